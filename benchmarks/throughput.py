"""Rollout throughput of quadjax against the machine's limit and its peers, in one run.

    python benchmarks/throughput.py            # full run (~15-30 min on 2 cores): writes
                                               # benchmarks/out/throughput.{json,md,png}
                                               # and copies the table to benchmarks/RESULTS.md
    python benchmarks/throughput.py --quick    # a light run (~2 min), nothing copied
    quadjax bench [--quick ...]                # the same, through the CLI (bench_main)

What it measures (float32 and float64, RK4, dt = 1 ms, RP-1 with and without motor lag):

* ns per vehicle-step and vehicle-steps/s of ``simulate`` batched by ``map_vehicles``, final
  state only (``SimConfig(save_every=0)``), for N from 1 to 10⁶ (T shrinks as N grows;
  per-vehicle commands and initial states), wall and process-CPU time, medians of repeats
  after a compile-and-warm-up call — with the native kernel (``backend="native"``, every
  dtype/lag combination) and with XLA (``backend="xla"``, float32 with lag);
* compile time (lower + compile), XLA's buffer sizes (``memory_analysis``) and the
  process's peak RSS — each configuration runs in its own subprocess, so both are its own;
* ``jax.grad`` of a 1 000-step rollout (always the XLA path) against the forward rollout
  (native and XLA), with and without ``checkpoint``;
* the levers at N = 4096 float32: the native kernel on one core and two, and for XLA
  vehicle tiles (``block``), scan unroll, one core vs two, XLA CPU flags, sharding
  (``map_vehicles(..., mesh=vehicle_mesh())``);
* side by side, as ratios to quadjax: a hand-vectorised C reference (where its build
  script is present), c4dynamics' ``solve_ivp`` (small N), crazyflow 0.4.0 and RotorPy 3.0
  batched (run with a separate Python environment that has them, ``--peers-python`` or
  ``$QUADJAX_PEERS_PYTHON``). A peer that cannot be run is reported as such.

The machine is shared: the load average is recorded before and after, and every figure
is a median of repeats. CI never runs this file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
PERF = REPO.parent / "shared" / "perf"
DEFAULT_PEERS_PYTHON = "/work/peers-venv/bin/python"

FULL_SIZES = [1, 16, 256, 4096, 65536, 1_000_000]
QUICK_SIZES = [1, 256, 4096]
DT = 1e-3


def steps_for(n: int, budget: float) -> int:
    """T for N vehicles: about ``budget`` vehicle-steps, 20 ≤ T ≤ 2000."""
    return int(min(2000, max(20, round(budget / n))))


# --------------------------------------------------------------------------- worker (one config)


def _worker(cfg: dict) -> dict:
    """Run one quadjax configuration in this process and return its figures."""
    import resource

    import jax

    jax.config.update("jax_enable_x64", True)  # float64 available; every array below has an explicit dtype
    import jax.numpy as jnp
    import numpy as np

    import quadjax as qj

    dtype = jnp.dtype(cfg["dtype"])
    n, t = cfg["N"], cfg["T"]
    p = qj.presets.rp1(dtype)
    if not cfg.get("lag", True):
        p = p.replace(motor_tau=jnp.asarray(0.0, dtype))
    rng = np.random.default_rng(0)
    s0 = qj.hover_state(p, (0.0, 0.0, 5.0))
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), s0)
    states = states.replace(position=states.position + jnp.asarray(rng.uniform(-1, 1, (n, 3)), dtype))
    spread = jnp.asarray(1.0 + 0.01 * rng.standard_normal((n, 1, 4)), dtype)
    commands = jnp.broadcast_to(qj.hover_rotor_speed(p) * spread, (n, t, 4)) + jnp.zeros((), dtype)
    config = qj.SimConfig(save_every=0, unroll=cfg.get("unroll", 1), checkpoint=cfg.get("checkpoint", False),
                          backend=cfg.get("backend", "auto"))
    dt = jnp.asarray(DT, dtype)
    mesh = None
    if cfg.get("sharded"):  # one XLA CPU device per core (XLA_FLAGS set by the caller), vehicles split
        from quadjax.sharding import vehicle_mesh

        mesh = vehicle_mesh()

    def one(p, s, u):
        return qj.simulate(p, s, dt, commands=u, config=config).final

    def forward(p, states, commands):  # params shared, per-vehicle states and commands
        return qj.map_vehicles(one, (p, states, commands), (None, 0, 0), block=cfg.get("block"), mesh=mesh)

    def loss(p, states, commands):
        final = forward(p, states, commands)
        return jnp.sum(final.position[..., 2]) + jnp.sum(final.body_rates)

    if cfg.get("mode") == "grad":
        fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
    elif cfg.get("mode") == "loss":
        fn = jax.jit(loss)
    else:
        fn = jax.jit(forward)
    args = (p, states, commands)
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(*args))  # warm-up
    walls, cpus = [], []
    budget = cfg.get("min_time", 0.5)
    for _ in range(cfg.get("repeats", 5)):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(*args))
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if sum(walls) > 10 * budget and len(walls) >= 3:
            break
    mem = compiled.memory_analysis()
    finite = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(out))
    wall, cpu = float(np.median(walls)), float(np.median(cpus))
    return {
        **cfg, "wall_s": wall, "cpu_s": cpu, "wall_ns": 1e9 * wall / (n * t), "cpu_ns": 1e9 * cpu / (n * t),
        "vehicle_steps_per_s": n * t / wall, "compile_s": compile_s, "repeats_done": len(walls),
        "xla_temp_bytes": getattr(mem, "temp_size_in_bytes", None),
        "xla_argument_bytes": getattr(mem, "argument_size_in_bytes", None),
        "xla_output_bytes": getattr(mem, "output_size_in_bytes", None),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "finite": finite,
    }


def run_config(cfg: dict, *, env_flags: str = "", cores: str | None = None, timeout: float = 1800) -> dict:
    """Run one configuration in a fresh subprocess (own compile cache, own peak memory)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if env_flags:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + env_flags).strip()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
    if cores is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cores] + cmd
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {**cfg, "error": f"timeout after {timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {**cfg, "error": (out.stderr or out.stdout).strip().splitlines()[-1:] or ["failed"]}
    row = json.loads(lines[-1])
    row.update(xla_flags=env_flags, cores=cores)
    return row


# --------------------------------------------------------------------------- references and peers


def c_reference(n: int, steps: int) -> dict:
    """The hand-vectorised C reference (single core, float32): ns per vehicle-step."""
    script = PERF / "run_limit.sh"
    if not script.exists():
        return {"peer": "C reference", "N": n, "error": f"{script} not found"}
    n64 = max(64, (n // 64) * 64)
    try:
        out = subprocess.run(["bash", str(script), str(n64), str(steps)], capture_output=True, text=True, timeout=900)
    except (subprocess.TimeoutExpired, OSError) as err:
        return {"peer": "C reference", "N": n64, "error": str(err)}
    m = re.search(r"([0-9.]+) ns/vehicle-step", out.stdout)
    if not m:
        return {"peer": "C reference", "N": n64, "error": (out.stderr or out.stdout).strip()[-300:]}
    return {"peer": "C reference", "N": n64, "T": steps, "dtype": "float32", "wall_ns": float(m.group(1)),
            "cpu_ns": float(m.group(1)), "note": "1 core, #pragma omp simd, -O3 -march=native -ffast-math"}


def c4dynamics_solve_ivp(n: int, t: int) -> dict:
    """c4dynamics 2.6 ``quadeqm`` integrated by scipy ``solve_ivp`` (RK45, max_step = dt), N vehicles in a loop."""
    try:
        import numpy as np
        from c4dynamics.eqm.quadcopter import quadeqm
        from scipy.integrate import solve_ivp

        import c4dynamics as c4d
    except ImportError as err:
        return {"peer": "c4dynamics", "N": n, "error": f"not installed ({err})"}
    quad = c4d.struct(m=0.468, g=9.81, l=0.225, kT=2.98e-6, kQ=0.0382 * 2.98e-6, Ixx=4.856e-3, Iyy=4.856e-3,
                      Izz=8.801e-3, Ax=0.3, Ay=0.3, Az=0.25, Ar=0.2, IR=3.357e-5, wind=np.zeros(3))
    hover = np.sqrt(0.468 * 9.81 / 4 / 2.98e-6) * 1.01 * np.ones(4)
    x0 = np.array([0, 0, 5.0, 0, 0, 0, 1.0, 0, 0, 0, 0, 0, 0])
    t0, c0 = time.perf_counter(), time.process_time()
    steps = 0
    for _ in range(n):
        sol = solve_ivp(lambda tt, x: quadeqm(tt, x, quad, hover, "ENU"), (0.0, t * DT), x0, method="RK45",
                        max_step=DT, rtol=1e-6, atol=1e-9)
        steps += sol.t.size - 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"peer": "c4dynamics", "version": "2.6.0", "N": n, "T": t, "dtype": "float64",
            "wall_ns": 1e9 * wall / (n * t), "cpu_ns": 1e9 * cpu / (n * t), "solver_steps": steps,
            "note": "solve_ivp RK45, max_step = dt, rtol 1e-6 (seed-004 model: no lag, no battery)"}


def peer(script: str, sizes: list, python: str, repeats: int, timeout: float = 2400) -> list[dict]:
    """Run a peer's benchmark script in the peers' venv; one row per size or one error row."""
    name = script.replace("_bench.py", "")
    if not python or not Path(python).exists():
        return [{"peer": name, "error": f"not installed (no peers' python at {python})"}]
    cfg = json.dumps({"sizes": sizes, "repeats": repeats})
    try:
        out = subprocess.run([python, str(HERE / "_peers" / script), cfg], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"peer": name, "error": f"timeout after {timeout:.0f} s"}]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not rows:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return [{"peer": name, "error": tail[0][:300]}]
    return rows


# --------------------------------------------------------------------------- report


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import jax

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "platform": platform.platform()}


def _fmt(x, digits=1):
    if x is None:
        return "—"
    if abs(x) >= 1e5:
        return f"{x:.3g}"
    return f"{x:.{digits}f}"


def _best_backend(res: dict) -> str:
    """The backend whose figures the ratios use: the native kernel when it ran."""
    return "native" if any(r.get("backend") == "native" and "error" not in r for r in res["sweep"]) else "xla"


def _find(rows, **match):
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()) and "error" not in r:
            return r
    return None


def targets(res: dict) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows for the issue's targets, float32, N ≥ 4096."""
    out = []
    sweep = [r for r in res["sweep"] if r.get("backend", "auto") == _best_backend(res)]
    big = [r for r in sweep if r["dtype"] == "float32" and r["lag"] and r["N"] >= 4096 and "error" not in r]
    best = min(big, key=lambda r: r["wall_ns"]) if big else None
    cref = [r for r in res["c_reference"] if "error" not in r]
    if best and cref:
        c = min(cref, key=lambda r: abs(r["N"] - best["N"]))
        ratio = best["wall_ns"] / c["wall_ns"]
        cpu_ratio = best["cpu_ns"] / c["cpu_ns"]
        out.append(("within 3× of the C reference (stretch 2×)",
                    f"{ratio:.1f}× wall, {cpu_ratio:.1f}× CPU time (quadjax N={best['N']} {best['wall_ns']:.1f} ns"
                    f" vs C N={c['N']} {c['wall_ns']:.1f} ns)",
                    "reached" if ratio <= 3 else f"not reached ({ratio / 3:.1f}× over)"))
        levers = [r for r in res["levers"] if "error" not in r and r["N"] >= 4096]
        if levers:
            lb = min(levers, key=lambda r: r["wall_ns"])
            c = min(cref, key=lambda r: abs(r["N"] - lb["N"]))
            ratio = lb["wall_ns"] / c["wall_ns"]
            verdict = "reached" if ratio <= 3 else f"not reached ({ratio / 3:.1f}× over)"
            out.append(("… with the best lever",
                        f"{ratio:.1f}× wall ({lb['lever']}, N={lb['N']}: {lb['wall_ns']:.1f} ns)", verdict))
    cf = [r for r in res["peers"] if r.get("peer") == "crazyflow" and "error" not in r and r["N"] >= 4096]
    for c in (sorted(cf, key=lambda r: r["N"]) if best else []):
        q = _find(sweep, dtype="float32", lag=True, N=c["N"]) or best
        ratio = c["wall_ns"] / q["wall_ns"]
        out.append((f"≥ 20× crazyflow's throughput (N={c['N']})", f"{ratio:.1f}× ({c['wall_ns']:.0f} vs "
                    f"{q['wall_ns']:.1f} ns)", "reached" if ratio >= 20 else f"not reached ({20 / ratio:.1f}× short)"))
    one = _find(sweep, dtype="float32", lag=True, N=1)
    if one:
        us = one["wall_ns"] / 1e3
        out.append(("single-vehicle rollout ≤ 0.5 µs per step", f"{us:.2f} µs",
                    "reached" if us <= 0.5 else f"not reached ({us / 0.5:.1f}× over)"))
    for g in res["gradient"]:
        if "ratio" in g:
            out.append((f"gradient ≤ 5× forward (N={g['N']}, T={g['T']}, checkpoint={g['checkpoint']})",
                        f"{g['ratio']:.1f}× the native forward, {g['ratio_xla']:.1f}× the XLA forward",
                        "reached" if g["ratio"] <= 5 else
                        ("reached against the XLA forward only" if g["ratio_xla"] <= 5 else "not reached")))
    comp = [r["compile_s"] for r in sweep if "compile_s" in r and r["dtype"] == "float32"]
    grad_comp = [g["grad_compile_s"] for g in res["gradient"] if "grad_compile_s" in g]
    if comp:
        worst = max(comp + grad_comp)
        out.append(("compile ≤ 5 s", f"forward {min(comp):.1f}–{max(comp):.1f} s (float32 sweep)"
                    + (f", gradient {min(grad_comp):.1f}–{max(grad_comp):.1f} s" if grad_comp else ""),
                    "reached" if worst <= 5 else f"forward reached; gradient worst {worst:.1f} s"))
    return out


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [
        "# Rollout throughput: quadjax, the C reference and peers (one run)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, JAX {m['jax']}, "
        f"XLA_FLAGS='{m['xla_flags']}'. Load average before/after: {res['load_before']} / {res['load_after']} "
        "(the 2 cores are shared with other jobs: wall times are noisy; CPU time is the process's user+system "
        "time over both threads). RK4, dt = 1 ms, RP-1 parameters, per-vehicle initial states and commands, "
        "`map_vehicles` over `simulate(..., config=SimConfig(save_every=0))` (final state only), medians of "
        "repeats after a warm-up call. Generated by "
        f"`python benchmarks/throughput.py` on {res['date']}.",
        "",
        "## quadjax: ns per vehicle-step (wall / CPU) and vehicle-steps/s",
        "",
        "| backend | N | T | dtype | motor lag | wall ns | CPU ns | vehicle-steps/s | compile s | XLA temp MB "
        "| peak RSS MB |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["sweep"]:
        if "error" in r:
            lines.append(f"| {r.get('backend')} | {r['N']} | {r['T']} | {r['dtype']} | {r['lag']} | "
                         f"error: {r['error']} ||||||")
            continue
        temp = (r.get("xla_temp_bytes") or 0) / 2**20
        lines.append(
            f"| {r.get('backend')} | {r['N']} | {r['T']} | {r['dtype']} | {'yes' if r['lag'] else 'no'} | "
            f"{_fmt(r['wall_ns'])} | "
            f"{_fmt(r['cpu_ns'])} | {r['vehicle_steps_per_s']:.3g} | {r['compile_s']:.1f} | {temp:.1f} | "
            f"{r['peak_rss_bytes'] / 2**20:.0f} |")
    lines += ["", f"## Side by side (ratios: peer time per vehicle-step ÷ quadjax {_best_backend(res)}'s, "
              "float32 with lag unless noted)", "",
              "| peer | N | T | dtype | wall ns | CPU ns | quadjax wall ns | peer ÷ quadjax (wall) | note |",
              "|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in res["c_reference"] + res["peers"]:
        if "error" in r:
            lines.append(f"| {r['peer']} | {r.get('N', '')} |  |  |  |  |  |  | {r['error']} |")
            continue
        best = _best_backend(res)
        q = _find(res["sweep"], dtype="float32", lag=True, N=r["N"], backend=best)
        if q is None:
            cand = [s for s in res["sweep"] if s["dtype"] == "float32" and s["lag"] and "error" not in s
                    and s.get("backend") == best]
            q = min(cand, key=lambda s: abs(s["N"] - r["N"])) if cand else None
        ratio = r["wall_ns"] / q["wall_ns"] if q else None
        lines.append(
            f"| {r['peer']} | {r['N']} | {r.get('T', '')} | {r.get('dtype', '')} | {_fmt(r['wall_ns'])} | "
            f"{_fmt(r.get('cpu_ns'))} | {_fmt(q['wall_ns']) if q else '—'} | "
            f"{(f'{ratio:.2f}×' if ratio is not None else '—')} | {r.get('note', '')} |")
    lines += ["", "## Gradient of a rollout against the forward rollout", "",
              "| N | T | dtype | checkpoint | forward ms (native) | forward ms (XLA) | grad ms | grad ÷ forward "
              "(native / XLA) | grad compile s | grad peak RSS MB |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for g in res["gradient"]:
        if "ratio" not in g:
            lines.append(f"| {g['N']} | {g['T']} | {g['dtype']} | {g['checkpoint']} | error: {g.get('error')} |||||")
            continue
        lines.append(f"| {g['N']} | {g['T']} | {g['dtype']} | {g['checkpoint']} | {g['forward_s'] * 1e3:.1f} | "
                     f"{g['forward_xla_s'] * 1e3:.1f} | {g['grad_s'] * 1e3:.1f} | {g['ratio']:.2f}× / "
                     f"{g['ratio_xla']:.2f}× | {g['grad_compile_s']:.1f} | "
                     f"{g['grad_peak_rss_bytes'] / 2**20:.0f} |")
    lines += ["", "## Levers, float32 with lag", "",
              "| lever | N | T | wall ns | CPU ns | compile s |", "|---|---:|---:|---:|---:|---:|"]
    for r in res["levers"]:
        if "error" in r:
            lines.append(f"| {r['lever']} | {r['N']} | {r['T']} | error: {r['error']} |||")
            continue
        lines.append(f"| {r['lever']} | {r['N']} | {r['T']} | {_fmt(r['wall_ns'])} | {_fmt(r['cpu_ns'])} | "
                     f"{r['compile_s']:.1f} |")
    lines += ["", "## Targets (issue #4; float32, N ≥ 4096)", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in targets(res)]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for dtype in ("float32", "float64"):
        for lag in (True, False):
            rows = [r for r in res["sweep"] if r["dtype"] == dtype and r["lag"] == lag and "error" not in r]
            if rows:
                ax.plot([r["N"] for r in rows], [r["wall_ns"] for r in rows], "o-" if dtype == "float32" else "s--",
                        label=f"quadjax {dtype}{'' if lag else ', no lag'}")
    groups = {}
    for r in res["c_reference"] + res["peers"]:
        if "error" not in r:
            groups.setdefault(r["peer"], []).append(r)
    for name, rows in groups.items():
        rows.sort(key=lambda r: r["N"])
        ax.plot([r["N"] for r in rows], [r["wall_ns"] for r in rows], "^:", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vehicles N")
    ax.set_ylabel("wall ns per vehicle-step (lower is better)")
    ax.set_title("RK4 rollout throughput, dt = 1 ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- main


def _native_available() -> bool:
    """Whether quadjax's native kernel builds here (in a subprocess: the parent never imports JAX)."""
    code = "import quadjax; print(quadjax.native.available())"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO))
    return out.stdout.strip().endswith("True")


def _load():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def bench_main(argv: list[str] | None = None) -> int:
    """Entry point of ``python benchmarks/throughput.py`` and ``quadjax bench``."""
    ap = argparse.ArgumentParser(prog="quadjax bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a light run: small N and T, no copy to RESULTS.md")
    ap.add_argument("--sizes", type=int, nargs="*", help="vehicle counts N (default: 1 … 10⁶, quick: 1 … 4096)")
    ap.add_argument("--budget", type=float, help="vehicle-steps per timed call (T = budget / N, 20 ≤ T ≤ 2000)")
    ap.add_argument("--repeats", type=int, help="timed repeats per configuration")
    ap.add_argument("--no-peers", action="store_true", help="skip crazyflow, RotorPy and c4dynamics")
    ap.add_argument("--no-levers", action="store_true", help="skip the levers section")
    ap.add_argument("--peers-python", default=os.environ.get("QUADJAX_PEERS_PYTHON", DEFAULT_PEERS_PYTHON))
    ap.add_argument("--out", type=Path, default=OUT, help="output folder (default benchmarks/out)")
    ap.add_argument("--results", type=Path, default=None,
                    help="copy the Markdown table here (default: benchmarks/RESULTS.md on a full run)")
    ap.add_argument("--from-json", type=Path, help="rewrite the Markdown from a saved throughput.json, run nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))), flush=True)
        return 0

    if args.from_json:
        md = markdown(json.loads(args.from_json.read_text()))
        if args.results:
            Path(args.results).write_text(md)
        print(md)
        return 0
    quick = args.quick
    sizes = args.sizes or (QUICK_SIZES if quick else FULL_SIZES)
    budget = args.budget or (2e6 if quick else 2e7)
    repeats = args.repeats or (3 if quick else 5)
    res = {"machine": machine_info(), "load_before": _load(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "quick": quick, "sweep": [], "gradient": [], "levers": [], "c_reference": [], "peers": []}

    def log(msg):
        print(msg, flush=True)

    # quadjax sweep: the native kernel in every configuration, XLA in float32 with lag
    backends = ["native", "xla"] if _native_available() else ["xla"]
    configs = [(b, d, lag) for b in backends for d in ("float32", "float64") for lag in (True, False)
               if (lag and d == "float32") or not (quick or b == "xla")]
    for backend, dtype, lag in configs:
        for n in sizes:
            t = steps_for(n, budget)
            row = run_config({"dtype": dtype, "lag": lag, "N": n, "T": t, "repeats": repeats, "backend": backend})
            res["sweep"].append(row)
            log(f"quadjax {backend} {dtype} lag={lag} N={n} T={t}: "
                + (row.get("error") and f"error {row['error']}" or
                   f"{row['wall_ns']:.1f} ns wall, {row['cpu_ns']:.1f} ns CPU, compile {row['compile_s']:.1f} s"))

    # gradient of a 1000-step rollout vs forward
    for n in ([1] if quick else [1, 1024]):
        for checkpoint in (False, True):
            base = {"dtype": "float32", "lag": True, "N": n, "T": 1000, "repeats": repeats, "checkpoint": checkpoint}
            fwd = run_config({**base, "mode": "loss"})
            fwd_xla = run_config({**base, "mode": "loss", "backend": "xla"})
            grd = run_config({**base, "mode": "grad"})
            g = {"N": n, "T": 1000, "dtype": "float32", "checkpoint": checkpoint}
            if "error" in fwd or "error" in grd or "error" in fwd_xla:
                g["error"] = fwd.get("error") or grd.get("error") or fwd_xla.get("error")
            else:
                g.update(forward_s=fwd["wall_s"], grad_s=grd["wall_s"], ratio=grd["wall_s"] / fwd["wall_s"],
                         forward_xla_s=fwd_xla["wall_s"], ratio_xla=grd["wall_s"] / fwd_xla["wall_s"],
                         cpu_ratio=grd["cpu_s"] / fwd["cpu_s"], grad_compile_s=grd["compile_s"],
                         grad_peak_rss_bytes=grd["peak_rss_bytes"], forward_peak_rss_bytes=fwd["peak_rss_bytes"])
            res["gradient"].append(g)
            log(f"gradient N={n} checkpoint={checkpoint}: {g.get('ratio', g.get('error'))}")

    # levers at N = 4096 float32
    if not args.no_levers:
        n = 4096
        t = steps_for(n, budget)
        base = {"dtype": "float32", "lag": True, "N": n, "T": t, "repeats": repeats, "backend": "xla"}
        levers = [("XLA baseline (vmap over all N, unroll 1, 2 cores)", {}, "", None)]
        if not quick:
            levers += [
                ("native kernel, one core (taskset -c 0)", {"backend": "native"}, "", "0"),
                ("native kernel, 2 cores", {"backend": "native"}, "", None),
                ("block = 512 (lax.map over tiles)", {"block": 512}, "", None),
                ("block = 1024", {"block": 1024}, "", None),
                ("scan unroll = 4", {"unroll": 4}, "", None),
                ("one core (taskset -c 0)", {}, "", "0"),
                ("XLA_FLAGS=--xla_cpu_prefer_vector_width=512", {}, "--xla_cpu_prefer_vector_width=512", None),
                ("one XLA device per core (--xla_force_host_platform_device_count=2) + map_vehicles(mesh=...)",
                 {"sharded": True}, "--xla_force_host_platform_device_count=2", None),
                ("the same + --xla_cpu_prefer_vector_width=512", {"sharded": True},
                 "--xla_force_host_platform_device_count=2 --xla_cpu_prefer_vector_width=512", None),
            ]
            levers += [(f"N = 65536, block = {b}", {"N": 65536, "T": steps_for(65536, budget), "block": b}, "", None)
                       for b in (None, 4096)]
        for name, extra, flags, cores in levers:
            row = run_config({**base, **extra}, env_flags=flags, cores=cores)
            row["lever"] = name
            res["levers"].append(row)
            log(f"lever {name}: {row.get('wall_ns', row.get('error'))}")

    # C reference
    for n in ([4096] if quick else [4096, 65536, 1_048_576]):
        row = c_reference(n, max(50, steps_for(n, budget)))
        res["c_reference"].append(row)
        log(f"C reference N={n}: {row.get('wall_ns', row.get('error'))}")

    # peers
    if not args.no_peers:
        res["peers"].append(c4dynamics_solve_ivp(1, 200 if quick else 1000))
        cf_sizes = [[1, 500], [4096, 50]] if quick else [[1, 2000], [256, 500], [4096, 200], [65536, 20]]
        res["peers"] += peer("crazyflow_bench.py", cf_sizes, args.peers_python, repeats)
        rp_sizes = [[1, 20], [256, 5]] if quick else [[1, 100], [256, 20], [4096, 5]]
        res["peers"] += peer("rotorpy_bench.py", rp_sizes, args.peers_python, repeats)
        for r in res["peers"]:
            log(f"peer {r.get('peer')} N={r.get('N')}: {r.get('wall_ns', r.get('error'))}")

    res["load_after"] = _load()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "throughput.json").write_text(json.dumps(res, indent=2))
    md = markdown(res)
    (args.out / "throughput.md").write_text(md)
    plot(res, args.out / "throughput.png")
    results = args.results or (None if quick else HERE / "RESULTS.md")
    if results is not None:
        Path(results).write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(bench_main())
