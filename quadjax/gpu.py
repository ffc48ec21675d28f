"""The GPU backend: the whole horizon in one Pallas kernel per block of vehicles (issue 15).

On a GPU, XLA runs a ``lax.scan`` as one launch sequence per iteration from the host, and splits
an RK4 step into dozens of fusions that pass the state through memory. Here the time loop lives
*inside* the kernel: each program owns ``block`` vehicles, one per GPU thread; their state stays
in registers for the whole horizon; commands (and wind, wrench) are read per tick, and only the
final state, the saved states or a per-vehicle fold are written out.

One statement of the physics. The kernel body is not written here: it is the straight-line form
(:func:`quadjax.native.generate.straight_line`) of the very per-vehicle step the CPU kernel is
generated from (:func:`quadjax.native.kernel_step`, i.e. ``integrators.rk4_step_c``), and, for the
closed loop, of the caller's controller and fold. What depends on the parameters alone is hoisted
out of the time loop. The Triton lowering (``jax.experimental.pallas.triton``) then sees only
element-wise arithmetic on (block,) vectors.

* :func:`rollout_rows` is :data:`quadjax.native.rollout_p` on the GPU: the engine's open loop
  (``backend="auto"`` or ``"native"``) lowers to it there, batched over ``vmap``-ped vehicles by
  the primitive's batching rule; its derivatives are XLA's of the same step.
* :func:`closed_loop` flies a controller (the library's PID or geometric, or any per-vehicle JAX
  function the generator supports) and folds per-vehicle statistics in the kernel.

``interpret=True`` runs the same kernels on the CPU (Pallas' interpreter): the test suite holds
them equal to the XLA path there (tests/test_gpu.py). ``benchmarks/gpu.py`` measures them on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.native.generate import StraightLine, straight_line

#: vehicles per kernel program: one per GPU thread, 4 warps
BLOCK = 128


# --------------------------------------------------------------------------- packed arguments


@dataclasses.dataclass(frozen=True)
class _Arg:
    """How one argument of a kernel travels: its flat elements grouped by dtype, each group one
    array, feature-major: (K, N) for per-vehicle values (``shared`` False), (K,) for values all
    vehicles share. ``groups`` lists (dtype name, element indices) in order."""

    name: str
    shared: bool
    groups: tuple
    size: int


def _pack(name: str, leaves: list, shared: bool, n_pad: int) -> tuple[_Arg, list]:
    """Flatten ``leaves`` (per-vehicle: leading axis N; shared: no vehicle axis) into per-dtype
    feature-major arrays, padded to ``n_pad`` vehicles with copies of the last one."""
    cols, dtypes = [], []
    for leaf in leaves:
        leaf = jnp.asarray(leaf)
        flat = jnp.reshape(leaf, (-1,)) if shared else jnp.reshape(leaf, (leaf.shape[0], -1)).T
        cols += list(flat)
        dtypes += [leaf.dtype.name] * (flat.shape[0])
    groups, arrays = [], []
    for d in sorted(set(dtypes), key=dtypes.index):
        idx = tuple(i for i, x in enumerate(dtypes) if x == d)
        rows = jnp.stack([cols[i] for i in idx])
        if not shared and rows.shape[1] != n_pad:
            rows = jnp.pad(rows, ((0, 0), (0, n_pad - rows.shape[1])), mode="edge")
        groups.append((d, idx))
        arrays.append(rows)
    return _Arg(name, shared, tuple(groups), len(cols)), arrays


def _spec(shape: tuple, shared: bool, block: int, lead: int = 0):
    """The BlockSpec of a packed array: per-vehicle arrays are cut into blocks of vehicles on the
    last axis, shared ones travel whole."""
    from jax.experimental import pallas as pl

    if shared:
        return pl.BlockSpec(shape, lambda i: (0,) * len(shape))
    return pl.BlockSpec(shape[:-1] + (block,), lambda i: (0,) * (len(shape) - 1) + (i,))


def _read(arg: _Arg, refs: list, *lead) -> list:
    """The argument's elements, in order, from its refs (``lead``: indices before the element's,
    e.g. the tick of a series): (block,) rows, or scalars for a shared argument."""
    out = [None] * arg.size
    for (_, idx), ref in zip(arg.groups, refs):
        for r, i in enumerate(idx):
            out[i] = ref[(*lead, r)] if arg.shared else ref[(*lead, r, slice(None))]
    return out


def _write(arg: _Arg, refs: list, values, *lead) -> None:
    """Store the argument's elements (each (block,)) as rows of its refs (``lead`` as in :func:`_read`)."""
    for (_, idx), ref in zip(arg.groups, refs):
        for r, i in enumerate(idx):
            ref[(*lead, r, slice(None))] = values[i]


def _compiler_params():
    from jax.experimental.pallas import triton as plt

    return plt.CompilerParams(num_warps=4, num_stages=1)


def _padded(n: int, block: int) -> int:
    return -(-n // block) * block


# --------------------------------------------------------------------------- the open loop


@functools.lru_cache(maxsize=None)
def rollout_step(rotors: int, dtype: str) -> StraightLine:
    """The straight-line step of :func:`quadjax.native.kernel_step` for ``rotors`` and ``dtype``:
    arguments P (params, h), S (state), U (command), Wd (wind), E (wrench); P invariant."""
    from quadjax import native

    return straight_line(native.kernel_step, native.step_example(rotors, np.dtype(dtype)), invariant=("P",))


def rollout_rows(P, x0, U, Wd, E, *, substeps: int, save_every: int, rotors: int, block: int = BLOCK,
                 interpret: bool = False):
    """:data:`quadjax.native.rollout_p` in the Pallas kernel.

    Packed rows with the same number of leading batch dims (each 1 or the batch's): params
    ``P`` (..., N_P), state ``x0`` (..., N_S), commands ``U`` (..., T, R), wind ``Wd`` (..., Tw, 3)
    and wrench ``E`` (..., Te, 6) with Tw, Te ∈ {1, T} (1: held). Returns ``(final (..., N_S),
    saved (..., T // save_every, N_S))``. An argument whose batch dims are all 1 is shared: read
    once per program instead of stored per vehicle.
    """
    from jax.experimental import pallas as pl

    args = {"P": (P, 1), "S": (x0, 1), "U": (U, 2), "Wd": (Wd, 2), "E": (E, 2)}
    dims = [a.shape[:a.ndim - c] for a, c in args.values()]
    batch = tuple(jnp.broadcast_shapes(*dims))
    n = math.prod(batch)
    n_pad = _padded(n, block)
    T, NS = U.shape[-2], x0.shape[-1]
    slots = T // save_every if save_every else 0
    dtype = U.dtype
    step = rollout_step(rotors, dtype.name)

    packed, series, arrays, specs = {}, {}, [], []
    for name, (a, core) in args.items():
        shared = math.prod(a.shape[:a.ndim - core]) == 1
        if shared:
            rows = jnp.reshape(a, a.shape[a.ndim - core:])  # (K,) or (T, K)
        else:
            a = jnp.reshape(jnp.broadcast_to(a, batch + a.shape[a.ndim - core:]), (n,) + a.shape[a.ndim - core:])
            rows = jnp.moveaxis(a, 0, -1)  # (K, N) or (T, K, N): vehicles last, for coalesced reads
            rows = jnp.pad(rows, [(0, 0)] * (rows.ndim - 1) + [(0, n_pad - n)], mode="edge")
        k = a.shape[-1]
        packed[name] = _Arg(name, shared, ((dtype.name, tuple(range(k))),), k)
        series[name] = a.shape[-2] if core == 2 else 0  # a series' length (1: held), 0: not a series
        arrays.append(rows)
        specs.append(_spec(rows.shape, shared, block))

    def load(ref, name, t=None):
        length = series[name]
        return _read(packed[name], [ref], *(() if not length else (t if length > 1 else 0,)))

    def kernel(p_ref, x_ref, u_ref, w_ref, e_ref, final_ref, *saved):
        hoisted = step.prologue({"P": load(p_ref, "P")})
        width = (block,)

        def tick(t, x):
            inputs = {"U": load(u_ref, "U", t), "Wd": load(w_ref, "Wd", t), "E": load(e_ref, "E", t)}
            for _ in range(substeps):  # static: unrolled
                x = tuple(step.step(hoisted, {"S": list(x), **inputs}))
            return x

        x = tuple(jnp.broadcast_to(v, width) for v in load(x_ref, "S"))
        if save_every:
            def slot(s, x):
                x = jax.lax.fori_loop(s * save_every, (s + 1) * save_every, tick, x)
                _write(packed["S"], [saved[0]], x, s)
                return x

            x = jax.lax.fori_loop(0, slots, slot, x)
        else:
            x = jax.lax.fori_loop(0, T, tick, x)
        _write(packed["S"], [final_ref], x)

    out_shape = [jax.ShapeDtypeStruct((NS, n_pad), dtype)]
    out_specs = [_spec((NS, n_pad), False, block)]
    if save_every:
        out_shape.append(jax.ShapeDtypeStruct((slots, NS, n_pad), dtype))
        out_specs.append(_spec((slots, NS, n_pad), False, block))
    outs = pl.pallas_call(kernel, out_shape=out_shape, grid=(n_pad // block,), in_specs=specs, out_specs=out_specs,
                          interpret=interpret, compiler_params=None if interpret else _compiler_params(),
                          name=f"quadjax_rollout_r{rotors}")(*arrays)
    final = jnp.reshape(outs[0][:, :n].T, batch + (NS,))
    if not save_every:
        return final, jnp.zeros(batch + (0, NS), dtype)
    saved = jnp.reshape(jnp.moveaxis(outs[1][:, :, :n], -1, 0), batch + (slots, NS))
    return final, saved


# --------------------------------------------------------------------------- the closed loop


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ClosedLoop:
    """What :func:`closed_loop` returns, every leaf with a leading vehicle axis (N, ...):
    ``final`` the state after the last tick, ``ctrl_state`` the controller's, ``fold`` the fold's
    value (None without a fold)."""

    final: object
    ctrl_state: object
    fold: object


def closed_loop_tick(controller, fold, substeps: int):
    """One vehicle's tick as the closed-loop kernel runs it (and :func:`quadjax.simulate` does):
    at t = k·dt the controller maps the state to a command, held for ``substeps`` RK4 steps of
    dt / substeps (:func:`quadjax.native.kernel_step`, the params' wind, no wrench), then
    ``fold(acc, state after)`` (a :class:`quadjax.engine.Reduce`'s function).

    ``tick(P, C, S, cs, acc, k) -> (S, cs, acc)`` with ``P = (params, h, dt)``."""
    from quadjax import native

    def tick(P, C, S, cs, acc, k):
        params, h, dt = P
        t = k.astype(dt.dtype) * dt
        command, cs = controller(C, cs, S, t)
        command = jnp.asarray(command, dt.dtype)
        wrench = jnp.zeros((6,), dt.dtype)
        for _ in range(substeps):
            S = native.kernel_step((params, h), S, command, params.wind, wrench)
        return S, cs, (acc if fold is None else fold(acc, S))

    return tick


def closed_loop(params, state0, controller, ctrl_params, ctrl_state, *, dt, num_ticks: int, substeps: int = 1,
                fold=None, fold_init=None, in_axes=(0, 0, None, 0, None), block: int = BLOCK,
                interpret: bool = False) -> ClosedLoop:
    """Fly N vehicles under ``controller`` for ``num_ticks`` ticks of ``dt`` [s], the whole horizon
    in one Pallas kernel: physics, controller and the fold, each vehicle's values in registers.

    ``controller(ctrl_params, ctrl_state, state, t) -> (command (R,), ctrl_state)`` is
    :func:`quadjax.simulate`'s controller (``functools.partial(pid_control, rates=...)``,
    ``geometric_control``); ``fold(acc, state) -> acc`` is folded over the state after every tick
    from ``fold_init`` (streaming statistics: worst error, energy, a crash flag). ``in_axes``:
    for (params, state0, ctrl_params, ctrl_state, fold_init), 0 where the argument has a
    leading vehicle axis, None where every vehicle shares it. Equals ``jax.vmap`` of
    :func:`quadjax.simulate` with ``controller=`` and a :class:`~quadjax.engine.Reduce` hook,
    on valid params (tests/test_gpu.py); params are not checked here (check them with
    :func:`quadjax.check_params` or fly them through :func:`quadjax.simulate` first).

    The controller and the fold must be per-vehicle JAX functions the generator supports
    (:func:`quadjax.native.generate.straight_line`); one it cannot scalarise raises
    :class:`~quadjax.native.generate.UnsupportedPrimitive` naming the primitive, at trace time.
    """
    from jax.experimental import pallas as pl

    from quadjax.state import QuadState

    if not isinstance(num_ticks, int) or num_ticks < 1 or not isinstance(substeps, int) or substeps < 1:
        raise ValueError(f"closed_loop: num_ticks={num_ticks!r}, substeps={substeps!r}: expected ints >= 1")
    if len(in_axes) != 5 or any(a not in (0, None) for a in in_axes):
        raise ValueError(f"closed_loop: in_axes={in_axes!r}: five entries, each 0 or None")
    if not isinstance(state0, QuadState):
        raise ValueError(f"closed_loop: state0: expected a QuadState, got {type(state0).__name__}")
    trees = (params, state0, ctrl_params, ctrl_state, fold_init)
    sizes = {jnp.shape(x)[0] for t, a in zip(trees, in_axes) if a == 0 for x in jax.tree_util.tree_leaves(t)}
    if len(sizes) != 1:
        raise ValueError(f"closed_loop: the arguments mapped over vehicles (in_axes 0) must agree on N, got {sorted(sizes)}")
    n = sizes.pop()
    dtype = jnp.result_type(state0.position)
    params = params.astype(dtype)
    dt = jnp.asarray(dt, dtype)
    P = (params, dt / substeps, dt)  # h as the engine divides it: the same bits

    def one(tree, axis):  # one vehicle's abstract value
        return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[1:] if axis == 0 else jnp.shape(x),
                                                                     jnp.result_type(x)), tree)

    p_axes = in_axes[0]
    example = {"P": (one(params, p_axes), jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((), dtype)),
               "C": one(ctrl_params, in_axes[2]), "S": one(state0, in_axes[1]), "cs": one(ctrl_state, in_axes[3]),
               "acc": one(fold_init, in_axes[4]), "k": jax.ShapeDtypeStruct((), jnp.int32)}
    step = straight_line(closed_loop_tick(controller, fold, substeps), example, invariant=("P", "C"))

    n_pad = _padded(n, block)
    shared = {"P": p_axes is None, "C": in_axes[2] is None, "S": in_axes[1] is None, "cs": in_axes[3] is None,
              "acc": in_axes[4] is None}
    trees = {"P": P if p_axes is None else (params, jnp.broadcast_to(P[1], (n,)), jnp.broadcast_to(P[2], (n,))),
             "C": ctrl_params, "S": state0, "cs": ctrl_state, "acc": fold_init}
    args, arrays, specs = {}, [], []
    for name, tree in trees.items():
        arg, rows = _pack(name, jax.tree_util.tree_leaves(tree), shared[name], n_pad)
        args[name] = arg
        arrays += rows
        specs += [_spec(r.shape, arg.shared, block) for r in rows]
    carried = ("S", "cs", "acc")
    out_shape, out_specs = [], []
    for name in carried:
        for d, idx in args[name].groups:
            out_shape.append(jax.ShapeDtypeStruct((len(idx), n_pad), d))
            out_specs.append(_spec((len(idx), n_pad), False, block))
    counts = [len(args[name].groups) for name in trees]

    def kernel(*refs):
        ins, outs = refs[:len(arrays)], refs[len(arrays):]
        by_arg, at = {}, 0
        for name, c in zip(trees, counts):
            by_arg[name], at = list(ins[at:at + c]), at + c
        hoisted = step.prologue({"P": _read(args["P"], by_arg["P"]), "C": _read(args["C"], by_arg["C"])})
        sizes = [args[name].size for name in carried]

        def tick(k, carry):
            it = iter(carry)
            values = {name: [next(it) for _ in range(size)] for name, size in zip(carried, sizes)}
            return tuple(step.step(hoisted, {**values, "k": [k]}))

        carry = tuple(jnp.broadcast_to(v, (block,)) for name in carried for v in _read(args[name], by_arg[name]))
        carry = jax.lax.fori_loop(0, num_ticks, tick, carry)
        it, o = iter(carry), 0
        for name, size in zip(carried, sizes):
            values = [next(it) for _ in range(size)]
            c = len(args[name].groups)
            _write(args[name], list(outs[o:o + c]), values)
            o += c

    outs = pl.pallas_call(kernel, out_shape=out_shape, grid=(n_pad // block,), in_specs=specs, out_specs=out_specs,
                          interpret=interpret, compiler_params=None if interpret else _compiler_params(),
                          name="quadjax_closed_loop")(*arrays)
    results, o = {}, 0
    for name in carried:
        arg, tree = args[name], trees[name]
        flat = [None] * arg.size
        for d, idx in arg.groups:
            for r, i in enumerate(idx):
                flat[i] = outs[o][r, :n]
            o += 1
        leaves, at = [], 0
        for leaf in jax.tree_util.tree_leaves(tree):
            shape = jnp.shape(leaf)[0 if arg.shared else 1:]
            k = math.prod(shape)
            leaves.append(jnp.reshape(jnp.stack(flat[at:at + k], axis=-1), (n,) + shape))
            at += k
        results[name] = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree), leaves)
    return ClosedLoop(final=results["S"], ctrl_state=results["cs"], fold=results["acc"] if fold is not None else None)
