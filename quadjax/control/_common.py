"""Pieces shared by the controllers: desired attitude, torque, the mixer at the end."""

import jax.numpy as jnp

from quadjax._pytree import pytree_dataclass
from quadjax.mixer import MixerParams, mix, saturation_from, to_rotor_command
from quadjax.params import QuadParams


@pytree_dataclass
class ControllerModel:
    """What a controller believes about its vehicle (may differ from the plant):
    mass () kg, inertia (3, 3) kg·m² (body FLU), gravity () m/s²."""

    mass: object
    inertia: object
    gravity: object

    @classmethod
    def from_params(cls, params: QuadParams) -> "ControllerModel":
        return cls(mass=params.mass, inertia=params.inertia, gravity=params.gravity)


def attitude_from_thrust(b3, yaw):
    """Desired rotation R_d (3, 3) = [b1 b2 b3] with body z along ``b3`` (unit, world) and
    heading ``yaw`` [rad]: b2 = b3 × b1_c / ‖·‖, b1 = b2 × b3, b1_c = (cos ψ, sin ψ, 0)
    (Lee, Leok, McClamroch 2010). Pre: b3 not horizontal along b1_c."""
    b1c = jnp.stack([jnp.cos(yaw), jnp.sin(yaw), jnp.zeros_like(yaw)])
    b2 = jnp.cross(b3, b1c)
    b2 = b2 / jnp.maximum(jnp.linalg.norm(b2), 1e-9)
    b1 = jnp.cross(b2, b3)
    return jnp.stack([b1, b2, b3], axis=-1)


def torque_for(inertia, body_rates, angular_acceleration):
    """τ = J α + ω × J ω [N·m]: the torque that produces α [rad/s²] at rates ω (Euler's equation)."""
    return inertia @ angular_acceleration + jnp.cross(body_rates, inertia @ body_rates)


def wrench_to_command(mixer: MixerParams, collective, torque):
    """Mix (F [N], τ [N·m]) with the seed-002 priority → (rotor command (R,) rad/s, report (4,), output)."""
    w = jnp.concatenate([jnp.reshape(collective, (1,)), torque])
    out = mix(mixer, w)
    return to_rotor_command(mixer, out.thrusts), saturation_from(w, out), out
