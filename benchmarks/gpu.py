"""The GPU kernel against XLA on the GPU, in one run on one device (issue 15).

    python benchmarks/gpu.py [--budget 420] [--out benchmarks]          # on a GPU machine
    python benchmarks/gpu.py --interpret [--out /tmp/gpu-dry]           # dry run on the CPU
    python benchmarks/gpu.py --sections closed_loop,gradient --merge    # what an earlier lease missed

Writes ``GPU_RESULTS.json`` and ``GPU_RESULTS.md`` in ``--out`` after every section (atomically),
so a run cut short keeps what it measured. Sections:

1. **correctness on the device**: the kernel (:mod:`quadjax.gpu`) against the XLA path of the same
   model, open loop (float32, and float64) and closed loop (PID), largest relative difference;
2. **open-loop throughput**, vehicle-steps/s for N = 1e3 … 1e7: the engine's open loop
   (``simulate`` under ``vmap``, RK4, dt 1 ms, RP-1 with per-vehicle mass, one command series
   shared by all vehicles, final state only) on ``backend="native"`` (on a GPU: the Pallas
   kernel) and on ``backend="xla"``, the same calls and data;
3. **closed-loop sweep**: PID on a 1e6-vehicle sweep (per-vehicle mass), 2 RK4 substeps a tick, the
   worst position error folded in the kernel (:func:`quadjax.gpu.closed_loop`), against the
   engine's XLA closed loop with the same fold as a ``Reduce`` hook, and the engine's closed loop
   with ``backend="native"`` ("per tick": the kernel launched once per tick inside XLA's scan, as
   ``quadjax sweep`` runs on a GPU), in vehicle-ticks/s;
4. **gradient cost**: ``jax.grad`` of a rollout loss (derivatives run on XLA on a GPU) against the
   kernel's forward and XLA's forward;
5. **peak device memory** (``memory_stats``) after each section, and **compile time**: each
   call's first run minus its median.

Each timing is the median of ``--repeats`` calls after the first (compile) call. ``--budget``
seconds: later points that would not fit are skipped and listed as skipped. ``--interpret`` runs
every section on the CPU at toy sizes, the kernels in Pallas' interpreter: it proves the script
end to end before device time is spent (tests/test_gpu.py runs it), and its numbers mean nothing.

A point that fails (a lowering the dry run cannot see, an out-of-memory) is recorded under
``errors`` with its message, the run goes on to the next point, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(fn, *args, repeats: int):
    """(first call [s], median of ``repeats`` later calls [s], result)."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), out


def peak_memory():
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


class Bench:
    def __init__(self, args):
        import jax
        import jax.numpy as jnp

        import quadjax as qj

        self.args, self.jax, self.jnp, self.qj = args, jax, jnp, qj
        self.t_start = time.perf_counter()
        self.results = {
            "device": str(jax.devices()[0].device_kind if hasattr(jax.devices()[0], "device_kind") else jax.devices()[0]),
            "backend": jax.default_backend(), "interpret": args.interpret, "jax": jax.__version__,
            "python": platform.python_version(), "sections": {}, "skipped": [], "errors": [],
        }

    # ---- helpers
    def attempt(self, label: str, fn, *args):
        """``fn(*args)``, or None with the error recorded under ``label``: device time is scarce, so
        one failing point (a lowering the CPU dry run cannot see, an out-of-memory at N = 1e7) must
        not cost the points after it. Any error makes the run's exit status 1."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 -- recorded, printed and reported in the exit status
            traceback.print_exc()
            self.results["errors"].append({"where": label, "error": f"{type(e).__name__}: {e}"[:2000]})
            return None

    def left(self) -> float:
        return self.args.budget - (time.perf_counter() - self.t_start)

    def save(self):
        from quadjax.files import write_atomic

        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in (("GPU_RESULTS.json", json.dumps(self.results, indent=2)), ("GPU_RESULTS.md", markdown(self.results))):
            write_atomic(out / name, lambda f, text=text: f.write(text.encode()))

    def vehicles(self, n, dtype):
        """RP-1 with per-vehicle mass (±10 %) at hover, 1 m up."""
        jnp, qj = self.jnp, self.qj
        p = qj.presets.rp1(dtype)
        masses = p.mass * jnp.linspace(0.9, 1.1, n).astype(dtype)
        return p, masses, qj.hover_state(p, (0.0, 0.0, 1.0))

    def commands(self, p, T, dtype):
        """One series for every vehicle: hover speed with a 2 % sine on each rotor."""
        jnp, qj = self.jnp, self.qj
        t = jnp.arange(T, dtype=dtype)[:, None] * 1e-3
        phase = jnp.arange(4, dtype=dtype)[None, :]
        return qj.hover_rotor_speed(p) * (1 + 0.02 * jnp.sin(2 * jnp.pi * 3.0 * t + phase))

    def open_loop(self, backend, p, s0, U, dt=1e-3):
        """final positions (N, 3) of the engine's open loop, per-vehicle mass; ``backend``
        "kernel" (on a GPU the Pallas kernel; with --interpret the kernel in the interpreter)."""
        jax, qj = self.jax, self.qj
        if backend == "kernel" and self.args.interpret:
            return self._interpreted_open_loop(p, s0, U, dt)
        config = qj.SimConfig(save_every=0, backend="native" if backend == "kernel" else "xla")

        @jax.jit
        def run(masses):
            return jax.vmap(lambda m: qj.simulate(p.replace(mass=m), s0, dt, commands=U, config=config).final.position)(masses)

        return run

    def _interpreted_open_loop(self, p, s0, U, dt):
        jax, jnp = self.jax, self.jnp
        from quadjax import gpu, native

        @jax.jit
        def run(masses):
            P = jax.vmap(lambda m: native.pack_params(p.replace(mass=m), jnp.asarray(dt, U.dtype)))(masses)
            final, _ = gpu.rollout_rows(P, native.pack_state(s0)[None], U[None], p.wind[None, None],
                                        jnp.zeros((1, 1, 6), U.dtype), substeps=1, save_every=0, rotors=4,
                                        interpret=True)
            return final[:, :3]

        return run

    # ---- sections
    def correctness(self):
        jnp = self.jnp
        a = self.args
        rows = []
        self.results["sections"]["correctness"] = {"rows": rows}

        def open_row(dtype):
            n, T = (16, 8) if a.interpret else (4096, 1000)
            p, masses, s0 = self.vehicles(n, dtype)
            U = self.commands(p, T, dtype)
            k = self.open_loop("kernel", p, s0, U)(masses)
            x = self.open_loop("xla", p, s0, U)(masses)
            rows.append({"case": f"open loop {dtype}, N {n}, T {T}",
                         "max_rel": float(jnp.max(jnp.abs(k - x) / (1 + jnp.abs(x))))})

        def closed_rows():
            cl = self.closed("kernel", "float32", *((16, 5) if a.interpret else (4096, 500)))
            xl = self.closed("xla", "float32", *((16, 5) if a.interpret else (4096, 500)))
            kf, kfold = cl[0](cl[1])
            xf, xfold = xl[0](xl[1])
            rows.append({"case": f"closed loop PID float32, N {cl[2]}, T {cl[3]}: final position",
                         "max_rel": float(jnp.max(jnp.abs(kf - xf) / (1 + jnp.abs(xf))))})
            rows.append({"case": "closed loop PID float32: folded worst error",
                         "max_rel": float(jnp.max(jnp.abs(kfold - xfold) / (1 + jnp.abs(xfold))))})

        for dtype in ("float32", "float64"):
            self.attempt(f"correctness open loop {dtype}", open_row, dtype)
        self.attempt("correctness closed loop", closed_rows)
        self.results["sections"]["correctness"]["peak_bytes"] = peak_memory()

    def throughput(self):
        a = self.args
        sizes = [16, 32] if a.interpret else [10**3, 10**4, 10**5, 10**6, 10**7]
        rows = []
        for n in sizes:
            T = 8 if a.interpret else (1000 if n <= 10**5 else 200 if n <= 10**6 else 100)
            p, masses, s0 = self.vehicles(n, "float32")
            U = self.commands(p, T, "float32")
            row = {"N": n, "T": T}
            for backend in ("kernel", "xla"):
                if self.left() < 30:
                    self.results["skipped"].append(f"throughput {backend} N={n}")
                    continue
                got = self.attempt(f"throughput {backend} N={n}", lambda: timed(self.open_loop(backend, p, s0, U), masses,
                                                                                 repeats=a.repeats))
                if got is not None:
                    first, med, _ = got
                    row[backend] = {"steps_per_s": n * T / med, "median_s": med, "compile_s": max(first - med, 0.0)}
            rows.append(row)
            self.results["sections"]["throughput"] = {"rows": rows, "peak_bytes": peak_memory()}
            self.save()

    def closed(self, backend, dtype, n, T):
        """(jitted run(masses) -> (final positions, folded worst error), masses, n, T)."""
        jax, jnp, qj = self.jax, self.jnp, self.qj
        from quadjax import gpu
        from quadjax.control import CascadeRates, Hover, PIDController, pid_control, pid_init
        from quadjax.engine import Reduce

        dt = 2e-3
        p, masses, s0 = self.vehicles(n, dtype)
        target = jnp.asarray([0.5, -0.5, 1.5], dtype)
        C = PIDController.create(p, Hover(position=target, yaw=jnp.asarray(0.3, dtype)))
        law = functools.partial(pid_control, rates=CascadeRates(dt=dt))
        init = jnp.zeros((), dtype)

        def worst(acc, state):
            return jnp.maximum(acc, jnp.linalg.norm(state.position - target))

        cs0 = pid_init(C, s0)
        if backend == "kernel":
            @jax.jit
            def run(masses):
                ps = jax.vmap(lambda m: p.replace(mass=m))(masses)
                out = gpu.closed_loop(ps, s0, law, C, cs0, dt=dt, num_ticks=T, substeps=2, fold=worst,
                                      fold_init=init, in_axes=(0, None, None, None, None),
                                      interpret=self.args.interpret)
                return out.final.position, out.fold
        else:
            # "per tick": the engine's closed loop with backend="native", which on a GPU launches the
            # kernel once per tick inside XLA's scan (the sweep's path there): is that worse than XLA's?
            config = qj.SimConfig(backend="native" if backend == "per tick" else "xla", substeps=2, save_every=0)

            @jax.jit
            def run(masses):
                def one(m):
                    tr = qj.simulate(p.replace(mass=m), s0, dt, controller=law, ctrl_params=C, ctrl_state=cs0,
                                     num_ticks=T, hooks=(Reduce(worst, init),), config=config)
                    return tr.final.position, tr.hooks[0]
                return jax.vmap(one)(masses)
        return run, masses, n, T

    def closed_loop(self):
        a = self.args
        rows = []
        plan = [("kernel", 16, 5), ("xla", 16, 5), ("per tick", 16, 5)] if a.interpret else [
            ("kernel", 10**6, 500), ("xla", 10**5, 100), ("xla", 10**6, 50), ("per tick", 10**5, 100)]
        for backend, n, T in plan:
            if self.left() < 60:
                self.results["skipped"].append(f"closed loop {backend} N={n}")
                continue
            got = self.attempt(f"closed loop {backend} N={n}",
                               lambda: timed(*self.closed(backend, "float32", n, T)[:2], repeats=max(1, a.repeats - 1)))
            if got is None:
                continue
            first, med, _ = got
            rows.append({"path": backend, "N": n, "ticks": T, "substeps": 2, "ticks_per_s": n * T / med,
                         "median_s": med, "compile_s": max(first - med, 0.0)})
            self.results["sections"]["closed_loop"] = {"rows": rows, "peak_bytes": peak_memory()}
            self.save()

    def gradient(self):
        jax, jnp = self.jax, self.jnp
        a = self.args
        n, T = (16, 8) if a.interpret else (10**4, 1000)
        p, masses, s0 = self.vehicles(n, "float32")
        U = self.commands(p, T, "float32")
        rows = []
        for backend in ("kernel", "xla"):
            if self.left() < 60:
                self.results["skipped"].append(f"gradient {backend}")
                continue
            forward = self.open_loop(backend, p, s0, U)
            if backend == "kernel" and a.interpret:
                # the interpreter's kernel has no derivative rule; the engine's derivatives are XLA's on a GPU
                grad = jax.jit(jax.grad(lambda m: jnp.sum(self.open_loop("xla", p, s0, U)(m)[:, 2])))
            else:
                grad = jax.jit(jax.grad(lambda m: jnp.sum(forward(m)[:, 2])))
            got = self.attempt(f"gradient {backend}", lambda: (timed(forward, masses, repeats=a.repeats),
                                                               timed(grad, masses, repeats=a.repeats)))
            if got is None:
                continue
            (f_first, f_med, _), (g_first, g_med, _) = got
            rows.append({"path": backend, "N": n, "T": T, "forward_s": f_med, "grad_s": g_med,
                         "grad_over_forward": g_med / f_med, "grad_compile_s": max(g_first - g_med, 0.0)})
        self.results["sections"]["gradient"] = {"rows": rows, "peak_bytes": peak_memory()}


SECTIONS = ("correctness", "throughput", "closed_loop", "gradient")


def merge_earlier(results: dict, path: Path, chosen: list) -> None:
    """Carry over from an earlier run's ``path`` the sections this run does not measure, its notes
    and its skip list, when it ran on the same device and jax (else they are not comparable, and
    nothing is carried)."""
    if not path.exists():
        return
    earlier = json.loads(path.read_text())
    if (earlier.get("device"), earlier.get("jax"), earlier.get("interpret")) != (
            results["device"], results["jax"], results["interpret"]):
        print(f"--merge: {path} is from {earlier.get('device')} / jax {earlier.get('jax')}: not merged", file=sys.stderr)
        return
    for name, section in earlier.get("sections", {}).items():
        if name not in chosen:
            results["sections"][name] = section
    results["notes"] = list(earlier.get("notes", []))
    results["skipped"] = [x for x in earlier.get("skipped", []) if not any(x.startswith(c.replace("_", " "))
                                                                         for c in chosen)]
    results["runs"] = "several runs, merged: see Notes"


def _si(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def markdown(r: dict) -> str:
    s = r["sections"]
    lines = [f"# GPU kernel vs XLA — {r['device']} ({r['backend']}{', INTERPRETED: numbers mean nothing' if r['interpret'] else ''})",
             "", f"jax {r['jax']}, Python {r['python']}; written by `python benchmarks/gpu.py` "
             f"({r.get('runs', 'one run')}).", ""]
    if "correctness" in s:
        lines += ["## Correctness on the device", "", "| case | max relative difference |", "|---|---:|"]
        lines += [f"| {row['case']} | {row['max_rel']:.2e} |" for row in s["correctness"]["rows"]] + [""]
    if "throughput" in s:
        lines += ["## Open loop, vehicle-steps/s (float32, RK4, final state only)", "",
                  "| N | T | kernel | XLA | kernel / XLA | kernel compile s | XLA compile s |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for row in s["throughput"]["rows"]:
            k, x = row.get("kernel", {}), row.get("xla", {})
            ratio = k["steps_per_s"] / x["steps_per_s"] if k and x else None
            lines.append(f"| {row['N']:.0e} | {row['T']} | {_si(k.get('steps_per_s'))} | {_si(x.get('steps_per_s'))} | "
                         f"{_si(ratio)} | {_si(k.get('compile_s'))} | {_si(x.get('compile_s'))} |")
        lines.append("")
    if "closed_loop" in s:
        lines += ["## Closed loop: PID, 2 RK4 substeps a tick, worst error folded", "",
                  "| path | N | ticks | vehicle-ticks/s | compile s |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {row['path']} | {row['N']:.0e} | {row['ticks']} | {_si(row['ticks_per_s'])} | {_si(row['compile_s'])} |"
                  for row in s["closed_loop"]["rows"]] + [""]
    if "gradient" in s:
        lines += ["## Gradient of a rollout loss (d/d mass of Σ z_final)", "",
                  "| forward path | N | T | forward s | grad s | grad / forward | grad compile s |", "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {row['path']} | {row['N']} | {row['T']} | {_si(row['forward_s'])} | {_si(row['grad_s'])} | "
                  f"{_si(row['grad_over_forward'])} | {_si(row['grad_compile_s'])} |" for row in s["gradient"]["rows"]] + [""]
    peaks = {k: v.get("peak_bytes") for k, v in s.items()}
    lines += ["## Peak device memory after each section", "", "| section | peak bytes |", "|---|---:|"]
    lines += [f"| {k} | {_si(v)} |" for k, v in peaks.items()] + [""]
    if r.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in r["notes"]] + [""]
    if r.get("errors"):
        lines += ["## Errors (the run's exit status is 1)", ""]
        lines += [f"- {e['where']}: `{e['error'][:300]}`" for e in r["errors"]] + [""]
    if r["skipped"]:
        lines += ["Skipped for the time budget: " + ", ".join(r["skipped"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interpret", action="store_true", help="dry run on the CPU at toy sizes (Pallas interpreter)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later points that would not fit are skipped")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated, in this order: {','.join(SECTIONS)} (e.g. the ones a lease did not reach)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the sections of --out's GPU_RESULTS.json that this run does not measure (same device "
                         "and jax only); each run's command is listed under Notes")
    args = ap.parse_args(argv)
    chosen = [x for x in args.sections.split(",") if x]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        ap.error(f"--sections: unknown {unknown}; choose from {list(SECTIONS)}")
    import jax

    jax.config.update("jax_enable_x64", True)  # the float64 correctness row; float32 runs stay float32
    if not args.interpret and jax.default_backend() != "gpu":
        print(f"benchmarks/gpu.py: no GPU (JAX backend {jax.default_backend()!r}); use --interpret for a dry run",
              file=sys.stderr)
        return 2
    bench = Bench(args)
    if args.merge:
        merge_earlier(bench.results, Path(args.out) / "GPU_RESULTS.json", chosen)
    bench.results.setdefault("notes", []).append(
        f"`python benchmarks/gpu.py --sections {','.join(chosen)} --budget {args.budget:g} --repeats {args.repeats}"
        f"{' --merge' if args.merge else ''}`"
        f" measured: {', '.join(chosen)}.")
    for section in (getattr(bench, name) for name in SECTIONS if name in chosen):
        t0 = time.perf_counter()
        bench.attempt(section.__name__, section)
        bench.save()
        print(f"{section.__name__}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(markdown(bench.results))
    return 1 if bench.results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
