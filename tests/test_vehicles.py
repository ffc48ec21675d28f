"""The other vehicles of seed 004 (quadjax.vehicles) on the same engine: the seed's worked
examples, c4dynamics 2.6's derivatives as an independent reference, vmap == loop, grad ==
finite differences, and the physics the missile model must have."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import frames, status
from quadjax.vehicles import car, helicopter, missile

c4d = pytest.importorskip("c4dynamics")
solve_ivp = pytest.importorskip("scipy.integrate").solve_ivp
from c4dynamics.envs.environments import helicopter as c4d_helicopter  # noqa: E402


def _fly(params, x0, dt, commands, **config):
    return qj.simulate(params, x0, dt, commands=commands, config=qj.SimConfig(**config))


def _seed_missile(attitude):
    """The seed's missile: 85 kg, J (0.5, 61, 61), 3000 N, no aerodynamics, no burn."""
    return missile.MissileParams.create(
        mass_full=85.0, propellant=0.0, inertia_full=(0.5, 61.0, 61.0), inertia_dry=(0.5, 61.0, 61.0),
        thrust=3000.0, burn_time=10.0, air_density=0.0, diameter=0.2, c_a0=0.0, c_a2=0.0, c_n_alpha=0.0,
        static_margin=0.0, c_mq=0.0, c_lp=0.0, c_m_delta=0.0, c_l_delta=0.0, fin_limit=0.3,
        gravity=c4d.g_ms2, attitude=attitude, dtype=jnp.float64)


# --------------------------------------------------------------------------- the seed's worked examples


@pytest.mark.parametrize("attitude", missile.ATTITUDES)
def test_seed_missile_launch_and_target(attitude):
    """NED launch at 30° pitch, 3000 N, 3 s at dt 0.01: |v| = 123.8 m/s; the target at x = 3250 m.
    The seed's NED data is converted to ENU/FLU at the edge and back."""
    p = _seed_missile(attitude)
    d = math.radians(30.0)
    v_ned = jnp.asarray([30 * math.cos(d), 0.0, -30 * math.sin(d)])
    q_ned = frames.euler321_to_quat(jnp.asarray([0.0, d, 0.0]))  # FRD→NED, 30° nose up
    q_enu = frames.quat_ned_frd_to_enu_flu(q_ned)
    att = frames.quat_to_euler321(q_enu) if attitude == "euler" else q_enu
    x0 = jnp.concatenate([jnp.zeros(3), frames.ned_to_enu(v_ned), att, jnp.zeros(4)])
    final = _fly(p, x0, 0.01, jnp.zeros((300, 3)), save_every=0).final
    speed = float(jnp.linalg.norm(final[3:6]))
    # constant thrust along a fixed nose plus gravity: v(3 s) = v0 + (T/m · nose + g) · 3 s, exactly
    nose = np.asarray(frames.ned_to_enu(jnp.asarray([math.cos(d), 0.0, -math.sin(d)])))
    exact = np.asarray(frames.ned_to_enu(v_ned)) + 3.0 * (3000.0 / 85.0 * nose - np.array([0, 0, c4d.g_ms2]))
    np.testing.assert_allclose(final[3:6], exact, rtol=1e-12, atol=1e-9)
    assert 123.8 <= speed < 123.9  # the seed prints 123.8...
    target = missile.PointMassParams.create(mass=1.0, dtype=jnp.float64)
    t0 = jnp.concatenate([frames.ned_to_enu(jnp.asarray([4000.0, 0.0, -1000.0])),
                          frames.ned_to_enu(jnp.asarray([-250.0, 0.0, 0.0]))])
    t_final = _fly(target, t0, 0.01, jnp.zeros((300, 3)), save_every=0).final
    assert float(frames.enu_to_ned(t_final[:3])[0]) == pytest.approx(3250.0, abs=1e-9)


def test_seed_car_back_on_the_line():
    """y0 = 1 m, δ = −0.5 y − 2ψ held for 0.2 s ticks, 8 s at 22.3 m/s: y ≈ −0.02 m (the seed, by
    solve_ivp); our RK4 with 20 substeps per tick agrees with a tight solve_ivp to 1e-6."""
    p = car.CarParams.create(22.3, dtype=jnp.float64)

    def feedback(_, cs, x, t):
        return jnp.stack([-0.5 * x[1] - 2.0 * x[2]]), cs

    traj = qj.simulate(p, jnp.asarray([0.0, 1.0, 0.0]), 0.2, controller=feedback, num_ticks=40,
                       config=qj.SimConfig(substeps=20, save_every=0))
    X = np.array([0.0, 1.0, 0.0])
    for _ in range(40):
        delta = -0.5 * X[1] - 2.0 * X[2]
        X = solve_ivp(lambda t, s: [22.3 * np.cos(s[2]), 22.3 * np.sin(s[2]), delta], [0, 0.2], X,
                      rtol=1e-11, atol=1e-12).y[:, -1]
    np.testing.assert_allclose(traj.final, X, atol=1e-6)
    assert -0.03 < float(traj.final[1]) <= -0.02  # the seed prints -0.02...


def test_seed_helicopter_trim_and_pitch_step():
    """Trim (G u = −F) plus +2 V on the pitch rotor for 2 s at dt 0.01: pitch 10.4°, yaw −2.5°."""
    p = helicopter.laboratory(jnp.float64)
    x0 = jnp.zeros(4)
    u_trim = helicopter.trim(p, x0)
    np.testing.assert_allclose(helicopter.derivative(p, x0, u_trim), 0.0, atol=1e-15)
    u = jnp.tile(u_trim + jnp.asarray([2.0, 0.0]), (200, 1))
    final = _fly(p, x0, 0.01, u, save_every=0).final
    assert 10.4 <= math.degrees(float(final[0])) < 10.5  # the seed prints (10.4..., -2.5...)
    assert -2.6 < math.degrees(float(final[1])) <= -2.5
    env = c4d_helicopter()
    ref = solve_ivp(env.dynamics, [0, 2], np.zeros(4), args=(np.asarray(u[0]),), rtol=1e-11, atol=1e-12).y[:, -1]
    np.testing.assert_allclose(final, ref, atol=1e-7)


# --------------------------------------------------------------------------- c4dynamics as the reference


def _assert_rel(ours, ref, rtol=1e-9):
    scale = np.maximum(np.abs(ref), np.max(np.abs(ref)) * 1e-3)
    np.testing.assert_array_less(np.abs(np.asarray(ours) - ref), rtol * scale + 1e-300)


def test_rigid_body_cores_equal_c4dynamics_eqm6_and_eqm6q():
    """The Euler-angle and quaternion rigid-body cores the missile flies on, against c4dynamics'
    eqm6 / eqm6q (inertial force, body moment) on 200 random states, forces and moments."""
    rng = np.random.default_rng(0)
    rb, qb = c4d.rigidbody(), c4d.quatbody()
    euler_core, quat_core, rotation = (jax.jit(f) for f in (frames.euler12_rigid_body, qj.rigid_body.rigid_body_derivative,
                                                            lambda e: qj.quaternion.quat_to_matrix(frames.euler321_to_quat(e))))
    for _ in range(200):
        mass, I = rng.uniform(1, 200), rng.uniform(0.1, 80, 3)
        x12 = np.concatenate([rng.normal(size=3) * 100, rng.normal(size=3) * 50, rng.uniform(-3, 3, 1),
                              rng.uniform(-1.4, 1.4, 1), rng.uniform(-3, 3, 1), rng.normal(size=3) * 3])
        F_b, M = rng.normal(size=3) * 1000, rng.normal(size=3) * 50
        q = np.asarray(frames.euler321_to_quat(jnp.asarray(x12[6:9])))
        R = np.asarray(rotation(jnp.asarray(x12[6:9])))
        g = 9.80665
        F_inertial = R @ F_b - np.array([0.0, 0.0, mass * g])
        rb.X, rb.mass, rb.I = x12, mass, list(I)
        ours = euler_core(mass, jnp.diag(jnp.asarray(I)), g, jnp.asarray(x12), jnp.asarray(F_b), jnp.asarray(M))
        _assert_rel(ours, c4d.eqm.eqm6(rb, F_inertial, M))
        qb.X, qb.mass, qb.I = np.concatenate([x12[:6], q, x12[9:]]), mass, list(I)
        pd, vd, qd, wd = quat_core(mass, jnp.diag(jnp.asarray(I)), g, jnp.asarray(q), jnp.asarray(x12[3:6]),
                                   jnp.asarray(x12[9:12]), jnp.asarray(F_b), jnp.asarray(M))
        _assert_rel(np.concatenate([pd, vd, qd, wd]), c4d.eqm.eqm6q(qb, F_inertial, M))


def test_missile_derivatives_equal_eqm6_with_their_forces():
    """Both missile states against c4dynamics' eqm6 / eqm6q fed the missile's own forces and
    moments (thrust, aerodynamics, fins, gravity) and its scheduled mass and inertia: 100 random
    flight states through and after the burn, with wind."""
    rng = np.random.default_rng(5)
    rb, qb = c4d.rigidbody(), c4d.quatbody()
    pe = missile.reference_missile("euler", jnp.float64).replace(wind=jnp.asarray([3.0, -2.0, 0.5]))
    pq = pe.replace(attitude="quaternion")
    de, dq = jax.jit(missile.derivative_euler), jax.jit(missile.derivative_quaternion)

    @jax.jit
    def wrench(x12, tau, fins):
        q = frames.euler321_to_quat(x12[6:9])
        thrust, mass, inertia = missile.schedule(pe, tau)
        v_b = qj.quaternion.quat_rotate_inverse(q, x12[3:6] - pe.wind)
        force, moment = missile.aerodynamics(pe, v_b, x12[9:12], fins)
        force = force.at[0].add(thrust)
        return q, mass, inertia, qj.quaternion.quat_rotate(q, force) - jnp.asarray([0, 0, 1.0]) * mass * pe.gravity, moment

    for _ in range(100):
        x12 = np.concatenate([rng.normal(size=3) * 1000, rng.normal(size=3) * 200, rng.uniform(-3, 3, 1),
                              rng.uniform(-1.4, 1.4, 1), rng.uniform(-3, 3, 1), rng.normal(size=3) * 2])
        tau, fins = rng.uniform(0, 8), rng.uniform(-0.4, 0.4, 3)
        q, mass, inertia, F, M = (np.asarray(v) for v in wrench(jnp.asarray(x12), tau, jnp.asarray(fins)))
        rb.X, rb.mass, rb.I = x12, float(mass), list(inertia)
        _assert_rel(de(pe, jnp.asarray(np.r_[x12, tau]), jnp.asarray(fins))[:12], c4d.eqm.eqm6(rb, F, M))
        qb.X, qb.mass, qb.I = np.concatenate([x12[:6], q, x12[9:]]), float(mass), list(inertia)
        xq = jnp.asarray(np.r_[x12[:6], q, x12[9:], tau])
        _assert_rel(dq(pq, xq, jnp.asarray(fins))[:13], c4d.eqm.eqm6q(qb, F, M))


def test_helicopter_equals_c4dynamics_environment():
    rng = np.random.default_rng(1)
    env = c4d_helicopter()
    p = helicopter.laboratory(jnp.float64)
    drift, gain, deriv = (jax.jit(f) for f in (helicopter.drift, helicopter.input_matrix, helicopter.derivative))
    for _ in range(200):
        x = np.concatenate([rng.uniform(-1.4, 1.4, 1), rng.uniform(-3, 3, 1), rng.normal(size=2) * 3])
        u = rng.normal(size=2) * 10
        _assert_rel(drift(p, jnp.asarray(x)), env.F(x))
        _assert_rel(gain(p, jnp.asarray(x)), env.G(x))
        _assert_rel(deriv(p, jnp.asarray(x), jnp.asarray(u)), env.dynamics(0.0, x, u))


# --------------------------------------------------------------------------- the missile's physics


def _aero_state(p, alpha_deg, speed=250.0):
    """Level flight at ``speed``, the nose ``alpha_deg`` above the velocity (τ past burn-out)."""
    x = missile.launch_state(p, (0.0, 0.0, 1000.0), speed, (0.0, -math.radians(alpha_deg), 0.0))
    v = jnp.asarray([speed, 0.0, 0.0])
    return x.at[3:6].set(v).at[-1].set(10.0)


@pytest.mark.parametrize("margin, stable", [(0.3, True), (-0.3, False)])
def test_weathercock_stability_follows_the_static_margin(margin, stable):
    """Nose 5° above the velocity, no fins, no thrust: with the centre of pressure behind the
    centre of mass the missile noses back (the angle of attack oscillates and decays); with it
    ahead (a planted defect: ℓ < 0) it diverges."""
    p = missile.reference_missile("quaternion", jnp.float64).replace(static_margin=jnp.asarray(margin))
    x0 = _aero_state(p, 5.0)
    states = _fly(p, x0, 0.001, jnp.zeros((600, 3)), save_every=10).states

    def alpha(x):
        v_b = qj.quaternion.quat_rotate_inverse(x[6:10], x[3:6])
        return jnp.degrees(jnp.arctan2(-v_b[2], v_b[0]))

    a = np.asarray(jax.vmap(alpha)(states))
    if stable:  # it swings through zero and never beyond where it started
        assert a.min() < -2.0 and np.abs(a).max() < 5.5
    else:
        assert np.abs(a[-1]) > 20.0


def test_quaternion_missile_stays_unit_and_the_monitor_sees_a_drifting_one():
    """The quaternion missile renormalises after each step (I2 holds under check="monitor"); the
    same RK4 without the projection (a planted defect) drifts off the unit sphere and is stopped."""
    p = missile.reference_missile("quaternion", jnp.float64)
    x0 = missile.launch_state(p, (0.0, 0.0, 0.0), 30.0, (0.3, -0.5, 0.2))
    fins = jnp.tile(jnp.asarray([0.05, 0.1, -0.1]), (400, 1))
    good = _fly(p, x0, 0.005, fins, check="monitor", save_every=0)
    assert int(good.status) == 0

    def unprojected(params, x, command, dt):
        return qj.integrators.runge_kutta4(lambda s: missile.derivative(params, s, command), x, dt)

    bad = _fly(p, x0, 0.005, fins, check="monitor", save_every=0, integrator=unprojected)
    assert int(bad.status) == status.STATUS_IDS.index("attitude_not_unit")


def test_burn_schedule_thrust_mass_and_inertia():
    p = missile.reference_missile(dtype=jnp.float64)
    for tau, T, m in ((0.0, 8000.0, 85.0), (2.0, 8000.0, 78.0), (4.0, 0.0, 71.0), (9.0, 0.0, 71.0)):
        thrust, mass, inertia = missile.schedule(p, jnp.asarray(tau))
        assert (float(thrust), float(mass)) == pytest.approx((T, m))
    np.testing.assert_allclose(missile.schedule(p, jnp.asarray(4.0))[2], p.inertia_dry)


def test_euler_and_quaternion_missiles_fly_the_same_flight():
    """A boosted, aerodynamic flight with fin commands: the two attitude forms agree to RK4's error."""
    T = 1500
    t = np.arange(T) * 0.001
    fins = jnp.asarray(np.stack([0.02 * np.sin(3 * t), 0.05 * np.sin(2 * t), 0.03 * np.cos(2.5 * t)], axis=1))
    finals = {}
    for att in missile.ATTITUDES:
        p = missile.reference_missile(att, jnp.float64)
        x0 = missile.launch_state(p, (0.0, 0.0, 0.0), 30.0, (0.1, math.radians(-30.0), 0.4))
        finals[att] = _fly(p, x0, 0.001, fins, save_every=0).final
    e, q = finals["euler"], finals["quaternion"]
    np.testing.assert_allclose(e[:6], q[:6], rtol=1e-8, atol=1e-7)
    angle = qj.quaternion.quat_angle_between(frames.euler321_to_quat(e[6:9]), q[6:10] / jnp.linalg.norm(q[6:10]))
    assert float(angle) < 1e-6
    np.testing.assert_allclose(e[9:13], q[10:14], rtol=1e-7, atol=1e-8)
    assert float(jnp.linalg.norm(e[3:6])) > 150  # boosted from 30 m/s (8 kN on 85 kg)


def test_proportional_navigation_intercepts():
    """PN (N = 4) with the trim autopilot against a crossing target 2.2 km away: miss < 2 m; with
    the navigation constant's sign flipped (a planted defect) it misses by far."""
    p = missile.reference_missile(dtype=jnp.float64)
    x0 = missile.launch_state(p, (0.0, 0.0, 0.0), 30.0, (0.0, math.radians(-35.0), 0.0))

    def miss(gain):
        ctrl = missile.PNGuidance(model=p, target0=jnp.asarray([2000.0, 300.0, 800.0]),
                                  target_velocity=jnp.asarray([-100.0, 30.0, 0.0]), gain=jnp.asarray(gain),
                                  rate_gain=jnp.asarray(10.0), tick=jnp.asarray(0.002))
        traj = qj.simulate(p, x0, 0.002, controller=missile.pn_control, ctrl_params=ctrl,
                           ctrl_state=jnp.asarray(jnp.inf), num_ticks=3500,
                           config=qj.SimConfig(save_every=1, save=("state",)))
        t = (np.arange(3500) + 1) * 0.002
        sampled = np.min(np.linalg.norm(traj.states[:, :3] - np.asarray(missile.target_position(ctrl, t[:, None])), axis=1))
        assert float(traj.ctrl_state) <= sampled + 1e-9  # the controller's closest approach, between ticks too
        return float(traj.ctrl_state)

    assert miss(4.0) < 2.0
    assert miss(-4.0) > 100.0


# --------------------------------------------------------------------------- batching, gradients, the boundary


def _cases():
    rng = np.random.default_rng(4)
    mp = missile.reference_missile("euler", jnp.float64)
    heli = helicopter.laboratory(jnp.float64)
    carp = car.CarParams.create(15.0, dtype=jnp.float64)
    mq = missile.reference_missile("quaternion", jnp.float64)
    target = missile.PointMassParams.create(2.0, dtype=jnp.float64)
    return [
        ("missile", mp, lambda s: missile.launch_state(mp, (0, 0, 0), 30.0 + s, (0.0, -0.5 - 0.1 * s, 0.2)),
         jnp.asarray(rng.normal(size=(100, 3)) * 0.05), 0.002, "c_n_alpha"),
        ("helicopter", heli, lambda s: jnp.asarray([0.1 * s, 0.0, 0.0, 0.0]),
         helicopter.trim(heli, jnp.zeros(4)) + jnp.asarray(rng.normal(size=(100, 2))), 0.01, "k_py"),
        ("car", carp, lambda s: jnp.asarray([0.0, 1.0 + s, 0.1]), jnp.asarray(rng.normal(size=(100, 1)) * 0.1),
         0.05, "speed"),
        ("missile (quaternion)", mq, lambda s: missile.launch_state(mq, (0, 0, 0), 30.0 + s, (0.1 * s, -0.5, 0.2)),
         jnp.asarray(rng.normal(size=(100, 3)) * 0.05), 0.002, "static_margin"),
        ("target", target, lambda s: jnp.asarray([100.0 * s, 0.0, 500.0, -200.0, 10.0 * s, 0.0]),
         jnp.asarray(rng.normal(size=(100, 3)) * 50.0), 0.01, "mass"),
        ("car lateral", car.LateralParams.of(carp), lambda s: jnp.asarray([0.1 * s, 1.0]),
         jnp.asarray(rng.normal(size=(100, 1)) * 0.1), 0.05, "speed"),
    ]


CASES = ["missile", "helicopter", "car", "missile (quaternion)", "target", "car lateral"]


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_vmap_equals_loop_and_grad_equals_finite_differences(case):
    name, p, start, commands, dt, field = _cases()[case]
    x0s = jnp.stack([start(s) for s in (0.0, 1.0, 2.0)])
    one = jax.jit(lambda x: _fly(p, x, dt, commands, save_every=0).final)
    batched = jax.jit(jax.vmap(lambda x: _fly(p, x, dt, commands, save_every=0).final))(x0s)
    np.testing.assert_allclose(batched, jnp.stack([one(x) for x in x0s]), rtol=1e-12, atol=1e-12)

    def loss(theta):  # a params field, a command gain and the start, through the whole flight
        q = p.replace(**{field: getattr(p, field) * theta[0]})
        final = _fly(q, start(theta[2]), dt, commands * theta[1], save_every=0).final
        return jnp.sum(jnp.tanh(0.1 * final))

    theta = jnp.asarray([1.1, 0.9, 0.5])
    g = np.asarray(jax.jit(jax.grad(loss))(theta))
    f = jax.jit(loss)
    for i in range(3):
        e = np.zeros(3)
        e[i] = 1e-6
        fd = (float(f(theta + e)) - float(f(theta - e))) / 2e-6
        assert g[i] == pytest.approx(fd, rel=1e-6, abs=1e-9), (name, i)


def test_boundary_errors_and_status_codes():
    p = helicopter.laboratory(jnp.float64)
    x0 = jnp.zeros(4)
    u = jnp.zeros((10, 2))
    with pytest.raises(ValueError, match="HelicopterParams.j_p"):
        helicopter.HelicopterParams.create(**{**{f: 1.0 for f in helicopter.FIELDS}, "j_p": -1.0})
    with pytest.raises(ValueError, match="is \\(4,\\) for one vehicle"):
        qj.simulate(p, jnp.zeros(5), 0.01, commands=u)
    with pytest.raises(ValueError, match="expected \\(T, 2\\) commands"):
        qj.simulate(p, x0, 0.01, commands=jnp.zeros((10, 3)))
    with pytest.raises(ValueError, match="viscous damping"):
        qj.simulate(p, x0, 10.0, commands=u)  # D_y/J_y = 9.8 1/s: RK4 at 10 s is unstable
    with pytest.raises(ValueError, match="MissileParams.attitude"):
        missile.MissileParams.create(attitude="rodrigues")
    with pytest.raises(ValueError, match="MissileParams.propellant"):
        missile.reference_missile().replace(propellant=jnp.asarray(100.0)).vehicle.check_params(
            missile.reference_missile().replace(propellant=jnp.asarray(100.0)))
    masses = jnp.asarray([1.075, -1.0])
    out = jax.vmap(lambda m: qj.simulate(p.replace(mass=m), x0, 0.01, commands=u, hooks=(qj.Hook(),),
                                         config=qj.SimConfig(save_every=0)))(masses)
    assert out.status.tolist() == [0, status.PARAMS_INVALID]
    f32 = _fly(car.CarParams.create(10.0, dtype=jnp.float32), jnp.zeros(3, jnp.float32), 0.1,
               jnp.zeros((5, 1), jnp.float32))
    assert f32.final.dtype == jnp.float32
    lateral = _fly(car.LateralParams.of(car.CarParams.create(10.0, dtype=jnp.float64)), jnp.asarray([0.1, 0.0]), 0.1,
                   jnp.zeros((10, 1)), save_every=0).final
    np.testing.assert_allclose(lateral, [0.1, 10.0 * 0.1 * 1.0], rtol=1e-12)  # ẏ = V ψ, ψ held
