"""MPC costs: small pure terms, each a pytree of float weights, summed by :class:`Cost`.

Every term is called as ``term(model, state, command, t) → ()`` on one predicted node:
``model`` the MPC's :class:`~quadjax.QuadParams` (its belief, not the plant), ``state`` a
:class:`~quadjax.QuadState`, ``command`` (R,) rotor speeds [rad/s] (``None`` where the
term is evaluated as a terminal cost) and ``t`` [s] the node's absolute time. Terms are
differentiable everywhere (no kinks with an undefined gradient at the usual operating
points), so every solver — sampling, gradient or Gauss–Newton — can use any of them.

Weights are float leaves: vmap over weight sets, or differentiate through them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from quadjax._pytree import pytree_dataclass
from quadjax.control._common import attitude_from_thrust
from quadjax.model import hover_rotor_speed
from quadjax.quaternion import quat_to_matrix


def flat_attitude(reference, gravity):
    """R_d (3, 3): body z along a_ref + g e₃ (the thrust direction the reference asks for), heading ψ_ref.

    The differential-flatness attitude of a multirotor (Mellinger & Kumar 2011).
    """
    a = reference.acceleration
    f = a + jnp.stack([jnp.zeros_like(gravity), jnp.zeros_like(gravity), gravity])
    b3 = f / jnp.sqrt(jnp.sum(f * f) + 1e-12)
    return attitude_from_thrust(b3, reference.yaw)


def command_span(model):
    """ω_max − ω_min [rad/s]: the scale that makes rotor-speed errors dimensionless."""
    return model.omega_max - model.omega_min


def _needs_command(name, command):
    if command is None:
        raise ValueError(f"{name} depends on the command and cannot be a terminal cost term")


@pytree_dataclass
class Tracking:
    """Follow a reference trajectory (any pytree with ``__call__(t) → Reference``):

        ℓ = Σ w_p (p − p_ref)² + Σ w_v (v − v_ref)² + w_R (1 − cos θ_R) + Σ w_ω ω²

    θ_R the angle between the body attitude and the flat attitude of the reference
    (:func:`flat_attitude`), 1 − cos θ_R = ½ (3 − tr(R_dᵀ R)). Weights: position (3,)
    [1/m²], velocity (3,) [s²/m²], attitude () [1], body_rates (3,) [s²/rad²] (ω is
    penalised about zero: a damping term).
    """

    reference: object
    position: jax.Array
    velocity: jax.Array
    attitude: jax.Array
    body_rates: jax.Array

    def __call__(self, model, state, command, t):
        ref = self.reference(t)
        e_p = state.position - ref.position
        e_v = state.velocity - ref.velocity
        R = quat_to_matrix(state.attitude)
        R_d = flat_attitude(ref, model.gravity)
        att = 0.5 * (3.0 - jnp.sum(R_d * R))
        w = state.body_rates
        return (jnp.sum(self.position * e_p * e_p) + jnp.sum(self.velocity * e_v * e_v)
                + self.attitude * att + jnp.sum(self.body_rates * w * w))


@pytree_dataclass
class Effort:
    """Control effort about the thrust the task needs: ℓ = w Σ ((uᵢ − ω_ff,ᵢ) / (ω_max − ω_min))².

    ω_ff is the model's hover speed where ``reference`` is None, else the speed at which
    R equal rotors make the reference's thrust, ω_ff = √(m ‖a_ref + g e₃‖ / (R k_f)).
    weight () [1].
    """

    weight: jax.Array
    reference: object = None

    def __call__(self, model, state, command, t):
        _needs_command("Effort", command)
        if self.reference is None:
            target = hover_rotor_speed(model)
        else:
            a = self.reference(t).acceleration
            f = a + jnp.stack([jnp.zeros_like(model.gravity), jnp.zeros_like(model.gravity), model.gravity])
            thrust = model.mass * jnp.sqrt(jnp.sum(f * f)) / command.shape[-1]
            target = jnp.sqrt(thrust / model.k_f) * jnp.ones_like(command)
        e = (command - target) / command_span(model)
        return self.weight * jnp.sum(e * e)


@pytree_dataclass
class CommandRate:
    """Smoothness: ℓ = w Σ ((uᵢ − ωᵢ) / (ω_max − ω_min))², the step asked of each rotor
    from the speed it has at this node. Without motor lag ωᵢ is the previous command,
    so this is the classic Δu penalty; with lag it penalises the rotor acceleration
    demanded (τ ω̇ = u − ω). weight () [1]."""

    weight: jax.Array

    def __call__(self, model, state, command, t):
        _needs_command("CommandRate", command)
        e = (command - state.rotor_speeds) / command_span(model)
        return self.weight * jnp.sum(e * e)


@pytree_dataclass
class Tilt:
    """Soft tilt limit: ℓ = w · max(0, cos θ_max − R₃₃)², R₃₃ = 1 − 2(x² + y²) = cos(tilt).

    Zero while the tilt is below ``limit`` θ_max () [rad]; with θ_max = 0 it is
    w (1 − cos θ)². weight () [1]."""

    weight: jax.Array
    limit: jax.Array

    def __call__(self, model, state, command, t):
        q = state.attitude
        r33 = 1.0 - 2.0 * (q[1] * q[1] + q[2] * q[2])
        excess = jnp.maximum(jnp.cos(self.limit) - r33, 0.0)
        return self.weight * excess * excess


@pytree_dataclass
class KeepOut:
    """Soft keep-out sphere: ℓ = w · max(0, r − d)², d = √(‖p − c‖² + ε²), ε = 1 mm.

    center (3,) [m] world, radius () [m], weight () [1/m²]. The ε keeps the gradient
    finite at the centre."""

    center: jax.Array
    radius: jax.Array
    weight: jax.Array

    def __call__(self, model, state, command, t):
        e = state.position - self.center
        d = jnp.sqrt(jnp.sum(e * e) + 1e-6)
        inside = jnp.maximum(self.radius - d, 0.0)
        return self.weight * inside * inside


@pytree_dataclass
class Cost:
    """The MPC objective over a plan of H nodes spaced dt:

        J = Σₖ dt · Σ_{terms in stage} ℓ(x_k, u_k, t_k) + Σ_{terms in terminal} ℓ(x_H, None, t_H)

    ``stage`` and ``terminal`` are tuples of terms (any callables with the term
    signature that are pytrees). Terms that read the command cannot be terminal."""

    stage: tuple
    terminal: tuple = ()


def stage_cost(cost: Cost, model, state, command, t):
    """Σ of the stage terms on one node (no dt factor)."""
    return sum((term(model, state, command, t) for term in cost.stage), jnp.zeros((), state.position.dtype))


def terminal_cost(cost: Cost, model, state, t):
    """Σ of the terminal terms on the last predicted state."""
    return sum((term(model, state, None, t) for term in cost.terminal), jnp.zeros((), state.position.dtype))
