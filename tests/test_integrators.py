"""Convergence order of the steppers and long-run attitude normalisation."""

import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from tests.helpers import BACKENDS, busy_params, busy_state, command_for, simulate_open_loop

T_END = 0.4
CHUNK = 20  # steps per engine call; every step count below is a multiple of it


def _final(step, dt, backend):
    """The state after T_END s of steps of ``dt``: the engine's rollout of CHUNK steps, chained.
    One command shape for every dt (dt is traced), so each stepper compiles once, not once per dt."""
    p = busy_params()
    s = busy_state(p)
    n = int(round(T_END / dt))
    assert n % CHUNK == 0, n
    run = simulate_open_loop(backend, integrator=step, save_every=0)
    u = jnp.tile(command_for(p), (CHUNK, 1))
    for _ in range(n // CHUNK):
        s = run(p, s, u, dt).final
    return np.concatenate([s.position, s.velocity, s.attitude, s.body_rates, s.rotor_speeds / 1e3])


def _order(step, dts, backend):
    ref = _final(qj.rk4_step, dts[-1] / 8, backend)
    errs = [np.linalg.norm(_final(step, dt, backend) - ref) for dt in dts]
    slope = np.polyfit(np.log(dts), np.log(errs), 1)[0]
    return slope, errs


@pytest.mark.parametrize("backend", BACKENDS)
def test_rk4_is_fourth_order(backend):
    slope, errs = _order(qj.rk4_step, [0.02, 0.01, 0.005, 0.0025], backend)
    assert slope == pytest.approx(4.0, abs=0.3), (slope, errs)


@pytest.mark.parametrize("step", [qj.euler_step, qj.semi_implicit_euler_step])
def test_euler_steps_are_first_order(step):
    slope, errs = _order(step, [0.004, 0.002, 0.001, 0.0005], "xla")  # the kernel runs RK4 only
    assert slope == pytest.approx(1.0, abs=0.15), (slope, errs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_attitude_stays_unit_over_ten_thousand_steps(dtype, backend):
    p = busy_params(dtype).replace(ground_z=jnp.asarray(-1e9, dtype))
    s0 = busy_state(p, dtype).replace(body_rates=jnp.asarray([4.0, -3.0, 6.0], dtype))
    cmd = jnp.tile(command_for(p, (1.2, 0.8, 1.1, 0.9)), (10_000, 1))
    traj = simulate_open_loop(backend)(p, s0, cmd, 1e-3).states
    norm2 = jnp.sum(traj.attitude.astype(jnp.float64) ** 2, axis=-1)
    assert float(jnp.max(jnp.abs(norm2 - 1))) <= 8 * float(jnp.finfo(dtype).eps)
    assert traj.attitude.dtype == dtype
