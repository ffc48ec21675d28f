"""The closed loop on the CPU, in one run (issue 14): the engine's closed loop with its whole horizon
in one generated native call (quadjax.native.loop) against the same loop with one physics kernel
call per tick (the engine before), on XLA, and the open-loop physics of the same ticks.

    python benchmarks/closed_loop.py [--n 4096] [--ticks 500] [--repeats 3]

The sweep's protocol: RP-1, float32, N vehicles (mass ±10 %), PID at 125 Hz (or geometric), a
tick of 8 ms = 2 RK4 substeps of 4 ms, a hover target 1 m up, the worst distance to it folded.
Rows, each the median of ``--repeats`` calls after a first (compile) call, in ns per
vehicle-tick, wall and CPU (all rows on the same cores, XLA's CPU threads):

* whole loop native: ``jax.jit(jax.vmap(simulate(controller=..., hooks=(Reduce(...),))))`` on
  ``backend="auto"``: the engine's tick (controller, substeps, monitor, fold, status) generated
  into one native call for the horizon;
* physics kernel per tick: the same call with the tick forced onto the previous path (the
  physics' native kernel once per tick, the controller and hooks in XLA): ``SimConfig(checkpoint=True)``,
  which the whole-loop kernel does not take (its derivatives run the XLA scan) and which changes
  nothing in a forward pass. (Until 2026-12-04 this row passed a zero wind series instead; once the
  whole-loop kernel took wind series, that row flew the whole-loop kernel too.);
* xla: the same on ``backend="xla"``;
* open-loop physics: ``simulate`` of the same 2-substep ticks with a held command (native
  kernel), the denominator of the issue's "closed loop ≤ 2× the open loop" target.

Also the whole-loop kernel's first call with a cold kernel cache (trace, C++ generation and
compile) and with it warm. Writes ``benchmarks/CLOSED_LOOP_RESULTS.md`` and ``.json`` (atomically).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def timed(fn, repeats):
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return first, statistics.median(walls), statistics.median(cpus)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--ticks", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    import quadjax as qj
    from quadjax.control import (CascadeRates, GeometricController, Hover, PIDController, geometric_control,
                                 geometric_init, pid_control, pid_init)
    from quadjax.engine import Reduce
    from quadjax.files import write_atomic

    dtype, dt, substeps, n, T = jnp.float32, 0.008, 2, args.n, args.ticks
    p = qj.presets.rp1(dtype)
    ps = jax.vmap(lambda a: p.replace(mass=p.mass * a))(jnp.asarray(np.random.default_rng(0).uniform(0.9, 1.1, n), dtype))
    s0 = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), qj.hover_state(p))
    target = jnp.asarray([0.0, 0.0, 1.0], dtype)
    hover = Hover(position=target, yaw=jnp.asarray(0.0, dtype))
    laws = {"pid": (functools.partial(pid_control, rates=CascadeRates(dt=dt)), PIDController.create(p, hover), pid_init),
            "geometric": (geometric_control, GeometricController.create(p, hover), geometric_init)}

    def worst(acc, state):
        return jnp.maximum(acc, jnp.linalg.norm(state.position - target))

    zero = jnp.zeros((), dtype)
    rows, per = [], n * T

    def row(name, law_name, fn):
        first, wall, cpu = timed(fn, args.repeats)
        rows.append({"path": name, "controller": law_name, "first_s": first, "wall_s": wall, "cpu_s": cpu,
                     "wall_ns": 1e9 * wall / per, "cpu_ns": 1e9 * cpu / per})
        print(f"{name:24s} {law_name:9s} {1e9 * wall / per:8.1f} ns wall {1e9 * cpu / per:8.1f} ns CPU "
              f"per vehicle-tick (first call {first:.2f} s)", flush=True)


    def fleet(law, ctrl, backend, per_tick=False):
        def one(p1, s, cs):
            tr = qj.simulate(p1, s, dt, controller=law, ctrl_params=ctrl, ctrl_state=cs, num_ticks=T,
                             hooks=(Reduce(worst, zero),),
                             config=qj.SimConfig(backend=backend, substeps=substeps, save_every=0, checkpoint=per_tick))
            return tr.hooks[0]

        return jax.jit(jax.vmap(one))

    cold_s = warm_s = None
    for law_name, (law, ctrl, init) in laws.items():
        cs0 = jax.vmap(lambda s: init(ctrl, s))(s0)
        if cold_s is None:  # the first call of the whole-loop kernel: cold cache, then warm (a new trace)
            with tempfile.TemporaryDirectory() as cold:
                os.environ["QUADJAX_CACHE_DIR"] = cold
                t0 = time.perf_counter()
                jax.block_until_ready(fleet(law, ctrl, "auto")(ps, s0, cs0))
                cold_s = time.perf_counter() - t0
                del os.environ["QUADJAX_CACHE_DIR"]
            t0 = time.perf_counter()
            jax.block_until_ready(fleet(law, ctrl, "auto")(ps, s0, cs0))
            warm_s = time.perf_counter() - t0
            print(f"whole-loop kernel ({law_name}): first call {cold_s:.1f} s with a cold cache, {warm_s:.1f} s warm")
        for path, backend, per_tick in (("whole loop native", "auto", False), ("physics kernel per tick", "auto", True),
                                        ("xla", "xla", False)):
            f = fleet(law, ctrl, backend, per_tick)
            row(path, law_name, lambda f=f, cs0=cs0: f(ps, s0, cs0))

    hover_cmd = jnp.broadcast_to(qj.hover_rotor_speed(p), (T, 4)).astype(dtype)

    def open_one(p1, s):
        tr = qj.simulate(p1, s, dt, commands=hover_cmd, config=qj.SimConfig(backend="native", substeps=substeps,
                                                                              save_every=0))
        return tr.final.position

    open_loop = jax.jit(jax.vmap(open_one))
    row("open-loop physics", "-", lambda: open_loop(ps, s0))

    base = {r["controller"]: r for r in rows if r["path"] == "physics kernel per tick"}
    phys = next(r for r in rows if r["path"] == "open-loop physics")
    results = {"n": n, "ticks": T, "dt": dt, "substeps": substeps, "dtype": "float32", "cpus": os.cpu_count(),
               "jax": jax.__version__, "first_call_cold_s": cold_s, "first_call_warm_s": warm_s,
               "rows": rows}
    lines = ["# The closed loop on the CPU (issue 14), one run", "",
             f"`python benchmarks/closed_loop.py --n {n} --ticks {T}`: RP-1 float32, {n} vehicles (mass ±10 %), "
             f"{T} ticks of {1e3 * dt:.0f} ms = {substeps} RK4 substeps, a hover target 1 m up, the worst distance "
             f"folded; {os.cpu_count()} cores, jax {jax.__version__}. Median of {args.repeats} calls after the first.", "",
             "| path | controller | ns / vehicle-tick, wall | CPU | speed-up over physics kernel per tick (wall) | CPU ÷ open-loop physics CPU | first call s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = base.get(r["controller"])
        speedup = f"{b['wall_s'] / r['wall_s']:.2f}×" if b else "—"
        lines.append(f"| {r['path']} | {r['controller']} | {r['wall_ns']:.1f} | {r['cpu_ns']:.1f} | {speedup} | "
                     f"{r['cpu_s'] / phys['cpu_s']:.2f} | {r['first_s']:.2f} |")
    lines += ["", f"The whole-loop kernel's first call (PID: trace, C++ generation and compile): {cold_s:.1f} s with a "
              f"cold kernel cache, {warm_s:.1f} s with it warm.", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "CLOSED_LOOP_RESULTS.json", lambda f: f.write(json.dumps(results, indent=1).encode()))
    write_atomic(args.out / "CLOSED_LOOP_RESULTS.md", lambda f: f.write("\n".join(lines).encode()))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
