"""The native CPU rollout kernel (quadjax.native) against the XLA rollout.

The kernel's step is generated from the JAX model (quadjax.native.kernel_step); these tests
hold the compiled result to the XLA path: every QuadParams leaf varied per vehicle, every
force and moment on (busy_params/busy_state), wind and wrench series, substeps, save
strides, no motor lag, ground contact, 4, 6 and 8 rotors, per-vehicle and nested batches,
both dtypes; a planted change to the model moves the kernel exactly as it moves XLA.
The kernel's own derivatives (tangent and adjoint kernels) are tested in
tests/test_native_derivatives.py; here, that they agree with XLA's where the engine uses them.
"""

import os
import shutil
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import quadjax as qj
import quadjax.native
from quadjax import vehicle_axes
from tests.helpers import busy_params, busy_state, leaves_close, leaves_equal, varied_fleet

pytestmark = pytest.mark.skipif(not quadjax.native.available(),
                                reason=f"native kernel: {quadjax.native.unavailable_reason()}")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = {jnp.float32: dict(rtol=2e-5, atol=2e-5), jnp.float64: dict(rtol=1e-12, atol=1e-12)}


def _fleet(p, N, T, dtype, seed=0, spread=0.1):
    """N vehicles from busy_state with scattered velocities and rates, commands ±spread about hover."""
    rng = np.random.default_rng(seed)
    R = p.rotor_spins.shape[-1]
    if R == 4:
        s0 = busy_state(p, dtype)
    else:  # busy_state is a quadrotor's: tilt and drain a hovering multirotor instead
        q = jnp.asarray([0.95, 0.1, -0.2, 0.2], dtype)
        s0 = qj.hover_state(p, (0.3, -0.2, 5.0)).replace(attitude=q / jnp.linalg.norm(q),
                                                          energy=jnp.asarray(100.0, dtype))
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), s0)
    states = states.replace(
        velocity=jnp.asarray(rng.normal(0, 2, (N, 3)), dtype),
        body_rates=jnp.asarray(rng.normal(0, 1, (N, 3)), dtype),
    )
    u = qj.hover_rotor_speed(p) * jnp.asarray(1 + spread * rng.standard_normal((N, T, R)), dtype)
    return states, u


def _batch(ps, s, u, dt, *, backend, params_axes=None, commands_axes=0, wind=None, wrench=None, hooks=(), **config):
    """N vehicles open loop through ``u`` (vmapped over ``s`` and, per the axes, ``ps`` and ``u``)."""
    config = qj.SimConfig(backend=backend, **config)
    inputs = qj.Inputs(wind=wind, wrench=wrench)

    def one(p, s, u):
        return qj.simulate(p, s, dt, commands=u, inputs=inputs, hooks=hooks, config=config)

    return qj.map_vehicles(one, (ps, s, u), (params_axes, 0, commands_axes))


def _both(fn):
    """fn(backend) jitted for the kernel and for XLA."""
    return jax.jit(lambda *a: fn("native", *a)), jax.jit(lambda *a: fn("xla", *a))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["float32", "float64"])
def test_kernel_matches_xla_with_every_term_on(dtype):
    p = busy_params(dtype)
    N, T = 37, 40  # one wide block (32), then a narrow one (5)
    states, u = _fleet(p, N, T, dtype)
    rng = np.random.default_rng(1)
    wind = jnp.asarray(rng.normal(0, 3, (T, 3)), dtype)
    wrench = jnp.asarray(rng.normal(0, 0.2, (T, 6)), dtype)
    fold = dict(hooks=(qj.Reduce(lambda c, s: jnp.maximum(c, jnp.abs(s.body_rates)), jnp.zeros(3, dtype)),))
    # save_every 2: 20 slots, fewer than a block holds before writing them (the next test: more)
    for kw in (dict(), dict(save_every=8, substeps=3, wind=wind, wrench=wrench), dict(wind=wind, **fold),
               dict(save_every=2)):
        native, xla = _both(lambda b, s, u: _batch(p, s, u, 2e-3, backend=b, **kw))
        on_native, on_xla = native(states, u), xla(states, u)
        assert (on_native.backend, on_xla.backend) == ("native", "xla")
        leaves_close(on_native, on_xla, **TOL[dtype])


def test_saved_states_beyond_what_a_block_holds_equal_xla():
    """A block holds its saved states and writes them a run of 16 to 128 slots per vehicle at a time
    (SavedSlots in rollout.cc, by the state's size): 300 saved ticks are two or more whole runs and
    a part run, in full and part-filled blocks of lanes. A run written one slot early (a planted
    `k == Kept - 2`) fails it; the 40-tick tests above do not see it."""
    p = qj.presets.rp1(jnp.float64)
    N, T = 21, 300
    states, u = _fleet(p, N, T, jnp.float64, spread=0.02)
    native, xla = _both(lambda b, s, u: _batch(p, s, u, 1e-3, backend=b, save_every=1).states)
    got, ref = native(states, u), xla(states, u)
    assert got.position.shape == (N, T, 3)
    leaves_close(got, ref, **TOL[jnp.float64])


@pytest.mark.parametrize("R", [4, 6, 8])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_kernel_equals_xla_with_every_params_leaf_varied_per_vehicle(R, dtype):
    """Each vehicle its own inertia (with products), rotor positions and spin order, gravity,
    ω limits, capacity, drags, wind, lag on or off (every 4th vehicle without), ground height
    and dt; airborne and grounded starts. 11 vehicles: full and part-filled blocks of lanes."""
    T = 25
    fleet = varied_fleet(R, 11, dtype, seed=100 + R)
    rng = np.random.default_rng(R)
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[(p, s, dt) for p, s, _, dt in fleet])
    u = jnp.stack([u[None] * rng.uniform(0.9, 1.1, (T, R)) for _, _, u, _ in fleet]).astype(dtype)

    def fly(backend):
        config = qj.SimConfig(backend=backend, save_every=5)
        return jax.jit(jax.vmap(lambda p, s, dt, u: qj.simulate(p, s, dt, commands=u, config=config)))

    on_native, on_xla = fly("native")(*stacked, u), fly("xla")(*stacked, u)
    assert (on_native.backend, on_xla.backend) == ("native", "xla")
    assert np.all(np.isfinite(np.asarray(on_xla.final.position)))
    leaves_close((on_native.final, on_native.states), (on_xla.final, on_xla.states),
                 **TOL[jnp.float64 if dtype == "float64" else jnp.float32])


PLANT = r"""
import jax, jax.numpy as jnp, numpy as np, sys
jax.config.update("jax_enable_x64", True)
import quadjax as qj, quadjax.quadrotor
if sys.argv[1] == "variant":  # one effect restated: rotational drag ∝ ω|ω| instead of ω
    quadjax.quadrotor.rotational_drag_moment_c = lambda params, w: tuple(
        -a * x * jnp.abs(x) * 50.0 for a, x in zip(params.drag_rotational, w))
from tests.helpers import busy_params, busy_state
builds = []  # the C++ builds of this process (a kernel loaded from a cache records none)
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **_: builds.append(seconds) if event == quadjax.native.BUILD_EVENT else None)
generated, keys = [], []  # the kernel sources this process generated (one kept in the cache is read); their keys
generate, kept = quadjax.native.generate_source, quadjax.native.cached_source
quadjax.native.generate_source = lambda *a: generated.append(a) or generate(*a)
quadjax.native.cached_source = lambda key, make: keys.append(key) or kept(key, make)
p = busy_params(jnp.float64)
s = busy_state(p, jnp.float64)
u = jnp.tile(qj.hover_rotor_speed(p), (200, 1))
out = [qj.simulate(p, s, 1e-3, commands=u, config=qj.SimConfig(backend=b, save_every=0)) for b in ("native", "xla")]
assert [t.backend for t in out] == ["native", "xla"]
np.save(sys.argv[2], np.stack([np.asarray(quadjax.native.pack_state(t.final)) for t in out]))
print("generated", len(generated), "built", len(builds), "keys", *keys)
"""


def test_a_one_line_physics_change_moves_the_kernel_exactly_as_it_moves_xla(tmp_path):
    """The proof that there is one source: plant a variant of one effect in the JAX model
    (nothing else touched), in a fresh process. Its kernel cache holds the C++ generated for the
    base model (kept under the base's trace); the variant's kernel is generated from its own
    trace and built there (the process records both), and its result moves from the base exactly
    as XLA's does."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    results, runs = {}, {}
    for which in ("base", "variant"):
        env = dict(os.environ, PYTHONPATH=REPO)
        if which == "variant":  # a cache holding only the base's kept sources
            env["QUADJAX_CACHE_DIR"] = str(cache)
            for key in runs["base"]["keys"]:
                for suffix in (".cc", ".cc.sha256"):
                    shutil.copy2(quadjax.native.cache_dir() / f"{quadjax.native.SOURCE_PREFIX}{key}{suffix}", cache)
        out = subprocess.run([sys.executable, "-c", PLANT, which, str(tmp_path / which)], env=env,
                             capture_output=True, text=True, timeout=300, cwd=REPO)
        assert out.returncode == 0, out.stderr[-3000:]
        results[which] = np.load(tmp_path / f"{which}.npy")
        words = out.stdout.split()
        runs[which] = {"generated": int(words[1]), "built": int(words[3]), "keys": words[5:]}
    variant = runs["variant"]
    assert runs["base"]["keys"] and not set(variant["keys"]) & set(runs["base"]["keys"]), runs
    assert variant["generated"] >= 1 and variant["built"] >= 1, runs  # from the variant's trace, built there
    (native_base, xla_base), (native_variant, xla_variant) = results["base"], results["variant"]
    change = xla_variant - xla_base
    assert np.abs(change).max() > 1e-3  # the planted change matters
    np.testing.assert_allclose(native_variant - native_base, change, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(native_variant, xla_variant, rtol=1e-12, atol=1e-12)


def test_a_kept_generated_source_is_read_and_a_damaged_one_is_generated_again(tmp_path, monkeypatch):
    """A fresh process reads a library's generated C++ from the kernel cache instead of tracing and
    generating it again (3-4 s per derivative library; its key is the step's trace, which
    test_a_one_line_physics_change... plants a variant into): read bit for bit, private (0600); a
    damaged kept source is generated again and rewritten; each dtype has its own."""
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(tmp_path / "cache"))
    generated = []
    real = quadjax.native.generate_source
    monkeypatch.setattr(quadjax.native, "generate_source", lambda *a: generated.append(a) or real(*a))
    source = quadjax.native.source.__wrapped__  # without the process's own memo

    def kept():
        return sorted((tmp_path / "cache").glob(f"{quadjax.native.SOURCE_PREFIX}*.cc"))

    base = source("float64", 4, "forward")
    assert len(generated) == 1 and len(kept()) == 1 and base == kept()[0].read_text()
    assert oct(kept()[0].stat().st_mode & 0o777) == "0o600"
    assert source("float64", 4, "forward") == base and len(generated) == 1  # read, not generated
    kept()[0].write_text(base.replace("sqrt", "cbrt", 1))  # damaged: its recorded digest no longer matches
    assert source("float64", 4, "forward") == base and len(generated) == 2
    assert kept()[0].read_text() == base
    assert source("float32", 4, "forward") != base and len(generated) == 3 and len(kept()) == 2
    # another process generating it holds its turn: this one waits, then reads what that one wrote
    path = next(p for p in kept() if p.read_text() == base)
    path.unlink()
    got = []
    with qj.files.exclusive_lock(path.with_name(path.name + ".lock"), 1.0):
        waiting = threading.Thread(target=lambda: got.append(source("float64", 4, "forward")))
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive() and not got
        path.write_text(base)  # as the other process writes it (its digest is still beside it)
    waiting.join(60)
    assert got == [base] and len(generated) == 3
    # no lock file can be made (a full disk): generated all the same, not a fall-back to XLA
    path.unlink()

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quadjax.native, "exclusive_lock", no_space)
    assert source("float64", 4, "forward") == base and len(generated) == 4


def test_kernel_matches_xla_without_motor_lag_on_the_ground_and_with_six_and_eight_rotors():
    dtype = jnp.float64
    base = busy_params(dtype)
    cases = {"no lag": base.replace(motor_tau=jnp.asarray(0.0, dtype))}
    for R in (6, 8):
        angle = 2 * np.pi * (np.arange(R) + 0.5) / R
        cases[f"{R} rotors"] = qj.QuadParams.create(
            mass=1.5, inertia=np.diag([0.03, 0.03, 0.05]), k_f=1e-5, k_m=0.016, omega_max=1500.0,
            rotor_positions=np.stack([0.25 * np.cos(angle), 0.25 * np.sin(angle), np.zeros(R)], -1),
            rotor_spins=np.where(np.arange(R) % 2 == 0, 1.0, -1.0), motor_tau=0.03, drag_linear=(0.1, 0.1, 0.2),
            drag_quadratic=(0.01, 0.01, 0.02), rotor_inertia=2e-5, k_p=1e-9, dtype=dtype,
        )
    for name, p in cases.items():
        states, u = _fleet(p, 9, 60, dtype, spread=0.3)
        # three vehicles start on the ground: idle (stays), full throttle (lifts off), one sinks in
        z = jnp.asarray([0.0, 0.0, 0.02] + [5.0] * 6, dtype)
        states = states.replace(position=states.position.at[:, 2].set(z),
                                on_ground=jnp.asarray([1, 1, 0] + [0] * 6, dtype))
        states = states.replace(velocity=states.velocity.at[2].set(jnp.asarray([0.0, 0.0, -3.0], dtype)))
        hover = qj.hover_rotor_speed(p)
        u = u.at[0].set(0.3 * hover).at[1].set(1.5 * hover).at[2].set(0.5 * hover)
        native, xla = _both(lambda b, s, u: _batch(p, s, u, 5e-3, backend=b))
        on_native, on_xla = native(states, u), xla(states, u)
        (fn, sn), (fx, sx) = (on_native.final, on_native.states), (on_xla.final, on_xla.states)
        leaves_close((fn, sn), (fx, sx), **TOL[dtype])
        assert float(sn.on_ground[0, -1]) == 1.0 and float(sn.on_ground[1, -1]) == 0.0, name
        assert float(sn.on_ground[2, -1]) == 1.0 and float(sn.position[2, -1, 2]) == float(p.ground_z), name


def test_per_vehicle_and_nested_batches_broadcast_like_vmap():
    dtype = jnp.float32
    p = busy_params(dtype)
    N, T = 6, 20
    states, u = _fleet(p, N, T, dtype)
    masses = p.mass * jnp.linspace(0.8, 1.2, N).astype(dtype)
    per = p.replace(mass=masses)
    native, xla = _both(lambda b, ps, s, u: _batch(ps, s, u, 1e-3, params_axes=vehicle_axes(ps, "mass"), backend=b))
    leaves_close(native(per, states, u), xla(per, states, u), **TOL[dtype])
    # 3 parameter sets × N vehicles sharing one command sequence: a 2-level vmap
    sets = p.replace(k_f=p.k_f * jnp.asarray([0.95, 1.0, 1.05], dtype))

    def grid(b, sets, s, u):
        one = lambda ps: _batch(ps, s, u[0], 1e-3, commands_axes=None, save_every=0, backend=b).final
        return jax.vmap(one, in_axes=(vehicle_axes(sets, "k_f"),))(sets)

    native, xla = _both(grid)
    out = native(sets, states, u)
    assert out.position.shape == (3, N, 3)
    leaves_close(out, xla(sets, states, u), **TOL[dtype])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_vehicle_gets_the_same_bits_in_any_batch_and_a_bad_one_spoils_nothing_else(dtype):
    """Lanes never mix: a vehicle's result does not depend on batch size or position (full blocks,
    part-filled ones, and batches small enough for the step's half-width copy, rollout.cc's Narrow,
    agree bit for bit), and a NaN command stays in its vehicle."""
    p = busy_params(dtype)
    states, u = _fleet(p, 70, 30, dtype)
    run = jax.jit(lambda s, u: _batch(p, s, u, 1e-3, save_every=0, backend="native").final)
    full = run(states, u)
    for lo, hi in ((0, 1), (33, 36), (40, 70), (64, 70)):
        part = run(jax.tree_util.tree_map(lambda x: x[lo:hi], states), u[lo:hi])
        leaves_equal(part, jax.tree_util.tree_map(lambda x: x[lo:hi], full))
    bad = run(states, u.at[5, 10, 1].set(jnp.nan))
    assert not np.all(np.isfinite(np.asarray(bad.position[5])))
    ok = np.arange(70) != 5
    leaves_equal(jax.tree_util.tree_map(lambda x: x[ok], bad), jax.tree_util.tree_map(lambda x: x[ok], full))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_saved_states_are_written_leaf_by_leaf_with_the_packed_rows_bits(dtype):
    """The engine's saved trajectory comes from the kernel's leaves entry (one result per
    QuadState leaf: no split of packed rows afterwards). Each leaf equals, bit for bit, the packed
    rollout's rows unpacked, for per-vehicle and shared params, nested vmaps, wind and wrench
    series, substeps and save_every > 1; a planted swap of two leaves' offsets would fail it."""
    R, N, T = 4, 11, 12
    fleet = varied_fleet(R, N, dtype, 21)
    stack = lambda xs: jax.tree_util.tree_map(lambda *v: jnp.stack(v), *xs)  # noqa: E731
    ps, ss, us, _ = (stack([v[k] for v in fleet]) for k in range(4))
    rng = np.random.default_rng(3)
    u = jnp.asarray(np.asarray(us)[:, None, :] * rng.uniform(0.97, 1.03, (N, T, R)), dtype)
    wind = jnp.asarray(rng.normal(0, 2, (N, T, 3)), dtype)
    wrench = jnp.asarray(rng.normal(0, 1e-3, (N, T, 6)), dtype)
    x0 = quadjax.native.pack_state(ss)

    def both(p, x, uu, w, e):
        kw = dict(substeps=2, save_every=3)
        packed = quadjax.native.rollout(p, x, uu, 0.01, w, e, **kw)
        leaves = quadjax.native.rollout_states(p, x, uu, 0.01, w, e, **kw)
        return packed, leaves

    for params_axis in (0, None):
        p = ps if params_axis == 0 else jax.tree_util.tree_map(lambda x: x[0], ps)
        run = jax.jit(jax.vmap(both, in_axes=(params_axis, 0, 0, 0, 0)))
        hlo = run.lower(p, x0, u, wind, wrench).as_text()
        assert "quadjax_leaves_" in hlo
        (final_p, saved_p), (final_l, saved_l) = run(p, x0, u, wind, wrench)
        assert saved_l.position.shape == (N, T // 3, 3) and saved_l.energy.shape == (N, T // 3)
        leaves_equal(saved_l, quadjax.native.unpack_state(saved_p, R))
        np.testing.assert_array_equal(final_l, final_p)
    # a 2-level vmap (3 parameter sets x N vehicles) keeps each vehicle's bits
    sets = jax.tree_util.tree_map(lambda x: jnp.stack([x[0]] * 3), ps).replace(k_f=ps.k_f[:3])
    grid = jax.jit(jax.vmap(jax.vmap(both, in_axes=(None, 0, 0, 0, 0)), in_axes=(0, None, None, None, None)))
    (_, saved_p), (_, saved_l) = grid(sets, x0, u, wind, wrench)
    assert saved_l.attitude.shape == (3, N, T // 3, 4)
    leaves_equal(saved_l, quadjax.native.unpack_state(saved_p, R))


def test_backend_choice_is_checked():
    p = busy_params()
    s0 = busy_state(p)
    u = jnp.tile(qj.hover_rotor_speed(p), (5, 1))
    with pytest.raises(ValueError, match="backend='native'.*RK4"):
        qj.simulate(p, s0, 1e-3, commands=u, config=qj.SimConfig(integrator="euler", backend="native"))
    with pytest.raises(ValueError, match="backend='gpu'"):
        qj.simulate(p, s0, 1e-3, commands=u, config=qj.SimConfig(backend="gpu"))


def test_disabled_kernel_falls_back_to_xla():
    code = (
        "import jax.numpy as jnp, quadjax as qj, quadjax.native\n"
        "p = qj.presets.rp1(jnp.float32); s = qj.hover_state(p, (0.0, 0.0, 1.0))\n"
        "assert not quadjax.native.available() and 'QUADJAX_NATIVE=0' in quadjax.native.unavailable_reason()\n"
        "u = jnp.tile(qj.hover_rotor_speed(p), (10, 1))\n"
        "traj = qj.simulate(p, s, 1e-3, commands=u)\n"
        "assert traj.backend == 'xla' and abs(float(traj.final.position[2]) - 1.0) < 1e-4\n"
        "try:\n"
        "    qj.simulate(p, s, 1e-3, commands=u, config=qj.SimConfig(backend='native'))\n"
        "except ValueError as e:\n"
        "    print('FALLBACK-OK', e)\n"
    )
    env = dict(os.environ, QUADJAX_NATIVE="0", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "FALLBACK-OK" in out.stdout, out.stderr[-2000:]


def test_closed_loop_ticks_in_the_kernel_match_xla_and_differentiate_like_it():
    """A closed loop runs each tick's physics in the kernel: same trajectory as XLA to
    rounding (wind and wrench per tick, substeps, a reduction), and its gradient (the adjoint kernel,
    one tick per call) is XLA's."""
    dtype = jnp.float64
    p = busy_params(dtype)
    s0 = busy_state(p, dtype)
    hover = qj.hover_rotor_speed(p)
    T = 30
    rng = np.random.default_rng(3)
    wind = jnp.asarray(rng.normal(0, 2, (T, 3)), dtype)
    wrench = jnp.asarray(rng.normal(0, 0.1, (T, 6)), dtype)

    def law(gain, integral, obs, t):  # a P-I altitude loop with a controller state
        err = 5.0 - obs.position[2]
        return hover * (1.0 + gain * err + 0.1 * integral), integral + 0.01 * err

    def run(backend, gain, hooks=()):
        return qj.simulate(p, s0, 0.01, controller=law, ctrl_params=gain, ctrl_state=jnp.zeros((), dtype),
                           num_ticks=T, inputs=qj.Inputs(wind=wind, wrench=wrench), hooks=hooks,
                           config=qj.SimConfig(substeps=2, backend=backend))

    gain = jnp.asarray(0.3, dtype)
    native, xla = (jax.jit(lambda g, b=b: run(b, g)) for b in ("native", "xla"))
    leaves_close(native(gain), xla(gain), **TOL[dtype])
    peak = jax.jit(lambda g: run("native", g, hooks=(qj.Reduce(lambda c, s: jnp.maximum(c, s.position[2]),
                                                                 jnp.asarray(-jnp.inf, dtype)),)).hooks[0])(gain)
    assert float(peak) == pytest.approx(float(jnp.max(xla(gain).states.position[:, 2])), rel=1e-12)

    def loss(backend, g):
        traj = run(backend, g)
        integral, states = traj.ctrl_state, traj.states
        return jnp.sum(states.position[:, 2] ** 2) + integral

    g_native, g_xla = (jax.jit(jax.grad(lambda g, b=b: loss(b, g)))(gain) for b in ("native", "xla"))
    np.testing.assert_allclose(g_native, g_xla, rtol=1e-10)


_SCALE = {  # field: (low, high) factor on busy_params' value, drawn per vehicle
    "mass": (0.5, 2.0), "k_f": (0.7, 1.3), "k_m": (0.5, 2.0), "motor_tau": (0.0, 2.0), "drag_linear": (0.0, 3.0),
    "drag_quadratic": (0.0, 3.0), "drag_rotational": (0.0, 3.0), "rotor_inertia": (0.0, 3.0), "k_p": (0.0, 3.0),
    "battery_sag": (0.0, 1.0), "wind": (-3.0, 3.0),
}
_RANDOM_FLEET = {}


def _random_fleet_run():
    """One jitted kernel-vs-XLA comparison over per-vehicle parameters (compiled once)."""
    if not _RANDOM_FLEET:
        def both(ps, s, u, dt):
            axes = vehicle_axes(ps, *_SCALE, "omega_min")
            run = lambda b: _batch(ps, s, u, dt, params_axes=axes, save_every=4, substeps=2, backend=b)
            return run("native"), run("xla")

        _RANDOM_FLEET["f"] = jax.jit(both)
    return _RANDOM_FLEET["f"]


@settings(max_examples=12)
@given(seed=st.integers(0, 2**31 - 1), dt=st.sampled_from([1e-3, 4e-3, 1e-2]))
def test_kernel_matches_xla_on_random_vehicles(seed, dt):
    """Property: for random per-vehicle parameters (no-lag vehicles, heavy sag, command clamps
    that bite, gusty wind), random states and commands, the kernel is the XLA model to rounding."""
    dtype = jnp.float64
    N, T = 11, 16
    rng = np.random.default_rng(seed)
    p = busy_params(dtype)
    fields = {}
    for name, (lo, hi) in _SCALE.items():
        base = np.asarray(getattr(p, name))
        draw = rng.uniform(lo, hi, (N,) + base.shape)
        fields[name] = jnp.asarray(draw if name == "wind" else base * draw, dtype)
    fields["motor_tau"] = jnp.where(rng.uniform(size=N) < 0.3, 0.0, fields["motor_tau"])  # some without lag
    hover = float(np.mean(np.asarray(qj.hover_rotor_speed(p))))
    fields["omega_min"] = jnp.asarray(rng.uniform(0.0, 0.9 * hover, N), dtype)
    ps = p.replace(**fields)
    states, u = _fleet(p, N, T, dtype, seed=seed, spread=0.4)
    q = rng.normal(size=(N, 4))
    states = states.replace(attitude=jnp.asarray(q / np.linalg.norm(q, axis=1, keepdims=True), dtype),
                            energy=jnp.asarray(rng.uniform(0, 2e5, N), dtype))
    native, xla = _random_fleet_run()(ps, states, u, jnp.asarray(dt, dtype))
    leaves_close(native, xla, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- the design card's shape


def _scan_of_vmapped(step):
    """A user's own rollout: ``lax.scan`` over ``jax.vmap(step)``, per-vehicle params and commands."""
    def fly(ps, s, u, dt):
        def tick(s, u_t):
            return jax.vmap(step)(ps, s, u_t, dt), None
        return jax.lax.scan(tick, s, jnp.swapaxes(u, 0, 1))[0]
    return fly


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_users_scan_of_vmapped_rk4_step_runs_the_kernel_and_equals_xla(dtype):
    """``lax.scan(jax.vmap(rk4_step))`` on the CPU lowers to the kernel (one call per step for
    the batch, on the state's leaves as they are), equals the XLA form of the step, and equals the engine's kernel rollout bit
    for bit (one generated step, whatever calls it). A fleet of 4 125 vehicles (enough for the
    kernel to hand each thread its share of blocks, each block's commands transposed whole) gives
    each vehicle the bits it gets among the 11."""
    from quadjax.integrators import rk4_step_xla

    T, R = 20, 4
    fleet = varied_fleet(R, 11, dtype, seed=3)
    ps, s, dt = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[(p, s, dt) for p, s, _, dt in fleet])
    rng = np.random.default_rng(0)
    u = jnp.stack([u[None] * rng.uniform(0.9, 1.1, (T, R)) for _, _, u, _ in fleet]).astype(dtype)
    mine = jax.jit(_scan_of_vmapped(qj.rk4_step))
    assert "quadjax_step_" in mine.lower(ps, s, u, dt).as_text()
    xla = jax.jit(_scan_of_vmapped(rk4_step_xla))
    assert "quadjax_" not in xla.lower(ps, s, u, dt).as_text()
    got = mine(ps, s, u, dt)
    leaves_close(got, xla(ps, s, u, dt), **TOL[jnp.float64 if dtype == "float64" else jnp.float32])
    engine = jax.jit(jax.vmap(lambda p, s, u, dt: qj.simulate(
        p, s, dt, commands=u, config=qj.SimConfig(backend="native", save_every=0)).final))
    leaves_equal(got, engine(ps, s, u, dt))
    copies = 375
    tiled = jax.tree_util.tree_map(lambda x: jnp.tile(x, (copies,) + (1,) * (x.ndim - 1)), (ps, s, u, dt))
    many = mine(*tiled)
    leaves_equal(jax.tree_util.tree_map(lambda x: x.reshape((copies, 11) + x.shape[1:]), many),
                 jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (copies,) + x.shape), got))
    # leading batch dims without vmap broadcast as in the XLA form
    one = fleet[0][0]  # one params for the whole batch
    leaves_close(jax.jit(qj.rk4_step)(one, s, u[:, 0], dt), jax.jit(rk4_step_xla)(one, s, u[:, 0], dt),
                 **TOL[jnp.float64 if dtype == "float64" else jnp.float32])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_users_scan_steps_straight_with_the_bits_of_the_general_path(dtype):
    """The step kernel takes the design card's shapes straight (each block's state, params and
    commands vector by vector; rows shared by the fleet loaded once per thread): one params row for
    the fleet with a held wind, or params and wind varied per vehicle (a sweep). Other shapes take the
    general path: here the same 87 vehicles as a 3 x 29 grid whose 29 params rows broadcast over the
    grid's rows. 87 vehicles: whole blocks and a partial one at either lane width. Each form equals the
    XLA form, and each vehicle's bits are the same in all of them and alone."""
    from quadjax.integrators import rk4_step_xla

    N, T = 87, 12
    tol = TOL[jnp.dtype(dtype).type]
    p = qj.presets.rp1(dtype)
    states, u = _fleet(p, N, T, dtype, seed=11, spread=0.3)
    p = p.replace(wind=jnp.asarray([4.0, -2.5, 0.5], dtype))  # held, and felt through the drag
    dt = jnp.asarray(1e-3, dtype)
    rng = np.random.default_rng(4)
    rows = p.replace(mass=p.mass * jnp.asarray(rng.uniform(0.8, 1.2, 29), dtype),
                     wind=jnp.asarray(rng.normal(0, 3, (29, 3)), dtype),
                     inertia=p.inertia * jnp.asarray(rng.uniform(0.8, 1.2, (29, 1, 1)), dtype))
    axes = jax.tree_util.tree_map(lambda x: 0 if x.shape[:1] == (29,) else None, rows)
    swept = jax.tree_util.tree_map(lambda x, a: jnp.tile(x, (3,) + (1,) * (x.ndim - 1)) if a == 0 else x, rows, axes)

    def scan(step, p_axes):
        def tick(p, s, u_t):
            return jax.vmap(step, in_axes=(p_axes, 0, 0, None))(p, s, u_t, dt)
        return jax.jit(lambda p, s, u: jax.lax.scan(lambda s, u_t: (tick(p, s, u_t), None), s, jnp.swapaxes(u, 0, 1))[0])

    def grid(p, s, u):  # the same vehicles as 3 x 29, the params rows broadcast over the 3
        inner = jax.vmap(qj.rk4_step, in_axes=(axes, 0, 0, None))
        outer = jax.vmap(inner, in_axes=(None, 0, 0, None))
        three = lambda x: x.reshape((3, 29) + x.shape[1:])  # noqa: E731
        out = jax.lax.scan(lambda s, u_t: (outer(p, s, u_t, dt), None), jax.tree_util.tree_map(three, s),
                           jnp.swapaxes(three(u), 0, 2).swapaxes(1, 2))[0]
        return jax.tree_util.tree_map(lambda x: x.reshape((N,) + x.shape[2:]), out)

    alone = jax.jit(lambda p, s, u: jax.lax.scan(lambda s, u_t: (qj.rk4_step(p, s, u_t, dt), None), s, u)[0])
    shared = scan(qj.rk4_step, None)(p, states, u)
    leaves_close(shared, scan(rk4_step_xla, None)(p, states, u), **tol)
    assert not np.allclose(shared.velocity, scan(qj.rk4_step, None)(p.replace(wind=0 * p.wind), states, u).velocity)
    each = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), p)  # per vehicle, all equal
    leaves_equal(shared, scan(qj.rk4_step, 0)(each, states, u))
    got = scan(qj.rk4_step, axes)(swept, states, u)
    leaves_close(got, scan(rk4_step_xla, axes)(swept, states, u), **tol)
    leaves_equal(got, jax.jit(grid)(rows, states, u))
    for v in (0, 15, 16, 47, N - 1):
        one = jax.tree_util.tree_map(lambda x: x[v], states)
        leaves_equal(jax.tree_util.tree_map(lambda x: x[v], shared), alone(p, one, u[v]))
        mine = jax.tree_util.tree_map(lambda x, a: x[v % 29] if a == 0 else x, rows, axes)
        leaves_equal(jax.tree_util.tree_map(lambda x: x[v], got), alone(mine, one, u[v]))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_rk4_step_batches_any_way_like_the_xla_form_and_each_vehicle_keeps_its_bits(dtype):
    """The step kernel's own batching (one call, vehicle-minor, its state updated in place):
    vmap over the state only, over the params only (the state shared: nothing updated in
    place), one leaf left unbatched, vmap of vmap with the vmapped axis not first, and whole
    blocks (16 vehicles) beside partial ones. Each equals the XLA form, and each vehicle's
    result is bit for bit the one it gets stepped alone."""
    from quadjax.integrators import rk4_step_xla

    tol = TOL[jnp.float64 if dtype == "float64" else jnp.float32]
    fleet = varied_fleet(4, 16, dtype, seed=5)
    ps, s, u, dt = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *fleet)
    p0, s0, u0, dt0 = fleet[0]
    step = jax.jit(qj.rk4_step)
    alone = [step(*f) for f in fleet]
    energy_shared = s.replace(**{f: None if f == "energy" else 0 for f in s.__dataclass_fields__})
    cases = {  # name: (how the step is batched, its arguments)
        "state": (lambda f: jax.vmap(lambda s, u: f(p0, s, u, dt0)), (s, u)),
        "params": (lambda f: jax.vmap(lambda p, dt: f(p, s0, u0, dt)), (ps, dt)),
        "energy shared": (lambda f: jax.vmap(f, in_axes=(0, energy_shared, 0, 0)), (ps, s.replace(energy=s0.energy), u, dt)),
    }
    for name, (batched, args) in cases.items():
        mine = jax.jit(batched(qj.rk4_step))
        leaves_close(mine(*args), jax.jit(batched(rk4_step_xla))(*args), **tol)
        assert "quadjax_step_" in mine.lower(*args).as_text(), name
    leaves_equal(jax.jit(jax.vmap(qj.rk4_step))(ps, s, u, dt), jax.tree_util.tree_map(lambda *x: jnp.stack(x), *alone))
    # 2 x 8 vehicles: the outer vmap over axis 1 of the state and commands, the inner over params
    grid = lambda f: jax.vmap(jax.vmap(f, in_axes=(0, 0, 0, 0)), in_axes=(None, 1, 1, None))  # noqa: E731
    two = lambda x: x.reshape((2, 8) + x.shape[1:])  # noqa: E731
    pg, dg = jax.tree_util.tree_map(lambda x: x[:8], ps), dt[:8]
    sg = jax.tree_util.tree_map(lambda x: jnp.swapaxes(two(x), 0, 1), s)
    ug = jnp.swapaxes(two(u), 0, 1)
    got = jax.jit(grid(qj.rk4_step))(pg, sg, ug, dg)
    assert got.position.shape == (2, 8, 3)
    leaves_close(got, jax.jit(grid(rk4_step_xla))(pg, sg, ug, dg), **tol)
    for i in range(2):
        for j in range(8):
            one = jax.tree_util.tree_map(lambda x: x[j], pg), jax.tree_util.tree_map(lambda x: x[j, i], sg)
            leaves_equal(jax.tree_util.tree_map(lambda x: x[i, j], got), step(*one, ug[j, i], dg[j]))


def test_derivatives_of_rk4_step_on_the_kernel_equal_xla_and_finite_differences():
    """grad, jvp, jacfwd, vmap(grad) and checkpoint of a loss over a scan of the kernel's
    rk4_step run in the adjoint / tangent kernels and equal those of the XLA form (to 1e-10)
    and central finite differences."""
    from quadjax.integrators import rk4_step_xla

    dtype, T = "float64", 30
    (p, s, u, dt), = varied_fleet(4, 1, dtype, seed=21)
    p = p.replace(ground_z=jnp.asarray(-10.0, dtype))  # airborne throughout: smooth in every input

    def loss(step, mass, k_f, s0, remat=False):
        q = p.replace(mass=mass, k_f=k_f)
        body = jax.checkpoint(lambda x: step(q, x, u, dt)) if remat else (lambda x: step(q, x, u, dt))
        final = jax.lax.scan(lambda x, _: (body(x), None), s0, None, length=T)[0]
        return jnp.sum(final.position ** 2) + jnp.sum(final.body_rates ** 2)

    args = (p.mass, p.k_f, s)
    g_xla = jax.jit(jax.grad(lambda *a: loss(rk4_step_xla, *a), argnums=(0, 1, 2)))(*args)
    for remat in (False, True):
        grad = jax.jit(jax.grad(lambda *a: loss(qj.rk4_step, *a, remat), argnums=(0, 1, 2)))
        assert "quadjax_adjoint_" in grad.lower(*args).as_text()
        leaves_close(grad(*args), g_xla, rtol=1e-10, atol=1e-12)
    def tangent(step):  # one step's tangent along (mass, body rates) at once
        move = lambda m, w: step(p.replace(mass=m), s.replace(body_rates=w), u, dt)
        return jax.jit(lambda: jax.jvp(move, (p.mass, s.body_rates), (jnp.ones((), dtype), jnp.ones(3, dtype)))[1])()

    leaves_close(tangent(qj.rk4_step), tangent(rk4_step_xla), rtol=1e-10, atol=1e-14)
    move = lambda m: qj.rk4_step(p.replace(mass=m), s, u, dt)  # noqa: E731
    assert "quadjax_tangent_" in jax.jit(lambda m: jax.jvp(move, (m,), (m,))[1]).lower(p.mass).as_text()
    # in the state alone (the params and dt not differentiated): the kernels without the params' terms
    grad_s = jax.jit(jax.grad(lambda x: loss(qj.rk4_step, p.mass, p.k_f, x)))
    assert "quadjax_adjoint_fixed_" in grad_s.lower(s).as_text()
    leaves_close(grad_s(s), g_xla[2], rtol=1e-10, atol=1e-12)
    jac_of = jax.jit(jax.jacfwd(lambda v: qj.rk4_step(p, s.replace(velocity=v), u, dt).position))
    # 3 tangents: one group of the multi-tangent kernel (padded with a zero tangent), params fixed
    assert "quadjax_tangents_fixed_" in jac_of.lower(s.velocity).as_text()
    jac = jac_of(s.velocity)
    jac_xla = jax.jit(jax.jacfwd(lambda v: rk4_step_xla(p, s.replace(velocity=v), u, dt).position))(s.velocity)
    np.testing.assert_allclose(jac, jac_xla, rtol=1e-10, atol=1e-14)
    masses = p.mass * jnp.asarray([0.9, 1.0, 1.1], dtype)
    per = jax.jit(jax.vmap(jax.grad(lambda m: loss(qj.rk4_step, m, p.k_f, s))))(masses)
    np.testing.assert_allclose(per[1], g_xla[0], rtol=1e-10)
    value = jax.jit(lambda m: loss(qj.rk4_step, m, p.k_f, s))
    for m, g_m in zip(masses, per):
        h = 1e-6 * float(m)
        # central differences: truncation ~h², rounding ~eps·loss/h ≈ 1e-9 here
        np.testing.assert_allclose(g_m, (value(m + h) - value(m - h)) / (2 * h), rtol=1e-6, atol=1e-8)
