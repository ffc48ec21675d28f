"""State invariants I2–I5 of seed 000, checked batched and under jit.

Codes, in the order they are checked (the first violated one is reported):

    0 none
    1 non_finite         I4: every value finite (checked first)
    2 attitude_not_unit  I2: |‖q‖² − 1| ≤ 8 ε of the state's dtype
    3 rotor_speed        I3: 0 ≤ ωᵢ ≤ ω_max
    4 energy             I3: energy ≥ 0
    5 below_ground       I5: position.z ≥ ground_z

I1 (parameters) is :func:`quadjax.params_valid`.
"""

import jax
import jax.numpy as jnp

from quadjax.params import QuadParams
from quadjax.state import QuadState

NONE, NON_FINITE, ATTITUDE_NOT_UNIT, ROTOR_SPEED, ENERGY, BELOW_GROUND = range(6)
INVARIANT_IDS = ("none", "non_finite", "attitude_not_unit", "rotor_speed", "energy", "below_ground")
#: the state field each code points at (for reports and repro files)
INVARIANT_FIELDS = ("", "", "attitude", "rotor_speeds", "energy", "position")


def invariant_id(code) -> str:
    """The name of a violation code (a Python int or a concrete 0-d array)."""
    return INVARIANT_IDS[int(code)]


def _all_finite(state: QuadState):
    leaves = jax.tree_util.tree_leaves(state)
    ok = jnp.isfinite(state.energy) & jnp.isfinite(state.on_ground)
    for leaf in leaves:
        if leaf.ndim > state.energy.ndim:
            ok = ok & jnp.all(jnp.isfinite(leaf), axis=-1)
    return ok


def unit_quaternion(q):
    """I2 on quaternions q (..., 4): |‖q‖² − 1| ≤ 8 ε of their dtype (per quaternion)."""
    eps = jnp.finfo(q.dtype).eps
    return jnp.abs(jnp.sum(q * q, axis=-1) - 1.0) <= 8 * eps


def state_violation(params: QuadParams, state: QuadState):
    """The first violated state invariant as an int32 code (0 = none), per vehicle.

    ``state`` may carry leading batch axes; the result has the batch shape.
    """
    checks = [
        (NON_FINITE, ~_all_finite(state)),
        (ATTITUDE_NOT_UNIT, ~unit_quaternion(state.attitude)),
        (ROTOR_SPEED, ~jnp.all(
            (state.rotor_speeds >= 0) & (state.rotor_speeds <= params.omega_max[..., None]), axis=-1)),
        (ENERGY, ~(state.energy >= 0)),
        (BELOW_GROUND, ~(state.position[..., 2] >= params.ground_z)),
    ]
    code = jnp.zeros(state.energy.shape, jnp.int32)
    for value, broken in reversed(checks):
        code = jnp.where(broken, value, code)
    return code


def state_valid(params: QuadParams, state: QuadState):
    """True where every state invariant holds (per vehicle)."""
    return state_violation(params, state) == NONE
