"""The 2-DoF laboratory helicopter of seed 004: pitch and yaw about a fixed pivot, two rotors.

State X = [θ, ψ, θ̇, ψ̇] (pitch/elevation, yaw/azimuth [rad], their rates [rad/s]); command
u = [V_p, V_y] [V], the pitch and yaw rotor voltages. The Lagrangian model, in control-affine
form Ẋ₁ = X₂, Ẋ₂ = F(X) + G(X) u, with X₁ = [θ, ψ], X₂ = [θ̇, ψ̇]:

    (J_p + M L²) θ̈ = K_pp V_p + K_py V_y − M g L cos θ − D_p θ̇ − M L² ψ̇² sin θ cos θ
    (J_y + M L² cos² θ) ψ̈ = K_yp V_p + K_yy V_y − D_y ψ̇ + 2 M L² ψ̇ θ̇ sin θ cos θ

(L = L_cm, the centre of mass's distance from the pivot.) :func:`laboratory` gives the numbers
of c4dynamics 2.6's ``helicopter`` environment, the seed's example.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from quadjax._pytree import pytree_dataclass
from quadjax.vehicles import VectorVehicle, create, finite, nonnegative, positive

FIELDS = ("j_p", "j_y", "d_p", "d_y", "k_pp", "k_py", "k_yp", "k_yy", "l_cm", "mass", "gravity")


@pytree_dataclass
class HelicopterParams:
    """j_p, j_y [kg·m²] pitch and yaw inertia; d_p, d_y [N·m·s/rad] viscous damping; k_pp, k_py,
    k_yp, k_yy [N·m/V] torque gains (axis ← rotor); l_cm [m]; mass [kg]; gravity [m/s²]."""

    j_p: jax.Array
    j_y: jax.Array
    d_p: jax.Array
    d_y: jax.Array
    k_pp: jax.Array
    k_py: jax.Array
    k_yp: jax.Array
    k_yy: jax.Array
    l_cm: jax.Array
    mass: jax.Array
    gravity: jax.Array

    @classmethod
    def create(cls, dtype=None, **values) -> "HelicopterParams":
        """Checked constructor; every field by name."""
        return create(cls, HELICOPTER, values, dtype)


def laboratory(dtype=None) -> HelicopterParams:
    """c4dynamics 2.6's ``helicopter`` environment (its class attributes)."""
    return HelicopterParams.create(j_p=0.0215, j_y=0.0237, d_p=0.0171, d_y=0.232, k_pp=0.0015, k_py=0.0021,
                                   k_yp=-0.0027, k_yy=0.0014, l_cm=0.0071, mass=1.075, gravity=9.81, dtype=dtype)


def _inertias(params: HelicopterParams, theta):
    """(J_p + M L², J_y + M L² cos² θ): the pitch and yaw inertia about the pivot."""
    ml2 = params.mass * params.l_cm**2
    return params.j_p + ml2, params.j_y + ml2 * jnp.cos(theta) ** 2


def drift(params: HelicopterParams, x) -> jax.Array:
    """F(X) (2,) [rad/s²]: the angular accelerations with no voltage (gravity, damping, the
    centrifugal and Coriolis terms)."""
    theta, dtheta, dpsi = x[0], x[2], x[3]
    ml2 = params.mass * params.l_cm**2
    sc = jnp.sin(theta) * jnp.cos(theta)
    jp, jy = _inertias(params, theta)
    pitch = (-params.mass * params.gravity * params.l_cm * jnp.cos(theta) - params.d_p * dtheta
             - ml2 * dpsi**2 * sc)
    yaw = -params.d_y * dpsi + 2.0 * ml2 * dpsi * dtheta * sc
    return jnp.stack([pitch / jp, yaw / jy])


def input_matrix(params: HelicopterParams, x) -> jax.Array:
    """G(X) (2, 2) [rad/s²/V]: the gains from [V_p, V_y] to [θ̈, ψ̈]."""
    jp, jy = _inertias(params, x[0])
    return jnp.stack([jnp.stack([params.k_pp, params.k_py]) / jp, jnp.stack([params.k_yp, params.k_yy]) / jy])


def derivative(params: HelicopterParams, x, command) -> jax.Array:
    """Ẋ = [θ̇, ψ̇, F(X) + G(X) u] (4,)."""
    return jnp.concatenate([x[2:4], drift(params, x) + input_matrix(params, x) @ command])


def trim(params: HelicopterParams, x) -> jax.Array:
    """The voltages [V_p, V_y] that hold X at rest: G(X) u = −F(X)."""
    return jnp.linalg.solve(input_matrix(params, x), -drift(params, x))


def _checks(p: HelicopterParams) -> dict:
    gains = finite(p.k_pp) & finite(p.k_py) & finite(p.k_yp) & finite(p.k_yy)
    return {"j_p": positive(p.j_p), "j_y": positive(p.j_y), "d_p": nonnegative(p.d_p), "d_y": nonnegative(p.d_y),
            "k_pp": gains & (jnp.abs(p.k_pp * p.k_yy - p.k_py * p.k_yp) > 0), "k_py": gains, "k_yp": gains,
            "k_yy": gains, "l_cm": nonnegative(p.l_cm), "mass": positive(p.mass), "gravity": nonnegative(p.gravity)}


_BOUNDS = {"j_p": "> 0", "j_y": "> 0", "d_p": ">= 0", "d_y": ">= 0", "k_pp": "with a non-singular gain matrix",
           "k_py": "finite", "k_yp": "finite", "k_yy": "finite", "l_cm": ">= 0", "mass": "> 0", "gravity": ">= 0"}


def _rate(p: HelicopterParams):
    """The damping rates D/J [1/s], the stiff part for an explicit stepper: the pitch inertia
    about the pivot, and the smallest the yaw one gets (J_y, at θ = ±90°)."""
    return jnp.maximum(p.d_p / _inertias(p, 0.0)[0], p.d_y / p.j_y)


HELICOPTER = VectorVehicle("the 2-DoF helicopter", derivative, 4, 2, {f: () for f in FIELDS}, _checks, _BOUNDS,
                           _rate, "the viscous damping D/J")
HelicopterParams.vehicle = HELICOPTER
