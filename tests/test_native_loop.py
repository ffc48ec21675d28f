"""The engine's closed loop in one native call (quadjax.native.loop, issue 14): under ``jax.vmap``
on the CPU, ``simulate(controller=...)``'s own tick (controller, held command's RK4 substeps,
monitor, hooks, status codes and freezing) is generated into vector-lane C++ and the whole horizon
runs in one call.

* PID and geometric control, float32 and float64, per-vehicle params: final state, controller
  state, fold and status equal the XLA backend's, and the compiled program holds the native call;
* shared params (in_axes None), N not a multiple of the lane count;
* a hook that stops vehicles at different ticks: the same codes, ticks and frozen states;
* integers in the float lanes: a toy controller with negative quotients, remainders and
  float → int truncation equals plain Python exactly;
* a tick the generator cannot compile (bitwise integer arithmetic) falls back with a warning
  naming the primitive, and flies the same;
* ``jax.grad`` around the vmap: the same gradient as the XLA backend;
* series streamed in (per-vehicle wind, a shared wrench, replayed commands) and ticks saved out
  (states, commands, the monitor, a hook), both dtypes; an n-way ``select_n`` compiles.
"""

import dataclasses
import functools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import native
from quadjax.engine import Hook, Reduce
from tests.helpers import closed_loop_case, worst_relative

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler")
TOL = {jnp.float32: 1e-5, jnp.float64: 1e-12}


def _fleet(args, backend, hooks=None, in_axes=(0, 0, 0)):
    """jit(vmap(simulate)) over (params, state0, ctrl_state) of closed_loop_case's arguments."""
    a = args
    hooks = (Reduce(a["fold"], a["fold_init"]),) if hooks is None else hooks

    def one(p1, s, cs):
        tr = qj.simulate(p1, s, a["dt"], controller=a["controller"], ctrl_params=a["ctrl_params"], ctrl_state=cs,
                         num_ticks=a["num_ticks"], hooks=hooks,
                         config=qj.SimConfig(backend=backend, substeps=a["substeps"], save_every=0))
        return tr.final, tr.ctrl_state, tr.hooks, tr.status, tr.status_tick

    return jax.jit(jax.vmap(one, in_axes=in_axes))


@pytest.mark.parametrize("name,dtype", [("pid", jnp.float32), ("pid", jnp.float64), ("geometric", jnp.float32),
                                        ("geometric", jnp.float64)])
def test_the_engine_closed_loop_runs_native_and_equals_xla(name, dtype):
    case = closed_loop_case(name, dtype)
    a = case["args"]
    fleet = _fleet(a, "native")
    assert "quadjax_loop_" in fleet.lower(a["params"], a["state0"], a["ctrl_state"]).as_text()
    final, cs, (acc,), status, _ = fleet(a["params"], a["state0"], a["ctrl_state"])
    ref_final, ref_cs, ref_acc = case["reference"]
    assert float(jnp.min(acc)) > 0.07  # the fold saw the flight (the start is 0.077 m off the target)
    assert worst_relative(final, ref_final) <= TOL[dtype]
    assert worst_relative(cs, ref_cs) <= TOL[dtype] * 10  # integrators and filters: rounding amplified by 1/h
    assert worst_relative(acc, ref_acc) <= TOL[dtype]
    assert np.all(np.asarray(status) == 0) and final.position.dtype == dtype
    assert all(x.dtype == y.dtype for x, y in zip(jax.tree_util.tree_leaves(cs), jax.tree_util.tree_leaves(ref_cs)))
    if name == "pid":
        assert np.all(np.asarray(cs.tick) == a["num_ticks"])  # the int counter, carried exactly


def test_a_fresh_process_reads_the_ticks_kept_source_instead_of_generating_it(monkeypatch):
    """The tick's C++ is kept in the kernel cache under its key (the tick's jaxpr, constants and
    avals: quadjax.native.source_key): flown again with no memo in the process (as a fresh process
    would), nothing is generated and the flight is the same, bit for bit."""
    from quadjax.native import loop

    made = []
    real = loop.generate_kernel
    monkeypatch.setattr(loop, "generate_kernel", lambda *a, **k: made.append(k["namespace"]) or real(*a, **k))
    monkeypatch.setattr(loop, "_kernel", loop._kernel.__wrapped__)  # no memo: every trace looks for its kernel
    a = closed_loop_case("pid", jnp.float32)["args"]
    first = _fleet(a, "native")(a["params"], a["state0"], a["ctrl_state"])
    made.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # not fallen back to XLA
        again = _fleet(a, "native")(a["params"], a["state0"], a["ctrl_state"])
    assert made == []
    for x, y in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(x, y)


def test_shared_params_and_a_partial_block():
    """Params shared by all N = 11 vehicles (not a multiple of the 4 float64 lanes), states
    scattered: each vehicle equals its XLA flight."""
    case = closed_loop_case("pid", jnp.float64, n=11, ticks=20, reference=False)
    a = case["args"]
    one_p = jax.tree_util.tree_map(lambda x: x[0], a["params"])
    got = _fleet(a, "native", in_axes=(None, 0, 0))(one_p, a["state0"], a["ctrl_state"])
    ref = _fleet(a, "xla", in_axes=(None, 0, 0))(one_p, a["state0"], a["ctrl_state"])
    assert got[0].position.shape == (11, 3)
    assert worst_relative(got[:3], ref[:3]) <= 1e-12


@dataclasses.dataclass(frozen=True)
class _SpeedLimit(Hook):
    """Stops a vehicle (code 42) the tick its speed exceeds ``limit`` [m/s]."""

    limit: float

    def init(self, params, state0, dt):
        return jnp.zeros((), jnp.int32)

    def update(self, carry, tick):
        fast = jnp.linalg.norm(tick.after.velocity) > self.limit
        return carry + 1, jnp.where(fast, 42, 0).astype(jnp.int32), None

    def result(self, carry):
        return carry


def test_stopped_vehicles_freeze_with_the_same_codes_and_ticks():
    """A hook stops the vehicles whose speed passes 0.12 m/s, each at its own tick: status 42, the
    tick, the frozen state and the hook's count equal XLA's; the others fly on (status 0)."""
    case = closed_loop_case("pid", jnp.float64, n=8, ticks=60, reference=False)
    a = case["args"]
    rng = np.random.default_rng(3)
    s0 = a["state0"].replace(velocity=jnp.asarray(rng.uniform(-0.12, 0.12, (8, 3)), jnp.float64))
    hooks = (_SpeedLimit(0.12),)
    got = _fleet(a, "native", hooks=hooks)(a["params"], s0, a["ctrl_state"])
    ref = _fleet(a, "xla", hooks=hooks)(a["params"], s0, a["ctrl_state"])
    status, ticks = np.asarray(got[3]), np.asarray(got[4])
    assert 0 < np.sum(status == 42) < 8 and len(set(ticks[status == 42])) > 1  # some stopped, at different ticks
    np.testing.assert_array_equal(status, ref[3])
    np.testing.assert_array_equal(ticks, ref[4])
    assert worst_relative(got[:3], ref[:3]) <= 1e-12


def _integer_controller(ctrl, cs, state, t):
    """A toy controller whose state is integer arithmetic with negative operands: C's truncating
    quotient and remainder, floor division, float → int truncation of negative values."""
    k = cs["k"]
    q = (k - 7) // 2                      # floor: −4 for k = 0 (lax.div, rem, sign, select)
    r = jax.lax.rem(k - 7, jnp.int32(3))  # sign of the dividend
    f = (-1000.0 * t - 0.5).astype(jnp.int32)  # toward zero
    nxt = {"k": k + 1, "acc": cs["acc"] + q * 100 + r * 10 + f, "m": jnp.maximum(cs["m"], jnp.abs(q - r))}
    command = ctrl * (1.0 + 0.001 * (k % 2).astype(state.position.dtype))
    return command, nxt


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_integers_in_float_lanes_are_exact(dtype):
    p = qj.presets.rp1(dtype)
    s0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (3,) + x.shape), qj.hover_state(p))
    cs0 = {"k": jnp.zeros(3, jnp.int32), "acc": jnp.array([0, -5, 9], jnp.int32), "m": jnp.zeros(3, jnp.int32)}

    def one(s, cs, backend):
        return qj.simulate(p, s, 0.002, controller=_integer_controller, ctrl_params=qj.hover_rotor_speed(p),
                           ctrl_state=cs, num_ticks=25, config=qj.SimConfig(backend=backend, save_every=0))

    got = jax.jit(jax.vmap(lambda s, cs: one(s, cs, "native")))(s0, cs0)
    ref = jax.jit(jax.vmap(lambda s, cs: one(s, cs, "xla")))(s0, cs0)
    assert got.backend == "native"
    acc, m = [0, -5, 9], 0  # in plain Python: floor quotient, C remainder, truncation toward zero of t
    for k in range(25):
        t = np.dtype(dtype).type(k) * np.dtype(dtype).type(0.002)
        q, r = (k - 7) // 2, int(np.fmod(k - 7, 3))
        f = int(np.trunc(np.dtype(dtype).type(-1000.0) * t - np.dtype(dtype).type(0.5)))
        acc, m = [a + q * 100 + r * 10 + f for a in acc], max(m, abs(q - r))
    assert got.ctrl_state["acc"].dtype == jnp.int32
    assert list(np.asarray(got.ctrl_state["acc"])) == acc and int(got.ctrl_state["m"][0]) == m
    np.testing.assert_array_equal(got.ctrl_state["k"], ref.ctrl_state["k"])
    assert worst_relative(got.final, ref.final) <= TOL[dtype]


def test_a_tick_it_cannot_compile_falls_back_naming_the_primitive():
    def flags(ctrl, cs, state, t):
        return ctrl, (cs + 1) & 7

    p = qj.presets.rp1(jnp.float32)
    s0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (2,) + x.shape), qj.hover_state(p))

    def one(s, backend):
        return qj.simulate(p, s, 0.002, controller=flags, ctrl_params=qj.hover_rotor_speed(p),
                           ctrl_state=jnp.zeros((), jnp.int32), num_ticks=10,
                           config=qj.SimConfig(backend=backend, save_every=0))

    with pytest.warns(RuntimeWarning, match="bitwise 'and'"):
        got = jax.jit(jax.vmap(lambda s: one(s, "native")))(s0)
    ref = jax.jit(jax.vmap(lambda s: one(s, "xla")))(s0)
    np.testing.assert_array_equal(got.ctrl_state, [2, 2])  # (10 mod 8)
    assert worst_relative(got.final, ref.final) <= 1e-5


def test_grad_around_the_fleet_equals_xla():
    """d(mean fold)/d(mass scale) through vmap(simulate) on the native backend (its JVP is the same
    ticks on XLA) equals the XLA backend's."""
    case = closed_loop_case("pid", jnp.float64, n=3, ticks=15, reference=False)
    a = case["args"]

    def loss(scale, backend):
        ps = a["params"].replace(mass=a["params"].mass * scale)
        return jnp.mean(_fleet(a, backend)(ps, a["state0"], a["ctrl_state"])[2][0])

    g_native = jax.jit(jax.grad(lambda x: loss(x, "native")))(jnp.float64(1.0))
    g_xla = jax.jit(jax.grad(lambda x: loss(x, "xla")))(jnp.float64(1.0))
    assert abs(float(g_native)) > 1e-6 and abs(float(g_native - g_xla)) <= 1e-10 * (1 + abs(float(g_xla)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("every", [1, 4])
def test_series_in_and_saved_outputs_out(dtype, every):
    """Streamed series and saved ticks go through the one native call: per-vehicle wind and a
    wrench shared by the fleet read at each tick's index; states, commands and the monitor
    saved every ``every``-th tick (the monitor checks every tick); all equal the XLA backend's."""
    case = closed_loop_case("pid", dtype, n=11, ticks=40, reference=False)
    a = case["args"]
    T = a["num_ticks"]
    rng = np.random.default_rng(1)
    wind = jnp.asarray(rng.normal(0, 2, (11, T, 3)), dtype)
    wrench = jnp.asarray(rng.normal(0, 0.05, (T, 6)), dtype)

    def fleet(backend):
        def one(p1, s, cs, w):
            tr = qj.simulate(p1, s, a["dt"], controller=a["controller"], ctrl_params=a["ctrl_params"], ctrl_state=cs,
                             num_ticks=T, inputs=qj.Inputs(wind=w, wrench=wrench),
                             config=qj.SimConfig(backend=backend, substeps=2, save_every=every, check="monitor",
                                                 save=("state", "command")))
            return tr.final, tr.states, tr.commands, tr.status, tr.report

        return jax.jit(jax.vmap(one))

    args = (a["params"], a["state0"], a["ctrl_state"], wind)
    assert "quadjax_loop_" in fleet("native").lower(*args).as_text()
    got, ref = fleet("native")(*args), fleet("xla")(*args)
    assert got[1].position.shape == (11, T // every, 3) and got[2].shape == (11, T // every, 4)
    assert float(jnp.std(got[0].velocity[:, 0])) > 1e-3  # the wind series moved them apart
    np.testing.assert_array_equal(got[3], ref[3])
    assert worst_relative(got[:3], ref[:3]) <= TOL[dtype] * 10
    assert worst_relative(got[4], ref[4]) <= TOL[dtype] * 10  # the monitor's figures


def test_saved_outputs_that_nothing_reads_are_not_saved():
    """The default SimConfig saves every tick's state and command. A fleet that reads only its final
    state runs the native call that save_every=0 runs, with the same bits; one that reads only the
    saved positions saves only them, the other leaves with no slots, and has the XLA backend's
    values (quadjax.native.loop._unread)."""
    case = closed_loop_case("pid", jnp.float64, n=11, ticks=40, reference=False)
    a = case["args"]
    args = (a["params"], a["state0"], a["ctrl_state"])

    def fleet(read, **config):
        def one(p1, s, cs):
            return read(qj.simulate(p1, s, a["dt"], controller=a["controller"], ctrl_params=a["ctrl_params"],
                                    ctrl_state=cs, num_ticks=a["num_ticks"], config=qj.SimConfig(substeps=2, **config)))
        return jax.jit(jax.vmap(one))

    def results(fn):  # of the loop's native call: the carry's shape, then each saved leaf's
        (line,) = [x for x in fn.lower(*args).compile().as_text().splitlines() if 'custom_call_target="quadjax_loop_' in x]
        return re.findall(r"\[[\d,]*\]", line.split(" custom-call(")[0])

    final = lambda tr: (tr.final, tr.ctrl_state, tr.status)
    default, unsaved = fleet(final, backend="native"), fleet(final, backend="native", save_every=0)
    assert qj.SimConfig().save_every == 1 and len(results(default)) == 1 and results(default) == results(unsaved)
    np.testing.assert_equal([np.asarray(x) for x in jax.tree_util.tree_leaves(default(*args))],
                            [np.asarray(x) for x in jax.tree_util.tree_leaves(unsaved(*args))])
    positions = lambda backend: fleet(lambda tr: tr.states.position, backend=backend, save_every=4)
    saved = results(positions("native"))[1:]
    assert saved.count("[11,10,3]") == 1 and len(saved) > 1 and all(
        x == "[11,10,3]" or x.startswith("[11,0,") for x in saved), saved
    np.testing.assert_allclose(positions("native")(*args), positions("xla")(*args), rtol=1e-10, atol=1e-12)


def test_replayed_commands_with_a_hook_stream_in():
    """An open loop with per-tick work (replayed commands, a hook) runs in the one native call,
    each vehicle's commands read at each tick: equal to XLA's, hook and saved states too. 300 saved
    ticks: more than a block holds (16 to 128 slots, SavedSlots), written in whole runs and a part run."""
    p = qj.presets.rp1(jnp.float64)
    n, T = 5, 300
    hover = qj.hover_rotor_speed(p)
    commands = hover * (1 + 0.02 * jnp.asarray(np.random.default_rng(2).normal(size=(n, T, 4))))
    s0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), qj.hover_state(p))

    def fleet(backend):
        def one(s, u):
            tr = qj.simulate(p, s, 0.002, commands=u, num_ticks=T, hooks=(_SpeedLimit(10.0),),
                             config=qj.SimConfig(backend=backend, save_every=1, save=("state",)))
            return tr.final, tr.states, tr.hooks

        return jax.jit(jax.vmap(one))

    assert "quadjax_loop_" in fleet("native").lower(s0, commands).as_text()
    got, ref = fleet("native")(s0, commands), fleet("xla")(s0, commands)
    assert float(jnp.std(got[0].body_rates[:, 0])) > 1e-4  # the commands differ per vehicle
    assert worst_relative(got, ref) <= 1e-12


def _mode_controller(ctrl, cs, state, t):
    """An n-way choice on an integer mode (jnp.select: ``select_n`` with four cases)."""
    mode = cs % 4
    gain = jnp.select([mode == 0, mode == 1, mode == 2], [1.0, 1.01, 0.99], 1.02).astype(state.position.dtype)
    return ctrl * gain, cs + 1


def test_a_select_of_more_than_two_cases_compiles():
    p = qj.presets.rp1(jnp.float64)
    s0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (3,) + x.shape), qj.hover_state(p))
    cs0 = jnp.array([0, 1, 2], jnp.int32)

    def one(s, cs, backend):
        return qj.simulate(p, s, 0.002, controller=_mode_controller, ctrl_params=qj.hover_rotor_speed(p),
                           ctrl_state=cs, num_ticks=21, config=qj.SimConfig(backend=backend, save_every=0)).final

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        got = jax.jit(jax.vmap(lambda s, cs: one(s, cs, "native")))(s0, cs0)
    ref = jax.jit(jax.vmap(lambda s, cs: one(s, cs, "xla")))(s0, cs0)
    assert float(jnp.std(got.velocity[:, 2])) > 0  # the modes differ per vehicle
    assert worst_relative(got, ref) <= 1e-12


@functools.cache
def _property_reference(name, dtype):
    """XLA's fleet with the controller an argument: one program for every preset and draw of gains
    (a program per draw was 3-4 s of XLA's compile each)."""
    return _property_fleet(name, dtype, "xla")


def _property_fleet(name, dtype, backend, ctrl=None):
    """jit(vmap(simulate)) closed over the controller ``ctrl`` (as a user flies one: its layout
    known, the mixer's closed form): per-vehicle params. Each draw of gains retraces; the kernel is
    reused (floats are the kernel's inputs, not its code). ``ctrl`` None: the controller is the
    fleet's fourth argument, shared by the vehicles."""
    from quadjax.control import CascadeRates, geometric_control, pid_control
    from quadjax.engine import Reduce

    law = functools.partial(pid_control, rates=CascadeRates(dt=0.002)) if name == "pid" else geometric_control

    def one(p1, s, cs, c):
        def worst(acc, state):
            return jnp.maximum(acc, jnp.linalg.norm(state.position - c.reference.position))

        tr = qj.simulate(p1, s, 0.002, controller=law, ctrl_params=c, ctrl_state=cs, num_ticks=30,
                         hooks=(Reduce(worst, jnp.zeros((), dtype)),),
                         config=qj.SimConfig(backend=backend, substeps=2, save_every=0))
        return tr.final, tr.ctrl_state, tr.hooks[0], tr.status

    if ctrl is None:
        return jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None)))
    return jax.jit(jax.vmap(lambda p1, s, cs: one(p1, s, cs, ctrl)))


@pytest.mark.parametrize("name,dtype", [("pid", jnp.float64), ("geometric", jnp.float64), ("pid", jnp.float32)])
def test_property_random_vehicles_gains_and_presets(name, dtype):
    """Property: over presets (RP-1, Crazyflie 2.1, Iris), gains drawn ±25 % around the defaults,
    and 6 vehicles each with its own mass, full inertia (products of inertia too), k_f, k_m,
    motor lag, drags and start, the native closed loop equals XLA's: final state and fold to
    1e-10 in float64 (1e-5 in float32), controller state to 10× that (integrators amplify the
    rounding by 1/h), the same status."""
    from quadjax.control import GeometricController, Hover, PIDController, geometric_init, pid_init

    rng = np.random.default_rng({"pid": 11, "geometric": 12}[name] + (dtype == jnp.float32))
    tol = 1e-10 if dtype == jnp.float64 else 1e-5
    n = 6
    for preset in ("rp1", "crazyflie21", "iris"):
        p = qj.presets.get(preset, dtype=dtype)
        target = jnp.asarray(np.asarray(CLOSED_LOOP_TARGET_SCALE) * float(jnp.max(jnp.abs(p.rotor_positions))), dtype)
        hover = Hover(position=target, yaw=jnp.asarray(rng.uniform(-0.1, 0.1), dtype))
        make, init = (PIDController, pid_init) if name == "pid" else (GeometricController, geometric_init)
        ctrl = make.create(p, hover)
        ctrl = ctrl.replace(gains=jax.tree_util.tree_map(
            lambda g: (g * rng.uniform(0.75, 1.25, np.shape(g))).astype(dtype), ctrl.gains))

        def u(lo, hi, shape=()):
            return jnp.asarray(rng.uniform(lo, hi, (n,) + shape), dtype)

        # a common scale, a little per axis (the moments must keep J_xx + J_yy ≥ J_zz: Iris is 5 % from
        # the bound) and small products of inertia
        products = u(-0.01, 0.01, (3,)) * jnp.min(jnp.diag(p.inertia))
        diagonal = jnp.diag(p.inertia) * u(0.9, 1.1)[:, None] * u(0.98, 1.02, (3,))
        inertia = jax.vmap(lambda d, c: jnp.diag(d) + jnp.asarray([[0, c[0], c[1]], [c[0], 0, c[2]], [c[1], c[2], 0]],
                                                                   dtype))(diagonal, products)
        ps = jax.vmap(lambda m, J, kf, km, tau, dl: p.replace(mass=p.mass * m, inertia=J, k_f=p.k_f * kf,
                                                               k_m=p.k_m * km, motor_tau=p.motor_tau * tau,
                                                               drag_linear=p.drag_linear * dl))(
            u(0.9, 1.1), inertia, u(0.9, 1.1), u(0.9, 1.1), u(0.8, 1.2), u(0.5, 1.5, (3,)))
        assert bool(jnp.all(jax.vmap(qj.params_valid)(ps)))
        s0 = jax.vmap(lambda v, w: qj.hover_state(p).replace(velocity=v, body_rates=w))(u(-0.05, 0.05, (3,)),
                                                                                      u(-0.05, 0.05, (3,)))
        cs0 = jax.vmap(lambda s: init(ctrl, s))(s0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # compiled, not fallen back
            got = _property_fleet(name, dtype, "native", ctrl)(ps, s0, cs0)
        ref = _property_reference(name, dtype)(ps, s0, cs0, ctrl)
        assert float(jnp.std(got[0].position[:, 2])) > 0  # the vehicles differ
        np.testing.assert_array_equal(got[3], ref[3])
        assert worst_relative((got[0], got[2]), (ref[0], ref[2])) <= tol, preset
        assert worst_relative(got[1], ref[1]) <= 10 * tol, preset


#: the property test's target, in units of the preset's arm length (near the start: far targets
#: saturate the mixer, see tests/helpers.CLOSED_LOOP_TARGET)
CLOSED_LOOP_TARGET_SCALE = (0.4, -0.25, 0.4)
