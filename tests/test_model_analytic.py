"""Analytic cases: hover, free fall, torque-free tumbling, ground contact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax.presets import PRESETS
from quadjax.quaternion import quat_rotate
from tests.helpers import BACKENDS, leaves_equal, simulate_open_loop


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_hover_is_an_equilibrium(name, dtype):
    p = PRESETS[name][0](dtype=dtype)
    s = qj.hover_state(p, (1.0, -2.0, 3.0))
    d = qj.derivative(p, s, qj.hover_rotor_speed(p))
    eps = float(jnp.finfo(dtype).eps)
    g = float(p.gravity)
    np.testing.assert_array_equal(d.position, 0.0)
    np.testing.assert_allclose(d.velocity, 0.0, atol=16 * eps * g)  # weight cancelled to rounding
    np.testing.assert_array_equal(d.attitude, 0.0)
    # moments cancel to rounding of the rotor moments m g L / J
    arm = float(jnp.max(jnp.abs(p.rotor_positions)))
    scale = float(p.mass) * g * arm / float(jnp.min(jnp.diag(p.inertia)))
    np.testing.assert_allclose(d.body_rates, 0.0, atol=64 * eps * scale)
    np.testing.assert_allclose(d.rotor_speeds, 0.0, atol=4 * eps * float(p.omega_max) / max(float(p.motor_tau), 1e-3))
    # energy keeps flowing at hover: the electrical power Σ k_p ω³
    np.testing.assert_allclose(d.energy, float(p.k_p) * float(jnp.sum(qj.hover_rotor_speed(p) ** 3)), rtol=1e-5)
    assert d.velocity.dtype == dtype


@pytest.mark.parametrize("backend", BACKENDS)
def test_hover_state_holds_for_a_second(backend):
    p = qj.presets.iris(dtype=jnp.float64)
    s = qj.hover_state(p, (0.0, 0.0, 2.0))
    final = simulate_open_loop(backend, save_every=0)(p, s, jnp.tile(qj.hover_rotor_speed(p), (1000, 1)), 1e-3).final
    np.testing.assert_allclose(final.position, s.position, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_free_fall_is_exact_under_rk4(backend):
    """Rotors stopped, no drag: z(t) = z0 + v0 t − g t²/2, exactly (RK4 is exact on polynomials)."""
    p = qj.presets.rp1(dtype=jnp.float64).replace(drag_linear=jnp.zeros(3), drag_quadratic=jnp.zeros(3))
    s0 = qj.QuadState.create(position=(0.0, 0.0, 100.0), velocity=(1.0, 2.0, 3.0), dtype=jnp.float64)
    T, dt = 200, 0.01
    out = simulate_open_loop(backend)(p, s0, jnp.zeros((T, 4)), dt)
    final, traj = out.final, out.states
    t = dt * np.arange(1, T + 1)
    g = float(p.gravity)
    np.testing.assert_allclose(traj.position[:, 2], 100.0 + 3.0 * t - 0.5 * g * t**2, rtol=1e-13)
    np.testing.assert_allclose(traj.position[:, 0], 1.0 * t, rtol=1e-13)
    np.testing.assert_allclose(traj.velocity[:, 2], 3.0 - g * t, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(traj.body_rates, 0.0)
    leaves_equal(final, jax.tree_util.tree_map(lambda x: x[-1], traj))  # the final state is the last saved one


@pytest.mark.parametrize("backend", BACKENDS)
def test_torque_free_tumbling_conserves_momentum_and_energy(backend):
    """No thrust, no drag, full asymmetric inertia: world angular momentum R J ω and ½ ωᵀJω are constant."""
    p = qj.presets.crazyflie21(dtype=jnp.float64).replace(ground_z=jnp.asarray(-1e9))
    J = p.inertia
    s0 = qj.QuadState.create(position=(0.0, 0.0, 10.0), body_rates=(3.0, -5.0, 8.0), rotor_speeds=(0.0,) * 4,
                             dtype=jnp.float64)
    traj = simulate_open_loop(backend)(p, s0, jnp.zeros((4000, 4)), 5e-4).states
    L = jax.vmap(lambda q, w: quat_rotate(q, J @ w))(traj.attitude, traj.body_rates)
    L0 = quat_rotate(s0.attitude, J @ s0.body_rates)
    np.testing.assert_allclose(L, jnp.broadcast_to(L0, L.shape), rtol=0, atol=1e-10 * float(jnp.linalg.norm(L0)))
    E = 0.5 * jnp.einsum("ti,ij,tj->t", traj.body_rates, J, traj.body_rates)
    E0 = 0.5 * s0.body_rates @ J @ s0.body_rates
    np.testing.assert_allclose(E, E0, rtol=1e-10)
    # the rates genuinely change (an asymmetric body precesses): the check is not vacuous
    assert float(jnp.max(jnp.abs(traj.body_rates - s0.body_rates))) > 0.5


# --- ground contact (seed 000: contact is a stop) ----------------------------------


def _grounded(p):
    return qj.hover_state(p, (0.5, 0.5, float(p.ground_z))).replace(on_ground=jnp.asarray(1.0, p.mass.dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_grounded_stays_put_below_weight(backend):
    p = qj.presets.rp1(dtype=jnp.float64)
    s = _grounded(p).replace(attitude=jnp.asarray([np.cos(0.2), 0.0, 0.0, np.sin(0.2)]))
    cmd = jnp.tile(0.99 * qj.hover_rotor_speed(p), (300, 1))
    out = simulate_open_loop(backend)(p, s, cmd, 1e-3)
    final, traj = out.final, out.states
    np.testing.assert_array_equal(traj.position, jnp.broadcast_to(s.position, traj.position.shape))
    np.testing.assert_array_equal(traj.velocity, 0.0)
    np.testing.assert_array_equal(traj.on_ground, 1.0)
    np.testing.assert_array_equal(final.attitude, s.attitude)
    assert float(final.energy) > 0  # the rotors still spin and draw power


@pytest.mark.parametrize("backend", BACKENDS)
def test_grounded_lifts_off_above_weight(backend):
    p = qj.presets.rp1(dtype=jnp.float64)
    cmd = jnp.tile(1.05 * qj.hover_rotor_speed(p), (300, 1))
    out = simulate_open_loop(backend)(p, _grounded(p), cmd, 1e-3)
    final, traj = out.final, out.states
    assert float(final.position[2]) > float(p.ground_z) + 1e-3
    assert float(final.on_ground) == 0.0
    first_air = int(np.argmax(np.asarray(traj.on_ground) == 0.0))
    # lift-off comes once the lagging rotors' thrust passes the weight
    w_lift = np.asarray(traj.rotor_speeds[first_air, 0])
    assert w_lift > float(qj.hover_rotor_speed(p)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_falling_vehicle_stops_at_ground(backend):
    p = qj.presets.rp1(dtype=jnp.float64).replace(ground_z=jnp.asarray(-0.5), drag_linear=jnp.zeros(3),
                                                  drag_quadratic=jnp.zeros(3))
    s0 = qj.QuadState.create(position=(0.0, 0.0, 1.5), dtype=jnp.float64)
    dt = 1e-3
    out = simulate_open_loop(backend)(p, s0, jnp.zeros((1000, 4)), dt)
    final, traj = out.final, out.states
    z = np.asarray(traj.position[:, 2])
    assert z.min() == pytest.approx(-0.5, abs=0.0)
    np.testing.assert_array_equal(final.velocity, 0.0)
    assert float(final.on_ground) == 1.0
    touchdown = (int(np.argmax(z <= -0.5)) + 1) * dt
    assert touchdown == pytest.approx(np.sqrt(2 * 2.0 / float(p.gravity)), abs=dt)


# seed 000's debugging scenario: quadjax verify's altimeter_bug (tests/test_verify.py) and
# tests/test_monitor.py

