"""The error-state EKF (quadjax.estimation) and the engine's observer slot: the update against
the textbook formula, Monte Carlo consistency (NEES, NIS inside their χ² bounds), convergence
from a 30° error, finite-difference gradients, per-vehicle divergence, a closed loop on estimates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import quadjax as qj
from quadjax import control as C
from quadjax import estimation as E
from quadjax import sensors as S
from quadjax import status

P = qj.presets.get("crazyflie21")
DT = 0.005
HOVER = qj.hover_state(P, position=(0.0, 0.0, 1.0))
SIGMA0 = jnp.array([0.05] * 3 + [0.05] * 3 + [0.02] * 3 + [0.05] * 3 + [0.005] * 3)


def suite(fix_velocity=False, latency=0.0):
    imu = S.Imu.create(accel=S.ImuAxes.create(noise_density=2e-3, random_walk=1e-4),
                       gyro=S.ImuAxes.create(noise_density=1e-4, random_walk=1e-5))
    return S.Sensors.create(DT, imu, mag=S.Magnetometer.create(noise=5e-7), mag_rate=50,
                            baro=S.Barometer.create(noise=0.1), baro_rate=50,
                            fix=S.PositionFix.create(position_noise=0.01, velocity_noise=0.02), fix_rate=50,
                            fix_velocity=fix_velocity, fix_latency=latency)


def hover_run(observer, T):
    u = jnp.tile(qj.hover_rotor_speed(P), (T, 1))
    return qj.simulate(P, HOVER, DT, commands=u, observe=observer, config=qj.SimConfig(save=("estimate",)))


def test_sequential_joseph_update_equals_the_textbook_joint_update():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(15, 15))
    Pm = A @ A.T / 15 + 0.1 * np.eye(15)
    H = rng.normal(size=(6, 15))
    noise = rng.uniform(0.1, 0.5, 6)
    r = rng.normal(size=6)
    nav = E.NavState(jnp.zeros(3), jnp.zeros(3), jnp.array([1.0, 0, 0, 0]), jnp.zeros(3), jnp.zeros(3))
    est = E.EKFState(nav=nav, P=jnp.asarray(Pm), history=jnp.zeros((0, 6)))
    out, nis = E.ekf_update(est, jnp.asarray(r), jnp.asarray(H), jnp.asarray(noise))
    R = np.diag(noise ** 2)
    S_ = H @ Pm @ H.T + R
    K = Pm @ H.T @ np.linalg.inv(S_)
    IKH = np.eye(15) - K @ H
    joint = IKH @ Pm @ IKH.T + K @ R @ K.T
    dx = K @ r
    assert float(nis) == pytest.approx(r @ np.linalg.solve(S_, r), rel=1e-10)
    np.testing.assert_allclose(out.nav.position, dx[0:3], rtol=1e-10, atol=1e-12)
    # after the reset (I − [½δθ]×) about the new attitude reference
    Gr = np.eye(15)
    Gr[6:9, 6:9] -= np.asarray(E.skew(jnp.asarray(0.5 * dx[6:9])))
    np.testing.assert_allclose(out.P, Gr @ joint @ Gr.T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out.P, np.asarray(out.P).T, atol=0)
    assert np.all(np.linalg.eigvalsh(np.asarray(out.P)) > 0)
    # H given as the indices it picks: the same update, by columns of P
    picked, nis_p = E.ekf_update(est, jnp.asarray(r[:3]), (4, 0, 9), jnp.asarray(noise[:3]))
    dense, nis_d = E.ekf_update(est, jnp.asarray(r[:3]), jnp.eye(15)[jnp.array([4, 0, 9])], jnp.asarray(noise[:3]))
    np.testing.assert_allclose(picked.P, dense.P, rtol=1e-12, atol=1e-14)
    assert float(nis_p) == pytest.approx(float(nis_d), rel=1e-12)
    # not valid: nothing changes
    same, zero = E.ekf_update(est, jnp.asarray(r), jnp.asarray(H), jnp.asarray(noise), valid=False)
    assert float(zero) == 0.0 and np.array_equal(same.P, est.P)


def _bounds(dof, n, level=0.95):
    """The two-sided ``level`` interval of the mean of n independent χ²(dof) values."""
    lo, hi = stats.chi2.interval(level, dof * n)
    return lo / n, hi / n


def test_monte_carlo_nees_and_nis_lie_inside_their_chi2_bounds():
    """1 000 hovering vehicles, each with its own sensor noise and initial error drawn from P₀;
    IMU at 200 Hz, mocap, barometer and magnetometer at 50 Hz. At each of 20 check times the
    ensemble-mean NEES (15 dof) lies inside its 95 % bound at the expected rate, and its mean
    over them too; the NIS of every sensor, averaged over all its updates, lies inside its bound
    (innovations of a consistent filter are white, so the pooled bound holds)."""
    n, T = 1000, 200
    sensors = suite()
    matched = E.EKFParams.from_sensors(sensors, P.gravity)

    @jax.jit
    def fleet(keys, fp):
        def one(key):
            run = hover_run(E.EKFObserver.create(sensors, key, SIGMA0, filter=fp), T)
            return run.estimates["nees"], run.estimates["nis"], run.status
        return jax.vmap(one)(keys)

    keys = jax.random.split(jax.random.PRNGKey(0), n)
    nees, nis, st = (np.asarray(x) for x in fleet(keys, matched))
    assert (st == 0).all()
    checks = np.arange(9, T, 10)
    lo, hi = _bounds(15, n)
    inside = [lo <= nees[:, k].mean() <= hi for k in checks]
    assert np.mean(inside) >= 0.85, (lo, hi, nees[:, checks].mean(0))
    assert 0.97 * 15 <= nees[:, checks].mean() <= 1.03 * 15
    every = sensors.fix_every
    for kind, dof, ticks in (("fix", 3, np.arange(0, T, every)), ("baro", 1, np.arange(0, T, every)),
                             ("mag", 3, np.arange(0, T, every))):
        values = nis[:, ticks, E.NIS_KINDS.index(kind)]
        lo, hi = _bounds(dof, values.size)
        assert lo <= values.mean() <= hi, (kind, lo, values.mean(), hi)
    # a filter that trusts its mocap 3× too much fails the same test (same program, other numbers)
    bad = matched.replace(fix_position_noise=matched.fix_position_noise / 3)
    nees_bad, nis_bad, _ = (np.asarray(x) for x in fleet(keys, bad))
    assert nees_bad[:, checks].mean() > 1.5 * 15
    assert nis_bad[:, ::every, 0].mean() > 2 * 3


def _error_deg(run):
    q = run.estimates["state"].attitude
    return np.degrees(np.asarray(jax.vmap(qj.quaternion.quat_angle_between)(q, jnp.broadcast_to(HOVER.attitude, q.shape))))


def test_filter_converges_from_a_30_degree_attitude_error():
    axis = np.array([1.0, 1.0, 1.0]) / np.sqrt(3)  # tilt and heading together
    offset = jnp.zeros(15).at[6:9].set(jnp.asarray(np.radians(30.0) * axis))
    sigma0 = SIGMA0.at[6:9].set(np.radians(30.0))
    obs = E.EKFObserver.create(suite(), jax.random.PRNGKey(4), sigma0, offset0=offset, draw_initial=False)
    run = jax.jit(hover_run, static_argnums=1)(obs, 600)
    start = obs.init(P, HOVER, jnp.asarray(DT))["ekf"].nav.attitude
    assert np.degrees(float(qj.quaternion.quat_angle_between(start, HOVER.attitude))) == pytest.approx(30.0)
    err = _error_deg(run)
    assert err[-100:].max() < 1.0, err[::50]
    assert int(run.status) == 0


def test_gradients_through_sensors_and_filter_are_finite_and_match_finite_differences():
    sensors = suite(fix_velocity=True)
    key = jax.random.PRNGKey(5)

    def loss(log_fix_noise, log_accel_noise):
        fp = E.EKFParams.from_sensors(sensors, P.gravity)
        fp = fp.replace(fix_position_noise=fp.fix_position_noise * jnp.exp(log_fix_noise),
                        accel_noise=fp.accel_noise * jnp.exp(log_accel_noise))
        run = hover_run(E.EKFObserver.create(sensors, key, SIGMA0, filter=fp), 40)
        est = run.estimates["state"]
        return jnp.mean(jnp.sum((est.position - HOVER.position) ** 2, -1)) * 1e4

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))  # one program for the gradient and the differences
    _, g = f(0.0, 0.0)
    assert all(np.isfinite(float(x)) and float(x) != 0.0 for x in g)
    eps = 1e-4
    for i, gi in enumerate(g):
        hi = f(*[eps if j == i else 0.0 for j in range(2)])[0]
        lo = f(*[-eps if j == i else 0.0 for j in range(2)])[0]
        assert float(gi) == pytest.approx(float(hi - lo) / (2 * eps), rel=1e-4)


def test_a_sensor_the_filter_fuses_needs_a_noise_above_zero():
    imu = S.Imu.create(accel=S.ImuAxes.create(noise_density=2e-3), gyro=S.ImuAxes.create(noise_density=1e-4))
    gps = S.Sensors.create(DT, imu, fix=S.PositionFix.create(position_noise=0.5), fix_velocity=True)  # velocity σ 0
    with pytest.raises(ValueError, match="fix_velocity_noise"):
        E.EKFObserver.create(gps, jax.random.PRNGKey(0), SIGMA0)
    with pytest.raises(ValueError, match="accel_noise"):  # a perfect IMU leaves the filter no process noise
        E.EKFObserver.create(S.Sensors.create(DT, S.Imu.create()), jax.random.PRNGKey(0), SIGMA0)
    with pytest.raises(ValueError, match="sigma0"):
        E.EKFObserver.create(suite(), jax.random.PRNGKey(0), SIGMA0.at[3].set(0.0))


def test_a_diverging_filter_stops_its_vehicle_only():
    sensors = suite()
    good = E.EKFParams.from_sensors(sensors, P.gravity)
    # vehicle 1 believes its mocap 10⁴ times better than it is (NEES blows up); vehicle 2's
    # magnetometer noise is NaN (a per-vehicle value the boundary cannot see): P goes non-finite
    fps = jax.tree_util.tree_map(lambda x: jnp.stack([x] * 4), good)
    fps = fps.replace(fix_position_noise=fps.fix_position_noise.at[1].multiply(1e-4),
                      mag_noise=fps.mag_noise.at[2].set(jnp.nan))
    keys = jax.random.split(jax.random.PRNGKey(6), 4)
    f = jax.jit(jax.vmap(lambda key, fp: hover_run(E.EKFObserver.create(sensors, key, SIGMA0, filter=fp), 40)))
    run = f(keys, fps)
    assert np.asarray(run.status).tolist() == [0, status.ESTIMATOR, status.ESTIMATOR, 0]
    assert status.status_id(status.ESTIMATOR) == "estimator"
    assert int(run.status_tick[1]) == 0 and int(run.status_tick[2]) == 0  # the first fix / mag update
    clean = f(keys, jax.tree_util.tree_map(lambda x: jnp.stack([x] * 4), good))  # the same batch, all healthy
    assert np.asarray(clean.status).tolist() == [0, 0, 0, 0]
    for a, b in zip(jax.tree_util.tree_leaves(run.observer), jax.tree_util.tree_leaves(clean.observer)):
        np.testing.assert_array_equal(np.asarray(a)[[0, 3]], np.asarray(b)[[0, 3]])
    assert np.all(np.isfinite(np.asarray(run.final.position)))


def test_closed_loop_flies_on_the_estimates():
    """A geometric controller that reads only the EKF (GPS with velocity, 20 ms late) takes the
    vehicle from 0.3 m off to its hover point; the controller never sees the truth."""
    sensors = suite(fix_velocity=True, latency=0.02)
    ref = C.Hover(position=jnp.array([0.0, 0.0, 1.0]), yaw=jnp.zeros(()))
    ctrl = C.GeometricController.create(P, ref)
    s0 = HOVER.replace(position=jnp.array([0.3, -0.2, 0.9]))
    obs = E.EKFObserver.create(sensors, jax.random.PRNGKey(8), SIGMA0)

    @jax.jit
    def fly(obs):
        return qj.simulate(P, s0, DT, controller=C.geometric_control, ctrl_params=ctrl,
                           ctrl_state=C.geometric_init(ctrl, s0), num_ticks=800, observe=obs,
                           config=qj.SimConfig(save=("state", "estimate")))

    run = fly(obs)
    assert int(run.status) == 0
    final = np.asarray(run.states.position[-100:])
    assert np.max(np.linalg.norm(final - [0.0, 0.0, 1.0], axis=-1)) < 0.05
    est_err = np.asarray(run.estimates["state"].position - run.states.position)
    assert 0 < np.sqrt(np.mean(est_err[-400:] ** 2)) < 0.03  # it flew on estimates, not on truth
    summary = E.summary(run.observer)
    assert float(summary["nees"]) < 3 * 15  # a late fix costs some consistency, not much


def test_sweep_flies_on_the_estimator_and_reports_its_error():
    from quadjax.sweep import config as K
    from quadjax.sweep.runner import run_sweep

    with pytest.raises(ValueError, match="estimator.*mag_rate = 50 Hz"):
        K.from_dict({"estimator": {"enabled": True, "mag_rate": 50.0}})  # 20 ms is not a whole number of 8 ms ticks
    with pytest.raises(ValueError, match="either noisy truth or the estimator"):
        K.from_dict({"estimator": {"enabled": True}, "sensor_noise": {"enabled": True}})
    with pytest.raises(ValueError, match="estimator.accel_noise"):
        K.from_dict({"estimator": {"enabled": True, "accel_noise": -1.0}})
    cfg = K.from_dict({"vehicles": 8, "chunk_size": 8, "block_size": 8, "keep_trajectories": 0,
                       "mission": {"duration": 1.6}, "estimator": {"enabled": True, "fix": "gps", "fix_rate": 25.0,
                                                                    "fix_latency": 0.04, "fix_position_noise": 0.05}})
    r = run_sweep(cfg, None, plots=False)
    est = r.summary["estimation"]
    assert r.summary["crashed"] == 0
    assert 0 < est["rms_position_m"]["p50"] < 0.2 and 0 < est["rms_attitude_deg"]["p50"] < 5.0
    assert np.isfinite(est["nees"]["mean"])
    assert np.all(np.asarray(r.vehicles["est_rms_position"]) > 0)
