"""C source generated from the JAX model: one statement of the physics, compiled (issue 13).

:func:`generate` traces a per-vehicle function of pytrees of small static-shape arrays (the
library's ``rk4_step``, ``derivative``, or a variant of them) with ``jax.make_jaxpr`` and
emits one straight-line C function from the jaxpr. The emitter is a partial evaluator over
*scalarised* values: every array of the trace is a numpy object array whose elements are
either Python/numpy constants (folded at generation time, in the element's own dtype, so
float32 folds round as float32 arithmetic does) or the names of C locals. So

* ``lax.scan`` of a static trip count is unrolled; its counter is a constant in each copy,
  and the ``dynamic_slice`` / ``rem`` it drives fold away;
* ``jit`` (pjit) and ``custom_jvp_call`` are inlined;
* slicing, squeezing, reshapes, broadcasts, ``stack`` and ``concatenate`` only move names;
* arithmetic, comparisons and ``select_n`` become one C expression per element.

An unsupported primitive raises :class:`UnsupportedPrimitive` naming it, at generation time.
Repeated subexpressions of the trace are emitted once (value numbering).

Two forms: :func:`generate`, one call of the function for one vehicle (scalar C); and
:func:`generate_rollout`, a time loop over a block of W vehicles in SIMD lanes, with what
depends on the parameters alone hoisted out of the loop. Not yet wired into the engine's
kernel (``rollout.cc`` is still the hand-written form): that, the tangent and adjoint
steps and the speed targets are the rest of issue 13.

The layout of the flat input and output vectors is the pytree's leaves in order (for the
dataclasses: their fields in declaration order), each raveled C-order: :class:`Layout`
records it, so the harness never restates a field list. NaN semantics follow XLA: ``max``,
``min`` and ``clamp`` propagate NaN. The code is meant to be compiled with
``-ffp-contract=off`` (no FMA), like the hand-written kernel, so it rounds as the model's
un-fused XLA operations do.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.extend.core
import numpy as np


class UnsupportedPrimitive(NotImplementedError):
    """The traced function uses a primitive the generator has no C form for."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each leaf of a pytree sits in a flat vector: (path, shape, offset) in order."""

    entries: tuple
    size: int

    @classmethod
    def of(cls, tree) -> "Layout":
        entries, offset = [], 0
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            shape = tuple(np.shape(leaf))
            entries.append((jax.tree_util.keystr(path), shape, offset))
            offset += math.prod(shape)
        return cls(tuple(entries), offset)


_CTYPE = {np.dtype("float32"): "float", np.dtype("float64"): "double", np.dtype("bool"): "bool",
          np.dtype("int32"): "int32_t", np.dtype("int64"): "int64_t", np.dtype("uint32"): "uint32_t"}

_PRELUDE = """#include <math.h>
#include <stdbool.h>
#include <stdint.h>
/* XLA's max/min/clamp propagate NaN; fmax/fmin do not */
static inline double qj_max_d(double a, double b) { return (a != a || a > b) ? a : b; }
static inline double qj_min_d(double a, double b) { return (a != a || a < b) ? a : b; }
static inline float qj_max_f(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float qj_min_f(float a, float b) { return (a != a || a < b) ? a : b; }
"""


_LITERAL = jax.extend.core.Literal


class _Sym(str):
    """The name of a C local (an element of a value that is not known at generation time)."""


class _Emitter:
    """Straight-line scalar C: one ``const`` local per computed element. Repeated
    subexpressions of the trace are emitted once (value numbering, :meth:`local`)."""

    def __init__(self):
        self.lines: list[str] = []
        self.count = 0
        self.seen: dict = {}

    def local(self, deps, ctype: str, expr: str) -> _Sym:
        """The local holding ``expr`` (``deps``: its operands), emitted on first use."""
        if (ctype, expr) not in self.seen:
            name = f"v{self.count}"
            self.count += 1
            self.seen[ctype, expr] = self.emit(name, deps, ctype, expr)
        return self.seen[ctype, expr]

    def emit(self, name: str, deps, ctype: str, expr: str) -> _Sym:
        self.lines.append(f"  const {ctype} {name} = {expr};")
        return _Sym(name)


class _LaneEmitter(_Emitter):
    """C over W lanes (one vehicle each): every local is an array ``vN[W]`` computed by a loop
    the compiler vectorises. A local whose operands are all invariant (the parameters, dt and
    what depends on them alone) goes to the prologue, computed once per block of vehicles
    rather than every step: the loop-invariant code motion a call boundary would prevent."""

    def __init__(self, invariant: set):
        super().__init__()
        self.prologue: list[str] = []
        self.declared: list[tuple[str, str]] = []
        self.invariant = set(invariant)

    def emit(self, name: str, deps, ctype: str, expr: str) -> _Sym:
        self.declared.append((ctype, name))
        sym = _Sym(f"{name}[l]")
        fixed = all(d in self.invariant for d in deps if isinstance(d, _Sym))
        (self.prologue if fixed else self.lines).append(f"    LANES {name}[l] = {expr};")
        if fixed:
            self.invariant.add(sym)
        return sym


def _literal(x, dtype: np.dtype) -> str:
    """A C literal for the constant ``x`` of ``dtype``."""
    if dtype == np.bool_:
        return "true" if bool(x) else "false"
    if np.issubdtype(dtype, np.integer):
        return str(int(x))
    v = float(x)
    suffix = "f" if dtype == np.float32 else ""
    if math.isnan(v):
        return f"(({_CTYPE[dtype]})NAN)"
    if math.isinf(v):
        return f"(({_CTYPE[dtype]}){'-' if v < 0 else ''}INFINITY)"
    # a hex float is exact: no decimal rounding between the folded constant and the C one
    return f"({float(np.asarray(v, dtype)).hex()}{suffix})"


def _expr(x, dtype) -> str:
    return x if isinstance(x, _Sym) else _literal(x, dtype)


def _const(x, dtype):
    """A folded constant as a numpy scalar of ``dtype`` (so arithmetic rounds in it)."""
    return np.asarray(x, dtype=dtype)[()]


# element-wise primitives: (numpy fold, C form taking (expressions, C suffix "d"/"f"))
def _binary(op):
    return lambda a, b, s: f"({a} {op} {b})"


def _call(name):
    return lambda *args: f"{name}{'f' if args[-1] == 'f' else ''}({', '.join(args[:-1])})"


_ELEMENTWISE = {
    "add": (np.add, _binary("+")), "sub": (np.subtract, _binary("-")), "mul": (np.multiply, _binary("*")),
    "div": (np.divide, _binary("/")), "neg": (np.negative, lambda a, s: f"(-{a})"),
    "max": (np.fmax, lambda a, b, s: f"qj_max_{s}({a}, {b})"), "min": (np.fmin, lambda a, b, s: f"qj_min_{s}({a}, {b})"),
    "gt": (np.greater, _binary(">")), "lt": (np.less, _binary("<")), "ge": (np.greater_equal, _binary(">=")),
    "le": (np.less_equal, _binary("<=")), "eq": (np.equal, _binary("==")), "ne": (np.not_equal, _binary("!=")),
    "and": (np.logical_and, _binary("&&")), "or": (np.logical_or, _binary("||")),
    "not": (np.logical_not, lambda a, s: f"(!{a})"),
    "sqrt": (np.sqrt, _call("sqrt")), "exp": (np.exp, _call("exp")), "log": (np.log, _call("log")),
    "sin": (np.sin, _call("sin")), "cos": (np.cos, _call("cos")), "tanh": (np.tanh, _call("tanh")),
    "abs": (np.abs, lambda a, s: f"fabs{'f' if s == 'f' else ''}({a})"),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda a, s: f"(1{'.0f' if s == 'f' else '.0'} / sqrt{'f' if s == 'f' else ''}({a}))"),
    "sign": (np.sign, lambda a, s: f"(({a} > 0) - ({a} < 0))"),
}


class _Generator:
    def __init__(self, emitter=None):
        self.out = emitter or _Emitter()

    # ---- values are numpy object arrays of constants and _Sym names, with their dtype
    def read(self, env, var):
        if isinstance(var, _LITERAL):
            return np.asarray(var.val, dtype=object).reshape(np.shape(var.val)), np.dtype(var.aval.dtype)
        return env[var]

    def run(self, jaxpr, consts, args):
        env = {}
        for v, c in zip(jaxpr.constvars, consts):
            arr = np.asarray(c)
            env[v] = (np.vectorize(lambda x, d=arr.dtype: _const(x, d), otypes=[object])(arr) if arr.size else
                      np.empty(arr.shape, object), arr.dtype)
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for eqn in jaxpr.eqns:
            ins = [self.read(env, v) for v in eqn.invars]
            outs = self.apply(eqn, ins)
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        return [self.read(env, v) for v in jaxpr.outvars]

    def apply(self, eqn, ins):
        name = eqn.primitive.name
        out_avals = [v.aval for v in eqn.outvars]
        if name in _ELEMENTWISE or name in ("select_n", "integer_pow", "convert_element_type", "clamp", "rem",
                                            "copy", "copy_p", "pow"):
            return [self.elementwise(name, eqn.params, ins, out_avals[0])]
        handler = getattr(self, f"p_{name}", None)
        if handler is None:
            raise UnsupportedPrimitive(f"quadjax.native.generate: no C form for the primitive '{name}' "
                                       f"(in {eqn.source_info.name_stack if hasattr(eqn, 'source_info') else eqn})")
        return handler(eqn, ins, out_avals)

    # ---- element-wise
    def elementwise(self, name, params, ins, aval):
        dtype = np.dtype(aval.dtype)
        shape = tuple(aval.shape)
        arrays = [np.broadcast_to(a, shape) for a, _ in ins]
        dtypes = [d for _, d in ins]
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(shape):
            out[idx] = self.scalar(name, params, [a[idx] for a in arrays], dtypes, dtype)
        return out, dtype

    def scalar(self, name, params, xs, dtypes, dtype):
        known = not any(isinstance(x, _Sym) for x in xs)
        suffix = "f" if dtype == np.float32 or (dtypes and dtypes[0] == np.float32) else "d"
        ctype = _CTYPE[dtype]
        if name == "select_n":
            pred, cases = xs[0], xs[1:]
            if not isinstance(pred, _Sym):
                return cases[int(pred)]
            if len(cases) != 2:
                raise UnsupportedPrimitive("quadjax.native.generate: select_n with more than two cases")
            return self.out.local(xs, ctype, f"({pred} ? {_expr(cases[1], dtype)} : {_expr(cases[0], dtype)})")
        if name == "convert_element_type":
            if known:
                return _const(xs[0], dtype)
            return self.out.local(xs, ctype, f"({ctype})({xs[0]})")
        if name in ("copy", "copy_p"):
            return xs[0]
        if name == "integer_pow":
            y = params["y"]
            if known:
                return _const(np.asarray(xs[0]) ** y, dtype)
            body = " * ".join([xs[0]] * abs(y)) if y else _literal(1, dtype)
            return self.out.local(xs, ctype, f"({_literal(1, dtype)} / ({body}))" if y < 0 else f"({body})")
        if name == "clamp":  # clamp(lo, x, hi)
            lo, x, hi = xs
            if known:
                return _const(np.fmin(np.fmax(x, lo), hi) if not np.isnan(x) else x, dtype)
            e = f"qj_min_{suffix}(qj_max_{suffix}({_expr(x, dtype)}, {_expr(lo, dtype)}), {_expr(hi, dtype)})"
            return self.out.local(xs, ctype, e)
        if name == "rem":
            if known:
                return _const(np.fmod(xs[0], xs[1]), dtype)
            a, b = (_expr(x, d) for x, d in zip(xs, dtypes))
            return self.out.local(xs, ctype, f"fmod{'f' if suffix == 'f' else ''}({a}, {b})" if np.issubdtype(
                dtype, np.floating) else f"({a} % {b})")
        if name == "pow":
            if known:
                return _const(np.power(xs[0], xs[1]), dtype)
            return self.out.local(xs, ctype, f"pow{'f' if suffix == 'f' else ''}({_expr(xs[0], dtypes[0])}, "
                                         f"{_expr(xs[1], dtypes[1])})")
        fold, form = _ELEMENTWISE[name]
        if known:
            with np.errstate(all="ignore"):
                if name in ("max", "min"):  # XLA semantics: NaN wins
                    a, b = xs
                    v = a if np.isnan(a) else b if np.isnan(b) else fold(a, b)
                else:
                    v = fold(*[_const(x, d) for x, d in zip(xs, dtypes)])
            return _const(v, dtype)
        return self.out.local(xs, ctype, form(*[_expr(x, d) for x, d in zip(xs, dtypes)], suffix))

    # ---- structure: names move, nothing is computed
    def p_broadcast_in_dim(self, eqn, ins, avals):
        (x, d), aval = ins[0], avals[0]
        dims = eqn.params["broadcast_dimensions"]
        shape = list(np.ones(len(aval.shape), int))
        for i, dim in enumerate(dims):
            shape[dim] = x.shape[i]
        return [(np.broadcast_to(x.reshape(shape), aval.shape).copy(), d)]

    def p_reshape(self, eqn, ins, avals):
        return [(ins[0][0].reshape(avals[0].shape), ins[0][1])]

    p_squeeze = p_reshape
    p_expand_dims = p_reshape

    def p_slice(self, eqn, ins, avals):
        (x, d) = ins[0]
        strides = eqn.params["strides"] or (1,) * x.ndim
        idx = tuple(slice(a, b, s) for a, b, s in zip(eqn.params["start_indices"], eqn.params["limit_indices"], strides))
        return [(x[idx], d)]

    def p_dynamic_slice(self, eqn, ins, avals):
        (x, d), starts = ins[0], ins[1:]
        sizes = eqn.params["slice_sizes"]
        idx = []
        for (s, _), size, n in zip(starts, sizes, x.shape):
            s = s[()] if isinstance(s, np.ndarray) else s
            if isinstance(s, _Sym):
                raise UnsupportedPrimitive("quadjax.native.generate: dynamic_slice with an index known only at run time")
            start = min(max(int(s), 0), n - size)  # XLA clamps the start into range
            idx.append(slice(start, start + size))
        return [(x[tuple(idx)], d)]

    def p_concatenate(self, eqn, ins, avals):
        return [(np.concatenate([x for x, _ in ins], axis=eqn.params["dimension"]), np.dtype(avals[0].dtype))]

    def p_stack(self, eqn, ins, avals):
        return [(np.stack([x for x, _ in ins], axis=eqn.params["axis"]), np.dtype(avals[0].dtype))]

    def p_iota(self, eqn, ins, avals):
        aval = avals[0]
        dtype = np.dtype(aval.dtype)
        dim = eqn.params["dimension"]
        ramp = np.arange(aval.shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(aval.shape))])
        values = np.broadcast_to(ramp, aval.shape)
        return [(np.vectorize(lambda x: _const(x, dtype), otypes=[object])(values), dtype)]

    def p_reduce_sum(self, eqn, ins, avals):
        (x, d) = ins[0]
        axes = tuple(eqn.params["axes"])
        moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0))) if axes else x
        flat = moved.reshape(moved.shape[: moved.ndim - len(axes)] + (-1,))
        out = np.empty(flat.shape[:-1], object)
        for idx in np.ndindex(out.shape):  # left to right, as a sequential sum would
            acc = flat[idx + (0,)]
            for y in flat[idx][1:]:
                acc = self.scalar("add", {}, [acc, y], [d, d], d)
            out[idx] = acc
        return [(out, d)]

    # ---- calls and loops: inlined / unrolled
    def p_jit(self, eqn, ins, avals):
        closed = eqn.params["jaxpr"]
        return self.run(closed.jaxpr, closed.consts, ins)

    p_pjit = p_jit

    def p_custom_jvp_call(self, eqn, ins, avals):
        closed = eqn.params["call_jaxpr"]
        return self.run(closed.jaxpr, closed.consts, ins)

    def p_custom_vjp_call(self, eqn, ins, avals):
        closed = eqn.params.get("call_jaxpr") or eqn.params["fun_jaxpr"]
        return self.run(closed.jaxpr, closed.consts, ins)

    def p_scan(self, eqn, ins, avals):
        p = eqn.params
        if p.get("reverse"):
            raise UnsupportedPrimitive("quadjax.native.generate: reverse scan")
        closed, length = p["jaxpr"], p["length"]
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
        ys = []
        for i in range(length):
            step_xs = [(np.asarray(x[i], dtype=object), d) for x, d in xs]
            outs = self.run(closed.jaxpr, closed.consts, list(consts) + list(carry) + step_xs)
            carry, y = outs[:n_carry], outs[n_carry:]
            ys.append(y)
        stacked = [(np.stack([y[k][0] for y in ys]), ys[0][k][1]) for k in range(len(avals) - n_carry)] if ys else []
        return list(carry) + stacked


def _named(leaves, name, start: int = 0) -> tuple[list, int]:
    """Each leaf's elements as C names ``name(k)``, k counting on from ``start`` in leaf and
    C order (the :class:`Layout` order); returns the object arrays and the next k."""
    arrays, k = [], start
    for leaf in leaves:
        names = np.empty(np.shape(leaf), object)
        for idx in np.ndindex(names.shape):
            names[idx] = _Sym(name(k))
            k += 1
        arrays.append(names)
    return arrays, k


def generate(fn, example_args: tuple, name: str) -> tuple[str, Layout, Layout]:
    """C source of ``void name(const T* in, T* out)`` computing ``fn(*example_args)`` for one
    vehicle, and the layouts of ``in`` (the flattened args) and ``out`` (the flattened result).

    ``example_args`` fix the shapes and the one float dtype T of every leaf (float32 or float64).
    """
    closed = jax.make_jaxpr(fn)(*example_args)
    leaves = jax.tree_util.tree_leaves(example_args)
    dtypes = {np.dtype(np.asarray(x).dtype) for x in leaves}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (np.float32, np.float64):
        raise ValueError(f"generate: every input leaf must share one dtype, float32 or float64 (got {dtypes})")
    dtype = next(iter(dtypes))
    ctype = _CTYPE[dtype]
    gen = _Generator()
    names, _ = _named(leaves, lambda k: f"in[{k}]")
    outs = gen.run(closed.jaxpr, closed.consts, [(x, dtype) for x in names])
    out_tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(jax.eval_shape(fn, *example_args)),
                                            [np.zeros(x.shape) for x, _ in outs])
    body, k = [], 0
    for x, d in outs:
        for idx in np.ndindex(x.shape):
            body.append(f"  out[{k}] = ({ctype})({_expr(x[idx], d)});")
            k += 1
    source = (_PRELUDE + f"\nvoid {name}(const {ctype}* restrict in, {ctype}* restrict out) {{\n"
              + "\n".join(gen.out.lines + body) + "\n}\n")
    return source, Layout.of(example_args), Layout.of(out_tree)


def generate_rollout(step, params, state, command, dt, name: str, lanes: int = 8) -> tuple[str, Layout, Layout]:
    """C of ``void name(const T* P, T* S, const T* U, long steps)``: ``steps`` applications of
    ``state = step(params, state, command[t], dt)`` to a block of ``lanes`` vehicles at once.

    Structure of arrays, lane fastest: ``P`` (NP, W) the parameters then dt (:class:`Layout`
    of ``(params, dt)``), ``S`` (NS, W) the state, updated in place (:class:`Layout` of
    ``state``), ``U`` (steps, R, W) the commands. What depends on the parameters and dt alone
    is computed once, before the time loop; the rest every step, lane-parallel.
    """
    closed = jax.make_jaxpr(step)(params, state, command, dt)
    dtype = np.dtype(np.asarray(jax.tree_util.tree_leaves(state)[0]).dtype)
    ctype = _CTYPE[dtype]
    p_leaves, s_leaves = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(state)
    R = int(np.shape(command)[-1])
    # P holds the params then dt (the invariant inputs); the step takes (params, state, command, dt)
    (*p_names, dt_name), _ = _named(p_leaves + [dt], lambda k: f"P[{k} * W + l]")
    s_names, n_state = _named(s_leaves, lambda j: f"s{j}[l]")
    (cmd,), _ = _named([command], lambda r: f"U[(t * {R} + {r}) * W + l]")
    state_vars = [f"s{j}" for j in range(n_state)]
    args = [(x, dtype) for x in p_names + s_names + [cmd, dt_name]]
    out = _LaneEmitter({x for a in p_names + [dt_name] for x in a.flat})
    outs = _Generator(out).run(closed.jaxpr, closed.consts, args)
    flat_out = [(x[idx], d) for x, d in outs for idx in np.ndindex(x.shape)]
    if len(flat_out) != len(state_vars):
        raise ValueError(f"generate_rollout: the step returns {len(flat_out)} values for a state of {len(state_vars)}")
    decl = [f"  {c} {n}[W];" for c, n in out.declared] + [f"  {ctype} {s}[W], n{s}[W];" for s in state_vars]
    load = [f"  LANES {s}[l] = S[{i} * W + l];" for i, s in enumerate(state_vars)]
    step_out = [f"    LANES n{s}[l] = ({ctype})({_expr(x, d)});" for s, (x, d) in zip(state_vars, flat_out)]
    commit = [f"    LANES {s}[l] = n{s}[l];" for s in state_vars]
    store = [f"  LANES S[{i} * W + l] = {s}[l];" for i, s in enumerate(state_vars)]
    prologue = [line[2:] for line in out.prologue]
    source = (_PRELUDE + f"#define W {lanes}\n#define LANES _Pragma(\"omp simd\") for (int l = 0; l < W; ++l)\n"
              f"\nvoid {name}(const {ctype}* restrict P, {ctype}* restrict S, const {ctype}* restrict U, long steps) {{\n"
              + "\n".join(decl + load + prologue) + "\n  for (long t = 0; t < steps; ++t) {\n"
              + "\n".join(out.lines + step_out + commit) + "\n  }\n" + "\n".join(store) + "\n}\n")
    return source, Layout.of((params, dt)), Layout.of(state)
