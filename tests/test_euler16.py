"""Seed 003's 16-state Euler-angle model (quadjax.euler16): the seed's motor model and
dynamics, its agreement with the full quaternion model, and its flight through the engine."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import euler16 as e16
from quadjax import frames, presets, status
from quadjax.control.trajectories import Step


@functools.cache
def cmu(corrections=()):
    return e16.from_quad_params(presets.cmu_plus(jnp.float64), corrections=corrections)


def full_derivative16(qp, x, wrench, p):
    """The full quaternion model's derivative, written in the 16 coordinates: the true
    Z-Y-X Euler rates, ω̇ with ω × Jω, rotor speeds in RPM/s."""
    d = qj.derivative(qp, e16.to_quad_state(x), e16.quad_command(p, wrench))
    return jnp.concatenate([d.position, d.velocity, frames.euler_rates(x[6:9], x[9:12]), d.body_rates,
                            frames.rad_s_to_rpm(d.rotor_speeds)])


# --------------------------------------------------------------------------- the motor model


def test_allocation_is_the_seed_table_and_its_solve_inverts_it():
    p = cmu()
    ct, cq, d = float(p.c_t), float(p.c_q), float(p.arm)
    seed_table = np.array([[ct, ct, ct, ct], [0, d * ct, 0, -d * ct], [-d * ct, 0, d * ct, 0], [-cq, cq, -cq, cq]])
    np.testing.assert_array_equal(np.asarray(e16.allocation(p)), seed_table)
    # the "+" layout's closed-form inverse, derived by hand from the table
    rng = np.random.default_rng(0)
    for _ in range(20):
        F = rng.uniform(5.0, 9.0)
        M = rng.uniform(-1, 1, 3) * np.array([0.05, 0.05, 0.004])
        w = np.array([F, *M])
        by_hand = np.array([F / (4 * ct) - M[1] / (2 * d * ct) - M[2] / (4 * cq),
                            F / (4 * ct) + M[0] / (2 * d * ct) + M[2] / (4 * cq),
                            F / (4 * ct) + M[1] / (2 * d * ct) - M[2] / (4 * cq),
                            F / (4 * ct) - M[0] / (2 * d * ct) + M[2] / (4 * cq)])
        rpm = np.asarray(e16.desired_rpm(p, jnp.asarray(w)))
        assert np.all((rpm > float(p.rpm_min)) & (rpm < float(p.rpm_max)))  # no clip: the pure solve
        np.testing.assert_allclose(rpm**2, by_hand, rtol=1e-12)
        np.testing.assert_allclose(seed_table @ rpm**2, w, rtol=1e-12, atol=1e-15)  # A A⁻¹ = 1


def test_clamp_then_sqrt_then_clip_as_the_seed_steps_3_and_4():
    p = cmu()
    ct, d = float(p.c_t), float(p.arm)
    lo, hi = float(p.rpm_min), float(p.rpm_max)
    hover = 0.77 * 9.80665
    # a pitch moment larger than motor 1 can give: its rpm² is negative → clamped to 0 → clipped to rpm_min
    F, My = 0.5 * hover, 0.3 * hover * d
    rpm_sq = np.asarray(jnp.linalg.solve(e16.allocation(p), jnp.asarray([F, 0.0, My, 0.0])))
    assert rpm_sq[0] < 0 < rpm_sq[2] < hi**2
    rpm = np.asarray(e16.desired_rpm(p, jnp.asarray([F, 0.0, My, 0.0])))
    assert rpm[0] == lo and rpm[2] == pytest.approx(np.sqrt(rpm_sq[2]), rel=1e-12)
    # with rpm_min = 0 the clamp alone acts: exactly 0, not NaN, and a finite gradient
    p0 = p.replace(rpm_min=jnp.asarray(0.0))
    assert float(e16.desired_rpm(p0, jnp.asarray([F, 0.0, My, 0.0]))[0]) == 0.0
    g = jax.grad(lambda m: e16.desired_rpm(p0, jnp.stack([F, 0.0, m, 0.0])).sum())(My)
    assert np.isfinite(float(g))
    # a positive rpm² below rpm_min² (0 < √ < rpm_min) is raised to rpm_min after the root
    F_low = 4 * ct * (0.5 * lo) ** 2
    np.testing.assert_array_equal(np.asarray(e16.desired_rpm(p, jnp.asarray([F_low, 0, 0, 0.0]))), lo)
    # and a thrust beyond 4 cT rpm_max² saturates every motor at rpm_max
    np.testing.assert_array_equal(np.asarray(e16.desired_rpm(p, jnp.asarray([4 * ct * (1.5 * hi) ** 2, 0, 0, 0.0]))), hi)


def test_motor_lag_and_actual_wrench():
    p = cmu()
    rpm = jnp.asarray([9000.0, 11000.0, 13000.0, 15000.0])
    w = jnp.asarray([6.0, 0.01, -0.02, 0.001])
    F, M, rpm_dot = e16.motor_model(p, rpm, w)
    np.testing.assert_allclose(rpm_dot, 36.5 * (e16.desired_rpm(p, w) - rpm), rtol=1e-14)
    actual = np.asarray(e16.allocation(p)) @ np.asarray(rpm) ** 2  # the wrench of the speeds reached
    np.testing.assert_allclose([float(F), *np.asarray(M)], actual, rtol=1e-14)


# --------------------------------------------------------------------------- the dynamics


@pytest.mark.parametrize("yaw", [0.0, 1.2])
def test_hover_is_an_equilibrium(yaw):
    p = cmu()
    x = e16.hover_state(p, position=(1.0, -2.0, 3.0), yaw=yaw)
    f = np.asarray(e16.derivative(p, x, e16.hover_wrench(p)))
    scale = np.r_[np.ones(12), np.full(4, float(p.k_motor * e16.hover_rpm(p)))]  # RPM/s for the motors
    assert np.max(np.abs(f) / scale) < 1e-13


def _small_case(rng, eps):
    p = cmu()
    x = e16.hover_state(p, yaw=0.4)
    direction = np.r_[np.zeros(3), rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3), np.zeros(4)]
    x = x + eps * jnp.asarray(direction)
    wrench = e16.hover_wrench(p) * (1 + eps * rng.uniform(-1, 1)) + eps * jnp.asarray(
        np.r_[0.0, rng.uniform(-1, 1, 3) * [0.05, 0.05, 0.005]])
    return p, x, wrench


def test_small_angles_and_rates_agree_with_the_full_model_to_first_order():
    """The seed's simplifications are second order: the derivative error is ≤ C ε² for angles
    and rates of size ε (and the command ε away from hover). Measured over 50 random directions:
    C = max error / ε² = 0.92 (median 0.46) at ε = 1e-2 and at 1e-3, in SI units of the
    first 12 rates (bound asserted: 2)."""
    qp = presets.cmu_plus(jnp.float64)
    rng = np.random.default_rng(3)
    ratios = {1e-2: [], 1e-3: []}
    gap = jax.jit(lambda p, x, w: jnp.max(jnp.abs(e16.derivative(p, x, w) - full_derivative16(qp, x, w, p))[:12]))
    for _ in range(50):
        state = rng.bit_generator.state
        for eps in ratios:
            rng.bit_generator.state = state  # the same direction at both sizes
            p, x, wrench = _small_case(rng, eps)
            err = float(gap(p, x, wrench))
            ratios[eps].append(err / eps**2)
    for eps, r in ratios.items():
        assert max(r) < 2.0, (eps, max(r))
    # second order, not first: the ratio err/ε² stays put from ε = 1e-2 to 1e-3
    assert np.median(ratios[1e-3]) == pytest.approx(np.median(ratios[1e-2]), rel=0.1)
    assert max(ratios[1e-3]) > 0.05  # the simplifications are not exact (this test can fail)


def _flight(p, x0, wrenches, dt=0.002):
    return qj.simulate(p, x0, dt, commands=wrenches, config=qj.SimConfig(save_every=0)).final


def test_with_both_corrections_it_is_the_full_model():
    """Undo "Euler rates = body rates" and restore ω × Jω and the 16-state model flies the full
    quaternion model's trajectory through an aggressive manoeuvre (a roll through ±π, pitch to
    ~1.3 rad, rates of ~6 rad/s): the gap is RK4's error in the other coordinates, ≈1e-8 at
    dt = 2 ms and 16× less at 1 ms (fourth order). The seed's model, same commands, is
    decimetres and radians off."""
    qp = presets.cmu_plus(jnp.float64)
    duration = 0.8
    hover = 0.77 * 9.80665
    x0 = e16.hover_state(cmu(), position=(0.0, 0.0, 10.0), yaw=0.3)
    gaps = {}
    for dt in (0.002, 0.001):
        t = np.arange(round(duration / dt)) * dt
        wrenches = jnp.asarray(np.stack([hover * (1 + 0.2 * np.sin(5 * t)), 0.08 * np.sin(7 * t),
                                         0.06 * np.sin(6 * t), 0.012 * np.ones_like(t)], axis=1))
        commands = jax.vmap(lambda w: e16.quad_command(cmu(), w))(wrenches)
        states = qj.simulate(qp, e16.to_quad_state(x0), dt, commands=commands, config=qj.SimConfig(backend="xla")).states
        full16 = np.asarray(e16.from_quad_state(jax.tree_util.tree_map(lambda v: v[-1], states)))

        def gap(x):  # state difference, angles wrapped, motors in units of 10⁴ RPM
            d = np.asarray(x) - full16
            d[6:9] = np.angle(np.exp(1j * d[6:9]))
            return np.max(np.abs(d / np.r_[np.ones(12), np.full(4, 1e4)]))

        gaps[dt] = gap(_flight(cmu(("euler_rates", "gyroscopic")), x0, wrenches, dt))
        seed_gap = gap(_flight(cmu(), x0, wrenches, dt))
    euler = np.abs(np.asarray(frames.quat_to_euler321(states.attitude)))
    assert euler[:, 0].max() > 3.0 and euler[:, 1].max() > 1.0  # it is aggressive
    assert np.max(np.abs(states.body_rates)) > 5.0
    assert gaps[0.002] < 3e-8 and 10 < gaps[0.002] / gaps[0.001] < 24, gaps
    assert seed_gap > 0.1


def test_conversions_round_trip_and_the_cmu_numbers():
    p = cmu()
    # cmu_plus states the course's yaml in SI; back in its units: cT 8.07e-9 N/RPM², 3000–20000 RPM, k_m 36.5
    assert float(p.c_t) == pytest.approx(8.07e-9, rel=1e-12)
    assert (float(p.rpm_min), float(p.rpm_max), float(p.k_motor)) == pytest.approx((3000, 20000, 36.5), rel=1e-12)
    rng = np.random.default_rng(1)
    x = jnp.asarray(np.c_[rng.normal(size=(20, 6)), rng.uniform(-3, 3, (20, 1)), rng.uniform(-1.5, 1.5, (20, 1)),
                          rng.uniform(-3, 3, (20, 1)), rng.normal(size=(20, 3)), rng.uniform(3000, 20000, (20, 4))])
    np.testing.assert_allclose(e16.from_quad_state(e16.to_quad_state(x)), x, rtol=1e-11, atol=1e-11)
    with pytest.raises(ValueError, match="'\\+' layout"):
        e16.from_quad_params(presets.rp1(jnp.float64))  # an X layout
    with pytest.raises(ValueError, match="drag"):
        e16.from_quad_params(presets.cmu_plus(jnp.float64).replace(drag_linear=jnp.ones(3)))
    with pytest.raises(ValueError, match="Euler16Params.c_q"):
        e16.Euler16Params.create(mass=1, inertia=(1, 1, 1), c_t=1e-8, c_q=-1, arm=0.1, k_motor=30,
                                 rpm_min=0, rpm_max=1e4)
    with pytest.raises(ValueError, match="corrections"):
        e16.from_quad_params(presets.cmu_plus(jnp.float64), corrections=("coriolis",))


# --------------------------------------------------------------------------- through the engine


def test_vmap_equals_loop_and_grad_equals_finite_differences():
    p = cmu()
    T = 100
    rng = np.random.default_rng(2)
    x0s = jnp.stack([e16.hover_state(p, yaw=y) for y in (0.0, 0.5, -1.0)])
    w = e16.hover_wrench(p) + jnp.asarray(rng.normal(size=(T, 4)) * [0.5, 0.01, 0.01, 0.001])
    run = jax.jit(lambda x0: _flight(p, x0, w))
    batched = jax.jit(jax.vmap(lambda x0: _flight(p, x0, w)))(x0s)
    # batched linear solves round differently from single ones: equal to a few ulp
    np.testing.assert_allclose(np.asarray(batched), np.stack([np.asarray(run(x)) for x in x0s]), rtol=1e-13, atol=1e-16)

    def loss(theta):  # mass, c_t and a gain on the roll moment, through the whole flight
        q = p.replace(mass=theta[0], c_t=theta[1] * 1e-9)
        final = _flight(q, x0s[1], w.at[:, 1].multiply(theta[2]))
        return jnp.sum(final[:3] ** 2) + jnp.sum(final[6:9] ** 2)

    theta = jnp.asarray([0.77, 8.07, 1.3])
    g = np.asarray(jax.jit(jax.grad(loss))(theta))
    f = jax.jit(loss)
    for i, h in enumerate((1e-6, 1e-6, 1e-6)):
        e = np.zeros(3)
        e[i] = h
        fd = (float(f(theta + e)) - float(f(theta - e))) / (2 * h)
        assert g[i] == pytest.approx(fd, rel=1e-6, abs=1e-9), i


def test_the_pd_controller_flies_both_models_through_the_engine():
    """A controller written for the 16-state flies it, and (through the conversions) the full
    quaternion model; a 1 m step in x, y and z with a yaw change settles in both."""
    p, qp = cmu(), presets.cmu_plus(jnp.float64)
    ref = Step(start=jnp.zeros(3), end=jnp.asarray([1.0, -0.5, 1.0]), t_step=jnp.asarray(0.2), yaw=jnp.asarray(0.5))
    ctrl = e16.PDController(model=p, gains=e16.PDGains.default(), reference=ref)
    x0 = e16.hover_state(p)

    def on_full(c, cs, obs, t):
        wrench, cs = e16.pd_control(c, cs, e16.from_quad_state(obs), t)
        return e16.quad_command(c.model, wrench), cs

    config = qj.SimConfig(save_every=0)
    seed = jax.jit(lambda x: qj.simulate(p, x, 0.002, controller=e16.pd_control, ctrl_params=ctrl, num_ticks=2000,
                                         config=config))(x0)
    full = jax.jit(lambda s: qj.simulate(qp, s, 0.002, controller=on_full, ctrl_params=ctrl, num_ticks=2000,
                                         config=config))(e16.to_quad_state(x0))
    assert int(seed.status) == 0 and int(full.status) == 0
    np.testing.assert_allclose(seed.final[:3], [1.0, -0.5, 1.0], atol=2e-3)
    np.testing.assert_allclose(seed.final[8], 0.5, atol=2e-3)
    np.testing.assert_allclose(full.final.position, [1.0, -0.5, 1.0], atol=2e-3)


def test_engine_boundary_errors_and_status_codes():
    p = cmu()
    x0 = e16.hover_state(p)
    w = jnp.tile(e16.hover_wrench(p), (10, 1))
    with pytest.raises(ValueError, match="is \\(16,\\) for one vehicle"):
        qj.simulate(p, x0[:12], 0.01, commands=w)
    with pytest.raises(ValueError, match="expected \\(T, 4\\) commands"):
        qj.simulate(p, x0, 0.01, commands=w[:, :3])
    with pytest.raises(ValueError, match="no wind"):
        qj.simulate(p, x0, 0.01, commands=w, inputs=qj.Inputs(wind=jnp.zeros((10, 3))))
    with pytest.raises(ValueError, match="backend='native'"):
        qj.simulate(p, x0, 0.01, commands=w, config=qj.SimConfig(backend="native"))
    with pytest.raises(ValueError, match="semi_implicit_euler"):
        qj.simulate(p, x0, 0.01, commands=w, config=qj.SimConfig(integrator="semi_implicit_euler"))
    with pytest.raises(ValueError, match="Euler16Params.mass"):
        qj.simulate(p.replace(mass=jnp.asarray(-1.0)), x0, 0.01, commands=w)
    with pytest.raises(ValueError, match="motor lag k_motor"):
        qj.simulate(p, x0, 0.1, commands=w)
    with pytest.raises(ValueError, match="QuadParams or the params of a quadjax.Vehicle"):
        qj.simulate({"mass": 1.0}, x0, 0.01, commands=w)
    # traced bad params: that vehicle gets params_invalid and stays at state0, the others fly
    masses = jnp.asarray([0.77, -1.0, 0.8])
    out = jax.jit(jax.vmap(lambda m: qj.simulate(p.replace(mass=m), x0, 0.01, commands=w, hooks=(qj.Hook(),),
                                                 config=qj.SimConfig(save_every=0))))(masses)
    assert out.status.tolist() == [0, status.PARAMS_INVALID, 0]
    np.testing.assert_array_equal(out.final[1], x0)
    assert float(out.final[2, 2]) < -1e-4  # heavier than the trim: it sinks
    # the monitor judges this vehicle too (I4): a NaN planted by edit= at tick 4 stops it there
    planted = qj.simulate(p, x0, 0.01, commands=w, edit=lambda x, k: jnp.where(k == 4, x.at[3].set(jnp.nan), x),
                          config=qj.SimConfig(check="monitor"))
    assert (int(planted.status), int(planted.status_tick)) == (status.STATUS_IDS.index("non_finite"), 4)
    clean = qj.simulate(p, x0, 0.01, commands=w, config=qj.SimConfig(check="monitor"))
    assert int(clean.status) == 0
    # float32 stays float32
    f32 = qj.simulate(p.astype(jnp.float32), x0.astype(jnp.float32), 0.01, commands=w.astype(jnp.float32))
    assert f32.final.dtype == jnp.float32 and f32.states.dtype == jnp.float32
