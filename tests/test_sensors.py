"""Sensor models (quadjax.sensors): the physics of what they read, their noise statistics, the
sample clock, latency and dropout, and the errors at the boundary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import sensors as S

P = qj.presets.get("crazyflie21")
G = float(P.gravity)


def _ideal(dt=0.01, **kw):
    return S.Sensors.create(dt, S.Imu.create(**kw))


def _free(params, state):
    """A vehicle with no thrust, drag or rotational drag: it falls freely."""
    zero3 = jnp.zeros(3)
    p = params.replace(drag_linear=zero3, drag_quadratic=zero3, drag_rotational=zero3, inertia=jnp.diag(jnp.diag(params.inertia)))
    return p, state.replace(rotor_speeds=jnp.zeros(4))


def test_accelerometer_reads_g_up_at_hover_and_zero_in_free_fall():
    s = qj.hover_state(P, position=(0.0, 0.0, 1.0))
    u = qj.hover_rotor_speed(P)
    np.testing.assert_allclose(S.specific_force(P, s, u, jnp.zeros(3)), [0.0, 0.0, G], atol=1e-9)
    # tilted 30° about x and still accelerating as the model says: f = Rᵀ(a − g)
    q = qj.frames.euler321_to_quat(jnp.array([0.5, 0.0, 0.0]))
    tilted = s.replace(attitude=q)
    a = qj.derivative(P, tilted, u).velocity
    expect = qj.quaternion.quat_rotate_inverse(q, a + jnp.array([0.0, 0.0, G]))
    np.testing.assert_allclose(S.specific_force(P, tilted, u, jnp.zeros(3)), expect, atol=1e-9)
    pf, sf = _free(P, tilted.replace(velocity=jnp.zeros(3)))
    np.testing.assert_allclose(S.specific_force(pf, sf, jnp.zeros(4), jnp.zeros(3)), 0.0, atol=1e-12)


def test_accelerometer_on_a_spinning_vehicle_shows_the_lever_arm_centripetal_term():
    w, r = 7.0, 0.03
    pf, sf = _free(P, qj.hover_state(P).replace(body_rates=jnp.array([0.0, 0.0, w])))
    f = S.specific_force(pf, sf, jnp.zeros(4), jnp.array([r, 0.0, 0.0]))
    # about a principal axis with no torque α = 0: the reading is ω × (ω × r) = (−ω² r, 0, 0)
    np.testing.assert_allclose(f, [-w * w * r, 0.0, 0.0], atol=1e-12)
    # and at rest on the ground the contact holds it: (0, 0, g) even with the rotors off
    ground = qj.hover_state(P).replace(rotor_speeds=jnp.zeros(4), on_ground=jnp.ones(()))
    np.testing.assert_allclose(S.specific_force(P, ground, jnp.zeros(4), jnp.zeros(3)), [0, 0, G], atol=1e-12)


def test_noise_free_gyro_and_accel_equal_the_truth_and_errors_enter_as_configured():
    s = qj.hover_state(P).replace(body_rates=jnp.array([0.3, -0.2, 0.5]))
    u = qj.hover_rotor_speed(P)
    suite = _ideal()
    st = S.sensors_init(suite, jax.random.PRNGKey(0), s)
    r, _ = S.sense(suite, st, P, s, u, 0, jax.random.PRNGKey(1))
    np.testing.assert_allclose(r.gyro, s.body_rates, atol=1e-15)
    np.testing.assert_allclose(r.accel, S.specific_force(P, s, u, jnp.zeros(3)), atol=1e-12)
    # scale, misalignment, bias, quantisation and saturation, each as documented
    mis = np.array([[0, 0.01, 0], [0, 0, -0.02], [0.005, 0, 0]])
    axes = S.ImuAxes.create(bias=[0.01, 0, 0], scale=[0.1, 0, 0], misalignment=mis, resolution=0.004, range=0.45)
    y, _, _ = S.imu_axes_sample(axes, s.body_rates, jnp.zeros(3), jnp.zeros(3), 0.01, jax.random.PRNGKey(2))
    x = np.asarray(s.body_rates)
    raw = x + np.array([0.1, 0, 0]) * x + mis @ x + np.array([0.01, 0, 0])
    np.testing.assert_allclose(y, np.clip(np.round(raw / 0.004) * 0.004, -0.45, 0.45), atol=1e-12)
    assert abs(float(y[2])) == pytest.approx(0.45)


def test_imu_means_reproduce_the_truths_attitude_and_velocity_steps():
    """On a manoeuvring vehicle the noise-free IMU sample at tick k is the mean over the last
    tick: q(k−1) ⊗ Exp(ω̄ h) = q(k) and v(k−1) + (R(k−1) f̄ + g) h = v(k), to rounding."""
    dt, T = 0.005, 60
    s0 = qj.hover_state(P, position=(0.0, 0.0, 1.0)).replace(body_rates=jnp.array([2.0, -1.0, 0.5]))
    w = qj.hover_rotor_speed(P)
    u = w * (1 + 0.2 * jnp.sin(jnp.arange(T)[:, None] * 0.3 + jnp.arange(4)[None, :]))
    states = qj.simulate(P, s0, dt, commands=u).states
    xs = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b[:-1]]), s0, states)  # the state at each tick
    suite = _ideal(dt)

    def step(st, x):
        s, k, cmd = x
        r, st = S.sense(suite, st, P, s, cmd, k, jax.random.PRNGKey(0))
        return st, (r.gyro, r.accel)

    cmds = jnp.concatenate([jnp.zeros((1, 4)), u[:-1]])
    gyro, accel = jax.lax.scan(step, S.sensors_init(suite, jax.random.PRNGKey(1), s0), (xs, jnp.arange(T), cmds))[1]
    q, v = np.asarray(xs.attitude), np.asarray(xs.velocity)
    for k in range(1, T):
        stepped = qj.quaternion.quat_multiply(q[k - 1], qj.quaternion.quat_from_rotation_vector(gyro[k] * dt))
        np.testing.assert_allclose(stepped, q[k], atol=1e-12)
        dv = qj.quaternion.quat_rotate(q[k - 1], accel[k]) - np.array([0, 0, G])
        np.testing.assert_allclose(v[k - 1] + dv * dt, v[k], atol=1e-12)
    assert np.ptp(np.asarray(gyro)[1:], axis=0).min() > 0.05  # it did manoeuvre


def _allan(x, dt, taus):
    """Overlapping Allan deviation of a rate record x (n,) sampled at dt (IEEE Std 952)."""
    theta = np.concatenate([[0.0], np.cumsum(x) * dt])
    out = []
    for tau in taus:
        m = int(round(tau / dt))
        d = theta[2 * m:] - 2 * theta[m:-m] + theta[:-2 * m]
        out.append(np.sqrt(np.mean(d * d) / (2 * (m * dt) ** 2)))
    return np.array(out)


def test_allan_deviation_recovers_noise_density_and_bias_instability():
    """16 records of 1 000 s at 100 Hz; the empirical Allan variance is fitted (weighted linear
    least squares) by the textbook terms N²/τ + σ_gm² f(τ/T_c) + K²τ/3, independent of the
    sampler; N and B = σ_gm · peak / 0.664 come back within 10 %."""
    N, B, Tc, K, dt, n = 2e-3, 1e-3, 2.0, 2e-5, 0.01, 100_000
    axes = S.ImuAxes.create(noise_density=N, bias_instability=B, correlation_time=Tc, random_walk=K)

    def record(key):
        k0, k1 = jax.random.split(key)
        gm0 = S.gm_sigma(axes.bias_instability) * jax.random.normal(k0, (3,))

        def step(c, k):
            y, gm, rw = S.imu_axes_sample(axes, jnp.zeros(3), c[0], c[1], dt, jax.random.fold_in(k1, k))
            return (gm, rw), y[0]

        return jax.lax.scan(step, (gm0, jnp.zeros(3)), jnp.arange(n))[1]

    xs = np.asarray(jax.jit(jax.vmap(record))(jax.random.split(jax.random.PRNGKey(7), 16)))
    taus = np.geomspace(0.02, 60.0, 30)
    avar = np.mean([_allan(x, dt, taus) ** 2 for x in xs], axis=0)
    basis = np.stack([1 / taus, S._gm_allan_variance(taus / Tc), taus / 3], axis=1)
    w = 1 / avar  # relative errors
    coef, *_ = np.linalg.lstsq(basis * w[:, None], avar * w, rcond=None)
    n_fit, b_fit = np.sqrt(coef[0]), np.sqrt(coef[1]) * S.GM_ADEV_PEAK / S.FLICKER_FLAT
    assert n_fit == pytest.approx(N, rel=0.10)
    assert b_fit == pytest.approx(B, rel=0.10)
    # and the white part alone reads N/√τ at short τ, as the −½ slope of the plot
    assert np.sqrt(avar[0] * taus[0]) == pytest.approx(N, rel=0.10)


def test_barometer_magnetometer_and_a_late_lossy_fix():
    dt, D = 0.01, 3
    suite = S.Sensors.create(dt, S.Imu.create(), mag=S.Magnetometer.create(), mag_rate=50,
                             baro=S.Barometer.create(drift=0.0, offset=0.25, resolution=0.01), baro_rate=25,
                             fix=S.PositionFix.create(dropout=0.3), fix_rate=100, fix_latency=D * dt)
    assert (suite.mag_every, suite.baro_every, suite.fix_delay) == (2, 4, D)
    q = qj.quaternion.quat_from_axis_angle(jnp.array([0.0, 0.0, 1.0]), 0.7)

    def run(key):
        st = S.sensors_init(suite, key, qj.hover_state(P))

        def step(st, k):
            s = qj.hover_state(P).replace(position=jnp.array([0.1, 0.2, 0.3]) * k, attitude=q)
            r, st = S.sense(suite, st, P, s, qj.hover_rotor_speed(P), k, jax.random.fold_in(key, k))
            return st, (r.mag, r.mag_fresh, r.baro, r.fix_position, r.fix_fresh)

        return jax.lax.scan(step, st, jnp.arange(400))[1]

    mag, mag_fresh, baro, fix, fresh = (np.asarray(x) for x in jax.jit(run)(jax.random.PRNGKey(3)))
    np.testing.assert_allclose(mag[0], qj.quaternion.quat_rotate_inverse(q, suite.mag.field), atol=1e-18)
    assert mag_fresh[::2].all() and not mag_fresh[1::2].any()
    np.testing.assert_allclose(baro, np.round((0.3 * np.arange(400) + 0.25) / 0.01) * 0.01, atol=1e-9)
    k = np.nonzero(fresh)[0]
    assert k.min() >= D  # nothing arrives before the first fix has flown its latency
    np.testing.assert_allclose(fix[k], 0.1 * (k[:, None] - D) * np.array([1.0, 2.0, 3.0]), atol=1e-12)
    assert abs(len(k) / (400 - D) - 0.7) < 0.07  # 30 % dropout


@pytest.mark.parametrize("bad, match", [
    (lambda: S.ImuAxes.create(noise_density=-1.0), "noise_density"),
    (lambda: S.ImuAxes.create(random_walk=float("nan")), "random_walk"),
    (lambda: S.ImuAxes.create(correlation_time=0.0), "correlation_time"),
    (lambda: S.ImuAxes.create(misalignment=np.eye(3)), "diagonal"),
    (lambda: S.Barometer.create(noise=float("inf")), "noise"),
    (lambda: S.PositionFix.create(dropout=1.0), "dropout"),
    (lambda: S.Sensors.create(0.004, S.Imu.create(), mag=S.Magnetometer.create(), mag_rate=75), "mag_rate"),
    (lambda: S.Sensors.create(0.01, S.Imu.create(), imu_rate=200), "faster than the tick"),
    (lambda: S.Sensors.create(0.01, S.Imu.create(), fix=S.PositionFix.create(), fix_latency=0.015), "fix_latency"),
])
def test_bad_sensor_input_gets_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
