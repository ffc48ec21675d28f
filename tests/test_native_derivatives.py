"""The kernel's own derivatives (quadjax.native: rollout_p, tangent_p, adjoint_p).

jax.jvp of a native rollout runs the generated tangent kernel and jax.grad the generated reverse
sweep, each one call for the whole horizon; these tests hold them to the derivatives of the
engine's XLA path (an independent implementation of the stepping) and to finite differences:
every QuadParams leaf varied per vehicle or shared by the fleet, the initial state, the commands,
wind and wrench series and dt; substeps, saved states, the recomputed segments of the reverse
sweep, vmap, second derivatives (XLA's, through the same primitives), and both dtypes.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.native as native
from tests.helpers import leaves_close, varied_fleet

pytestmark = pytest.mark.skipif(not native.available(), reason=f"native kernel: {native.unavailable_reason()}")

N, T, SUBSTEPS, SAVE = 5, 12, 2, 6


def _fleet(dtype, seed=5):
    """N airborne vehicles, every params leaf drawn per vehicle, wind and wrench series."""
    fleet = varied_fleet(4, N, dtype, seed)
    stack = lambda xs: jax.tree_util.tree_map(lambda *v: jnp.stack(v), *xs)  # noqa: E731
    ps, ss, us, dts = (stack([v[k] for v in fleet]) for k in range(4))
    ps = ps.replace(ground_z=jnp.full((N,), -50.0, dtype))  # airborne throughout: smooth in every input
    ss = ss.replace(on_ground=jnp.zeros((N,), dtype))
    rng = np.random.default_rng(seed)
    u = jnp.asarray(np.asarray(us)[:, None, :] * rng.uniform(0.97, 1.03, (N, T, 4)), dtype)
    wind = jnp.asarray(rng.normal(0, 2, (N, T, 3)), dtype)
    wrench = jnp.asarray(rng.normal(0, 1e-3, (N, T, 6)), dtype) * ps.mass[:, None, None]
    return ps, ss, u, wind, wrench, dts


def _loss(backend, shared):
    """A loss of the final and the saved states of the whole fleet, as a function of every input."""
    config = qj.SimConfig(backend=backend, substeps=SUBSTEPS, save_every=SAVE)

    def one(p, s, u, wind, wrench, dt):
        traj = qj.simulate(p, s, dt, commands=u, inputs=qj.Inputs(wind=wind, wrench=wrench), config=config)
        f, saved = traj.final, traj.states
        return (jnp.sum(f.position ** 2) + jnp.sum(f.velocity * f.body_rates) + jnp.sum(jnp.sin(saved.attitude))
                + 1e-6 * jnp.sum(saved.rotor_speeds) + 1e-3 * f.energy)

    def loss(p, s, u, wind, wrench, dt):
        return jnp.sum(jax.vmap(one, in_axes=(None if shared else 0, 0, 0, 0, 0, 0))(p, s, u, wind, wrench, dt))

    return loss


def _targets(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text()


def _inputs(dtype, shared):
    """The fleet's inputs to :func:`_loss`: one parameter set for all when ``shared``."""
    ps, ss, u, wind, wrench, dts = _fleet(dtype)
    return (jax.tree_util.tree_map(lambda x: x[0], ps) if shared else ps), ss, u, wind, wrench, dts


@functools.cache
def _xla_gradient(dtype, shared):
    """XLA's gradient of :func:`_loss` in all six inputs: the reference both first-order tests hold
    the kernels to. Its program is the largest this file compiles (20-25 s here): computed once, in
    the one worker that runs the tests marked XLA_GRADIENT."""
    return jax.jit(jax.grad(_loss("xla", shared), argnums=tuple(range(6))))(*_inputs(dtype, shared))


# the tests that hold the kernels to _xla_gradient run in one pytest-xdist worker (--dist loadgroup in
# pyproject.toml), so that it is compiled once: run side by side, each worker compiled it for itself
XLA_GRADIENT = pytest.mark.xdist_group("xla_gradient")


@XLA_GRADIENT
@pytest.mark.parametrize("dtype, shared", [("float64", False), ("float32", True)],
                         ids=["float64, per-vehicle params", "float32, shared params"])
def test_grad_and_jvp_run_in_the_native_kernels_and_equal_xla(dtype, shared):
    args = _inputs(dtype, shared)
    grad = jax.grad(_loss("native", shared), argnums=tuple(range(6)))
    hlo = _targets(grad, *args)
    assert "quadjax_adjoint_" in hlo and "quadjax_tangent_" not in hlo  # reverse mode: one sweep, no tangents
    g_native, g_xla = jax.jit(grad)(*args), _xla_gradient(dtype, shared)
    rtol = 1e-10 if dtype == "float64" else 2e-3
    for a, b in zip(jax.tree_util.tree_leaves(g_native), jax.tree_util.tree_leaves(g_xla)):
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = float(np.max(np.abs(b)))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)
    assert float(jnp.max(jnp.abs(g_native[3]))) > 0 and float(jnp.max(jnp.abs(g_native[4]))) > 0  # wind, wrench

    rng = np.random.default_rng(1)
    direction = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype) * 1e-3 * (
        jnp.abs(x) + 1e-3), args)
    jvp = lambda *a: jax.jvp(_loss("native", shared), a, direction)  # noqa: E731
    hlo = _targets(jvp, *args)
    # forward mode: one tangent-kernel call gives the primal as well, no forward kernel beside it
    assert "quadjax_tangent_" in hlo and "quadjax_rollout_" not in hlo and "quadjax_leaves_" not in hlo
    v_n, t_n = jax.jit(jvp)(*args)
    # the forward kernel's value to rounding (not its bits: the tangent step's primal products also
    # feed its tangent, so fewer of them are fused, and it multiplies by reciprocals)
    np.testing.assert_allclose(v_n, jax.jit(_loss("native", shared))(*args), rtol=rtol / 100)
    # the directional derivative as XLA's gradient and the kernel's reverse sweep give it (grad · direction):
    # the same number to rounding (XLA's own jvp program would be a second large compile)
    dot = {k: sum(jnp.sum(g * d) for g, d in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(direction)))
           for k, grads in (("xla", g_xla), ("native", g_native))}
    np.testing.assert_allclose(t_n, dot["xla"], rtol=rtol)
    np.testing.assert_allclose(t_n, dot["native"], rtol=10 * rtol)


@XLA_GRADIENT
@pytest.mark.parametrize("dtype, shared", [("float64", False), ("float32", True)],
                         ids=["float64, per-vehicle params", "float32, shared params"])
def test_with_the_parameters_fixed_the_kernels_without_their_terms_run_and_agree(dtype, shared):
    """Differentiated in the state, commands, wind and wrench only (MPC, iLQR, sensitivities), the
    parameters' tangent is a symbolic zero: the tangent and adjoint kernels generated without the
    parameters' terms run, not the full ones. Their derivatives are XLA's, and the full kernels'
    (run with the parameters differentiated too, or by a tangent of explicit zeros for them); second
    order (a Hessian in the initial velocity, through the fixed adjoint's JVP) equals central
    differences of the native gradient."""
    p, *args, dts = _inputs(dtype, shared)
    args = tuple(args)
    full_native = _loss("native", shared)
    native_loss = lambda *a: full_native(p, *a, dts)  # noqa: E731
    rtol = 1e-10 if dtype == "float64" else 2e-3
    grad = jax.grad(native_loss, argnums=(0, 1, 2, 3))
    hlo = _targets(grad, *args)
    assert "quadjax_adjoint_fixed_" in hlo and not re.search(r"quadjax_adjoint_f(32|64)_", hlo)
    g_fixed = jax.jit(grad)(*args)
    g_xla = _xla_gradient(dtype, shared)[1:5]
    g_full = jax.jit(jax.grad(full_native, argnums=(1, 2, 3, 4)))(p, *args, dts)  # the params differentiated too
    for a, b, c in zip(*(jax.tree_util.tree_leaves(g) for g in (g_fixed, g_xla, g_full))):
        scale = float(np.max(np.abs(b)))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)
        np.testing.assert_allclose(a, c, rtol=rtol / 100, atol=rtol / 100 * scale)

    rng = np.random.default_rng(2)
    direction = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 1e-3 * (np.abs(x) + 1e-3), x.dtype),
                                       args)
    jvp = lambda *a: jax.jvp(native_loss, a, direction)  # noqa: E731
    hlo = _targets(jvp, *args)
    assert "quadjax_tangent_fixed_" in hlo and not re.search(r"quadjax_tangent_f(32|64)_", hlo)
    v_fixed, t_fixed = jax.jit(jvp)(*args)
    # XLA's directional derivative through its reverse mode: its gradient dotted with the direction
    t_xla = sum(jnp.sum(g * d) for g, d in zip(jax.tree_util.tree_leaves(g_xla), jax.tree_util.tree_leaves(direction)))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, (p, dts))
    full = lambda q, *a: full_native(q, *a[:-1], a[-1])  # noqa: E731
    full_jvp = lambda *a: jax.jvp(full, (p, *a, dts), (zeros[0], *direction, zeros[1]))  # noqa: E731
    assert re.search(r"quadjax_tangent_f(32|64)_", _targets(full_jvp, *args))
    t_full = jax.jit(lambda *a: full_jvp(*a)[1])(*args)
    np.testing.assert_allclose(t_fixed, t_xla, rtol=rtol)
    np.testing.assert_allclose(t_fixed, t_full, rtol=rtol / 100)
    np.testing.assert_allclose(v_fixed, jax.jit(native_loss)(*args), rtol=rtol / 100)

    if dtype == "float64":
        q, s0, u1 = (jax.tree_util.tree_map(lambda x: x[0], t) for t in (p, args[0], args[1]))

        def final_position(v):
            return jnp.sum(qj.simulate(q, s0.replace(velocity=v), 0.01, commands=u1,
                                       config=qj.SimConfig(backend="native")).final.position ** 2)

        hessian = jax.jit(jax.hessian(final_position))(s0.velocity)
        g, h = jax.jit(jax.grad(final_position)), 1e-5
        central = jnp.stack([(g(s0.velocity.at[k].add(h)) - g(s0.velocity.at[k].add(-h))) / (2 * h) for k in range(3)])
        np.testing.assert_allclose(hessian, central.T, rtol=1e-6, atol=1e-9 * float(np.max(np.abs(central))))


def test_gradient_equals_central_finite_differences():
    """Independent of both implementations: d loss / d(mass, k_f, drag, x0, one command) by
    central differences (f64; truncation ~h², rounding ~eps·loss/h)."""
    ps, ss, u, wind, wrench, dts = _fleet("float64", seed=9)
    loss = _loss("native", False)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(ps, ss, u, wind, wrench, dts)
    value = jax.jit(loss)
    base = (ps, ss, u)
    probes = [(0, lambda x, e: x.replace(mass=x.mass.at[2].add(e)), lambda g: g.mass[2], 1e-6),
              (0, lambda x, e: x.replace(k_f=x.k_f.at[1].multiply(1 + e)), lambda g: g.k_f[1] * ps.k_f[1], 1e-6),
              (0, lambda x, e: x.replace(drag_linear=x.drag_linear.at[3, 0].add(e)), lambda g: g.drag_linear[3, 0], 1e-6),
              (1, lambda x, e: x.replace(velocity=x.velocity.at[0, 2].add(e)), lambda g: g.velocity[0, 2], 1e-6),
              (2, lambda x, e: x.at[4, 7, 1].add(e * 100), lambda g: g[4, 7, 1] * 100, 1e-6)]
    for i, move, pick, h in probes:
        plus = list(base)
        minus = list(base)
        plus[i], minus[i] = move(base[i], h), move(base[i], -h)
        fd = (value(*plus, wind, wrench, dts) - value(*minus, wind, wrench, dts)) / (2 * h)
        np.testing.assert_allclose(pick(g[i]), fd, rtol=2e-6, atol=1e-7)


def test_the_kept_trail_and_recomputed_segments_give_the_same_sweep_bit_for_bit(monkeypatch):
    """jax.grad's forward pass (quadjax_trail_) keeps what the reverse sweep reads: within
    native.TRAIL_BYTES the whole trail of states, so that the sweep runs no forward pass of its own;
    beyond it, or for an explicit segment, the checkpoints at the segments' starts, from which the
    sweep recomputes the whole horizon at once or segments of 1, 5 or 7 ticks (the memory bound,
    with a last segment shorter than the others). A vmap over cotangents alone (jax.jacrev) meets
    a trail of another batch, and the sweep runs its own forward pass. A rollout that saves states
    keeps the same. Every way gives the same bits (the same
    operations in the same order), and the Jacobian is XLA's. 20 vehicles: whole blocks of lanes and
    a part of one, which the kept values hold each their own way."""
    ps, ss, u, wind, wrench, dts = jax.tree_util.tree_map(lambda x: jnp.concatenate([x] * 4), _fleet("float64"))
    x0 = native.pack_state(ss)

    def loss(segment, save_every=0):
        def fn(p, x, u, w, e):
            f, saved = jax.vmap(lambda p, x, u, w, e: native.rollout(
                p, x, u, 0.01, w, e, substeps=SUBSTEPS, save_every=save_every, segment=segment))(p, x, u, w, e)
            return jnp.sum(f ** 2) + jnp.sum(jnp.cos(f)) + (0.0 if saved is None else 0.0 * jnp.sum(saved))
        return fn

    def grads(segment, save_every=0):
        grad = jax.jit(jax.grad(loss(segment, save_every), argnums=(0, 1, 2, 3, 4)))
        hlo = grad.lower(ps, x0, u, wind, wrench).as_text()
        # the kept values' width in the program: the whole trail's, or the checkpoints'
        widths = {int(w) for w in re.findall(r"tensor<20x(\d+)xf64>", hlo)} if "quadjax_trail_" in hlo else {0}
        return grad(ps, x0, u, wind, wrench), widths

    NS, whole = x0.shape[-1], T * SUBSTEPS * x0.shape[-1]
    kept, widths = grads(0)
    assert whole in widths
    monkeypatch.setattr(native, "TRAIL_BYTES", 0)
    cases = [(grads(0), NS)]  # beyond the budget, one segment: the checkpoint is the initial state
    monkeypatch.setattr(native, "TRAIL_VECTORS", 5 * SUBSTEPS * NS)  # segments of 5 ticks by default
    cases.append((grads(0), -(-T // 5) * NS))
    monkeypatch.undo()
    cases += [(grads(segment), -(-T // segment) * NS) for segment in (1, 5, 7)]  # within the budget too
    cases.append((grads(0, save_every=SAVE), whole))  # saving too (its saved states' cotangent 0)
    for (g, widths), width in cases:
        assert width in widths and (whole not in widths or width == whole)
        np.testing.assert_equal([np.asarray(x) for x in jax.tree_util.tree_leaves(g)],
                                [np.asarray(x) for x in jax.tree_util.tree_leaves(kept)])

    def finals(backend):
        config = qj.SimConfig(backend=backend, substeps=SUBSTEPS)
        return lambda v: jax.vmap(lambda p, s, u: native.pack_state(
            qj.simulate(p, s, 0.01, commands=u, config=config).final))(ps, ss.replace(velocity=v), u)[:, :6].ravel()

    jac = jax.jit(jax.jacrev(finals("native")))(ss.velocity)
    np.testing.assert_allclose(jac, jax.jit(jax.jacrev(finals("xla")))(ss.velocity), rtol=1e-10,
                               atol=1e-12 * float(np.max(np.abs(jac))))


def test_a_loss_on_every_saved_state_has_xla_gradient_through_the_staged_cotangents():
    """The sweep reads the saved states' cotangents 16 slots at a time, a vector load per lane and a
    transposition in registers (rollout.cc, kStagedSlots). 44 ticks saved every second one: 22
    slots, a whole run of 16 and a part, ticks between saves that read none; 20 vehicles: a whole
    block of lanes and a part of one. Every saved value has its own weight in the loss, so that a
    value read from another slot, lane or place changes the gradient."""
    ps, ss, u, *_ = jax.tree_util.tree_map(lambda x: jnp.concatenate([x] * 4), _fleet("float64"))
    u = jnp.concatenate([u] * 4, axis=1)[:, :44]

    def saved(backend):
        config = qj.SimConfig(backend=backend, substeps=SUBSTEPS, save_every=2)
        return jax.vmap(lambda p, s, u: qj.simulate(p, s, 0.01, commands=u, config=config).states)

    rng = np.random.default_rng(7)
    weights = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape)),
                                     jax.eval_shape(saved("xla"), ps, ss, u))

    def loss(backend):
        def fn(u, velocity):
            states = saved(backend)(ps, ss.replace(velocity=velocity), u)
            return sum(jnp.sum(w * x) for w, x in zip(jax.tree_util.tree_leaves(weights),
                                                      jax.tree_util.tree_leaves(states)))
        return jax.jit(jax.grad(fn, argnums=(0, 1)))

    native_grad, xla_grad = loss("native"), loss("xla")
    assert "quadjax_adjoint" in native_grad.lower(u, ss.velocity).as_text()
    got, want = native_grad(u, ss.velocity), xla_grad(u, ss.velocity)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12 * float(np.max(np.abs(w))))


def test_saved_states_that_nothing_uses_are_not_saved():
    """simulate's default SimConfig saves every state. Where a program uses only the final state,
    jit's dead-code elimination has the kernels save nothing (native._unsaved): the forward,
    jax.grad (its forward pass, and a sweep that adds no saved states' cotangent) and jax.jvp run
    the very calls that save_every=0 runs, with the same bits. Of the saved states' leaves, those
    used are saved, and have XLA's values; the others are not."""
    ps, ss, u, _, _, dts = _fleet("float64")
    du = jnp.asarray(np.random.default_rng(3).normal(size=u.shape))

    def fly(config):
        return lambda u: jax.vmap(lambda p, s, u, dt: qj.simulate(p, s, dt, commands=u, config=config))(ps, ss, u, dts)

    def programs(config):
        final = lambda u: jnp.sum(fly(config)(u).final.position ** 2) + jnp.sum(jnp.cos(fly(config)(u).final.attitude))
        return {"forward": final, "grad": jax.grad(final), "jvp": lambda u: jax.jvp(final, (u,), (du,))}

    def calls(fn):  # the kernels' custom calls, by their results' and operands' shapes
        hlo = jax.jit(fn).lower(u).compile().as_text()
        lines = [line for line in hlo.splitlines() if 'custom_call_target="quadjax_' in line]
        shapes = lambda text: " ".join(re.findall(r"\w+\[[\d,]*\]", text))
        return sorted(shapes(line.split(" custom-call(")[0]) + " <- " + shapes(
            line.split("operand_layout_constraints=", 1)[1].split("}}", 1)[0]) for line in lines)

    default, unsaved = programs(qj.SimConfig(backend="native", substeps=SUBSTEPS)), programs(
        qj.SimConfig(backend="native", substeps=SUBSTEPS, save_every=0))
    assert qj.SimConfig().save_every == 1
    for name in default:
        assert calls(default[name]) == calls(unsaved[name]) != [], name
        np.testing.assert_equal([np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(default[name])(u))],
                                [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(unsaved[name])(u))])
    # the leaves used are saved, the others not: the position's 4 slots, no attitude's
    saved = lambda backend: lambda u: (lambda s: (s.position, s.energy))(
        fly(qj.SimConfig(backend=backend, substeps=SUBSTEPS, save_every=3))(u).states)
    (call,) = calls(saved("native"))
    S = T // 3  # the leaves: position, velocity, attitude, body rates, rotor speeds, energy, on the ground
    assert call.split(" <- ")[0] == (f"f64[{N},19] f64[{N},{S},3] f64[{N},0,3] f64[{N},0,4] f64[{N},0,3] "
                                     f"f64[{N},0,4] f64[{N},{S}] f64[{N},0]"), call
    for got, want in zip(jax.jit(saved("native"))(u), saved("xla")(u)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_second_derivatives_and_vmap_of_grad():
    """jacfwd(grad) through the primitives (the JVPs of the tangent and adjoint: XLA's) equals
    central differences of the native gradient; vmap(grad) over initial states with every other
    input shared (unbatched cotangents, summed over the broadcast batch) equals a loop."""
    ps, ss, u, wind, wrench, dts = _fleet("float64", seed=3)
    p, u1 = (jax.tree_util.tree_map(lambda x: x[0], t) for t in (ps, u))
    s0 = jax.tree_util.tree_map(lambda x: x[0], ss)
    # no wind or wrench series here (the first-order tests cover them): XLA's second-order
    # program of the kernel step is then a third of the size to compile
    config = qj.SimConfig(backend="native")

    def loss(v, m):
        return jnp.sum(qj.simulate(p.replace(mass=m), s0.replace(velocity=v), 0.01, commands=u1,
                                   config=config).final.position ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    d2v, d2m = jax.jit(jax.jacfwd(lambda v, m: grad(v, m)[1], argnums=(0, 1)))(s0.velocity, p.mass)
    h = 1e-5
    fd_m = (grad(s0.velocity, p.mass + h)[1] - grad(s0.velocity, p.mass - h)[1]) / (2 * h)
    fd_v = [(grad(s0.velocity.at[k].add(h), p.mass)[1] - grad(s0.velocity.at[k].add(-h), p.mass)[1]) / (2 * h)
            for k in range(3)]
    np.testing.assert_allclose(d2m, fd_m, rtol=1e-6)
    np.testing.assert_allclose(d2v, fd_v, rtol=1e-6, atol=1e-9 * float(np.max(np.abs(fd_v))))
    velocities = s0.velocity + jnp.asarray(np.random.default_rng(0).normal(size=(3, 3)))
    per = jax.jit(jax.vmap(grad, in_axes=(0, None)))(velocities, p.mass)
    loop = [grad(v, p.mass) for v in velocities]
    leaves_close(per, jax.tree_util.tree_map(lambda *x: jnp.stack(x), *loop), rtol=1e-12, atol=1e-14)
    assert float(jnp.std(per[1])) > 0


def _finals(backend):
    """The fleet's final and saved states, packed, as a function of the per-vehicle masses, initial
    velocities and commands (every other input held)."""
    config = qj.SimConfig(backend=backend, substeps=SUBSTEPS, save_every=SAVE)

    def finals(mass, velocity, u, ps, ss, wind, wrench, dts):
        def one(p, s, u, wind, wrench, dt):
            traj = qj.simulate(p, s, dt, commands=u, inputs=qj.Inputs(wind=wind, wrench=wrench), config=config)
            return jnp.concatenate([native.pack_state(traj.final), jnp.ravel(native.pack_state(traj.states))])
        return jax.vmap(one)(ps.replace(mass=mass), ss.replace(velocity=velocity), u, wind, wrench, dts)

    return finals


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_jacfwd_pushes_its_tangents_four_at_a_time_and_equals_xla(dtype):
    """jax.jacfwd (a vmap over tangents, the primals unmapped) with the parameters fixed runs the
    multi-tangent kernel: groups of native.TANGENTS tangents with one primal each, a rest of
    TANGENTS - 1 padded with a zero tangent, a smaller rest in the one-tangent kernel. With the
    parameters differentiated every tangent runs the one-tangent kernel (pushed together they cost
    more). Its Jacobians are XLA's either way; each tangent gets the bits a one-tangent call gives it
    (a tangent does not depend on the others riding with it, nor on its lane), and so does the primal."""
    ps, ss, u, wind, wrench, dts = _fleet(dtype, seed=11)
    held = (ps, ss, wind, wrench, dts)
    rtol = 1e-10 if dtype == "float64" else 2e-3
    k = native.TANGENTS
    assert k == 4 and N == 5  # the groups and rests below
    cases = {  # argnums: (tangents, the kernels that must run)
        (1,): (3 * N, {"tangents_fixed"}),  # 15 = 3 groups and a rest of 3, padded
        (0,): (N, {"tangent"}),  # 5, the parameters differentiated: one at a time
    }
    f = {b: _finals(b) for b in ("native", "xla")}
    for argnums, (m, kinds) in cases.items():
        jac = {b: jax.jacfwd(lambda *a, b=b: f[b](*a, *held), argnums=argnums) for b in f}
        hlo = _targets(jac["native"], ps.mass, ss.velocity, u)
        ran = set(re.findall(r"quadjax_(tangents_fixed|tangents|tangent_fixed|tangent)_f(?:32|64)_", hlo))
        assert ran == kinds, (argnums, ran)
        got, want = (jax.jit(jac[b])(ps.mass, ss.velocity, u) for b in f)
        assert sum(np.size(x) for x in jax.tree_util.tree_leaves(got)) == m * np.size(want[0]) // np.size(
            (ps.mass, ss.velocity)[argnums[0]])
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            scale = float(np.max(np.abs(b)))
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)

    # four directions in the commands at once against each alone: the same bits
    rng = np.random.default_rng(4)
    directions = jnp.asarray(rng.normal(size=(k,) + u.shape) * np.asarray(u) * 1e-2, dtype)
    push = lambda d: jax.jvp(lambda u: f["native"](ps.mass, ss.velocity, u, *held), (u,), (d,))  # noqa: E731
    many = jax.jit(jax.vmap(push))(directions)
    assert "quadjax_tangents_fixed_" in _targets(jax.vmap(push), directions)
    for j in range(k):
        value, tangent = jax.jit(push)(directions[j])
        np.testing.assert_array_equal(many[1][j], tangent)
        np.testing.assert_array_equal(many[0][j], value)


def test_commands_and_their_tangents_broadcast_to_the_fleet_each_on_its_own():
    """The tangent kernels take the commands and their tangents as two inputs, each broadcast to the
    fleet on its own (they were concatenated into one array per call): per-vehicle commands with a
    tangent shared by the fleet (an offset ``c`` added to every vehicle's series), and one series
    for the whole fleet with tangents per group (jax.jacfwd in that series); one tangent and groups of
    four. Each equals XLA's (float64)."""
    ps, ss, u, wind, wrench, dts = _fleet("float64", seed=3)

    def finals(backend, per_vehicle):
        config = qj.SimConfig(backend=backend, substeps=SUBSTEPS)

        def one(p, s, u, wind, wrench, dt):
            traj = qj.simulate(p, s, dt, commands=u, inputs=qj.Inputs(wind=wind, wrench=wrench), config=config)
            return native.pack_state(traj.final)

        if per_vehicle:  # U per vehicle, the tangent of c shared
            return lambda c: jax.vmap(lambda p, s, u, *a: one(p, s, u + c, *a))(ps, ss, u, wind, wrench, dts)
        return lambda u1: jax.vmap(one, in_axes=(0, 0, None, 0, 0, 0))(ps, ss, u1, wind, wrench, dts)

    c, dc = jnp.zeros_like(u[0]), jnp.asarray(np.random.default_rng(3).normal(size=u[0].shape), jnp.float64)
    for per_vehicle, x in ((True, c), (False, u[0])):
        f = {b: finals(b, per_vehicle) for b in ("native", "xla")}
        hlo = _targets(lambda x: jax.jvp(f["native"], (x,), (dc,)), x) + _targets(jax.jacfwd(f["native"]), x)
        assert {"tangent_fixed", "tangents_fixed"} <= set(re.findall(r"quadjax_(tangents?_fixed)_f64_", hlo))
        for mode in (lambda g, x: jax.jvp(g, (x,), (dc,)), lambda g, x: jax.jacfwd(g)(x)):
            got, want = (jax.jit(lambda x, b=b: mode(f[b], x))(x) for b in f)
            for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * float(np.max(np.abs(b))))


def test_jacfwd_of_jacfwd_through_the_kernels_equals_central_differences():
    """Second order over a first derivative that pushed its tangents in a group (initial roll rates,
    the parameters fixed: the JVP of the multi-tangent primitive, XLA's, on the packed tangents)
    equals central differences of that first derivative. A Hessian by jacfwd of jacfwd had failed
    before with 'jvp called with different primal and tangent shapes': the JVP rule handed XLA the
    primitive's primals and tangents, which may differ in their batch (1 against N). (Second order in
    the parameters, one tangent at a time: test_second_derivatives_and_vmap_of_grad.)"""
    ps, ss, u, wind, wrench, dts = _fleet("float64", seed=12)
    p = jax.tree_util.tree_map(lambda x: x[0], ps)
    s0, u1 = (jax.tree_util.tree_map(lambda x: x[:3], t) for t in (ss, u))
    config = qj.SimConfig(backend="native")

    def positions(roll):  # 3 vehicles, one initial roll rate each: the inner jacfwd pushes 3 tangents (padded)
        def one(r, s, u):
            s = s.replace(body_rates=s.body_rates.at[0].set(r))
            return qj.simulate(p, s, 0.01, commands=u, config=config).final.position
        return jnp.ravel(jax.vmap(one)(roll, s0, u1))

    roll = jnp.asarray([-0.5, 0.2, 0.9])
    first = jax.jacfwd(positions)
    assert set(re.findall(r"quadjax_(tangents?(?:_fixed)?)_f64_", _targets(first, roll))) == {"tangents_fixed"}
    hess = jax.jit(jax.jacfwd(first))(roll)
    first = jax.jit(first)
    h = 1e-6
    fd = jnp.stack([(first(roll.at[k].add(h)) - first(roll.at[k].add(-h))) / (2 * h) for k in range(3)], axis=-1)
    np.testing.assert_allclose(hess, fd, rtol=1e-5, atol=1e-7 * float(np.max(np.abs(fd))))
    assert float(np.max(np.abs(fd))) > 0
