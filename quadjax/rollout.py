"""Open-loop rollouts: ``lax.scan`` of a stepper over a command sequence."""

from typing import Callable

import jax

from quadjax.integrators import rk4_step
from quadjax.params import QuadParams
from quadjax.state import QuadState

Stepper = Callable[[QuadParams, QuadState, jax.Array, float], QuadState]


def rollout(
    params: QuadParams,
    state0: QuadState,
    commands,
    dt,
    *,
    substeps: int = 1,
    step: Stepper = rk4_step,
):
    """Fly one vehicle open loop through ``commands`` (T, R) [rad/s], each held for ``dt`` [s].

    Each command is held for ``substeps`` physics steps of ``dt / substeps``.
    Returns ``(final_state, states)``, where ``states`` holds the state after each
    command with a leading time axis (T, ...). Batch with ``jax.vmap`` (vehicles
    first, so batched outputs are (N, T, ...)).
    """
    h = dt / substeps

    def hold(state, command):
        def physics(s, _):
            return step(params, s, command, h), None

        state, _ = jax.lax.scan(physics, state, None, length=substeps)
        return state, state

    return jax.lax.scan(hold, state0, commands)
