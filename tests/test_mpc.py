"""MPC (#8): costs, iLQR against the discrete Riccati solution, each solver flying hover,
jit and vmap over vehicles, dtype and non-finite safety.

Compiles dominate the runtime here: each solver's ``control`` is jitted once (cached
below) and reused by every test that needs it.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import control as C
from quadjax import mpc as M
from quadjax.presets import quad_x_positions
from quadjax.quaternion import quat_from_axis_angle, quat_from_matrix

F64 = jnp.float64
TICK = 0.02  # 50 Hz controller
SUBSTEPS = 10  # plant steps of 2 ms per tick
TARGET = (0.0, 0.0, 2.0)


def a(x, dtype=F64):
    return jnp.asarray(x, dtype)


def vehicle(dtype=F64):
    """The uzh-rpg data-driven-MPC quadrotor (m 1 kg, J diag(.03, .03, .06), arm 0.235 m X,
    20 N per rotor, k_m 0.013 m); ω_max = 2000 rad/s is our choice (k_f = 20 N / ω_max²)."""
    return qj.QuadParams.create(
        mass=1.0, inertia=(0.03, 0.03, 0.06), rotor_positions=quad_x_positions(0.235 / math.sqrt(2.0)),
        rotor_spins=(1.0, 1.0, -1.0, -1.0), k_f=20.0 / 2000.0**2, k_m=0.013, omega_max=2000.0, gravity=9.81,
        dtype=dtype,
    )


def hover_cost(dtype=F64):
    ref = C.Hover(position=a(TARGET, dtype), yaw=a(0.0, dtype))
    track = M.Tracking(ref, position=a([10.0] * 3, dtype), velocity=a([1.0] * 3, dtype), attitude=a(1.0, dtype),
                       body_rates=a([0.05] * 3, dtype))
    return M.Cost(stage=(track, M.Effort(a(0.1, dtype)), M.CommandRate(a(0.05, dtype))), terminal=(track,))


CONFIGS = {
    "mppi": (M.MPPI(horizon=10, dt=0.1, samples=128, control_dt=TICK),
             lambda d: M.MPPIParams(temperature=a(0.5, d), noise_std=a(0.02, d))),
    "shooting": (M.Shooting(horizon=10, dt=0.1, iterations=3, control_dt=TICK),
                 lambda d: M.ShootingParams.default(d)),
    "ilqr": (M.ILQR(horizon=10, dt=0.1, iterations=2, control_dt=TICK), lambda d: M.ILQRParams.default(d)),
}


def problem(name, dtype=F64):
    cfg, solver = CONFIGS[name]
    return cfg, M.MPCParams(model=vehicle(dtype), cost=hover_cost(dtype), solver=solver(dtype))


@functools.cache
def jitted_control(name):
    return jax.jit(CONFIGS[name][0].control)


@functools.cache
def jitted_hold():
    """Plant: one controller tick of SUBSTEPS RK4 steps with the command held."""
    config = qj.SimConfig(substeps=SUBSTEPS, save_every=0)
    return jax.jit(lambda p, s, u: qj.simulate(p, s, TICK, commands=u[None], config=config).final)


@pytest.fixture(scope="module", params=["mppi", "shooting", "ilqr"])
def name(request):
    """The solver of the parametrised tests. Module-scoped, so pytest runs each solver's tests one
    after another: its control (compiled once per process, above) is used by all of them while it
    is there, and under pytest-xdist they tend to land on the same worker (not one compile each)."""
    return request.param


def perturbed(p, dtype=F64, offset=(0.4, -0.3, -0.3), tilt=0.2, velocity=(0.3, 0.0, 0.0)):
    s = qj.hover_state(p, np.asarray(TARGET) + np.asarray(offset))
    return s.replace(attitude=quat_from_axis_angle(a([1.0, 0.0, 0.0], dtype), tilt), velocity=a(velocity, dtype))


def fly_loop(name, params, plant, s0, ticks, key=None):
    """Closed loop in Python: the jitted controller, then the jitted plant, tick by tick."""
    cfg = CONFIGS[name][0]
    control, hold = jitted_control(name), jitted_hold()
    cs = cfg.init(params, s0, key)
    s, states, infos, commands = s0, [], [], []
    for k in range(ticks):
        u, cs = control(params, cs, s, k * TICK)
        infos.append(cs)
        commands.append(u)
        s = hold(plant, s, u)
        states.append(s)
    stack = lambda xs: jax.tree_util.tree_map(lambda *v: jnp.stack(v), *xs)  # noqa: E731
    return stack(states), stack(infos), jnp.stack(commands)


# ---- costs ------------------------------------------------------------------------


def test_tracking_is_zero_on_the_reference_and_quadratic_off_it():
    p = vehicle()
    ref = C.Circle(center=a([0.0, 0.0, 1.0]), radius=a(5.0), omega=a(1.6), yaw=a(0.0))
    track = M.Tracking(ref, position=a([10.0, 20.0, 30.0]), velocity=a([1.0, 1.0, 1.0]), attitude=a(2.0),
                       body_rates=a([0.0, 0.0, 0.0]))
    t = 0.7
    r = ref(t)
    q = quat_from_matrix(M.flat_attitude(r, p.gravity))
    s = qj.hover_state(p).replace(position=r.position, velocity=r.velocity, attitude=q)
    assert float(track(p, s, None, t)) == pytest.approx(0.0, abs=1e-12)
    # 8 m/s on a 5 m circle: the flat attitude leans into the turn by atan(12.8 / 9.81)
    tilt = math.acos(float(M.flat_attitude(r, p.gravity)[2, 2]))
    assert tilt == pytest.approx(math.atan2(5.0 * 1.6**2, 9.81), rel=1e-9)
    off = s.replace(position=r.position + a([0.0, 0.1, 0.0]))
    assert float(track(p, off, None, t)) == pytest.approx(20.0 * 0.01, rel=1e-12)
    # 1 − cos θ for an attitude rotated by θ about the body z axis (heading error)
    yawed = s.replace(attitude=qj.quaternion.quat_multiply(q, quat_from_axis_angle(a([0.0, 0.0, 1.0]), 0.3)))
    assert float(track(p, yawed, None, t)) == pytest.approx(2.0 * (1.0 - math.cos(0.3)), rel=1e-9)


def test_effort_tilt_keepout_and_command_rate_values():
    p = vehicle()
    span = float(p.omega_max - p.omega_min)
    w_h = qj.hover_rotor_speed(p)
    s = qj.hover_state(p, TARGET)
    assert float(M.Effort(a(3.0))(p, s, w_h, 0.0)) == pytest.approx(0.0, abs=1e-12)
    assert float(M.Effort(a(3.0))(p, s, w_h + 0.1 * span, 0.0)) == pytest.approx(3.0 * 4 * 0.01, rel=1e-9)
    # along a circle, the feed-forward speed makes m‖a + g e3‖ with four equal rotors
    circle = C.Circle(center=a([0.0, 0.0, 1.0]), radius=a(5.0), omega=a(1.6), yaw=a(0.0))
    w_ff = math.sqrt(1.0 * math.hypot(5.0 * 1.6**2, 9.81) / 4 / float(p.k_f))
    assert float(M.Effort(a(1.0), circle)(p, s, jnp.full(4, w_ff), 0.3)) == pytest.approx(0.0, abs=1e-9)
    assert float(M.CommandRate(a(5.0))(p, s, s.rotor_speeds, 0.0)) == pytest.approx(0.0, abs=1e-12)
    assert float(M.CommandRate(a(5.0))(p, s, s.rotor_speeds + 0.2 * span, 0.0)) == pytest.approx(5.0 * 4 * 0.04)

    def tilted(deg):
        return s.replace(attitude=quat_from_axis_angle(a([0.6, 0.8, 0.0]), math.radians(deg)))

    tilt = M.Tilt(weight=a(7.0), limit=a(math.radians(20.0)))
    assert float(tilt(p, tilted(10.0), None, 0.0)) == 0.0
    expect = 7.0 * (math.cos(math.radians(20.0)) - math.cos(math.radians(30.0))) ** 2
    assert float(tilt(p, tilted(30.0), None, 0.0)) == pytest.approx(expect, rel=1e-9)

    keep = M.KeepOut(center=a([1.0, 2.0, 3.0]), radius=a(0.5), weight=a(4.0))
    at = lambda pos: s.replace(position=a(pos))  # noqa: E731
    assert float(keep(p, at([1.0, 2.0, 3.25]), None, 0.0)) == pytest.approx(4.0 * (0.5 - math.hypot(0.25, 1e-3)) ** 2)
    assert float(keep(p, at([1.0, 2.0, 3.6]), None, 0.0)) == 0.0
    g = jax.grad(lambda pos: keep(p, at(pos), None, 0.0))(a([1.0, 2.0, 3.0]))
    assert np.all(np.isfinite(np.asarray(g)))
    g = jax.grad(lambda pos: keep(p, at(pos), None, 0.0))(a([1.0, 2.0, 3.25]))
    assert float(g[2]) < 0.0  # pushes away from the centre: the cost falls as z grows


def test_command_terms_cannot_be_terminal_and_configs_are_checked():
    p = vehicle()
    s = qj.hover_state(p)
    bad = M.Cost(stage=(), terminal=(M.Effort(a(1.0)),))
    with pytest.raises(ValueError, match="Effort"):
        M.terminal_cost(bad, p, s, 0.0)
    with pytest.raises(ValueError, match="horizon"):
        M.MPPI(horizon=0, dt=0.1)
    with pytest.raises(ValueError, match="dt"):
        M.ILQR(horizon=5, dt=-0.1)
    with pytest.raises(ValueError, match="samples"):
        M.MPPI(horizon=5, dt=0.1, samples=0)
    with pytest.raises(ValueError, match="box"):
        M.Shooting(horizon=5, dt=0.1, box="tanh")
    with pytest.raises(ValueError, match="alphas"):
        M.ILQR(horizon=5, dt=0.1, alphas=())
    cfg, params = problem("mppi")
    with pytest.raises(ValueError, match="MPPIParams.temperature"):
        cfg.init(params.replace(solver=params.solver.replace(temperature=a(0.0))), s)
    cfg, params = problem("ilqr")
    with pytest.raises(ValueError, match="ILQRParams.regularization"):
        cfg.init(params.replace(solver=params.solver.replace(regularization=a(jnp.nan))), s)
    with pytest.raises(ValueError, match="prediction model: QuadParams.mass"):  # the README's replace idiom
        cfg.init(params.replace(model=params.model.replace(mass=a(-1.0))), s)


def test_shift_plan_interpolates_and_holds_the_last_node():
    plan = jnp.stack([jnp.arange(5.0), 10.0 * jnp.arange(5.0)], axis=1)
    np.testing.assert_allclose(M.shift_plan(plan, 1.0)[:, 0], [1, 2, 3, 4, 4])
    np.testing.assert_allclose(M.shift_plan(plan, 0.2)[:, 1], [2, 12, 22, 32, 40])
    np.testing.assert_allclose(M.shift_plan(plan, 0.0), plan)


# ---- iLQR and the Riccati recursion -------------------------------------------------


def riccati(A, B, Q, R, N, Qf, H):
    """Finite-horizon discrete LQR gains K_k (u = K_k x) and cost-to-go P_0, numpy float64.
    Stage ½ [x; u]ᵀ [[Q, Nᵀ], [N, R]] [x; u], terminal ½ xᵀ Qf x."""
    P, gains = Qf, []
    for _ in range(H):
        S = R + B.T @ P @ B
        G = B.T @ P @ A + N
        K = -np.linalg.solve(S, G)
        P = Q + A.T @ P @ A + G.T @ K
        P = 0.5 * (P + P.T)
        gains.append(K)
    return np.array(gains[::-1]), P


def test_ilqr_is_the_riccati_solution_on_a_linear_quadratic_problem():
    rng = np.random.default_rng(3)
    n, m, H = 4, 2, 12
    A = np.eye(n) + 0.1 * rng.standard_normal((n, n))
    B = rng.standard_normal((n, m))
    L = rng.standard_normal((n, n))
    Q, Qf = L @ L.T / n, np.diag([3.0, 1.0, 2.0, 1.0])
    R = np.diag([0.5, 2.0])
    x0 = rng.standard_normal(n)

    dyn = lambda x, u, k: jnp.asarray(A) @ x + jnp.asarray(B) @ u  # noqa: E731
    stage = lambda x, u, k: 0.5 * x @ jnp.asarray(Q) @ x + 0.5 * u @ jnp.asarray(R) @ u  # noqa: E731
    term = lambda x: 0.5 * x @ jnp.asarray(Qf) @ x  # noqa: E731
    U0 = jnp.ones((H, m))  # a poor guess: the LQ problem is solved from anywhere in one step
    one = M.ilqr(dyn, stage, term, a(x0), U0, iterations=1, alphas=(1.0, 0.5))
    more = M.ilqr(dyn, stage, term, a(x0), U0, iterations=3)

    K, P0 = riccati(A, B, Q, R, np.zeros((m, n)), Qf, H)
    np.testing.assert_allclose(one.gains, K, rtol=1e-9, atol=1e-12)
    assert float(one.cost) == pytest.approx(0.5 * x0 @ P0 @ x0, rel=1e-10)
    x, U = x0, []
    for k in range(H):
        U.append(K[k] @ x)
        x = A @ x + B @ U[-1]
    np.testing.assert_allclose(one.controls, U, rtol=1e-9, atol=1e-12)
    assert float(more.cost) == pytest.approx(float(one.cost), rel=1e-12)  # converged after one
    assert float(one.initial_cost) > 2.0 * float(one.cost)


# ---- each solver in closed loop ----------------------------------------------------

HOVER_TOL = {"mppi": 0.1, "shooting": 0.02, "ilqr": 0.02}  # MPPI keeps a sampling jitter
HOVER_TICKS = {"mppi": 150, "shooting": 100, "ilqr": 100}  # MPPI's averaging converges slower


def test_vmap_over_vehicles_in_a_closed_loop_simulation_matches_single_runs():
    """Two vehicles with different plants (mass +10 %), starts and PRNG keys, batched by vmap
    inside one jitted closed-loop simulate, equal the same flights run one by one."""
    name = "mppi"
    cfg, params = problem(name)
    p = params.model
    plants = [p, p.replace(mass=a(1.1))]
    starts = [perturbed(p), perturbed(p, offset=(-0.2, 0.3, 0.1), tilt=-0.1)]
    keys = [jax.random.PRNGKey(1), jax.random.PRNGKey(2)]
    stack = lambda xs: jax.tree_util.tree_map(lambda *v: jnp.stack(v), *xs)  # noqa: E731
    ticks = 25

    def one(plant, s0, key):
        cs0 = cfg.init(params, s0, key)
        return qj.simulate(plant, s0, TICK, controller=cfg.control, ctrl_params=params, ctrl_state=cs0,
                           num_ticks=ticks, config=qj.SimConfig(substeps=SUBSTEPS))

    traj = jax.jit(jax.vmap(one))(stack(plants), stack(starts), stack(keys))
    cs, states, commands = traj.ctrl_state, traj.states, traj.commands
    for i in range(2):
        loop_states, loop_infos, loop_commands = fly_loop(name, params, plants[i], starts[i], ticks, keys[i])
        np.testing.assert_allclose(states.position[i], loop_states.position, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(commands[i], loop_commands, rtol=1e-9)
        np.testing.assert_allclose(cs.key[i], loop_infos.key[-1])
    assert float(jnp.abs(states.position[0] - states.position[1]).max()) > 0.1


def test_solver_stabilises_hover_and_lowers_the_cost_below_its_guess(name):
    _, params = problem(name)
    p = params.model
    s0 = perturbed(p)
    states, infos, commands = fly_loop(name, params, p, s0, ticks=HOVER_TICKS[name])
    # the first solve (from hover commands) must improve on its guess by a wide margin
    assert float(infos.cost[0]) < 0.5 * float(infos.guess_cost[0])
    assert np.all(np.asarray(infos.cost) <= np.asarray(infos.guess_cost))
    assert np.all(np.asarray(infos.status) == M.STATUS_OK)
    err0 = float(jnp.linalg.norm(s0.position - a(TARGET)))
    end = jax.tree_util.tree_map(lambda x: x[-10:], states)  # the last 0.2 s (of 2 or 3 s)
    err = np.linalg.norm(np.asarray(end.position) - np.asarray(TARGET), axis=-1).max()
    assert err < HOVER_TOL[name] < err0
    assert np.linalg.norm(np.asarray(end.velocity), axis=-1).max() < 5 * HOVER_TOL[name]
    q = np.asarray(end.attitude)
    tilt = np.degrees(np.arccos(np.clip(1 - 2 * (q[:, 1] ** 2 + q[:, 2] ** 2), -1, 1)))
    assert tilt.max() < 5.0
    u = np.asarray(commands)
    assert np.all((u >= float(p.omega_min)) & (u <= float(p.omega_max)))


def test_a_nonfinite_observation_keeps_the_plan_and_sets_a_status(name):
    cfg, params = problem(name)
    s0 = perturbed(params.model)
    cs = cfg.init(params, s0)
    _, cs = jitted_control(name)(params, cs, s0, 0.0)
    bad = s0.replace(position=a([jnp.nan, 0.0, 2.0]))
    u_bad, cs_bad = jitted_control(name)(params, cs, bad, TICK)
    assert np.all(np.isfinite(np.asarray(u_bad)))
    np.testing.assert_allclose(u_bad, cs.plan[0])  # the warm start's first node
    assert int(cs_bad.status) & M.STATUS_NONFINITE_GUESS
    assert np.all(np.isfinite(np.asarray(cs_bad.plan)))


def test_float32_in_float32_out(name):
    """Traced only (jax.eval_shape): the controller keeps the caller's float32."""
    cfg, params = problem(name, jnp.float32)
    s0 = qj.hover_state(params.model, TARGET)
    cs = cfg.init(params, s0)
    u, out = jax.eval_shape(cfg.control, params, cs, s0, 0.0)
    assert u.dtype == jnp.float32 and u.shape == (4,)
    assert out.plan.dtype == jnp.float32 and out.cost.dtype == jnp.float32


# ---- iLQR near hover: placed after iLQR's closed-loop tests, whose compiled control it reuses -------


def test_ilqr_near_hover_is_the_riccati_feedback_of_the_linearised_quadrotor():
    """Near an exact hover equilibrium the MPC problem is linear-quadratic to first order:
    (A, B) the node map's Jacobians, taken here by central differences (independent of the
    jacfwd inside iLQR), (Q, N, R) the cost's Hessians. iLQR's first command from a small
    perturbation δx must be u_h + K₀ δx with K₀ the Riccati gain, up to O(δ²)."""
    name = "ilqr"
    cfg, params = problem(name)
    p = params.model
    s_h = qj.hover_state(p, TARGET)
    x_h, dyn, stage, term, _ = cfg.vector_problem(params, s_h, 0.0)
    a_h = M.to_unit(p, qj.hover_rotor_speed(p))
    n, m = x_h.shape[0], a_h.shape[0]
    f = jax.jit(lambda z: dyn(z[:n], z[n:], 0))
    z_h = np.concatenate([x_h, a_h])
    h = 1e-6
    J = np.stack([(np.asarray(f(z_h + h * e)) - np.asarray(f(z_h - h * e))) / (2 * h) for e in np.eye(n + m)], 1)
    A, B = J[:, :n], J[:, n:]
    Hs = np.asarray(jax.jit(jax.hessian(lambda z: stage(z[:n], z[n:], 0)))(z_h))
    Qf = np.asarray(jax.jit(jax.hessian(term))(x_h))
    K, _ = riccati(A, B, Hs[:n, :n], Hs[n:, n:], Hs[n:, :n], Qf, cfg.horizon)

    errors = []
    for eps in (2e-3, 1e-3):
        s = perturbed(p, offset=(eps, -eps, eps), tilt=eps, velocity=(eps, 0.0, -eps))
        dx = np.asarray(jax.flatten_util.ravel_pytree(s)[0]) - np.asarray(x_h)
        u, _ = jitted_control(name)(params, cfg.init(params, s), s, 0.0)
        du = np.asarray(M.to_unit(p, u) - a_h)
        linear = K[0] @ dx
        errors.append(np.abs(du - linear).max() / np.abs(linear).max())
    assert errors[0] < 0.02, errors
    assert errors[1] < 0.6 * errors[0], errors  # the residual shrinks with δ: it is the nonlinearity
