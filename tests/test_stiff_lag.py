"""Stiff motor lag: the steppers solve the first-order lag exactly, so a time step many times
the motor constant is still right (RK4 on the lag diverges past h = 2.79 τ: iris at 40 ms
climbed from 10 m to 40.9 m in 1 s and the invariants said "valid")."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.native

F64 = jnp.float64
BACKENDS = ["native", "xla"]


def _backend(b):
    if b == "native" and not quadjax.native.available():
        pytest.skip("native kernel unavailable")
    return b


@functools.lru_cache(maxsize=None)
def _iris_step_response(dt, backend, dtype=F64, duration=1.0):
    """iris (τ = 12.5 ms) at 10 m, rotors at half hover speed, commanded to 1.02 × hover."""
    p = qj.presets.iris(dtype)
    hover = qj.hover_rotor_speed(p)
    s0 = qj.hover_state(p, (0.0, 0.0, 10.0)).replace(rotor_speeds=0.5 * hover)
    u = jnp.tile(1.02 * hover, (int(round(duration / dt)), 1))
    cfg = qj.SimConfig(backend=backend, save_every=0)
    return p, jax.jit(lambda s: qj.simulate(p, s, dt, commands=u, config=cfg))(s0).final


@pytest.mark.parametrize("dtype", [jnp.float32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_iris_at_40_ms_matches_a_fine_step_reference(backend, dtype):
    p, coarse = _iris_step_response(0.04, _backend(backend), dtype)  # dt / τ = 3.2, past RK4's limit
    _, fine = _iris_step_response(2e-4, "xla", dtype)  # 62 steps per τ
    assert float(p.motor_tau) == pytest.approx(0.0125)
    # the lag's transient is over in ~50 ms: the coarse step keeps the altitude to a millimetre
    assert abs(float(coarse.position[2]) - float(fine.position[2])) < 1e-3
    assert abs(float(coarse.velocity[2]) - float(fine.velocity[2])) < 2e-3
    np.testing.assert_allclose(np.asarray(coarse.rotor_speeds), np.asarray(fine.rotor_speeds), rtol=1e-5)
    assert coarse.position.dtype == dtype
    assert bool(qj.state_valid(p, coarse))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ratio", [0.1, 3.2, 50.0])
def test_one_step_of_the_rotors_is_the_exact_lag(backend, ratio):
    """ω(h) = u + (ω₀ − u) e^(−h/τ) for any h/τ, on the ground and with every other term on."""
    p = qj.presets.iris()
    dtype = p.mass.dtype
    h = ratio * float(p.motor_tau)
    w0 = jnp.asarray([100.0, 300.0, 500.0, 700.0], dtype)
    s0 = qj.hover_state(p, (0.0, 0.0, 5.0)).replace(rotor_speeds=w0)
    u = jnp.asarray([[600.0, 200.0, 5000.0, -10.0]], dtype)  # two of them beyond the clamp
    run = jax.jit(lambda s: qj.simulate(p, s, h, commands=u, config=qj.SimConfig(backend=_backend(backend))))(s0)
    uc = np.clip(np.asarray(u[0], np.float64), float(p.omega_min), float(p.omega_max))
    exact = uc + (np.asarray(w0, np.float64) - uc) * np.exp(-ratio)
    np.testing.assert_allclose(np.asarray(run.final.rotor_speeds, np.float64), exact, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("integrator", ["euler", "semi_implicit_euler", "rk4"])
def test_every_stepper_is_stable_for_a_stiff_lag(integrator):
    """Each stepper's rotors converge monotonically to the command at h = 10 τ (explicit Euler
    on the lag would oscillate with growing amplitude: |1 − h/τ| = 9)."""
    p = qj.presets.iris()
    hover = qj.hover_rotor_speed(p)
    s0 = qj.hover_state(p, (0.0, 0.0, 50.0)).replace(rotor_speeds=0.5 * hover)
    u = jnp.tile(hover, (20, 1))
    cfg = qj.SimConfig(integrator=integrator, backend="xla")
    run = jax.jit(lambda s: qj.simulate(p, s, 10 * float(p.motor_tau), commands=u, config=cfg))(s0)
    w = np.asarray(run.states.rotor_speeds)
    assert np.all(np.diff(w, axis=0) >= -1e-3 * np.asarray(hover))  # no overshoot, no oscillation
    np.testing.assert_allclose(w[-1], np.asarray(hover), rtol=1e-6)


def test_rk4_keeps_fourth_order_with_the_exact_lag():
    """The rest of the state is still RK4: halving h cuts the error ~16× with a rotor
    transient and a tilt on (float64, against a 16× finer step)."""
    p = qj.presets.rp1(F64)
    hover = qj.hover_rotor_speed(p)
    s0 = qj.hover_state(p, (0.0, 0.0, 5.0)).replace(rotor_speeds=0.6 * hover)
    command = hover * jnp.asarray([1.05, 0.97, 1.02, 0.99], F64)

    def final(dt):
        n = int(round(0.2 / dt))
        run = qj.simulate(p, s0, dt, commands=jnp.tile(command, (n, 1)),
                          config=qj.SimConfig(backend="xla", save_every=0))
        return np.concatenate([np.asarray(run.final.position), np.asarray(run.final.attitude)])

    ref = final(0.2 / 1024)
    errors = [np.max(np.abs(final(0.2 / n) - ref)) for n in (16, 32, 64)]
    orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    assert np.all(orders > 3.5), (errors, orders)
