"""The engine (#4, qj.simulate): scan == Python loop, options, time-varying inputs, closed loop,
batching, checkpoint, both backends, checked runs (monitor, checkify), boundary errors."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import quadjax as qj
from quadjax.monitor import AFTER_STEP, BEFORE_STEP, describe, replay, write_repro
from tests.helpers import below_ground_edit, busy_params, busy_state, command_for, leaves_close, leaves_equal, spread_fleet

F64 = jnp.float64
NEEDS_NATIVE = pytest.mark.skipif(not qj.native.available(),
                                  reason=f"native kernel unavailable: {qj.native.unavailable_reason()}")
BACKENDS = [pytest.param("native", marks=NEEDS_NATIVE), "xla"]


def _commands(p, T, seed=0):
    rng = np.random.default_rng(seed)
    return qj.hover_rotor_speed(p) * jnp.asarray(1 + 0.05 * rng.standard_normal((T, 4)), p.mass.dtype)


def _loop(step, p, s, commands, dt, substeps=1, **kw):
    """The reference: a Python loop over a jitted single step."""
    one = jax.jit(lambda s, u, h: step(p, s, u, h))
    out = []
    for u in commands:
        for _ in range(substeps):
            s = one(s, u, dt / substeps)
        out.append(s)
    return s, jax.tree_util.tree_map(lambda *x: jnp.stack(x), *out)


# the native kernel runs the library's RK4 only: the other steppers run on XLA
@pytest.mark.parametrize("name,step,backend", [
    pytest.param("rk4", qj.rk4_step, "native", marks=NEEDS_NATIVE), ("rk4", qj.rk4_step, "xla"), ("euler", qj.euler_step, "xla"),
    ("semi_implicit_euler", qj.semi_implicit_euler_step, "xla")])
def test_rollout_equals_a_python_loop_of_steps(name, step, backend):
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 25)
    cfg = qj.SimConfig(integrator=name, substeps=2, backend=backend)
    traj = jax.jit(lambda s, u: qj.simulate(p, s, 0.01, commands=u, config=cfg))(s0, u)
    assert traj.backend == backend
    ref_final, ref_states = _loop(step, p, s0, u, 0.01, substeps=2)
    leaves_close(traj.states, ref_states, rtol=1e-12, atol=1e-12)
    leaves_close(traj.final, ref_final, rtol=1e-12, atol=1e-12)
    assert traj.states.position.shape == (25, 3)
    leaves_equal(traj.commands, u)  # the commands of every tick are saved as given
    assert int(traj.status) == 0 and int(traj.status_tick) == -1


def test_native_backend_refuses_what_it_cannot_run():
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 5)
    for integrator in ("euler", "semi_implicit_euler", lambda *a: qj.rk4_step(*a)):
        with pytest.raises(ValueError, match="backend='native'.*RK4 only"):
            qj.simulate(p, s0, 0.01, commands=u, config=qj.SimConfig(integrator=integrator, backend="native"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_stride_final_only_and_reduce_agree_with_the_full_run(backend):
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 24)
    cfg = qj.SimConfig(backend=backend)
    zmax = qj.Reduce(lambda c, st: jnp.maximum(c, st.position[2]), -jnp.inf)
    run = jax.jit(lambda s, u: (
        qj.simulate(p, s, 0.01, commands=u, config=cfg),
        qj.simulate(p, s, 0.01, commands=u, config=cfg.replace(save_every=6)),
        qj.simulate(p, s, 0.01, commands=u, config=cfg.replace(save_every=0)),
        # the kernel folds one call per command: the same bits as one call for the whole horizon
        qj.simulate(p, s, 0.01, commands=u, hooks=(zmax,), config=cfg),
    ))
    full, t6, t0, tr = run(s0, u)
    leaves_equal(t6.states, jax.tree_util.tree_map(lambda x: x[5::6], full.states))
    leaves_equal(t6.commands, u[5::6])
    for t in (t6, t0, tr):
        leaves_equal(t.final, full.final)
    leaves_equal(tr.states, full.states)
    assert t0.states is None and t0.commands is None
    assert float(tr.hooks[0]) == float(jnp.max(full.states.position[:, 2]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_varying_wind_equals_chained_rollouts_with_that_wind(backend):
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 20)
    cfg = qj.SimConfig(save_every=0, backend=backend)
    w1, w2 = jnp.asarray([3.0, -1.0, 0.5]), jnp.asarray([-2.0, 2.0, 0.0])
    run = jax.jit(lambda wind: qj.simulate(p, s0, 0.01, commands=u, inputs=qj.Inputs(wind=wind), config=cfg).final)
    final = run(jnp.concatenate([jnp.tile(w1, (10, 1)), jnp.tile(w2, (10, 1))]))
    piece = jax.jit(lambda w, s, u: qj.simulate(p.replace(wind=w), s, 0.01, commands=u, config=cfg).final)
    ref = piece(w2, piece(w1, s0, u[:10]), u[10:])
    leaves_close(final, ref, rtol=1e-12, atol=1e-12)
    # and it mattered: without the wind change the result is different
    other = run(jnp.tile(w1, (20, 1)))
    assert float(jnp.max(jnp.abs(other.velocity - final.velocity))) > 1e-3


def _free_body(dtype=F64):
    """A vehicle with its rotors stopped, far from the ground, no drag: only gravity and the wrench act."""
    p = qj.presets.rp1(dtype).replace(
        ground_z=jnp.asarray(-1e9, dtype), drag_linear=jnp.zeros(3, dtype), drag_quadratic=jnp.zeros(3, dtype),
        motor_tau=jnp.asarray(0.0, dtype),
    )
    s0 = qj.QuadState.create(position=(0.0, 0.0, 10.0), dtype=dtype)
    return p, s0, jnp.zeros((100, 4), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_external_body_force_equal_to_weight_holds_a_stopped_vehicle_in_the_air(backend):
    p, s0, u = _free_body()
    weight = float(p.mass * p.gravity)
    wrench = jnp.tile(jnp.asarray([0.0, 0.0, weight, 0.0, 0.0, 0.0]), (100, 1))
    cfg = qj.SimConfig(save_every=0, backend=backend)
    run = jax.jit(lambda x: qj.simulate(p, s0, 0.01, commands=u, inputs=qj.Inputs(wrench=x), config=cfg).final)
    final = run(wrench)
    np.testing.assert_allclose(final.position, [0.0, 0.0, 10.0], atol=1e-12)
    np.testing.assert_allclose(final.velocity, 0.0, atol=1e-12)
    # without it, free fall z = 10 − g t²/2
    fall = run(jnp.zeros_like(wrench))
    np.testing.assert_allclose(fall.position[2], 10.0 - 0.5 * float(p.gravity) * 1.0**2, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_external_yaw_moment_spins_up_at_moment_over_inertia(backend):
    p, s0, u = _free_body()
    M = 0.05  # N·m about body z, for 1 s, then removed
    wrench = jnp.zeros((100, 6)).at[:50, 5].set(M)
    cfg = qj.SimConfig(backend=backend)
    states = jax.jit(lambda x: qj.simulate(p, s0, 0.01, commands=u, inputs=qj.Inputs(wrench=x),
                                           config=cfg).states)(wrench)
    izz = float(p.inertia[2, 2])
    np.testing.assert_allclose(states.body_rates[49, 2], M * 0.5 / izz, rtol=1e-12)
    np.testing.assert_allclose(states.body_rates[-1, 2], M * 0.5 / izz, rtol=1e-12)  # torque-free: constant


@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_loop_runs_the_controller_at_its_own_rate_and_replays_open_loop(backend):
    p = busy_params()
    s0 = busy_state(p)
    hover = qj.hover_rotor_speed(p)

    def altitude_hold(gain, cs, obs, t):
        command = hover * (1.0 + gain * (5.0 - obs.position[2]))
        return command, cs.at[jnp.asarray(t / 0.01).round().astype(int)].set(t)

    cs0 = jnp.full(30, -1.0)
    cfg = qj.SimConfig(substeps=5, backend=backend)
    traj = jax.jit(lambda g: qj.simulate(p, s0, 0.01, controller=altitude_hold, ctrl_params=g, ctrl_state=cs0,
                                         num_ticks=30, config=cfg))(jnp.asarray(0.2))
    assert traj.backend == backend
    # called once per tick at k·dt
    np.testing.assert_allclose(traj.ctrl_state, 0.01 * np.arange(30), rtol=1e-12, atol=1e-15)
    assert traj.commands.shape == (30, 4) and traj.states.position.shape == (30, 3)
    ref = jax.jit(lambda c: qj.simulate(p, s0, 0.01, commands=c, config=cfg))(traj.commands)
    leaves_close(traj.states, ref.states, rtol=1e-12, atol=1e-12)
    leaves_close(traj.final, ref.final, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_loop_observation_and_reduction(backend):
    p = busy_params()
    s0 = busy_state(p)
    hover = qj.hover_rotor_speed(p)

    def law(gain, cs, obs, t):
        return hover * (1.0 + gain * (5.0 - obs)), cs

    def altimeter(params, state, t):  # the controller sees only the height, biased by 0.1 m
        return state.position[2] + 0.1

    cfg = qj.SimConfig(backend=backend)
    zmin = qj.Reduce(lambda c, s: jnp.minimum(c, s.position[2]), jnp.inf)
    reduced, full = jax.jit(lambda g: (
        qj.simulate(p, s0, 0.01, controller=law, ctrl_params=g, num_ticks=40, observe=altimeter, hooks=(zmin,),
                    config=cfg.replace(save_every=0)),
        qj.simulate(p, s0, 0.01, controller=law, ctrl_params=g, num_ticks=40, observe=altimeter, config=cfg),
    ))(jnp.asarray(0.2))
    assert reduced.states is None and reduced.commands is None  # nothing (T, ...) is kept
    assert float(reduced.hooks[0]) == float(jnp.min(full.states.position[:, 2]))
    leaves_equal(reduced.final, full.final)
    # the observation is what the controller saw: the biased altimeter, not the true state
    np.testing.assert_allclose(full.commands[0], hover * (1.0 + 0.2 * (5.0 - (s0.position[2] + 0.1))), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_params_equal_separate_runs_and_tiles_change_nothing(backend):
    p = busy_params()
    s0 = busy_state(p)
    N, T = 5, 12
    masses = p.mass * jnp.linspace(0.8, 1.2, N)
    ps = p.replace(mass=masses, wind=jnp.asarray(np.random.default_rng(1).normal(size=(N, 3))))
    u = _commands(p, T)
    cfg = qj.SimConfig(backend=backend)
    axes = qj.vehicle_axes(ps, "mass", "wind")

    def fly(q):
        t = qj.simulate(q, s0, 0.01, commands=u, config=cfg)
        return t.final, t.states

    run = jax.jit(lambda ps, block: qj.map_vehicles(fly, (ps,), (axes,), block=block), static_argnums=1)
    final, states = run(ps, None)
    assert states.position.shape == (N, T, 3) and final.position.shape == (N, 3)
    single = jax.jit(lambda m, w: fly(p.replace(mass=m, wind=w))[1])
    for i in range(N):
        si = single(masses[i], ps.wind[i])
        leaves_close(jax.tree_util.tree_map(lambda x: x[i], states), si, rtol=1e-12, atol=1e-12)
    # tiles of 2 vehicles (and a remainder of 1): the same arithmetic; XLA may contract a·b + c
    # into FMA in different places for other shapes, so equal to ~1 ulp (bitwise under AVX, no FMA)
    leaves_close(run(ps, 2), (final, states), rtol=1e-13, atol=1e-15)
    # one full parameter set per vehicle (in_axes 0) gives the same as the partial axes
    full = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + jnp.shape(x)), p).replace(
        mass=masses, wind=ps.wind)
    per_vehicle = jax.jit(lambda q: qj.map_vehicles(fly, (q,), (0,)))
    leaves_close(per_vehicle(full), (final, states), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closed_loop_batch_with_one_gain_per_vehicle(backend):
    p = busy_params()
    s0 = busy_state(p)
    hover = qj.hover_rotor_speed(p)
    cfg = qj.SimConfig(backend=backend)

    def law(gain, cs, obs, t):
        return hover * (1.0 + gain * (5.0 - obs.position[2])), cs

    def fly(g):
        return qj.simulate(p, s0, 0.01, controller=law, ctrl_params=g, num_ticks=20, config=cfg).final

    gains = jnp.asarray([0.05, 0.1, 0.4])
    final = jax.jit(lambda g: qj.map_vehicles(fly, (g,), (0,)))(gains)
    single = jax.jit(fly)
    for i, g in enumerate(gains):
        leaves_close(jax.tree_util.tree_map(lambda x: x[i], final), single(g), rtol=1e-12, atol=1e-12)
    # and the gain mattered
    assert float(jnp.abs(final.position[0, 2] - final.position[2, 2])) > 1e-6


# derivatives always run XLA's program (tests/test_native.py checks the kernel's forward pass
# under grad), so one backend suffices here
@pytest.mark.parametrize("backend", ["xla"])
def test_checkpointed_gradient_of_a_thousand_step_rollout_matches_the_plain_one(backend):
    p = busy_params()
    s0 = busy_state(p)
    u = jnp.tile(command_for(p), (1000, 1))

    def loss(mass, k_f, v0, checkpoint):
        q = p.replace(mass=mass, k_f=k_f)
        cfg = qj.SimConfig(save_every=0, checkpoint=checkpoint, backend=backend)
        final = qj.simulate(q, s0.replace(velocity=v0), 1e-3, commands=u, config=cfg).final
        return jnp.sum(final.position ** 2) + jnp.sum(final.body_rates)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    plain = grad(p.mass, p.k_f, s0.velocity, False)
    checked = grad(p.mass, p.k_f, s0.velocity, True)
    for a, b in zip(plain, checked):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(b, a, rtol=1e-10)
    assert float(jnp.abs(plain[0])) > 0  # the loss does depend on the mass


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_state_keeps_float32_with_float64_inputs(backend):
    p = busy_params(F64)
    s0 = busy_state(p, jnp.float32)
    u = _commands(p, 5)  # float64
    cfg = qj.SimConfig(backend=backend)
    traj = jax.jit(lambda: qj.simulate(p, s0, jnp.asarray(0.01, F64), commands=u,
                                       inputs=qj.Inputs(wind=jnp.ones((5, 3), F64)), config=cfg))()
    assert traj.backend == backend
    for leaf in jax.tree_util.tree_leaves((traj.final, traj.states, traj.commands)):
        assert leaf.dtype == jnp.float32


def test_any_stepper_works_through_the_generic_path():
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 10)

    def my_rk4(params, state, command, dt):  # not a library stepper: joined and split around each call
        return qj.rk4_step(params, state, command, dt)

    a = jax.jit(lambda s: qj.simulate(p, s, 0.01, commands=u, config=qj.SimConfig(integrator=my_rk4)))(s0)
    b = jax.jit(lambda s: qj.simulate(p, s, 0.01, commands=u))(s0)
    assert a.backend == "xla"
    leaves_close((a.final, a.states), (b.final, b.states), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="inputs.wrench needs one of the library's steppers"):
        qj.simulate(p, s0, 0.01, commands=u, inputs=qj.Inputs(wrench=jnp.zeros((10, 6))),
                    config=qj.SimConfig(integrator=my_rk4))


@pytest.mark.parametrize("kwargs,config,match", [
    (dict(commands=jnp.zeros((10, 3))), {}, "commands"),
    ({}, dict(save_every=3), "save_every"),
    ({}, dict(substeps=0), "substeps"),
    ({}, dict(integrator="rk5"), "rk5"),
    (dict(inputs=qj.Inputs(wind=jnp.zeros((9, 3)))), {}, "wind"),
    (dict(inputs=qj.Inputs(wrench=jnp.zeros((10, 3)))), {}, "wrench"),
    (dict(num_ticks=11), {}, "num_ticks"),
    ({}, dict(backend="gpu"), "backend"),
    ({}, dict(check="always"), "check"),
])
def test_bad_options_raise_a_value_error_naming_them(kwargs, config, match):
    p = busy_params()
    s0 = busy_state(p)
    args = dict(commands=jnp.zeros((10, 4)))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        qj.simulate(p, s0, 0.01, config=qj.SimConfig(**config), **args)


# --------------------------------------------------------------------------- checked runs

N, T = 8, 20
_BELOW_GROUND_5_7 = below_ground_edit(5, 7)  # one object: an edit is part of what is compiled


@NEEDS_NATIVE
def test_checked_native_run_stops_only_the_planted_vehicles_and_replays_them(tmp_path):
    p, s0, u = spread_fleet(F64, N, T)
    u = u.at[3, 5, 2].set(jnp.nan)  # vehicle 3: a NaN command at tick 5 -> the step breaks I4
    dt = 1e-3
    checked_cfg = qj.SimConfig(check="monitor", backend="native")
    checked = jax.jit(lambda s, u: qj.map_vehicles(
        lambda s, u: qj.simulate(p, s, dt, commands=u, edit=below_ground_edit(6, 11), config=checked_cfg),
        (s, u), (0, 0)))(s0, u)
    # the production path: no hook, no edit, the whole horizon in one kernel call
    plain = jax.jit(lambda s, u: qj.map_vehicles(
        lambda s, u: qj.simulate(p, s, dt, commands=u, config=qj.SimConfig(backend="native")), (s, u), (0, 0)))(s0, u)
    assert checked.backend == plain.backend == "native"
    expect = {3: (5, qj.STATUS_IDS.index("non_finite"), AFTER_STEP),
              6: (11, qj.STATUS_IDS.index("below_ground"), BEFORE_STEP)}
    for v in range(N):
        tick, code, phase = expect.get(v, (-1, 0, -1))
        assert (int(checked.status[v]), int(checked.status_tick[v])) == (code, tick), v
        assert (int(checked.report.tick[v]), int(checked.report.code[v]), int(checked.report.phase[v])) == (
            tick, code, phase), v
    assert list(checked.report.broken()) == [3, 6]
    assert list(np.flatnonzero(~np.asarray(checked.ok))) == [3, 6]
    # every other vehicle is bit for bit what the unchecked native run gives
    ok = np.asarray([v not in expect for v in range(N)])
    for a, b in zip(jax.tree_util.tree_leaves((checked.final, checked.states, checked.commands)),
                    jax.tree_util.tree_leaves((plain.final, plain.states, plain.commands)), strict=True):
        np.testing.assert_array_equal(np.asarray(a)[ok], np.asarray(b)[ok])
    # the stopped ones are frozen at their state before the tick in which they stopped
    for v, (tick, _, _) in expect.items():
        for a, b in zip(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x[v, tick:], checked.states)),
                        jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x[v, tick - 1], plain.states))):
            np.testing.assert_array_equal(np.asarray(a), np.broadcast_to(np.asarray(b), np.shape(a)))
        assert bool(qj.state_valid(p, jax.tree_util.tree_map(lambda x: x[v], checked.final)))
    text = describe(checked.report, p)
    assert "vehicle 3: I4 non_finite after step 5: position." in text
    assert "vehicle 6: I5 below_ground before step 11: position.z = -0.02 m < ground_z = 0 m" in text
    # repro files of both, replayed on the native kernel
    for v in expect:
        path = write_repro(tmp_path / f"v{v}.npz", checked, p, dt, vehicle=v)
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
        assert meta["backend"] == "native" and meta["vehicle"] == v and meta["tick"] == expect[v][0]
        r = replay(path)
        assert r.reproduced and r.bitwise and r.code == expect[v][1], v
        assert r.meta["backend"] == "native"
    # the after-step one: the step's output was recomputed (not a no-op), NaN where the command was
    r = replay(tmp_path / "v3.npz")
    assert not np.all(np.isfinite(np.asarray(r.after.position)))


@functools.cache
def _checkified_fleet(backend, edit):
    """The checked fleet run, jitted once per (backend, edit): the NaN-command case and the clean
    one differ only in the commands' values, so they share one compilation."""
    cfg = qj.SimConfig(check="raise", backend=backend)

    @jax.jit
    @checkify.checkify
    def debug(p, s, u):
        return qj.map_vehicles(lambda s, u: qj.simulate(p, s, 1e-3, commands=u, edit=edit, config=cfg),
                               (s, u), (0, 0))

    return debug


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("plant", ["below_ground", "non_finite", None])
def test_checkify_raises_naming_the_invariant_the_vehicle_and_the_tick(backend, plant):
    p, s0, u = spread_fleet(F64, N, T)
    vehicle, tick = 5, 7
    edit = None
    if plant == "below_ground":
        edit = _BELOW_GROUND_5_7
    elif plant == "non_finite":
        u = u.at[vehicle, tick, 0].set(jnp.nan)
    err, traj = _checkified_fleet(backend, edit)(p, s0, u)
    if plant is None:
        assert err.get() is None
        err.throw()  # does not raise
        assert np.all(np.asarray(traj.ok))
        return
    assert int(traj.status[vehicle]) == qj.STATUS_IDS.index(plant) and int(traj.status_tick[vehicle]) == tick
    with pytest.raises(checkify.JaxRuntimeError) as info:
        err.throw()
    message = str(info.value)
    assert plant in message and f"vehicle {vehicle}" in message and f"tick {tick}" in message, message


# --------------------------------------------------------------------------- the boundary


def test_batched_arguments_without_vmap_raise_pointing_at_map_vehicles():
    p, s0, u = spread_fleet(F64, N, T)
    ps = p.replace(mass=jnp.full(N, float(p.mass)))
    one = jax.tree_util.tree_map(lambda x: x[0], s0)
    with pytest.raises(ValueError, match="map_vehicles"):
        qj.simulate(ps, one, 1e-3, commands=u[0])
    with pytest.raises(ValueError, match="map_vehicles"):
        qj.simulate(p, s0, 1e-3, commands=u[0])


def test_concrete_invalid_params_raise_naming_the_field():
    p, s0, u = spread_fleet(F64, N, T)
    one = jax.tree_util.tree_map(lambda x: x[0], s0)
    bad = p.replace(mass=jnp.asarray(-1.0))  # not through QuadParams.create, which would refuse it
    with pytest.raises(ValueError, match="QuadParams.mass"):
        qj.simulate(bad, one, 1e-3, commands=u[0])
    with pytest.raises(ValueError, match="QuadParams.mass"):  # closed loop too
        qj.simulate(bad, one, 1e-3, controller=lambda g, cs, obs, t: (u[0, 0], cs), num_ticks=3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("check", ["off", "monitor"])
def test_invalid_params_under_vmap_are_flagged_and_stop_only_that_vehicle(backend, check):
    p, s0, u = spread_fleet(F64, N, T)
    masses = jnp.full(N, float(p.mass))
    bad = masses.at[2].set(-1.0)  # I1: mass must be > 0
    cfg = qj.SimConfig(backend=backend, check=check)
    axes = qj.vehicle_axes(p.replace(mass=masses), "mass")
    run = jax.jit(lambda m, s, u: qj.map_vehicles(
        lambda q, s, u: qj.simulate(q, s, 1e-3, commands=u, config=cfg), (p.replace(mass=m), s, u), (axes, 0, 0)))
    traj, good = run(bad, s0, u), run(masses, s0, u)
    assert traj.backend == backend
    expect_status = np.zeros(N, int)
    expect_status[2] = qj.status.PARAMS_INVALID
    np.testing.assert_array_equal(traj.status, expect_status)
    np.testing.assert_array_equal(traj.status_tick, np.where(expect_status, 0, -1))
    np.testing.assert_array_equal(good.status, 0)
    # with per-tick work (the monitor) the invalid one never flew: every saved state and the final
    # one are its state0; the bare open loop flags it and flies it (what optimisers differentiate)
    if check == "monitor":
        for a, b in zip(jax.tree_util.tree_leaves((traj.final, traj.states)),
                        jax.tree_util.tree_leaves((jax.tree_util.tree_map(lambda x: x[2], s0),) * 2)):
            np.testing.assert_array_equal(np.asarray(a)[2], np.broadcast_to(np.asarray(b), np.shape(a)[1:]))
    else:
        assert float(jnp.max(jnp.abs(traj.final.position[2] - s0.position[2]))) > 0
    # the others fly normally: bit for bit what they do in a fleet without the bad vehicle
    others = np.arange(N) != 2
    for a, b in zip(jax.tree_util.tree_leaves((traj.final, traj.states)),
                    jax.tree_util.tree_leaves((good.final, good.states)), strict=True):
        np.testing.assert_array_equal(np.asarray(a)[others], np.asarray(b)[others])
    assert float(jnp.max(jnp.abs(good.final.position[others] - s0.position[others]))) > 1e-7  # they moved (20 ms near hover)
    if check == "monitor":
        assert list(traj.report.broken()) == [2] and int(traj.report.tick[2]) == 0
        assert "QuadParams.mass" in describe(traj.report, p.replace(mass=bad), params_axes=axes)
