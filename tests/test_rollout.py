"""Rollouts (#4): scan == Python loop, options, time-varying inputs, closed loop, batching, checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax.rollout import rollout_batch, rollout_closed_loop_batch, vehicle_axes
from tests.helpers import busy_params, busy_state, command_for, leaves_close, leaves_equal

F64 = jnp.float64


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


@pytest.mark.parametrize("name,step", [("rk4", qj.rk4_step), ("euler", qj.euler_step),
                                       ("semi_implicit_euler", qj.semi_implicit_euler_step)])
def test_rollout_equals_a_python_loop_of_steps(name, step):
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 25)
    final, states = jax.jit(lambda s, u: qj.rollout(p, s, u, 0.01, substeps=2, step=name))(s0, u)
    ref_final, ref_states = _loop(step, p, s0, u, 0.01, substeps=2)
    leaves_close(states, ref_states, rtol=1e-12, atol=1e-12)
    leaves_close(final, ref_final, rtol=1e-12, atol=1e-12)
    assert states.position.shape == (25, 3)


@pytest.mark.parametrize("backend", ["xla", "native"])
def test_save_stride_final_only_and_reduce_agree_with_the_full_run(backend):
    if backend == "native" and not qj.native.available():
        pytest.skip(f"native kernel unavailable: {qj.native.unavailable_reason()}")
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 24)
    run = jax.jit(lambda s, u: (
        qj.rollout(p, s, u, 0.01, backend=backend),
        qj.rollout(p, s, u, 0.01, save_every=6, backend=backend),
        qj.rollout(p, s, u, 0.01, save_every=0, backend=backend),
        # the kernel folds one call per command: the same bits as one call for the whole horizon
        qj.rollout(p, s, u, 0.01, reduce=lambda c, st: jnp.maximum(c, st.position[2]), reduce_init=-jnp.inf,
                   backend=backend),
    ))
    (final, states), (f6, s6), (f0, none), (fr, zmax) = run(s0, u)
    leaves_equal(s6, jax.tree_util.tree_map(lambda x: x[5::6], states))
    for f in (f6, f0, fr):
        leaves_equal(f, final)
    assert none is None
    assert float(zmax) == float(jnp.max(states.position[:, 2]))


def test_time_varying_wind_equals_chained_rollouts_with_that_wind():
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 20)
    w1, w2 = jnp.asarray([3.0, -1.0, 0.5]), jnp.asarray([-2.0, 2.0, 0.0])
    run = jax.jit(lambda wind: qj.rollout(p, s0, u, 0.01, wind=wind, save_every=0)[0])
    final = run(jnp.concatenate([jnp.tile(w1, (10, 1)), jnp.tile(w2, (10, 1))]))
    piece = jax.jit(lambda w, s, u: qj.rollout(p.replace(wind=w), s, u, 0.01, save_every=0)[0])
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


def test_external_body_force_equal_to_weight_holds_a_stopped_vehicle_in_the_air():
    p, s0, u = _free_body()
    weight = float(p.mass * p.gravity)
    wrench = jnp.tile(jnp.asarray([0.0, 0.0, weight, 0.0, 0.0, 0.0]), (100, 1))
    run = jax.jit(lambda x: qj.rollout(p, s0, u, 0.01, wrench=x, save_every=0)[0])
    final = run(wrench)
    np.testing.assert_allclose(final.position, [0.0, 0.0, 10.0], atol=1e-12)
    np.testing.assert_allclose(final.velocity, 0.0, atol=1e-12)
    # without it, free fall z = 10 − g t²/2
    fall = run(jnp.zeros_like(wrench))
    np.testing.assert_allclose(fall.position[2], 10.0 - 0.5 * float(p.gravity) * 1.0**2, rtol=1e-12)


def test_external_yaw_moment_spins_up_at_moment_over_inertia():
    p, s0, u = _free_body()
    M = 0.05  # N·m about body z, for 1 s, then removed
    wrench = jnp.zeros((100, 6)).at[:50, 5].set(M)
    _, states = jax.jit(lambda x: qj.rollout(p, s0, u, 0.01, wrench=x))(wrench)
    izz = float(p.inertia[2, 2])
    np.testing.assert_allclose(states.body_rates[49, 2], M * 0.5 / izz, rtol=1e-12)
    np.testing.assert_allclose(states.body_rates[-1, 2], M * 0.5 / izz, rtol=1e-12)  # torque-free: constant


def test_closed_loop_runs_the_controller_at_its_own_rate_and_replays_open_loop():
    p = busy_params()
    s0 = busy_state(p)
    hover = qj.hover_rotor_speed(p)

    def altitude_hold(gain, cs, obs, t):
        command = hover * (1.0 + gain * (5.0 - obs.position[2]))
        return command, cs.at[jnp.asarray(t / 0.01).round().astype(int)].set(t)

    cs0 = jnp.full(30, -1.0)
    final, cs, states, commands = jax.jit(
        lambda g: qj.rollout_closed_loop(p, s0, altitude_hold, g, cs0, 30, 0.01, substeps=5)
    )(jnp.asarray(0.2))
    np.testing.assert_allclose(cs, 0.01 * np.arange(30), rtol=1e-12, atol=1e-15)  # called once per tick at k·dt
    assert commands.shape == (30, 4) and states.position.shape == (30, 3)
    ref_final, ref_states = jax.jit(lambda c: qj.rollout(p, s0, c, 0.01, substeps=5))(commands)
    leaves_close(states, ref_states, rtol=1e-12, atol=1e-12)
    leaves_close(final, ref_final, rtol=1e-12, atol=1e-12)


def test_closed_loop_observation_and_reduction():
    p = busy_params()
    s0 = busy_state(p)
    hover = qj.hover_rotor_speed(p)

    def law(gain, cs, obs, t):
        return hover * (1.0 + gain * (5.0 - obs)), cs

    def altimeter(params, state, t):  # the controller sees only the height, biased by 0.1 m
        return state.position[2] + 0.1

    (_, _, zmin, none), (_, _, states, _) = jax.jit(lambda g: (
        qj.rollout_closed_loop(p, s0, law, g, None, 40, 0.01, observe=altimeter,
                               reduce=lambda c, s: jnp.minimum(c, s.position[2]), reduce_init=jnp.inf),
        qj.rollout_closed_loop(p, s0, law, g, None, 40, 0.01, observe=altimeter),
    ))(jnp.asarray(0.2))
    assert none is None
    assert float(zmin) == float(jnp.min(states.position[:, 2]))


def test_batched_params_equal_separate_runs_and_tiles_change_nothing():
    p = busy_params()
    s0 = busy_state(p)
    N, T = 5, 12
    masses = p.mass * jnp.linspace(0.8, 1.2, N)
    ps = p.replace(mass=masses, wind=jnp.asarray(np.random.default_rng(1).normal(size=(N, 3))))
    u = _commands(p, T)
    axes = vehicle_axes(ps, "mass", "wind")
    run = jax.jit(lambda ps, u, block: rollout_batch(ps, s0, u, 0.01, params_axes=axes, state_axes=None,
                                                     commands_axes=None, block=block), static_argnums=2)
    final, states = run(ps, u, None)
    assert states.position.shape == (N, T, 3) and final.position.shape == (N, 3)
    single = jax.jit(lambda m, w: qj.rollout(p.replace(mass=m, wind=w), s0, u, 0.01)[1])
    for i in range(N):
        si = single(masses[i], ps.wind[i])
        leaves_close(jax.tree_util.tree_map(lambda x: x[i], states), si, rtol=1e-12, atol=1e-12)
    # tiles of 2 vehicles (and a remainder of 1): the same arithmetic; XLA may contract a·b + c
    # into FMA in different places for other shapes, so equal to ~1 ulp (bitwise under AVX, no FMA)
    leaves_close(run(ps, u, 2), (final, states), rtol=1e-13, atol=1e-15)
    # one full parameter set per vehicle (in_axes 0) gives the same as the partial axes
    full = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + jnp.shape(x)), p).replace(
        mass=masses, wind=ps.wind)
    per_vehicle = jax.jit(lambda q: rollout_batch(q, s0, u, 0.01, params_axes=0, state_axes=None,
                                                  commands_axes=None))
    leaves_close(per_vehicle(full), (final, states), rtol=1e-13, atol=1e-15)


def test_closed_loop_batch_with_one_gain_per_vehicle():
    p = busy_params()
    s0 = busy_state(p)
    hover = qj.hover_rotor_speed(p)

    def law(gain, cs, obs, t):
        return hover * (1.0 + gain * (5.0 - obs.position[2])), cs

    gains = jnp.asarray([0.05, 0.1, 0.4])
    final, _, states, _ = jax.jit(lambda g: rollout_closed_loop_batch(
        p, s0, law, g, None, 20, 0.01, state_axes=None, ctrl_params_axes=0, ctrl_state_axes=None))(gains)
    single = jax.jit(lambda g: qj.rollout_closed_loop(p, s0, law, g, None, 20, 0.01)[0])
    for i, g in enumerate(gains):
        f = single(g)
        leaves_close(jax.tree_util.tree_map(lambda x: x[i], final), f, rtol=1e-12, atol=1e-12)


def test_checkpointed_gradient_of_a_thousand_step_rollout_matches_the_plain_one():
    p = busy_params()
    s0 = busy_state(p)
    u = jnp.tile(command_for(p), (1000, 1))

    def loss(mass, k_f, v0, checkpoint):
        q = p.replace(mass=mass, k_f=k_f)
        final, _ = qj.rollout(q, s0.replace(velocity=v0), u, 1e-3, save_every=0, checkpoint=checkpoint)
        return jnp.sum(final.position ** 2) + jnp.sum(final.body_rates)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    plain = grad(p.mass, p.k_f, s0.velocity, False)
    checked = grad(p.mass, p.k_f, s0.velocity, True)
    for a, b in zip(plain, checked):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(b, a, rtol=1e-10)
    assert float(jnp.abs(plain[0])) > 0  # the loss does depend on the mass


def test_float32_state_keeps_float32_with_float64_inputs():
    p = busy_params(F64)
    s0 = busy_state(p, jnp.float32)
    u = _commands(p, 5)  # float64
    final, states = jax.jit(lambda: qj.rollout(p, s0, u, jnp.asarray(0.01, F64), wind=jnp.ones((5, 3), F64)))()
    for leaf in jax.tree_util.tree_leaves((final, states)):
        assert leaf.dtype == jnp.float32


def test_any_stepper_works_through_the_generic_path():
    p = busy_params()
    s0 = busy_state(p)
    u = _commands(p, 10)

    def my_rk4(params, state, command, dt):  # not a library stepper: joined and split around each call
        return qj.rk4_step(params, state, command, dt)

    a = jax.jit(lambda s: qj.rollout(p, s, u, 0.01, step=my_rk4))(s0)
    b = jax.jit(lambda s: qj.rollout(p, s, u, 0.01))(s0)
    leaves_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="external wrench"):
        qj.rollout(p, s0, u, 0.01, step=my_rk4, wrench=jnp.zeros((10, 6)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(commands=jnp.zeros((10, 3))), "commands"),
    (dict(save_every=3), "save_every"),
    (dict(substeps=0), "substeps"),
    (dict(step="rk5"), "rk5"),
    (dict(wind=jnp.zeros((9, 3))), "wind"),
    (dict(wrench=jnp.zeros((10, 3))), "wrench"),
])
def test_bad_options_raise_a_value_error_naming_them(kwargs, match):
    p = busy_params()
    s0 = busy_state(p)
    args = dict(commands=jnp.zeros((10, 4)))
    args.update(kwargs)
    commands = args.pop("commands")
    with pytest.raises(ValueError, match=match):
        qj.rollout(p, s0, commands, 0.01, **args)
