"""Closed loops at kernel speed (issue 14): the engine's own tick, the whole horizon in one
generated native call on the CPU.

One engine. :func:`quadjax.simulate`'s closed loop (observer, controller, the held command's RK4
substeps, hooks, status codes and freezing) is one per-vehicle ``tick(carry, k)``. On the CPU
with ``backend="auto"`` or ``"native"``, when nothing is saved per tick and no wind or wrench
series streams in, the engine hands that tick to :func:`run_ticks`: it binds :data:`loop_p`,
whose batching rule (``jax.vmap`` over vehicles, the way users fly fleets) generates C++ from the
tick's jaxpr (:func:`quadjax.native.generate.generate_kernel`: W vehicles in vector lanes, what
depends on the tick's invariant inputs hoisted per block) and runs every tick of the horizon in
one call (``native/loop.cc``). A tick the generator cannot compile (a PRNG's bitwise integer
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

from quadjax.native.generate import VECTOR_PRELUDE, UnsupportedPrimitive, generate_kernel

_NAMESPACE = "qj_loop"


# --------------------------------------------------------------------------- the CPU kernel
#
# The generated kernel takes every input in the float dtype: the tick is wrapped so that its
# invariant inputs and its carry are flat tuples of float leaves, integers and flags among them
# as whole numbers (exact below 2^24 in float32), converted back to their own dtypes in the trace.


def _as(x, dtype):
    """``x`` (a float lane value) as ``dtype``."""
    return x != 0 if np.dtype(dtype) == np.bool_ else x.astype(dtype)


def _tick_impl(*args, jaxpr, n_consts: int, num_ticks: int):
    """:data:`loop_p` on XLA: ``fori_loop`` over the ticks of one vehicle's tick jaxpr."""
    consts, carry = args[:n_consts], args[n_consts:]

    def body(k, c):  # the jaxpr's tick index is int32 (fori_loop's may be int64 under x64)
        return tuple(jax.core.eval_jaxpr(jaxpr, consts, *c, jnp.asarray(k, jnp.int32)))

    return list(jax.lax.fori_loop(0, num_ticks, body, tuple(carry)))


def _abstract(*args, jaxpr, n_consts, num_ticks):
    return [jax.core.ShapedArray(a.shape, a.dtype) for a in args[n_consts:]]


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
def _kernel(jaxpr, const_avals: tuple, carry_avals: tuple, dtype) -> tuple:
    """(None or why the kernel is unavailable, its FFI target, the carry's size) for this tick."""
    from quadjax import native

    def step(P, X, k):
        consts = [_as(x, a.dtype) for x, a in zip(P, const_avals)]
        carry = [_as(x, a.dtype) for x, a in zip(X, carry_avals)]
        out = jax.core.eval_jaxpr(jaxpr, consts, *carry, _as(k, np.int32))
        return tuple(jnp.asarray(x).astype(dtype) for x in out)

    floats = {"P": tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in const_avals) + (jax.ShapeDtypeStruct((), dtype),),
              "X": tuple(jax.ShapeDtypeStruct(a.shape, dtype) for a in carry_avals),
              "k": jax.ShapeDtypeStruct((), dtype)}
    try:
        ks = generate_kernel(step, floats, carry="X", invariant=("P",), namespace=_NAMESPACE,
                             lanes=native.VECTOR_BYTES // np.dtype(dtype).itemsize)
    except UnsupportedPrimitive as err:
        warnings.warn(f"quadjax: this closed loop runs on XLA, not in the native kernel: {err}", RuntimeWarning,
                      stacklevel=2)
        return str(err), None, 0
    text = "\n".join([VECTOR_PRELUDE, ks.source, native.HARNESS.read_text(), native.LOOP_HARNESS.read_text()])
    target = f"quadjax_loop_{hashlib.sha256(text.encode()).hexdigest()[:16]}"  # one target per tick
    text += f"\nQUADJAX_LOOP({target}, {_NAMESPACE});\n"
    return native.load_library(text, (target,), "native closed-loop kernel"), target, ks.layouts["X"].size


def _compiled(jaxpr, avals: list, n_consts: int) -> tuple:
    """(None or why not, target, carry width, dtype): the tick's kernel for one vehicle's
    ``avals`` (the invariant inputs, then the carry), generated and built at most once."""
    floats = {np.dtype(a.dtype) for a in avals if np.issubdtype(a.dtype, np.floating)}
    if len(floats) != 1:
        return "the tick mixes float dtypes", None, 0, None
    dtype = floats.pop()
    return (*_kernel(jaxpr, tuple(avals[:n_consts]), tuple(avals[n_consts:]), dtype), dtype)


def _rows(xs, flags, avals, n: int, lead: int, dtype) -> jax.Array:
    """``xs`` (each batched or not, per ``flags``) as one (lead, size) block of ``dtype`` rows."""
    return jnp.concatenate([jnp.broadcast_to(jnp.reshape(jnp.asarray(x).astype(dtype), (n if b else 1, -1)),
                                             (lead, math.prod(a.shape))) for x, b, a in zip(xs, flags, avals)]
                           + [jnp.zeros((lead, 0), dtype)], axis=1)


def _loop_batched(args, dims, *, jaxpr, n_consts, num_ticks):
    """vmap over vehicles: every tick of the horizon in one native call (or XLA's loop, vmapped)."""
    args = [x if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    batched = [d is not None for d in dims]
    n = next(x.shape[0] for x, b in zip(args, batched) if b)
    per = [_aval(x.shape[1:] if b else x.shape, x.dtype) for x, b in zip(args, batched)]
    why, target, width, dtype = _compiled(jaxpr, per, n_consts)
    xla = jax.vmap(functools.partial(_tick_impl, jaxpr=jaxpr, n_consts=n_consts, num_ticks=num_ticks),
                   in_axes=tuple(0 if b else None for b in batched))
    if why is not None:
        out = xla(*args)
        return out, [0] * len(out)

    @jax.custom_jvp
    def native_call(*args):
        rows = n if any(batched[:n_consts]) else 1  # the invariant inputs: one row each vehicle, or one for all
        P = jnp.concatenate([_rows(args[:n_consts], batched[:n_consts], per[:n_consts], n, rows, dtype),
                             jnp.zeros((rows, 1), dtype)], axis=1)  # + the kernel's spare input: never empty
        X = _rows(args[n_consts:], batched[n_consts:], per[n_consts:], n, n, dtype)
        out = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((n, width), dtype), vmap_method="sequential")(
            P, X, num_ticks=np.int64(num_ticks))
        results, at = [], 0
        for a in per[n_consts:]:
            k = math.prod(a.shape)
            results.append(_as(jnp.reshape(out[:, at:at + k], (n,) + tuple(a.shape)), a.dtype))
            at += k
        return results

    # differentiated (a grad around the vmap): the same ticks on XLA, differentiated by JAX
    native_call.defjvp(lambda primals, tangents: jax.jvp(xla, primals, tangents))
    out = native_call(*args)
    return out, [0] * len(out)


batching.primitive_batchers[loop_p] = _loop_batched


def run_ticks(tick, carry0, num_ticks: int):
    """``carry`` after ``num_ticks`` ticks of ``tick(carry, k) -> carry`` (k the int32 tick index)
    from ``carry0``: the engine's closed loop on the CPU, under ``jax.vmap`` in one native call
    for the whole horizon (the module's docstring). None (the caller then runs its own loop) for
    one vehicle (no ``vmap``: the per-tick path is as fast, and its results stay bit for bit the
    same whether or not states are saved) and for a tick the generator cannot compile (a
    warning names the primitive)."""
    leaves, treedef = jax.tree_util.tree_flatten(carry0)

    def flat(*args):
        *c, k = args
        return jax.tree_util.tree_leaves(tick(jax.tree_util.tree_unflatten(treedef, c), k))

    closed = jax.make_jaxpr(flat)(*leaves, jnp.zeros((), jnp.int32))
    consts = closed.consts
    if not any(hasattr(x, "batch_dim") for x in (*consts, *leaves)):  # one vehicle: the caller's own loop
        return None
    # vmap's tracers (a fleet): compile it now, so that a tick that cannot be falls back here
    if _compiled(closed.jaxpr, [_aval(jnp.shape(x), jnp.result_type(x)) for x in (*consts, *leaves)],
                 len(consts))[0] is not None:
        return None
    out = loop_p.bind(*consts, *leaves, jaxpr=closed.jaxpr, n_consts=len(consts), num_ticks=num_ticks)
    return jax.tree_util.tree_unflatten(treedef, out)


def _aval(shape, dtype) -> jax.core.ShapedArray:
    """One vehicle's abstract value (no weak type: the same key for the kernel cache from the
    trace and from the batching rule)."""
    return jax.core.ShapedArray(tuple(shape), np.dtype(dtype))
