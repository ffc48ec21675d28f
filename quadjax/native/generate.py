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

Two forms: :func:`generate`, one call of the function for one vehicle (scalar C, for tests
and tools); and :func:`generate_kernel`, the engine's kernel step (quadjax.native): C++ over
GCC vector types, W vehicles in the lanes of one SIMD register, every local a register value
the compiler schedules and allocates as straight-line code, and what depends on the
parameters alone hoisted into a prologue run once per block of vehicles.

The layout of the flat input and output vectors is the pytree's leaves in order (for the
dataclasses: their fields in declaration order), each raveled C-order: :class:`Layout`
records it, so the harness never restates a field list. NaN semantics follow XLA: ``max``,
``min`` and ``clamp`` propagate NaN. Compiled with ``-ffp-contract=off`` (no FMA) the code rounds
as the model's un-fused XLA operations do (tests/test_generate.py). The kernel form writes its fused
multiply-adds itself (a product whose every use is a sum is fused into each, one rounding) and is
compiled without contraction (quadjax.native.FLAGS): it agrees with XLA to rounding, and rounds the
same at every vector width.
"""

from __future__ import annotations

import dataclasses
import math
import re

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
            shape = _shape(leaf)
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
_LOCAL = re.compile(r"\bv\d+\b")  # a local's name in emitted C
_DEFINITION = re.compile(r"\s*const V (v\d+) = ")
_ASSIGNMENT = re.compile(r"\s*(v\d+) = ")  # a branch's result


class _Sym(str):
    """The name of a C local (an element of a value that is not known at generation time)."""


class _Emitter:
    """Straight-line scalar C: one ``const`` local per computed element. Repeated
    subexpressions of the trace are emitted once (value numbering, :meth:`local`)."""

    def __init__(self):
        self.lines: list[str] = []
        self.count = 0
        self.seen: dict = {}

    branches = False  # a cond's branch per block of lanes (_VectorEmitter); here both arms and a select

    def mark(self) -> tuple:
        """Where the emitted code stands: equal marks, nothing emitted between them."""
        return len(self.lines), self.count

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

    # how values and operations are spelled (scalar C here; vector lanes in _VectorEmitter)
    def ctype(self, dtype) -> str:
        return _CTYPE[np.dtype(dtype)]

    def expr(self, x, dtype) -> str:
        return x if isinstance(x, _Sym) else _literal(x, np.dtype(dtype))

    def spell(self, name: str, args: list, suffix: str) -> str:
        """C for the element-wise primitive ``name`` on operand expressions ``args``."""
        _, kind, sym = _ELEMENTWISE[name]
        if kind == "op":
            return f"({args[0]} {sym} {args[1]})"
        if kind == "prefix":
            return f"({sym}{args[0]})"
        if kind == "nan":
            return f"qj_{sym}_{suffix}({args[0]}, {args[1]})"
        f = "f" if suffix == "f" else ""
        if sym == "rsqrt":
            return f"(1{'.0f' if f else '.0'} / sqrt{f}({args[0]}))"
        if sym == "sign":
            return f"(({args[0]} > 0) - ({args[0]} < 0))"
        return f"{sym}{f}({', '.join(args)})"

    def select(self, pred: str, on_true: str, on_false: str) -> str:
        return f"({pred} ? {on_true} : {on_false})"

    def convert(self, x: str, src, dst) -> str:
        return f"({_CTYPE[np.dtype(dst)]})({x})"

    def clamp(self, lo: str, x: str, hi: str, suffix: str) -> str:
        return f"qj_min_{suffix}(qj_max_{suffix}({x}, {lo}), {hi})"

    def call(self, name: str, args: list, suffix: str) -> str:
        """A libm function of two arguments (fmod, pow)."""
        return f"{name}{'f' if suffix == 'f' else ''}({', '.join(args)})"

    def intdiv(self, a: str, b: str) -> str:
        return f"({a} % {b})"

    def quotient(self, a: str, b: str) -> str:
        """a / b of integers, truncated (C's and XLA's)."""
        return f"({a} / {b})"

    def bitwise(self, name: str) -> None:
        """``and`` / ``or`` / ``not`` of integers: spelled as logical here (scalar C of bools)."""

    def integer_pow(self, x: str, y: int, dtype) -> str:
        """x**y for a static integer y, as repeated products (what XLA emits)."""
        one = self.expr(_const(1, dtype), dtype)
        body = " * ".join([x] * abs(y)) if y else one
        return f"({one} / ({body}))" if y < 0 else f"({body})"

    def exact_division(self, operands) -> bool:
        """Whether a division (``a / b``, or a negative ``integer_pow``) of these operands keeps
        XLA's correctly rounded quotient; else it is ``a * (1 / b)`` with ``1 / b`` shared. Here always."""
        return True

    def note(self, name: str, q: _Sym, xs, dtype) -> None:
        """A float local ``q = name(*xs)`` was emitted (:class:`_VectorEmitter` fuses multiply-adds
        from these; scalar C leaves the products and sums as XLA's un-fused operations round)."""


class _VectorEmitter(_Emitter):
    """C++ over a block of W vehicles, one per lane of GCC vector types (``V``: W floats, ``M``:
    the W-lane mask comparisons yield), so that every local is a vector register value and the
    compiler schedules and allocates the whole step as straight-line SIMD code. A local whose
    operands are all invariant (the parameters and what depends on them alone) goes to the
    prologue, stored in ``H`` once per block rather than recomputed every step."""

    def __init__(self, invariant: set, reciprocals: bool = False):
        super().__init__()
        self.prologue: list[str] = []
        self.products: dict = {}  # a local computed as a product: its two operands
        self.sums: dict = {}  # a local computed as a sum of a product: its fused forms
        self.hoisted = 0
        self.invariant = set(invariant)
        self.open: list = []  # the enclosing code and value numbering of each open branch
        self.reciprocals = reciprocals

    def emit(self, name: str, deps, ctype: str, expr: str) -> _Sym:
        if ctype not in ("V", "M"):
            raise UnsupportedPrimitive(f"quadjax.native.generate: a {ctype} value known only at run time "
                                       f"cannot live in a vector lane ({expr})")
        if all(d in self.invariant for d in deps if isinstance(d, _Sym)):
            sym = _Sym(f"H[{self.hoisted}]")
            self.hoisted += 1
            self.prologue.append(f"  {sym} = {expr};" if ctype == "V" else f"  {sym} = qj_vfloat<V>({expr});")
            # a hoisted mask is stored as 1/0 in H (a V array) and read back as a mask
            sym = sym if ctype == "V" else _Sym(f"({sym} != V{{}})")
            self.invariant.add(sym)
            return sym
        self.lines.append(f"  const {ctype} {name} = {expr};")
        return _Sym(name)

    # ---- divisions. A derivative step divides often (d(a/b) = da/b − a·db/b²) by few divisors (a
    # mass, a norm); with ``reciprocals`` each of its divisions is a product by the divisor's
    # reciprocal, computed once (once per block for a parameter's): within a rounding of XLA's
    # quotient, not bit for bit, so never in the forward step
    def exact_division(self, operands) -> bool:
        # one whose operands are all invariant runs once per block in the prologue either way
        return not self.reciprocals or all(x in self.invariant for x in operands if isinstance(x, _Sym))

    # ---- a branch taken per block: the code of a cond's second branch runs only where a lane of the
    # block takes it; every lane still gets the select of both branches, so the values are the
    # cond's (and XLA's) in every lane, and a lane's result never depends on its neighbours'
    branches = True

    def mark(self) -> tuple:
        return len(self.lines), len(self.prologue), self.count

    def open_branch(self) -> None:
        """Emit what follows into a branch (closed by :meth:`close_branch`)."""
        self.open.append((self.lines, dict(self.seen)))
        self.lines = []

    def close_branch(self, pred, outs, skipped) -> list:
        """``if (any lane of pred) {the branch; b = outs} else {b = skipped}``: the results as
        locals declared before the branch. Locals of the branch are forgotten after it (value
        numbering must not reuse them outside); hoisted ones stay (the prologue always runs)."""
        inner = self.lines
        self.lines, seen = self.open.pop()
        taken, other, results = [], [], []
        for (x, d), (x0, _) in zip(outs, skipped):
            ctype = self.ctype(d)
            names = np.empty(x.shape, object)
            for idx in np.ndindex(x.shape):
                name = _Sym(f"v{self.count}")
                self.count += 1
                self.lines.append(f"  {ctype} {name};")
                taken.append(f"  {name} = {self.expr(x[idx], d)};")
                other.append(f"  {name} = {self.expr(x0[idx], d)};")
                names[idx] = name
            results.append((names, d))
        self.lines.append(f"  if (qj_any({pred})) {{")
        self.lines += ["  " + line for line in inner + taken]
        self.lines.append("  } else {")
        self.lines += ["  " + line for line in other]
        self.lines.append("  }")
        self.seen = {k: v for k, v in self.seen.items() if k in seen or v in self.invariant}
        return results

    # Integers (a controller's tick counter, a mode) live in the float lanes as whole numbers:
    # +, −, ×, comparisons, min/max, select and remainder are exact there while |i| < 2^24
    # (float32) or 2^53 (float64); a quotient is truncated, a conversion to an integer
    # truncates. Bitwise operations on integers have no such form and are refused.
    def ctype(self, dtype) -> str:
        dtype = np.dtype(dtype)
        return "M" if dtype == np.bool_ else "V" if np.issubdtype(dtype, np.number) else _CTYPE.get(dtype, "?")

    def expr(self, x, dtype) -> str:
        if isinstance(x, _Sym):
            return x
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            return "(M{} - 1)" if bool(x) else "M{}"
        if np.issubdtype(dtype, np.integer):
            return f"({int(x)} - V{{}})"  # exact in the lane's float (the limits above)
        if not np.issubdtype(dtype, np.floating):
            raise UnsupportedPrimitive(f"quadjax.native.generate: a {dtype} constant in a vector lane")
        return f"({_literal(x, dtype)} - V{{}})"  # broadcast; c − 0 keeps the sign of −0

    def spell(self, name: str, args: list, suffix: str) -> str:
        _, kind, sym = _ELEMENTWISE[name]
        logical = {"and": "&", "or": "|", "not": "~"}
        if name in logical:
            return f"({args[0]} {logical[name]} {args[1]})" if len(args) == 2 else f"(~{args[0]})"
        if kind == "op":
            return f"({args[0]} {sym} {args[1]})"
        if kind == "prefix":
            return f"({sym}{args[0]})"
        return f"qj_v{sym}({', '.join(args)})"

    def convert(self, x: str, src, dst) -> str:
        src, dst = np.dtype(src), np.dtype(dst)
        if src == np.bool_ and np.issubdtype(dst, np.number):
            return f"qj_vfloat<V>({x})"
        if np.issubdtype(src, np.number) and dst == np.bool_:
            return f"({x} != V{{}})"
        if np.issubdtype(src, np.floating) and np.issubdtype(dst, np.integer):
            return f"qj_vtrunc({x})"  # C's and XLA's float → int: toward zero
        if np.issubdtype(src, np.number) and np.issubdtype(dst, np.number):
            return f"({x})"  # int → float, float → float of the lane's width: the same lane value
        raise UnsupportedPrimitive(f"quadjax.native.generate: convert {src} -> {dst} in a vector lane")

    def clamp(self, lo: str, x: str, hi: str, suffix: str) -> str:
        return f"qj_vmin(qj_vmax({x}, {lo}), {hi})"

    # ---- fused multiply-adds, placed here rather than by the compiler's contraction: the kernel is
    # compiled with -ffp-contract=off, so the same source rounds the same at every vector width (GCC's
    # contraction fused 486 products at one width and 482 at the other), and a vehicle's bits never
    # depend on which width of the step ran it. Sums and products are noted as they are emitted; once
    # the step is complete, :meth:`fuse` rewrites the sums of each product used only in sums
    def note(self, name: str, q: _Sym, xs, dtype) -> None:
        """Record a product (its operands; a negated product's first operand negated) and a sum that
        one of its operands could absorb (its fused forms, the second operand's first: a dot
        product's running sum is the first)."""
        if q in self.invariant:  # a hoisted product's operands would be reloaded every step to save one add
            return
        if name == "mul":
            self.products[q] = tuple(self.expr(x, dtype) for x in xs)
        elif name == "neg" and xs[0] in self.products:  # the transposes of a step negate products often
            a, b = self.products[xs[0]]
            self.products[q] = (f"(-{a})", b)  # exact; GCC folds it into the FMA's sign
        elif name in ("add", "add_any", "sub") and q not in self.sums and xs[0] is not xs[1]:
            x, y = xs
            forms = [(p, self.fma(*self.products[p], self.expr(c, dtype), sign))
                     for p, c, sign in ((y, x, "-" if name == "sub" else "+"), (x, y, "~" if name == "sub" else "+"))
                     if p in self.products]
            if forms:
                self.sums[q] = forms

    @staticmethod
    def fma(a: str, b: str, c: str, sign: str) -> str:
        """a·b + c (sign "+"), c − a·b ("-"), or a·b − c ("~"), each rounded once."""
        return {"+": f"qj_vfma({a}, {b}, {c})", "-": f"qj_vfnma({a}, {b}, {c})", "~": f"qj_vfms({a}, {b}, {c})"}[sign]

    def fuse(self, tail: list) -> int:
        """Rewrite as fused multiply-adds the sums of the products whose every live use is such a sum
        (GCC's rule for contraction: a product with another use stays, and fusing it into its sums
        would keep its operands live beside it: the tangent step was 8 % slower so). ``tail``: the
        code after the step's lines that reads its locals. Uses are read from the emitted lines, which
        are the ground truth: a local's operands at emission do not always name what its expression
        reads (a negative integer power reads the reciprocal, not its operand)."""
        reads: dict = {}  # a local: the locals its definitions read (a branch's result has two)
        for line in self.lines:
            m = _DEFINITION.match(line) or _ASSIGNMENT.match(line)
            if m:
                reads.setdefault(m.group(1), set()).update(_LOCAL.findall(line[m.end():]))
        live, todo = set(), [n for line in tail for n in _LOCAL.findall(line)]
        todo += [n for line in self.lines if not (_DEFINITION.match(line) or _ASSIGNMENT.match(line))
                 for n in _LOCAL.findall(line)]  # a branch's test
        while todo:
            n = todo.pop()
            if n not in live:
                live.add(n)
                todo += reads.get(n, ())
        uses: dict = {}
        for line in self.lines + tail:
            m = _DEFINITION.match(line) or _ASSIGNMENT.match(line)
            if m is None or m.group(1) in live:
                for n in _LOCAL.findall(line[m.end():] if m else line):
                    uses[n] = uses.get(n, 0) + 1
        claims: dict = {}
        for q, forms in self.sums.items():
            for p, _ in forms if q in live else ():
                claims[p] = claims.get(p, 0) + 1
        fusable = {p for p, n in claims.items() if uses.get(p, 0) == n}
        chosen = {q: next((f for p, f in forms if p in fusable), None) for q, forms in self.sums.items()}
        for i, line in enumerate(self.lines):
            m = _DEFINITION.match(line)
            if m and chosen.get(m.group(1)):
                self.lines[i] = f"{line[:m.end()]}{chosen[m.group(1)]};"

    def call(self, name: str, args: list, suffix: str) -> str:
        return f"qj_v{name}({', '.join(args)})"

    def intdiv(self, a: str, b: str) -> str:
        # whole numbers: C's remainder (sign of the dividend) as a − b·trunc(a / b), exact while
        # |a| < 2^24 (float32): a / b rounds no non-integer quotient onto an integer; no libm call
        return f"({a} - {b} * qj_vtrunc({a} / {b}))"

    def quotient(self, a: str, b: str) -> str:
        return f"qj_vtrunc({a} / {b})"

    def bitwise(self, name: str) -> None:
        raise UnsupportedPrimitive(f"quadjax.native.generate: bitwise '{name}' of integers in a vector lane "
                                   "(integers live in float lanes there)")


VECTOR_PRELUDE = """#include <cmath>
#include <cstdint>
#include <cstring>
// Lane-wise helpers over GCC vector types (quadjax.native.generate). XLA's max/min/clamp
// propagate NaN, as these do; libm functions apply lane by lane (the compiler vectorises the
// ones with a vector instruction: sqrt, fabs).
template <class V> inline V qj_vmax(V a, V b) { return ((a != a) | (a > b)) ? a : b; }
template <class V> inline V qj_vmin(V a, V b) { return ((a != a) | (a < b)) ? a : b; }
template <class V, class M> inline V qj_vfloat(M m) { return m ? (V{} + 1) : V{}; }
template <class M> inline bool qj_any(M m) {  // some lane of the mask is set
  // OR of the mask's 64-bit words: GCC folds it in registers (10 instructions for 16 lanes), where a
  // test lane by lane took ~45 through the stack, at every gated effect of every stage
  std::uint64_t w[sizeof(M) / 8];
  std::memcpy(w, &m, sizeof(M));
  std::uint64_t any = 0;
  for (unsigned i = 0; i < sizeof(M) / 8; ++i) any |= w[i];
  return any != 0;
}
#define QJ_LANEWISE(NAME, EXPR)                                                    \
  template <class V> inline V NAME(V a) {                                          \
    V r;                                                                           \
    for (unsigned l = 0; l < sizeof(V) / sizeof(a[0]); ++l) { auto x = a[l]; r[l] = EXPR; } \
    return r;                                                                      \
  }
// a libm call per lane costs far more than the arithmetic around it; where every lane holds the
// same argument (a reference trajectory at the tick's time), one call serves them all
#define QJ_LIBM(NAME, EXPR)                                                        \
  template <class V> inline V NAME(V a) {                                          \
    bool same = true;                                                              \
    for (unsigned l = 1; l < sizeof(V) / sizeof(a[0]); ++l) same &= a[l] == a[0];  \
    if (same) { auto x = a[0]; return (V{} + 1) * (EXPR); }                         \
    V r;                                                                           \
    for (unsigned l = 0; l < sizeof(V) / sizeof(a[0]); ++l) { auto x = a[l]; r[l] = EXPR; } \
    return r;                                                                      \
  }
QJ_LANEWISE(qj_vsqrt, std::sqrt(x))
QJ_LANEWISE(qj_vrsqrt, 1 / std::sqrt(x))
QJ_LANEWISE(qj_vfabs, std::fabs(x))
QJ_LIBM(qj_vexp, std::exp(x))
QJ_LIBM(qj_vlog, std::log(x))
QJ_LIBM(qj_vsin, std::sin(x))
QJ_LIBM(qj_vcos, std::cos(x))
QJ_LIBM(qj_vtan, std::tan(x))
QJ_LIBM(qj_vtanh, std::tanh(x))
QJ_LANEWISE(qj_vsign, (x > 0) - (x < 0))
QJ_LANEWISE(qj_vtrunc, std::trunc(x))
#undef QJ_LANEWISE
#undef QJ_LIBM
// Fused multiply-adds, one rounding, placed by the generator (the kernel is compiled without
// contraction): the same instruction at every vector width, so a lane's bits never depend on it
#if defined(__x86_64__) && defined(__FMA__)
#include <immintrin.h>
#endif
template <class V> inline V qj_vfma(V a, V b, V c) {  // a * b + c
#if defined(__x86_64__) && defined(__FMA__)
  constexpr bool f32 = sizeof(a[0]) == 4;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && f32) return (V)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
  if constexpr (sizeof(V) == 64 && !f32) return (V)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#endif
  if constexpr (sizeof(V) == 32 && f32) return (V)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
  if constexpr (sizeof(V) == 32 && !f32) return (V)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
  if constexpr (sizeof(V) == 16 && f32) return (V)_mm_fmadd_ps((__m128)a, (__m128)b, (__m128)c);
  if constexpr (sizeof(V) == 16 && !f32) return (V)_mm_fmadd_pd((__m128d)a, (__m128d)b, (__m128d)c);
#endif
#if defined(FP_FAST_FMA) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
  V r;  // a hardware FMA lane by lane (vectorised by the compiler)
  for (unsigned l = 0; l < sizeof(V) / sizeof(a[0]); ++l) r[l] = std::fma(a[l], b[l], c[l]);
  return r;
#else
  return a * b + c;  // no FMA in hardware: two roundings (the same at every width, still)
#endif
}
template <class V> inline V qj_vfnma(V a, V b, V c) { return qj_vfma(-a, b, c); }  // c - a * b
template <class V> inline V qj_vfms(V a, V b, V c) { return qj_vfma(a, b, -c); }   // a * b - c
template <class V> inline V qj_vfmod(V a, V b) { V r; for (unsigned l = 0; l < sizeof(V) / sizeof(a[0]); ++l) r[l] = std::fmod(a[l], b[l]); return r; }
template <class V> inline V qj_vpow(V a, V b) { V r; for (unsigned l = 0; l < sizeof(V) / sizeof(a[0]); ++l) r[l] = std::pow(a[l], b[l]); return r; }
"""


def _where(eqn) -> str:
    """The innermost line outside JAX that staged ``eqn`` (file:line, function), for messages."""
    tb = getattr(getattr(eqn, "source_info", None), "traceback", None)
    for f in (tb.frames if tb is not None else ()):
        if "/jax/" not in f.file_name and "/jaxlib/" not in f.file_name:
            return f"{f.file_name}:{f.line_num}, {f.function_name}"
    return "an unknown line"


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


def _same(a, b) -> bool:
    """Two folded constants with the same bits (so a select between them is no select)."""
    return np.asarray(a).tobytes() == np.asarray(b).tobytes() and np.asarray(a).dtype == np.asarray(b).dtype


def _cast(x, src, dst):
    """A value of dtype ``src`` as ``dst`` (a folded constant converted; a name must already be ``dst``)."""
    if np.dtype(src) == np.dtype(dst):
        return x
    if isinstance(x, _Sym):
        raise UnsupportedPrimitive(f"quadjax.native.generate: dot_general of {np.dtype(src)} into {np.dtype(dst)}")
    return _const(x, dst)


def _const(x, dtype):
    """A folded constant as a numpy scalar of ``dtype`` (so arithmetic rounds in it)."""
    return np.asarray(x, dtype=dtype)[()]


# element-wise primitives: numpy fold (at generation time), and how C spells them:
# ("op", infix operator), ("prefix", operator), ("fn", libm name), ("nan", XLA's NaN-propagating max/min)
_ELEMENTWISE = {
    "add": (np.add, "op", "+"), "add_any": (np.add, "op", "+"), "sub": (np.subtract, "op", "-"), "mul": (np.multiply, "op", "*"),
    "div": (np.divide, "op", "/"), "neg": (np.negative, "prefix", "-"),
    "max": (np.fmax, "nan", "max"), "min": (np.fmin, "nan", "min"),
    "gt": (np.greater, "op", ">"), "lt": (np.less, "op", "<"), "ge": (np.greater_equal, "op", ">="),
    "le": (np.less_equal, "op", "<="), "eq": (np.equal, "op", "=="), "ne": (np.not_equal, "op", "!="),
    "and": (np.logical_and, "op", "&&"), "or": (np.logical_or, "op", "||"), "not": (np.logical_not, "prefix", "!"),
    "sqrt": (np.sqrt, "fn", "sqrt"), "exp": (np.exp, "fn", "exp"), "log": (np.log, "fn", "log"),
    "sin": (np.sin, "fn", "sin"), "cos": (np.cos, "fn", "cos"), "tan": (np.tan, "fn", "tan"),
    "tanh": (np.tanh, "fn", "tanh"),
    "abs": (np.abs, "fn", "fabs"), "rsqrt": (lambda x: 1 / np.sqrt(x), "fn", "rsqrt"),
    "sign": (np.sign, "fn", "sign"),
}


def _power_of_two(x) -> bool:
    """x is ±2^k (its reciprocal exact, barring overflow)."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):  # the reciprocal of a subnormal power of two overflows: not one
        return bool(np.isfinite(x) and x != 0 and np.frexp(x)[0] in (0.5, -0.5) and np.isfinite(1 / x))


class _Generator:
    def __init__(self, emitter=None):
        self.out = emitter or _Emitter()
        self.choices: dict = {}  # a local that selects between two constants: (pred, on false, on true)

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
                                            "copy", "copy_p", "stop_gradient", "pow", "is_finite"):
            return [self.elementwise(name, eqn.params, ins, out_avals[0])]
        handler = getattr(self, f"p_{name}", None)
        if handler is None:
            raise UnsupportedPrimitive(f"quadjax.native.generate: no C form for the primitive '{name}' "
                                       f"(at {_where(eqn)})")
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
        out = self.out
        known = not any(isinstance(x, _Sym) for x in xs)
        suffix = "f" if dtype == np.float32 or (dtypes and dtypes[0] == np.float32) else "d"
        ctype = out.ctype(dtype)
        if name == "select_n":
            pred, cases = xs[0], xs[1:]
            if not isinstance(pred, _Sym):
                return cases[int(pred)]
            if len(cases) > 2:  # an integer index (jnp.select, lax.switch's values): a chain of two-way selects
                p, chosen = dtypes[0], cases[0]
                for i, case in enumerate(cases[1:], 1):
                    hit = self.scalar("eq", {}, [pred, _const(i, p)], [p, p], np.dtype(np.bool_))
                    chosen = self.scalar("select_n", {}, [hit, chosen, case], [np.dtype(np.bool_), dtype, dtype], dtype)
                return chosen
            if cases[0] is cases[1] or (not isinstance(cases[0], _Sym) and not isinstance(cases[1], _Sym)
                                        and _same(cases[0], cases[1])):
                return cases[0]
            q = out.local(xs, ctype, out.select(pred, out.expr(cases[1], dtype), out.expr(cases[0], dtype)))
            if not isinstance(cases[0], _Sym) and not isinstance(cases[1], _Sym):
                self.choices[q] = (pred, cases[0], cases[1])
            return q
        if name == "convert_element_type":
            if known:
                return _const(xs[0], dtype)
            if dtypes[0] == dtype:
                return xs[0]
            return out.local(xs, ctype, out.convert(xs[0], dtypes[0], dtype))
        if name in ("copy", "copy_p", "stop_gradient"):  # the value passes (derivatives are not generated here)
            return xs[0]
        if name == "is_finite":  # x − x is 0 for a finite x, NaN for ±inf and NaN (no libm call)
            if known:
                return _const(np.isfinite(xs[0]), dtype)
            d = dtypes[0]
            diff = self.scalar("sub", {}, [xs[0], xs[0]], [d, d], d)
            return self.scalar("eq", {}, [diff, _const(0, d)], [d, d], dtype)
        if name == "integer_pow":
            y = params["y"]
            if known:
                return _const(np.asarray(xs[0]) ** y, dtype)
            if y >= 0 or out.exact_division(xs):
                return out.local(xs, ctype, out.integer_pow(xs[0], y, dtype))
            return out.local(xs, ctype, out.integer_pow(self.reciprocal(xs[0], dtype, suffix), -y, dtype))
        if name == "clamp":  # clamp(lo, x, hi)
            lo, x, hi = xs
            if known:
                return _const(np.fmin(np.fmax(x, lo), hi) if not np.isnan(x) else x, dtype)
            return out.local(xs, ctype, out.clamp(out.expr(lo, dtype), out.expr(x, dtype), out.expr(hi, dtype), suffix))
        if name == "rem":
            if known:
                return _const(np.fmod(xs[0], xs[1]), dtype)
            a, b = (out.expr(x, d) for x, d in zip(xs, dtypes))
            floating = np.issubdtype(dtype, np.floating)
            return out.local(xs, ctype, out.call("fmod", [a, b], suffix) if floating else out.intdiv(a, b))
        if name == "pow":
            if known:
                return _const(np.power(xs[0], xs[1]), dtype)
            return out.local(xs, ctype, out.call("pow", [out.expr(x, d) for x, d in zip(xs, dtypes)], suffix))
        if np.issubdtype(dtype, np.integer) and not known:
            if name in ("and", "or", "not"):
                out.bitwise(name)
            if name == "div":
                return out.local(xs, ctype, out.quotient(out.expr(xs[0], dtypes[0]), out.expr(xs[1], dtypes[1])))
        if name == "div" and not known and np.issubdtype(dtype, np.floating):
            if xs[1] in self.choices and all(_power_of_two(c) for c in self.choices[xs[1]][1:]):
                # a by a choice of powers of two (jax's max/min derivative: 1 or 2 where tied): a times
                # the choice of their reciprocals, which are exact, so is the product
                pred, c0, c1 = self.choices[xs[1]]
                inv = self.scalar("select_n", {}, [pred, 1 / c0, 1 / c1], [np.dtype(np.bool_), dtype, dtype], dtype)
                return self.scalar("mul", {}, [xs[0], inv], [dtype, dtype], dtype)
            if not out.exact_division(xs):
                return self.scalar("mul", {}, [xs[0], self.reciprocal(xs[1], dtype, suffix)], [dtype, dtype], dtype)
        fold = _ELEMENTWISE[name][0]
        if known:
            with np.errstate(all="ignore"):
                if name in ("max", "min"):  # XLA semantics: NaN wins
                    a, b = xs
                    v = a if np.isnan(a) else b if np.isnan(b) else fold(a, b)
                else:
                    v = fold(*[_const(x, d) for x, d in zip(xs, dtypes)])
            return _const(v, dtype)
        q = out.local(xs, ctype, out.spell(name, [out.expr(x, d) for x, d in zip(xs, dtypes)], suffix))
        if np.issubdtype(dtype, np.floating):
            out.note(name, q, xs, dtype)
        return q

    def reciprocal(self, x, dtype, suffix) -> _Sym:
        """The local 1 / x (one per x: value numbering)."""
        if not isinstance(x, _Sym):
            with np.errstate(all="ignore"):
                return _const(np.divide(_const(1, dtype), _const(x, dtype)), dtype)
        one = self.out.expr(_const(1, dtype), dtype)
        return self.out.local([x], self.out.ctype(dtype), self.out.spell("div", [one, x], suffix))

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

    @staticmethod
    def _window(name, starts, sizes, shape) -> tuple:
        """The static index of a dynamic slice of ``sizes`` at ``starts`` (folded constants, as
        XLA clamps them into range)."""
        idx = []
        for (s, _), size, n in zip(starts, sizes, shape):
            s = s[()] if isinstance(s, np.ndarray) else s
            if isinstance(s, _Sym):
                raise UnsupportedPrimitive(f"quadjax.native.generate: {name} with an index known only at run time")
            start = min(max(int(s), 0), n - size)
            idx.append(slice(start, start + size))
        return tuple(idx)

    def p_dynamic_slice(self, eqn, ins, avals):
        (x, d), starts = ins[0], ins[1:]
        return [(x[self._window("dynamic_slice", starts, eqn.params["slice_sizes"], x.shape)], d)]

    def p_gather(self, eqn, ins, avals):
        """A gather at indices known when the code is generated (a NumPy index array, folded): XLA's
        own gather run on the elements' positions says which element lands where."""
        (x, d), (idx, idt) = ins
        if any(isinstance(v, _Sym) for v in np.asarray(idx, object).flat):
            raise UnsupportedPrimitive(f"quadjax.native.generate: a gather at indices known only at run time "
                                       f"(at {_where(eqn)})")
        known = np.asarray([int(v) for v in np.asarray(idx, object).flat], np.int64).reshape(np.shape(idx))
        with jax.ensure_compile_time_eval():  # now, on numbers, even inside the caller's trace
            where = np.asarray(jax.lax.gather_p.bind(jax.numpy.arange(x.size, dtype=np.int32).reshape(x.shape),
                                                     jax.numpy.asarray(known, np.int32),
                                                     **{**eqn.params, "fill_value": -1}))
        fill = eqn.params.get("fill_value")
        if fill is None:  # XLA's defaults for a gather out of bounds
            fill = (np.nan if np.issubdtype(d, np.inexact) else True if d == np.bool_ else np.iinfo(d).min)
        out = np.empty(where.shape, object)
        for k in np.ndindex(where.shape):
            out[k] = x.flat[where[k]] if where[k] >= 0 else _const(fill, d)
        return [(out, d)]

    def p_dynamic_update_slice(self, eqn, ins, avals):  # the transpose of dynamic_slice
        (x, d), (update, _), starts = ins[0], ins[1], ins[2:]
        out = x.copy()
        out[self._window("dynamic_update_slice", starts, update.shape, x.shape)] = update
        return [(out, d)]

    def p_pad(self, eqn, ins, avals):  # the transpose of a slice: x at lo + i (interior + 1), the rest pad
        (x, d), (pad, _) = ins
        pad = pad[()] if isinstance(pad, np.ndarray) else pad
        out = np.empty(avals[0].shape, object)
        out.fill(pad)
        for idx in np.ndindex(x.shape):
            at = tuple(lo + i * (interior + 1) for i, (lo, _, interior) in zip(idx, eqn.params["padding_config"]))
            if all(0 <= a < n for a, n in zip(at, out.shape)):  # negative padding crops
                out[at] = x[idx]
        return [(out, d)]

    def p_empty2(self, eqn, ins, avals):
        """An array of no defined value (``lax.empty``: a transposed cond's branch that has no
        cotangent for an operand); zeros here, known at generation time."""
        dtype = np.dtype(avals[0].dtype)
        out = np.empty(avals[0].shape, object)
        out.fill(_const(0, dtype))
        return [(out, dtype)]

    p_empty = p_empty2

    def p_concatenate(self, eqn, ins, avals):
        return [(np.concatenate([x for x, _ in ins], axis=eqn.params["dimension"]), np.dtype(avals[0].dtype))]

    def p_stack(self, eqn, ins, avals):
        return [(np.stack([x for x, _ in ins], axis=eqn.params["axis"]), np.dtype(avals[0].dtype))]

    def p_unstack(self, eqn, ins, avals):  # the transpose of stack
        (x, d), axis = ins[0], eqn.params["axis"]
        return [(np.asarray(np.take(x, i, axis=axis), dtype=object), d) for i in range(x.shape[axis])]

    def p_iota(self, eqn, ins, avals):
        aval = avals[0]
        dtype = np.dtype(aval.dtype)
        dim = eqn.params["dimension"]
        ramp = np.arange(aval.shape[dim]).reshape([-1 if i == dim else 1 for i in range(len(aval.shape))])
        values = np.broadcast_to(ramp, aval.shape)
        return [(np.vectorize(lambda x: _const(x, dtype), otypes=[object])(values), dtype)]

    def p_dot_general(self, eqn, ins, avals):
        """A contraction over static axes, unrolled: each output element the left-to-right sum
        of its products (batch axes first, then the left's free axes, then the right's)."""
        (lhs, dl), (rhs, dr) = ins
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        dtype = np.dtype(avals[0].dtype)
        lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
        rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]
        lhs = np.transpose(lhs, [*lb, *lf, *lc])
        rhs = np.transpose(rhs, [*rb, *rf, *rc])
        nb, nlf = len(lb), len(lf)
        out = np.empty(avals[0].shape, object)
        contract = lhs.shape[nb + nlf:]
        for idx in np.ndindex(out.shape):
            b, i, j = idx[:nb], idx[nb:nb + nlf], idx[nb + nlf:]
            acc = None
            for c in np.ndindex(contract):
                a, r = lhs[b + i + c], rhs[b + j + c]
                term = self.scalar("mul", {}, [_cast(a, dl, dtype), _cast(r, dr, dtype)], [dtype, dtype], dtype)
                acc = term if acc is None else self.scalar("add", {}, [acc, term], [dtype, dtype], dtype)
            out[idx] = acc if acc is not None else _const(0, dtype)
        return [(out, dtype)]

    def p_argmax(self, eqn, ins, avals):
        """The index of the first largest element along one static axis (a NaN counts as the
        largest, as XLA's argmax has it), by a chain of compares and selects."""
        (x, d), (axis,) = ins[0], eqn.params["axes"]
        idt, b = np.dtype(eqn.params["index_dtype"]), np.dtype(np.bool_)
        moved = np.moveaxis(x, axis, -1)
        out = np.empty(moved.shape[:-1], object)
        for idx in np.ndindex(out.shape):
            best, at = moved[idx + (0,)], _const(0, idt)
            for k in range(1, moved.shape[-1]):
                y = moved[idx + (k,)]
                if d == b:  # the first true (a lane's true mask is all ones, −1 as an integer: no ">")
                    take = self.scalar("and", {}, [y, self.scalar("not", {}, [best], [b], b)], [b, b], b)
                    best = self.scalar("or", {}, [best, y], [b, b], b)
                    at = self.scalar("select_n", {}, [take, at, _const(k, idt)], [b, idt, idt], idt)
                    continue
                bigger = self.scalar("gt", {}, [y, best], [d, d], b)
                y_nan = self.scalar("ne", {}, [y, y], [d, d], b)
                best_num = self.scalar("eq", {}, [best, best], [d, d], b)
                take = self.scalar("or", {}, [bigger, self.scalar("and", {}, [y_nan, best_num], [b, b], b)], [b, b], b)
                best = self.scalar("select_n", {}, [take, best, y], [b, d, d], d)
                at = self.scalar("select_n", {}, [take, at, _const(k, idt)], [b, idt, idt], idt)
            out[idx] = at
        return [(out, idt)]

    def p_transpose(self, eqn, ins, avals):
        return [(np.transpose(ins[0][0], eqn.params["permutation"]), ins[0][1])]

    def _reduce(self, op, eqn, ins):
        (x, d) = ins[0]
        axes = tuple(eqn.params["axes"])
        moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0))) if axes else x
        flat = moved.reshape(moved.shape[: moved.ndim - len(axes)] + (-1,))
        out = np.empty(flat.shape[:-1], object)
        for idx in np.ndindex(out.shape):  # left to right, as a sequential sum would
            acc = flat[idx + (0,)]
            for y in flat[idx][1:]:
                acc = self.scalar(op, {}, [acc, y], [d, d], d)
            out[idx] = acc
        return [(out, d)]

    def p_reduce_sum(self, eqn, ins, avals):
        return self._reduce("add", eqn, ins)

    def p_reduce_max(self, eqn, ins, avals):
        return self._reduce("max", eqn, ins)

    def p_reduce_min(self, eqn, ins, avals):
        return self._reduce("min", eqn, ins)

    def p_reduce_and(self, eqn, ins, avals):  # of bools (jnp.all)
        return self._reduce("and", eqn, ins)

    def p_reduce_or(self, eqn, ins, avals):  # of bools (jnp.any)
        return self._reduce("or", eqn, ins)

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

    def p_platform_index(self, eqn, ins, avals):
        """The generated code is the model's portable form: ``platform_dependent`` takes its
        default branch (the one that is not, e.g., the native kernel on the CPU)."""
        platforms = eqn.params["platforms"]
        if None not in platforms:
            raise UnsupportedPrimitive("quadjax.native.generate: platform_dependent without a default branch")
        return [(np.asarray(_const(platforms.index(None), np.int32), dtype=object), np.dtype(np.int32))]

    def p_cond(self, eqn, ins, avals):
        """``lax.cond`` / ``switch``: the branch itself when the index is known; otherwise every
        branch (they are pure) and a select per element of the results. Where the first branch
        computes nothing (constants, operands: an effect switched off) and the emitter can branch,
        the second runs only for a block with a lane that takes it (:meth:`_VectorEmitter.close_branch`)."""
        (index, idtype), operands = ins[0], ins[1:]
        branches = eqn.params["branches"]
        index = index[()] if isinstance(index, np.ndarray) else index
        if not isinstance(index, _Sym):
            k = min(max(int(index), 0), len(branches) - 1)  # XLA clamps the index
            return self.run(branches[k].jaxpr, branches[k].consts, operands)
        if len(branches) != 2:
            raise UnsupportedPrimitive("quadjax.native.generate: lax.switch over more than two branches at run time")
        pred = self.scalar("ne", {}, [index, _const(0, idtype)], [idtype, idtype], np.dtype(np.bool_))
        before = self.out.mark()
        skipped = self.run(branches[0].jaxpr, branches[0].consts, operands)
        gate = self.out.branches and self.out.mark() == before
        if gate:
            self.out.open_branch()
        taken = self.run(branches[1].jaxpr, branches[1].consts, operands)
        outs = []
        for (x0, d), (x1, _) in zip(skipped, taken):
            out = np.empty(x0.shape, object)
            for idx in np.ndindex(x0.shape):
                out[idx] = self.scalar("select_n", {}, [pred, x0[idx], x1[idx]], [np.dtype(np.bool_), d, d], d)
            outs.append((out, d))
        return self.out.close_branch(pred, outs, skipped) if gate else outs

    def p_scan(self, eqn, ins, avals):
        p = eqn.params
        closed, length = p["jaxpr"], p["length"]
        n_consts, n_carry = scan_counts(p)
        consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
        ys = [None] * length
        # a reverse scan (the transpose of a forward one, in an adjoint) visits i = length-1 .. 0
        for i in (reversed(range(length)) if p.get("reverse") else range(length)):
            step_xs = [(np.asarray(x[i], dtype=object), d) for x, d in xs]
            outs = self.run(closed.jaxpr, closed.consts, list(consts) + list(carry) + step_xs)
            carry, ys[i] = outs[:n_carry], outs[n_carry:]
        stacked = [(np.stack([y[k][0] for y in ys]), ys[0][k][1]) for k in range(len(avals) - n_carry)] if ys else []
        return list(carry) + stacked


def scan_counts(params: dict) -> tuple[int, int]:
    """(constants, carries) among a ``scan`` equation's operands. jax <= 0.10 names the counts in
    the params; jax 0.11 gives the operands' structure instead, a flat tree of (consts, carry, xs)
    (found on the H200 machine's jax 0.11.2, where every generated kernel failed on the key)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


def _shape(leaf) -> tuple:
    return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def _dtype(leaf) -> np.dtype:
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype


def _named(leaves, name, start: int = 0) -> tuple[list, int]:
    """Each leaf's elements as C names ``name(k)``, k counting on from ``start`` in leaf and
    C order (the :class:`Layout` order); returns the object arrays and the next k."""
    arrays, k = [], start
    for leaf in leaves:
        names = np.empty(_shape(leaf), object)
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


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A generated block kernel (:func:`generate_kernel`): C++ source of one namespace, the
    layout of each input, and how many hoisted values the prologue stores."""

    source: str
    namespace: str
    layouts: dict
    hoisted: int
    lanes: int


def generate_kernel(step, args: dict, *, carry: str, invariant: tuple, namespace: str, lanes: int,
                    emit: str | None = None, reciprocals: bool = False) -> KernelSource:
    """C++ struct ``namespace`` with a block step over W = ``lanes`` vehicles in vector lanes.

    ``step(*args.values())`` is traced for one vehicle; its result must have the layout of
    ``args[carry]`` or, with ``emit``, be a pair (the new carry, a per-step output written to
    the array ``emit``, the step's last argument; its layout is ``layouts[emit]``).
    The struct defines ``W``, ``NH``, ``N_<name>`` (each input's size),
    ``NL_<name>`` and ``L_<name>`` (its number of leaves and their sizes), the vector types ``V`` / ``M``, and

    * ``void prologue(const V* <invariant...>, V* H)``: what depends on the ``invariant``
      inputs alone, into ``H`` (NH values), once per block;
    * ``void step(const V* H, V* / const V* <name>...)``: one step for W vehicles,
      ``<carry>`` updated in place, every other input read.

    Arrays are of vectors: element k of input ``x`` for lane l is ``x[k][l]`` (structure of
    arrays, lane fastest), in the :class:`Layout` of ``args[name]``.

    ``reciprocals``: each division multiplies by the divisor's reciprocal, computed once
    (:meth:`_VectorEmitter.exact_division`; a derivative step's, within a rounding of the quotient).
    """
    values = list(args.values())
    closed = jax.make_jaxpr(step)(*values)
    layouts = {name: Layout.of(tree) for name, tree in args.items()}
    if emit is not None:
        layouts[emit] = Layout.of(jax.eval_shape(step, *values)[1])
    leaves = jax.tree_util.tree_leaves(values)
    dtypes = {_dtype(x) for x in leaves}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (np.float32, np.float64):
        raise ValueError(f"generate_kernel: every input leaf must share one dtype, float32 or float64 (got {dtypes})")
    dtype = next(iter(dtypes))
    named, invariant_syms = [], set()
    for name, tree in args.items():
        arrays, _ = _named(jax.tree_util.tree_leaves(tree), lambda k, n=name: f"{n}[{k}]")
        named += arrays
        if name in invariant:
            invariant_syms |= {x for a in arrays for x in a.flat}
    out = _VectorEmitter(invariant_syms, reciprocals)
    outs = _Generator(out).run(closed.jaxpr, closed.consts, [(x, dtype) for x in named])
    flat = [(x[idx], d) for x, d in outs for idx in np.ndindex(x.shape)]
    n_x, n_y = layouts[carry].size, layouts[emit].size if emit is not None else 0
    if len(flat) != n_x + n_y:
        raise ValueError(f"generate_kernel: the step returns {len(flat)} values for a {carry} of {n_x}"
                         + (f" and an {emit} of {n_y}" if emit is not None else ""))
    F = _CTYPE[dtype]
    mask = "int32_t" if dtype == np.float32 else "int64_t"
    # every result is computed before the first store: the carry is updated in place
    results = [f"  const V o{k} = {out.expr(x, d) if d != np.bool_ else f'qj_vfloat<V>({out.expr(x, d)})'};"
               for k, (x, d) in enumerate(flat)]
    stores = [f"  {carry}[{k}] = o{k};" if k < n_x else f"  {emit}[{k - n_x}] = o{k};" for k in range(len(flat))]
    out.fuse(results)
    ptrs = ", ".join(f"{'' if n == carry else 'const '}V* __restrict {n}" for n in args)
    if emit is not None:
        ptrs += f", V* __restrict {emit}"
    sizes = "".join(f"  static constexpr int N_{n} = {layouts[n].size};\n"
                    f"  static constexpr int NL_{n} = {len(layouts[n].entries)};\n"
                    f"  static constexpr int L_{n}[] = {{{', '.join(str(math.prod(e[1])) for e in layouts[n].entries)}}};\n"
                    for n in layouts)
    inv = ", ".join(f"const V* __restrict {n}" for n in invariant)
    source = (f"struct {namespace} {{\n  using F = {F};\n  static constexpr int W = {lanes};\n"
              f"  typedef F V __attribute__((vector_size(W * sizeof(F))));\n"
              f"  typedef {mask} M __attribute__((vector_size(W * sizeof(F))));\n"
              f"  static constexpr int NH = {max(out.hoisted, 1)};\n{sizes}"
              f"static inline void prologue({inv}, V* __restrict H) {{\n" + "\n".join(out.prologue) + "\n}\n"
              f"static inline void step(const V* __restrict H, {ptrs}) {{\n"
              + "\n".join(out.lines + results + stores) + "\n}\n};\n")
    return KernelSource(source, namespace, layouts, out.hoisted, lanes)


# --------------------------------------------------------------------------- straight-line JAX
#
# The same scalarised program, emitted as JAX operations instead of C: what a GPU kernel
# (quadjax.gpu, Pallas) runs per block of vehicles. Scans are unrolled, calls inlined, constants
# folded and repeated subexpressions computed once, exactly as for the C forms; what is left is
# element-wise arithmetic, comparisons, selects and conversions on arrays of vehicles, which every
# Pallas lowering supports (no dynamic slicing, no loops, no small stacks inside the step).


class _JaxEmitter(_Emitter):
    """Records the program as ``(name, dtype, op)`` entries, ``op`` a tuple (operation, operands
    ...) whose operands are names or ``("const", bytes, dtype)``; a local whose operands are all
    invariant goes to the prologue (as :class:`_VectorEmitter` hoists them)."""

    def __init__(self, invariant: set):
        super().__init__()
        self.program: list = []
        self.prologue: list = []
        self.invariant = set(invariant)

    def emit(self, name, deps, ctype, expr):
        entry = (name, ctype, expr)
        if all(d in self.invariant for d in deps if isinstance(d, _Sym)):
            self.prologue.append(entry)
            self.invariant.add(name)
        else:
            self.program.append(entry)
        return _Sym(name)

    def ctype(self, dtype) -> str:
        return np.dtype(dtype).name

    def expr(self, x, dtype):
        if isinstance(x, _Sym):
            return x
        return ("const", np.asarray(x, dtype).tobytes(), np.dtype(dtype).name)

    def spell(self, name, args, suffix):
        return (name, *args)

    def select(self, pred, on_true, on_false):
        return ("select", pred, on_true, on_false)

    def convert(self, x, src, dst):
        return ("convert", x, np.dtype(dst).name)

    def clamp(self, lo, x, hi, suffix):
        return ("clamp", lo, x, hi)

    def call(self, name, args, suffix):
        return (name, *args)

    def intdiv(self, a, b):
        return ("rem", a, b)

    def quotient(self, a, b):
        return ("div", a, b)

    def integer_pow(self, x, y, dtype):
        return ("integer_pow", x, y)


def _jax_ops():
    from jax import lax

    def nan_max(a, b):  # lax.max propagates NaN, as XLA's max does
        return lax.max(*jax.numpy.broadcast_arrays(a, b))

    def nan_min(a, b):
        return lax.min(*jax.numpy.broadcast_arrays(a, b))

    jnp = jax.numpy
    return {
        "add": jnp.add, "add_any": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": _divide,
        "neg": jnp.negative, "max": nan_max, "min": nan_min,
        "gt": jnp.greater, "lt": jnp.less, "ge": jnp.greater_equal, "le": jnp.less_equal, "eq": jnp.equal,
        "ne": jnp.not_equal, "and": jnp.logical_and, "or": jnp.logical_or, "not": jnp.logical_not,
        "sqrt": jnp.sqrt, "exp": jnp.exp, "log": jnp.log, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh,
        "abs": jnp.abs, "rsqrt": lax.rsqrt, "sign": jnp.sign, "fmod": _rem, "rem": _rem, "pow": jnp.power,
        "select": lambda p, t, f: jnp.where(p, t, f),
        "clamp": lambda lo, x, hi: nan_min(nan_max(x, lo), hi),
        "integer_pow": lambda x, y: jax.lax.integer_pow(x, y),
    }


def _divide(a, b):
    """a / b with C's semantics for both kinds: true division of floats, truncation of integers
    (jnp.divide would promote integers to float)."""
    if jax.numpy.issubdtype(jax.numpy.result_type(a), jax.numpy.integer):
        return jax.lax.div(*jax.numpy.broadcast_arrays(a, b))
    return jax.numpy.divide(a, b)


def _rem(a, b):
    """C's remainder (sign of the dividend), as XLA's ``rem``."""
    return jax.lax.rem(*jax.numpy.broadcast_arrays(a, b))


@dataclasses.dataclass(frozen=True)
class StraightLine:
    """A per-vehicle function as straight-line JAX operations on arrays of vehicles
    (:func:`straight_line`). Call :meth:`prologue` on the invariant inputs once, then
    :meth:`step` as often as needed; every input is a flat list of arrays (one per element of
    the :class:`Layout` of its argument), every output likewise. All inputs broadcast together
    (a block of vehicles (B,), or scalars for one)."""

    names: tuple          # per argument: its element names, in Layout order
    dtypes: tuple         # per argument: each element's dtype name
    prologue_ops: tuple
    step_ops: tuple
    outputs: tuple        # output elements: a name or ("const", bytes, dtype)
    out_dtypes: tuple
    out_tree: object
    layouts: dict
    invariant: tuple

    @property
    def operations(self) -> int:
        """Operations per step (the prologue's not counted)."""
        return len(self.step_ops)

    def prologue(self, invariant_inputs: dict) -> dict:
        """The hoisted values from the invariant arguments (name → flat list of arrays)."""
        env = self._bind(invariant_inputs)
        _evaluate(self.prologue_ops, env)
        return {op[0]: env[op[0]] for op in self.prologue_ops} | env

    def step(self, hoisted: dict, inputs: dict) -> list:
        """The outputs (flat, in the output Layout) from the other arguments' flat lists."""
        env = dict(hoisted)
        env.update(self._bind(inputs))
        _evaluate(self.step_ops, env)
        shape = jax.numpy.broadcast_shapes(*[jax.numpy.shape(v) for v in env.values()])
        return [jax.numpy.broadcast_to(_value(o, env, d), shape) for o, d in zip(self.outputs, self.out_dtypes)]

    def __call__(self, **inputs) -> list:
        """Prologue and one step together: the flat outputs."""
        inv = {k: v for k, v in inputs.items() if k in self.invariant}
        return self.step(self.prologue(inv), {k: v for k, v in inputs.items() if k not in self.invariant})

    def _bind(self, inputs: dict) -> dict:
        env = {}
        for arg, values in inputs.items():
            names, dtypes = self.names[arg], self.dtypes[arg]
            if len(values) != len(names):
                raise ValueError(f"StraightLine: argument {arg!r} has {len(names)} elements, got {len(values)}")
            env.update({n: jax.numpy.asarray(v, d) for n, v, d in zip(names, values, dtypes)})
        return env


def _value(x, env, dtype):
    if isinstance(x, tuple):  # a folded constant
        return jax.numpy.asarray(np.frombuffer(x[1], dtype=x[2])[0])
    if isinstance(x, _Sym) and x in env:
        return env[x]
    return jax.numpy.asarray(np.asarray(x, dtype))


def _evaluate(ops, env: dict) -> None:
    table = _jax_ops()
    for name, dtype, (op, *args) in ops:
        if op == "convert":
            env[name] = env[args[0]].astype(args[1]) if isinstance(args[0], str) else _value(args[0], env, dtype)
            continue
        if op == "integer_pow":
            env[name] = table[op](env[args[0]], args[1])
            continue
        vals = [_value(a, env, dtype) for a in args]
        out = table[op](*vals)
        env[name] = out if out.dtype == np.dtype(dtype) else out.astype(dtype)


def straight_line(fn, args: dict, *, invariant: tuple = ()) -> StraightLine:
    """``fn(*args.values())`` for one vehicle as a :class:`StraightLine`: the jaxpr of ``fn``
    scalarised as for the C forms (loops unrolled, calls inlined, constants folded, repeated
    subexpressions once), its elements named per argument in :class:`Layout` order, and what
    depends on the ``invariant`` arguments alone split into the prologue. Leaves may have any
    dtype (float, int, bool); an unsupported primitive raises :class:`UnsupportedPrimitive`."""
    values = list(args.values())
    closed = jax.make_jaxpr(fn)(*values)
    named, names, dtypes, inv = [], {}, {}, set()
    k = 0
    for arg, tree in args.items():
        leaves = jax.tree_util.tree_leaves(tree)
        arrays, k2 = _named(leaves, lambda j: f"i{j}", k)
        names[arg] = tuple(x for a in arrays for x in a.flat)
        dtypes[arg] = tuple(_dtype(leaf).name for leaf, a in zip(leaves, arrays) for _ in a.flat)
        named += [(a, _dtype(leaf)) for a, leaf in zip(arrays, leaves)]
        if arg in invariant:
            inv |= set(names[arg])
        k = k2
    out = _JaxEmitter(inv)
    outs = _Generator(out).run(closed.jaxpr, closed.consts, named)
    flat = [(x[idx], d) for x, d in outs for idx in np.ndindex(x.shape)]
    elements = tuple(x if isinstance(x, _Sym) else out.expr(x, d) for x, d in flat)
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *values))
    return StraightLine(names=names, dtypes=dtypes, prologue_ops=tuple(out.prologue), step_ops=tuple(out.program),
                        outputs=elements, out_dtypes=tuple(np.dtype(d).name for _, d in flat), out_tree=out_tree,
                        layouts={a: Layout.of(t) for a, t in args.items()}, invariant=tuple(invariant))
