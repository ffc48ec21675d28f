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
        state = _hold(params, state, command, h, substeps, step)
        return state, state

    return jax.lax.scan(hold, state0, commands)


def _hold(params, state, command, h, substeps, step):
    """``substeps`` physics steps of ``h`` with the command held (zero-order hold)."""

    def physics(s, _):
        return step(params, s, command, h), None

    state, _ = jax.lax.scan(physics, state, None, length=substeps)
    return state


def rollout_closed_loop(
    params: QuadParams,
    state0: QuadState,
    controller,
    ctrl_params,
    ctrl_state0,
    num_ticks: int,
    dt,
    *,
    substeps: int = 1,
    step: Stepper = rk4_step,
):
    """Fly one vehicle under a pure controller for ``num_ticks`` controller ticks of ``dt`` [s].

    ``controller(ctrl_params, ctrl_state, observation, t) -> (command (R,), ctrl_state)``
    runs once per tick at t = k·dt on the current state (the observation) and its
    command is held for ``substeps`` physics steps of ``dt / substeps``. Controllers,
    MPC and system identification all plug in here. Returns ``(final_state,
    final_ctrl_state, states (T, ...), commands (T, R))``; batch with ``jax.vmap``.
    """
    h = dt / substeps

    def tick(carry, k):
        state, cs = carry
        command, cs = controller(ctrl_params, cs, state, k * dt)
        state = _hold(params, state, command, h, substeps, step)
        return (state, cs), (state, command)

    ticks = jax.numpy.arange(num_ticks)
    (state, cs), (states, commands) = jax.lax.scan(tick, (state0, ctrl_state0), ticks)
    return state, cs, states, commands
