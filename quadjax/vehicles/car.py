"""The car of seed 004: a kinematic unicycle at constant speed, and its linearised lateral model.

Kinematic model, state X = [x, y, ψ] (position [m], heading from the x axis [rad]), command
δ (1,) [rad/s] the steering input (the heading rate); no slip, so no forces:

    ẋ = V cos ψ,   ẏ = V sin ψ,   ψ̇ = δ.

Linearised about a straight line along x (ψ = 0), the lateral model, state [ψ, y]:
ψ̇ = δ, ẏ = V ψ (:func:`lateral_matrices`: ẋ = A x + B δ), the MPC's prediction model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from quadjax._pytree import pytree_dataclass
from quadjax.vehicles import VectorVehicle, create, positive


@pytree_dataclass
class CarParams:
    """speed V [m/s] (constant, > 0)."""

    speed: jax.Array

    @classmethod
    def create(cls, speed, dtype=None) -> "CarParams":
        return create(cls, CAR, {"speed": speed}, dtype)


def derivative(params: CarParams, x, command) -> jax.Array:
    """[V cos ψ, V sin ψ, δ] (3,)."""
    return jnp.stack([params.speed * jnp.cos(x[2]), params.speed * jnp.sin(x[2]), command[0]])


def lateral_matrices(params: CarParams):
    """(A (2, 2), B (2, 1)) of the lateral model on [ψ, y]: ψ̇ = δ, ẏ = V ψ."""
    z, one = jnp.zeros_like(params.speed), jnp.ones_like(params.speed)
    A = jnp.stack([jnp.stack([z, z]), jnp.stack([params.speed, z])])
    B = jnp.stack([jnp.stack([one]), jnp.stack([z])])
    return A, B


def lateral_derivative(params: CarParams, x, command) -> jax.Array:
    """The lateral model [ψ̇, ẏ] = A [ψ, y] + B δ (2,)."""
    A, B = lateral_matrices(params)
    return A @ x + B @ command


def lateral_state(x) -> jax.Array:
    """[ψ, y] of the kinematic state [x, y, ψ]."""
    return jnp.stack([x[..., 2], x[..., 1]], axis=-1)


def _checks(p: CarParams) -> dict:
    return {"speed": positive(p.speed)}


CAR = VectorVehicle("the kinematic car", derivative, 3, 1, {"speed": ()}, _checks, {"speed": "> 0"})
LATERAL = VectorVehicle("the car's lateral model", lateral_derivative, 2, 1, {"speed": ()}, _checks,
                        {"speed": "> 0"})


@pytree_dataclass
class LateralParams:
    """The lateral model's params (the same speed V [m/s]): a separate type, so that
    :func:`quadjax.simulate` flies the linear model rather than the kinematic one."""

    speed: jax.Array

    @classmethod
    def of(cls, params: CarParams) -> "LateralParams":
        return cls(speed=params.speed)


CarParams.vehicle = CAR
LateralParams.vehicle = LATERAL
