"""The generated steps alone: what one forward, tangent and adjoint step of the native kernel costs
in C++, with no harness, no XLA and no memory traffic beyond L1 (issue 13's floors for jvp and grad).

    python benchmarks/generated_steps.py [--dtype float32] [--ticks 1000] [--repeats 200]

Each struct is generated exactly as the kernel libraries generate it (``quadjax.native``: the
step, its ``jax.jvp`` with one and with ``TANGENTS`` tangents, its ``jax.vjp``; each with and
without the parameters' terms), compiled with the kernel's flags into one driver, and timed over
``--ticks`` steps of one block of W vehicles in vector lanes (RP-1 at hover, commands 1.01x
hover), fastest of ``--repeats``; one thread. Ratios are to the forward step of the same run.
Beside each time, the multiplies and fused multiply-adds in the step's compiled code (one block,
``objdump``): a count that does not vary from run to run, as a timing on a shared host does.

The reverse sweep's floor follows from two rows: ``jax.grad`` of a rollout runs a forward pass
that keeps the trail of states for the sweep ("forward, keeping the trail"; within
``native.TRAIL_BYTES``), then one adjoint step per tick.

``split adjoint`` is an experiment kept here because its answer decides a design: the adjoint
step cut, by data flow, into a forward part that writes its residuals (every value the backward
part reads) and a backward part that reads them, run a segment of ticks at a time. It is what a
taped sweep would run, which could fold the trail pass into the residual pass. The generated
step recomputes its forward part instead. The cut is made on the generated C (a value that
depends on no cotangent is forward), not by the generator.

Writes ``benchmarks/out/generated_steps.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import quadjax as qj
from quadjax import native
from quadjax.native import generate

OUT = Path(__file__).parent / "out"

DRIVER = r"""
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

static const F P0[] = {%(params)s};
static const F S0[] = {%(state)s};
static const F U0[] = {%(command)s};
static int ticks = 1000, repeats = 200;

// element i of the block's input: the primal's value, or a small tangent/cotangent
template <class V> static void fill(V* v, int n, const F* primal, int n_primal) {
  for (int i = 0; i < n; ++i) for (int j = 0; j < (int)(sizeof(V) / sizeof(F)); ++j) v[i][j] = i < n_primal ? primal[i] : F(1e-3);
  // the values are not known to the compiler: a step must not fold the preset's zeros and ones away
  asm volatile("" : : "r"(v) : "memory");
}
static double now_ns() { return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static volatile F sink;
// the cotangents a sweep ended with; the largest difference of a split sweep's from the adjoint step's
static std::vector<double> last, fused;
static double split_error = 0;

// K::step ticks times, carrying S; with `kept`, each state is stored before its step (the adjoint's trail pass)
template <class K> static double carry(std::vector<typename K::V>* kept = nullptr) {
  using V = typename K::V;
  V P[K::N_P], H[K::NH], S[K::N_S], U[K::N_U], Wd[K::N_Wd] = {}, E[K::N_E] = {};  // no wind, no wrench: the presets' case
  fill(P, K::N_P, P0, N_P0); K::prologue(P, H); fill(U, K::N_U, U0, N_U0);
  if (kept) kept->resize(ticks * K::N_S);
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    fill(S, K::N_S, S0, N_S0);
    const double t0 = now_ns();
    for (int t = 0; t < ticks; ++t) {
      if (kept) std::copy_n(S, K::N_S, &(*kept)[t * K::N_S]);
      K::step(H, P, S, U, Wd, E);
    }
    best = std::min(best, now_ns() - t0);
    sink = S[0][0];
  }
  return best / ticks / K::W;
}

// the reverse sweep over a kept trail: the cotangents of the held inputs zeroed each tick, as the harness does
template <class K, class A, class Sweep> static double sweep(const std::vector<typename K::V>& kept, Sweep run) {
  using V = typename K::V;
  V P[K::N_P], H[A::NH], U[K::N_U], Wd[K::N_Wd] = {}, E[K::N_E] = {}, C[A::N_C];
  fill(P, K::N_P, P0, N_P0); A::prologue(P, H); fill(U, K::N_U, U0, N_U0);
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    fill(C, A::N_C, nullptr, 0);
    const double t0 = now_ns();
    run(H, P, U, Wd, E, C, kept);
    best = std::min(best, now_ns() - t0);
  }
  last.clear();
  for (int i = 0; i < A::N_C; ++i) for (int j = 0; j < K::W; ++j) last.push_back(C[i][j]);
  return best / ticks / K::W;
}

template <class K, class A> static double adjoint(const std::vector<typename K::V>& kept) {
  const double ns = sweep<K, A>(kept, [](auto H, auto P, auto U, auto Wd, auto E, auto C, const auto& kept) {
    for (int t = ticks - 1; t >= 0; --t) {
      for (int i = K::N_S; i < A::N_C; ++i) C[i] = typename K::V{};
      A::step(H, P, &kept[t * K::N_S], U, Wd, E, C);
    }
  });
  fused = last;
  return ns;
}

template <class K, class A, class S> static double split(const std::vector<typename K::V>& kept, int segment) {
  std::vector<typename K::V> R(segment * S::NR);
  const double ns = sweep<K, A>(kept, [&](auto H, auto P, auto U, auto Wd, auto E, auto C, const auto& kept) {
    for (int t1 = ticks; t1 > 0; t1 -= segment) {
      const int t0 = std::max(0, t1 - segment);
      for (int t = t0; t < t1; ++t) S::fwd(H, P, &kept[t * K::N_S], U, Wd, E, &R[(t - t0) * S::NR]);
      for (int t = t1 - 1; t >= t0; --t) {
        for (int i = K::N_S; i < A::N_C; ++i) C[i] = typename K::V{};
        S::bwd(H, P, &kept[t * K::N_S], U, Wd, E, &R[(t - t0) * S::NR], C);
      }
    }
  });
  for (size_t i = 0; i < last.size(); ++i) split_error = std::max(split_error, std::abs(last[i] - fused[i]));
  return ns;
}

int main(int argc, char** argv) {
  ticks = std::atoi(argv[1]);
  repeats = std::atoi(argv[2]);
  std::vector<fwd::V> kept;
  const double kept_ns = carry<fwd>(&kept);
  std::printf("{\"forward\": %%.4f, \"forward, keeping the trail\": %%.4f", carry<fwd>(), kept_ns);
%(rows)s
  std::printf(", \"split error\": %%g}\n", split_error);
}
"""


def _values(dtype) -> dict:
    p = qj.presets.rp1(dtype)
    state = native.pack_state(qj.hover_state(p, (0.0, 0.0, 1.0)))
    command = qj.hover_rotor_speed(p) * jnp.asarray(1.01, dtype)
    as_c = lambda x: ", ".join(repr(float(v)) for v in np.ravel(np.asarray(x, np.float64)))
    return {"params": as_c(native.pack_params(p, jnp.asarray(1e-3, dtype))), "state": as_c(state),
            "command": as_c(command)}


def split_adjoint(source: str, namespace: str, name: str) -> tuple[str, int]:
    """The generated adjoint step ``namespace::step`` cut by data flow into ``name::fwd`` (every
    value that depends on no cotangent; writes the ones the rest reads into R) and ``name::bwd``
    (reads them from R, computes the rest). Returns (the C++ struct, the residuals per step)."""
    body = source.split(f"struct {namespace} {{", 1)[1].split("static inline void step(", 1)[1]
    lines = body.split("\n")[1:]
    lines = lines[:lines.index("}")]
    ref = re.compile(r"\b(v\d+|o\d+)\b|\b(C)\[\d+\]")
    kind, backward, parts = {}, set(), []
    # a gated branch (an effect's code, run for a block where a lane has it on) is one part: the
    # results it declares before its `if`, then both arms (their own locals stay inside)
    groups, i = [], 0
    while i < len(lines):
        if not re.match(r"\s*(V|M) v\d+;$", lines[i]):
            groups.append([lines[i]])
            i += 1
            continue
        j = lines.index("  } else {", i)
        j = lines.index("  }", j)
        groups.append(lines[i:j + 1])
        i = j + 1
    for group in groups:
        inner = set()
        defined, uses = [], set()
        for line in group:
            m = re.match(r"\s*const (V|M) (\w+) = (.*);$", line)
            d = re.match(r"\s*(V|M) (v\d+);$", line)
            if d:
                kind[d.group(2)] = d.group(1)
                defined.append(d.group(2))
                continue
            if m:
                (inner.add(m.group(2)) if len(group) > 1 else defined.append(m.group(2)))
                kind[m.group(2)] = m.group(1)
            body = m.group(3) if m else line
            uses |= {a or "C" for a, _ in ref.findall(body)}
        uses -= inner | set(defined) if len(group) > 1 else set()
        back = not defined or "C" in uses or bool(uses & backward)
        if back:
            backward.update(defined)
        parts.append(("\n".join(group), back, uses))
    residuals = list(dict.fromkeys(u for _, back, uses in parts if back for u in sorted(uses)
                                   if u in kind and u not in backward))
    store = [f"  R[{i}] = {'(V)' if kind[r] == 'M' else ''}{r};" for i, r in enumerate(residuals)]
    load = [f"  const {kind[r]} {r} = {'(M)' if kind[r] == 'M' else ''}R[{i}];" for i, r in enumerate(residuals)]
    args = ("const V* __restrict H, const V* __restrict P, const V* __restrict X, const V* __restrict U, "
            "const V* __restrict Wd, const V* __restrict E")
    text = (f"struct {name} {{\n  using V = {namespace}::V;\n  using M = {namespace}::M;\n"
            f"  static constexpr int NR = {len(residuals)};\n"
            f"static inline void fwd({args}, V* __restrict R) {{\n"
            + "\n".join([line for line, back, _ in parts if not back] + store) + "\n}\n"
            f"static inline void bwd({args}, const V* __restrict R, V* __restrict C) {{\n"
            + "\n".join(load + [line for line, back, _ in parts if back]) + "\n}\n};\n")
    return text, len(residuals)


def build(dtype, segments=(8, 32, 128), tangents=(1, native.TANGENTS)) -> tuple[str, dict]:
    """The driver's C++ (every struct, then the rows to time), the split adjoints' residuals per step
    and the struct each row's step is (its namespace)."""
    dtype = np.dtype(dtype)
    lanes, ex = native.VECTOR_BYTES // dtype.itemsize, native.step_example(4, dtype)
    inputs = {"P": ex["P"], "X": ex["S"], "U": ex["U"], "Wd": ex["Wd"], "E": ex["E"]}
    structs = [generate.generate_kernel(native.kernel_step, ex, carry="S", invariant=("P",), namespace="fwd",
                                        lanes=lanes).source]
    rows, residuals, structs_of = [], {}, {"forward": "fwd"}
    for suffix, with_params in (("", True), ("_fixed", False)):
        what = "with the parameters' terms" if with_params else "parameters fixed"
        for k in tangents:
            tuples = {n: (v,) * (k + 1) if with_params or n != "P" else v for n, v in ex.items()}
            step = native.tangent_step if with_params else native.tangent_step_fixed
            ns = f"tan{k}{suffix}"
            structs.append(generate.generate_kernel(step, tuples, carry="S", invariant=("P",), namespace=ns,
                                                    lanes=lanes, reciprocals=True).source)
            rows.append((f"tangent step, {k} tangent{'s' * (k > 1)}, {what}", f"carry<{ns}>()"))
            structs_of[rows[-1][0]] = ns
        held = [v for n, v in inputs.items() if n != "X" and (with_params or n != "P")]
        step = native.adjoint_step if with_params else native.adjoint_step_fixed
        adj = generate.generate_kernel(step, dict(inputs, C=(ex["S"], *held)), carry="C", invariant=("P",),
                                       namespace=f"adj{suffix}", lanes=lanes, reciprocals=True).source
        cut, residuals[f"residuals per step, {what}"] = split_adjoint(adj, f"adj{suffix}", f"cut{suffix}")
        structs += [adj, cut]
        rows.append((f"adjoint step, {what}", f"adjoint<fwd, adj{suffix}>(kept)"))
        structs_of[rows[-1][0]] = f"adj{suffix}"
        rows += [(f"split adjoint, {what}, segments of {n} ticks", f"split<fwd, adj{suffix}, cut{suffix}>(kept, {n})")
                 for n in segments]
    # the tangent structs' primal leaves come first: fill() gives them the primal's values
    sizes = "static const int N_P0 = fwd::N_P, N_S0 = fwd::N_S, N_U0 = fwd::N_U;\n"
    printed = "\n".join(f'  std::printf(", \\"{label}\\": %.4f", {call});' for label, call in rows)
    text = "\n".join([generate.VECTOR_PRELUDE, f"using F = {'float' if dtype == np.float32 else 'double'};",
                      *structs, sizes, DRIVER % {**_values(dtype), "rows": printed}])
    return text, residuals, structs_of


def multiplies(exe: Path, structs: dict) -> dict:
    """Per row: the vector multiplies and fused multiply-adds in its struct's compiled ``step``, one
    block of W vehicles (``objdump``; None where the compiler inlined the step or there is no
    objdump). A count, not a timing: it does not vary from run to run. On this project's AMD EPYC
    host the forward step and the tangent steps with the parameters fixed ran at about one such
    instruction per cycle, so their ratios to the forward's are the floor their arithmetic sets
    under ``jvp`` (benchmarks/README.md, 2026-12-07)."""
    try:
        listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)], check=True,
                                 capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {label: None for label in structs}
    counts, name = {}, None
    for line in listing.splitlines():
        head = re.match(r"[0-9a-f]+ <(\S+)>:$", line)
        if head:
            name = head.group(1)
        elif name and re.match(r"\s+[0-9a-f]+:\s+v(f(n)?m(add|sub)\d+|mul)[sp][sd]\b", line):
            counts[name] = counts.get(name, 0) + 1
    def of(ns):
        return next((n for sym, n in counts.items() if sym.startswith(f"_ZN{len(ns)}{ns}4stepE")), None)
    return {label: of(ns) for label, ns in structs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--ticks", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--tangents", default=f"1,{native.TANGENTS}", help="tangent steps to time, by tangents pushed")
    args = ap.parse_args()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # a script, not the library: the float64 trace needs it
    cxx = native.compiler()
    if cxx is None:
        raise SystemExit("no C++ compiler: the generated steps cannot be built")
    text, residuals, structs = build(args.dtype, tangents=tuple(int(k) for k in args.tangents.split(",")))
    with tempfile.TemporaryDirectory(prefix="quadjax-steps-") as tmp:
        cc, exe = Path(tmp) / "steps.cc", Path(tmp) / "steps"
        cc.write_text(text)
        flags = [f for f in native.FLAGS if f not in ("-shared", "-fPIC")]
        subprocess.run([cxx, *flags, "-o", str(exe), str(cc)], check=True)
        ns = json.loads(subprocess.run([str(exe), str(args.ticks), str(args.repeats)], check=True,
                                       capture_output=True, text=True).stdout)
        muls = multiplies(exe, structs)
    # the cut computes the adjoint step's own statements: it must end with the same cotangents, bit for bit
    if ns.pop("split error") != 0:
        raise SystemExit("the split adjoint's cotangents differ from the adjoint step's: the cut is wrong")
    forward = ns["forward"]
    lanes = native.VECTOR_BYTES // np.dtype(args.dtype).itemsize
    print(f"{args.dtype}, {lanes} lanes, {args.ticks} ticks, fastest of {args.repeats}, one thread")
    print(f"{'step':<72} {'ns/vehicle-step':>16} {'x forward':>10} {'multiplies':>11} {'x forward':>10}")
    for label, v in ns.items():
        m, m0 = muls.get(label), muls.get("forward")
        count = f"{m:>11} {m / m0:>10.2f}" if m and m0 else ""
        print(f"{label:<72} {v:>16.2f} {v / forward:>10.2f} {count}")
    for label, v in residuals.items():
        print(f"{label}: {v}")
    OUT.mkdir(exist_ok=True)
    (OUT / "generated_steps.json").write_text(json.dumps({"dtype": args.dtype, "ticks": args.ticks,
                                                          "repeats": args.repeats, "lanes": lanes, **residuals, "ns": ns,
                                                          "multiplies": muls}, indent=1))


if __name__ == "__main__":
    main()
