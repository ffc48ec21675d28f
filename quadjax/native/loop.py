"""Closed loops at kernel speed (issue 14): the engine's own tick, the whole horizon in one
generated native call on the CPU.

One engine. :func:`quadjax.simulate`'s loop with per-tick work (observer, controller or replayed
commands, the held command's RK4 substeps, hooks, status codes and freezing) is one per-vehicle
``tick(carry, k, x) -> (carry, y)``: ``x`` the tick's row of the streamed series (commands, wind,
wrench), ``y`` what is saved (states, commands, hooks' outputs). On the CPU with
``backend="auto"`` or ``"native"`` the engine hands that tick to :func:`run_ticks`: it binds
:data:`loop_p`, whose batching rule (``jax.vmap`` over vehicles, the way users fly fleets)
generates C++ from the tick's jaxpr (:func:`quadjax.native.generate.generate_kernel`: W vehicles
in vector lanes, what depends on the tick's invariant inputs hoisted per block) and runs every
tick of the horizon in one call (``native/loop.cc``), reading each tick's series row and writing
every ``every``-th tick's output as it goes. A tick the generator cannot compile (a PRNG's bitwise integer
arithmetic, a data-dependent loop) takes the engine's per-tick path instead, with a warning naming
the primitive; so does one vehicle (no ``vmap``). Derivatives run the same tick on XLA (a JVP
rule). The whole loop equals the per-tick path to rounding, not bit for bit (the physics is the
component form compiled with the tick rather than the rollout kernel).
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir
from jax.interpreters import partial_eval as pe

from quadjax.native.generate import VECTOR_PRELUDE, Layout, UnsupportedPrimitive, generate_kernel

_NAMESPACE = "qj_loop"


# --------------------------------------------------------------------------- the CPU kernel
#
# The generated kernel takes every input in the float dtype: the tick is wrapped so that its
# invariant inputs and its carry are flat tuples of float leaves, integers and flags among them
# as whole numbers (exact below 2^24 in float32), converted back to their own dtypes in the trace.


def _as(x, dtype):
    """``x`` (a float lane value) as ``dtype``."""
    return x != 0 if np.dtype(dtype) == np.bool_ else x.astype(dtype)


def _split(args, n_consts: int, n_carry: int):
    return args[:n_consts], args[n_consts:n_consts + n_carry], args[n_consts + n_carry:]


def _tick_impl(*args, jaxpr, n_consts: int, n_carry: int, num_ticks: int, every: int):
    """:data:`loop_p` on XLA: the engine's scan over the ticks of one vehicle's tick jaxpr
    (a ClosedJaxpr: its own constants are the tick's fixed integers, its first ``n_consts``
    inputs the rest of what it closes over)."""
    from quadjax.engine import scan_ticks

    consts, carry, xs = _split(args, n_consts, n_carry)

    def body(c, kx):
        out = jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *consts, *c, *kx)
        return tuple(out[:n_carry]), tuple(out[n_carry:])

    c, ys = scan_ticks(body, tuple(carry), (jnp.arange(num_ticks, dtype=jnp.int32), *xs), num_ticks, every)
    return list(c) + (list(ys) if every else [])


def _abstract(*args, jaxpr, n_consts, n_carry, num_ticks, every):
    carry = [jax.core.ShapedArray(a.shape, a.dtype) for a in args[n_consts:n_consts + n_carry]]
    saved = [jax.core.ShapedArray((num_ticks // every,) + tuple(v.aval.shape), v.aval.dtype)
             for v in jaxpr.jaxpr.outvars[n_carry:]] if every else []
    return carry + saved


loop_p = jax.extend.core.Primitive("quadjax_loop")
loop_p.multiple_results = True
loop_p.def_impl(_tick_impl)
loop_p.def_abstract_eval(_abstract)
mlir.register_lowering(loop_p, mlir.lower_fun(_tick_impl, multiple_results=True))


def _loop_jvp(primals, tangents, **params):  # derivatives: the same tick on XLA, differentiated by JAX
    return jax.jvp(functools.partial(_tick_impl, **params), tuple(primals),
                   tuple(ad.instantiate_zeros(t) for t in tangents))


ad.primitive_jvps[loop_p] = _loop_jvp


@functools.lru_cache(maxsize=32)
def _kernel(jaxpr, const_avals: tuple, carry_avals: tuple, x_avals: tuple, dtype) -> tuple:
    """(None or why the kernel is unavailable, its FFI target, the carry's size) for this tick;
    ``x_avals`` one tick's row of each series."""
    from quadjax import native

    n_carry = len(carry_avals)

    def step(P, X, k, U):
        consts = [_as(x, a.dtype) for x, a in zip(P, const_avals)]
        carry = [_as(x, a.dtype) for x, a in zip(X, carry_avals)]
        xs = [_as(x, a.dtype) for x, a in zip(U, x_avals)]
        out = [jnp.asarray(x).astype(dtype)
               for x in jax.core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *consts, *carry, _as(k, np.int32), *xs)]
        return tuple(out[:n_carry]), tuple(out[n_carry:]) + (jnp.zeros((), dtype),)  # + a spare: never empty

    def floats(avals, spare=False):
        return tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in avals) + ((jax.ShapeDtypeStruct((), dtype),)
                                                                             if spare else ())

    args = {"P": floats(const_avals, True), "X": floats(carry_avals), "k": jax.ShapeDtypeStruct((), dtype),
            "U": floats(x_avals, True)}
    lanes = native.VECTOR_BYTES // np.dtype(dtype).itemsize

    def generate() -> str:
        ks = generate_kernel(step, args, carry="X", invariant=("P",), namespace=_NAMESPACE, emit="Y", lanes=lanes)
        # the struct in an anonymous namespace: every tick's library names it qj_loop, and C++17 makes
        # its static constexpr arrays (L_U, L_Y) process-wide unique symbols otherwise, so that a second
        # library loaded into the process would read the first one's sizes
        return "\n".join([VECTOR_PRELUDE, "namespace {", ks.source, "}  // namespace", native.HARNESS.read_text(),
                          native.LOOP_HARNESS.read_text()])

    try:  # the tick's C++ is a function of its jaxpr and avals (a fresh process reads it from the cache)
        text = native.cached_source(native.source_key(jaxpr, const_avals, carry_avals, x_avals, dtype, lanes),
                                    generate)
    except UnsupportedPrimitive as err:
        warnings.warn(f"quadjax: this closed loop runs on XLA, not in the native kernel: {err}", RuntimeWarning,
                      stacklevel=2)
        return str(err), None, 0
    target = f"quadjax_loop_{hashlib.sha256(text.encode()).hexdigest()[:16]}"  # one target per tick
    text += f"\nQUADJAX_LOOP({target}, {_NAMESPACE});\n"
    return native.load_library(text, (target,), "native closed-loop kernel"), target, Layout.of(args["X"]).size


def _compiled(jaxpr, avals: list, n_consts: int, n_carry: int) -> tuple:
    """(None or why not, target, carry width, dtype): the tick's kernel for one
    vehicle's ``avals`` (the invariant inputs, the carry, one tick's row of each series),
    generated and built at most once."""
    floats = {np.dtype(a.dtype) for a in avals if np.issubdtype(a.dtype, np.floating)}
    if len(floats) != 1:
        return "the tick mixes float dtypes", None, 0, None
    dtype = floats.pop()
    consts, carry, xs = _split(tuple(avals), n_consts, n_carry)
    return (*_kernel(jaxpr, consts, carry, xs, dtype), dtype)


def _rows(xs, flags, lead: int, dtype, spare: bool = False) -> jax.Array:
    """``xs`` (each batched, with a leading vehicle axis, or not, per ``flags``) as one
    (lead, size) block of ``dtype`` rows; ``spare``: a zero column after them (never empty)."""
    parts = [jnp.broadcast_to(jnp.reshape(jnp.asarray(x).astype(dtype), (x.shape[0] if b else 1, -1)),
                              (lead, math.prod(x.shape[1:] if b else x.shape))) for x, b in zip(xs, flags)]
    return jnp.concatenate(parts + ([jnp.zeros((lead, 1), dtype)] if spare else []), axis=-1)


def _unrows(out, avals, lead: tuple) -> list:
    """The leaves of ``avals`` from the columns of ``out`` (…, width), ``lead`` their leading shape."""
    results, at = [], 0
    for a in avals:
        k = math.prod(a.shape)
        results.append(_as(jnp.reshape(out[..., at:at + k], lead + tuple(a.shape)), a.dtype))
        at += k
    return results


def _loop_batched(args, dims, *, jaxpr, n_consts, n_carry, num_ticks, every):
    """vmap over vehicles: every tick of the horizon in one native call (or XLA's loop, vmapped)."""
    args = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    n = next(x.shape[0] for x, b in zip(args, batched) if b)
    per = [_aval(x.shape[1:] if b else x.shape, x.dtype) for x, b in zip(args, batched)]
    tick_avals = per[:n_consts + n_carry] + [_aval(a.shape[1:], a.dtype) for a in per[n_consts + n_carry:]]
    why, target, _, dtype = _compiled(jaxpr, tick_avals, n_consts, n_carry)
    params = dict(jaxpr=jaxpr, n_consts=n_consts, n_carry=n_carry, num_ticks=num_ticks, every=every)
    xla = jax.vmap(functools.partial(_tick_impl, **params), in_axes=tuple(0 if b else None for b in batched))
    if why is not None:
        out = xla(*args)
        return out, [0] * len(out)
    y_avals = [v.aval for v in jaxpr.jaxpr.outvars[n_carry:]] if every else []

    @jax.custom_jvp
    def native_call(*args):
        consts, carry, xs = _split(args, n_consts, n_carry)
        fc, fx, fs = _split(batched, n_consts, n_carry)
        P = _rows(consts, fc, n if any(fc) else 1, dtype, spare=True)  # one row each vehicle, or one for all
        X = _rows(carry, fx, n, dtype)
        # each series as XLA holds it (N or 1, T, size): no copy to pack them
        U = [jnp.reshape(jnp.asarray(x).astype(dtype), (n if b else 1, num_ticks, -1)) for x, b in zip(xs, fs)]
        S = num_ticks // every if every else 0
        final, *saved = call_p.bind(P, X, *U, target=target, sizes=tuple(math.prod(a.shape) for a in y_avals),
                                    num_ticks=num_ticks, every=every)  # a result per saved leaf
        return _unrows(final, per[n_consts:n_consts + n_carry], (n,)) + [
            _as(jnp.reshape(y, (n, S) + tuple(a.shape)), a.dtype) for y, a in zip(saved, y_avals)]

    # differentiated (a grad around the vmap): the same ticks on XLA, differentiated by JAX
    native_call.defjvp(lambda primals, tangents: jax.jvp(xla, primals, tangents))
    out = native_call(*args)
    return out, [0] * len(out)


batching.primitive_batchers[loop_p] = _loop_batched


def _call(P, X, *U, target: str, sizes: tuple, num_ticks: int, every: int, kept: tuple | None = None):
    """The closed-loop kernel's call: (the carry after ``num_ticks`` ticks (N, width), and with
    ``every`` > 0 one result per leaf of the tick's output, (N, num_ticks // every, its size)). A
    leaf that ``kept`` (a bool per leaf; None: all) leaves out has no slots, and the kernel does not
    save it (nothing reads it: :func:`_unread`)."""
    n, dtype = X.shape[0], X.dtype
    S = num_ticks // every if every else 0
    shapes = [X.shape] + ([(n, S if keep else 0, size) for size, keep in zip(sizes, kept or (True,) * len(sizes))]
                          if every else [])
    return jax.ffi.ffi_call(target, [jax.ShapeDtypeStruct(x, dtype) for x in shapes], vmap_method="sequential")(
        P, X, *U, num_ticks=np.int64(num_ticks), every=np.int64(every))


#: the kernel's call as a primitive of its own, for its dead-code elimination rule (:func:`_unread`)
call_p = jax.extend.core.Primitive("quadjax_loop_call")
call_p.multiple_results = True
call_p.def_impl(_call)
call_p.def_abstract_eval(lambda *args, **params: [jax.core.ShapedArray(o.shape, o.dtype) for o in jax.eval_shape(
    functools.partial(_call, **params), *args)])
mlir.register_lowering(call_p, mlir.lower_fun(_call, multiple_results=True), platform="cpu")


def _unread(used_outputs, eqn):
    """:data:`call_p`'s dead-code elimination: the tick's outputs that nothing reads are not saved
    (none read: ``every`` 0), as the open loop's saved states (``quadjax.native._unsaved``). A
    fleet under ``simulate``'s default ``SimConfig(save_every=1)`` that reads only ``.final``
    costs what ``save_every=0`` does (benchmarks/README.md, sixteenth session)."""
    if not any(used_outputs):
        return [False] * len(eqn.invars), None
    read = [bool(u) for u in used_outputs[1:]]
    if eqn.params["every"] == 0 or all(read):
        return [True] * len(eqn.invars), eqn
    from quadjax import native

    params = dict(eqn.params, every=0, kept=None) if not any(read) else dict(eqn.params, kept=tuple(read))
    return [True] * len(eqn.invars), native.rebound(eqn, used_outputs, call_p, params)


pe.dce_rules[call_p] = _unread


def run_ticks(tick, carry0, xs, num_ticks: int, every: int = 0):
    """(carry, ys) after ``num_ticks`` ticks of ``tick(carry, k, x) -> (carry, y)`` from
    ``carry0``: k the int32 tick index, ``x`` tick k's row of the series ``xs`` (leaves with a
    leading axis of ``num_ticks``), ``ys`` every ``every``-th tick's ``y`` stacked on a leading
    axis (None for ``every`` = 0). The engine's loop on the CPU, under ``jax.vmap`` in one native
    call for the whole horizon (the module's docstring). None (the caller then runs its own
    loop) for one vehicle (no ``vmap``: the per-tick path is as fast, and its results stay bit
    for bit the same whether or not states are saved) and for a tick the generator cannot
    compile (a warning names the primitive)."""
    leaves, treedef = jax.tree_util.tree_flatten(carry0)
    x_leaves, x_tree = jax.tree_util.tree_flatten(xs)
    y_tree = []

    def flat(*args):
        c, k, x = args[:len(leaves)], args[len(leaves)], args[len(leaves) + 1:]
        c1, y = tick(jax.tree_util.tree_unflatten(treedef, c), k, jax.tree_util.tree_unflatten(x_tree, x))
        y_leaves, tree = jax.tree_util.tree_flatten(y if every else None)  # nothing saved: not computed
        y_tree.append(tree)
        return jax.tree_util.tree_leaves(c1) + y_leaves

    rows = [jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.result_type(x)) for x in x_leaves]
    closed = jax.make_jaxpr(flat)(*leaves, jnp.zeros((), jnp.int32), *rows)
    if not any(hasattr(x, "batch_dim") for x in (*closed.consts, *leaves, *x_leaves)):  # one vehicle: the caller's
        return None
    jaxpr, consts = _fix_integers(closed)
    # vmap's tracers (a fleet): compile it now, so that a tick that cannot be falls back here
    avals = [_aval(jnp.shape(x), jnp.result_type(x)) for x in (*consts, *leaves)] + [_aval(r.shape, r.dtype)
                                                                                      for r in rows]
    if _compiled(jaxpr, avals, len(consts), len(leaves))[0] is not None:
        return None
    out = loop_p.bind(*consts, *leaves, *x_leaves, jaxpr=jaxpr, n_consts=len(consts), n_carry=len(leaves),
                      num_ticks=num_ticks, every=every)
    carry = jax.tree_util.tree_unflatten(treedef, out[:len(leaves)])
    return carry, (jax.tree_util.tree_unflatten(y_tree[-1], out[len(leaves):]) if every else None)


def _fix_integers(closed):
    """(the tick as a ClosedJaxpr whose own constants are the concrete integer and flag arrays it
    closes over, what else it closes over). Those are structure (the index arrays of NumPy
    indexing, a mixer's rotor pairs): generated as known numbers, a gather at them is a choice
    of elements. Floats stay inputs, so that new gains or parameters reuse the kernel."""
    fixed, rest = [], []
    for v, c in zip(closed.jaxpr.constvars, closed.consts):
        concrete = not isinstance(c, jax.core.Tracer)
        kind = np.dtype(c.dtype) if concrete else None
        (fixed if concrete and (np.issubdtype(kind, np.integer) or kind == np.bool_) else rest).append((v, c))
    jaxpr = closed.jaxpr.replace(constvars=[v for v, _ in fixed], invars=[v for v, _ in rest] + closed.jaxpr.invars)
    return jax.extend.core.ClosedJaxpr(jaxpr, [np.asarray(c) for _, c in fixed]), [c for _, c in rest]


def _aval(shape, dtype) -> jax.core.ShapedArray:
    """One vehicle's abstract value (no weak type: the same key for the kernel cache from the
    trace and from the batching rule)."""
    return jax.core.ShapedArray(tuple(shape), np.dtype(dtype))
