"""One sweep, one or two processes (jax.distributed on 127.0.0.1): throughput and coordination cost.

    python benchmarks/distributed.py             # ~4 min on 2 idle cores
    python benchmarks/distributed.py --vehicles 1024 --duration 5   # a quicker look

Writes benchmarks/DISTRIBUTED_RESULTS.md and prints the same tables. Everything runs on this
machine, one job at a time; run it with nothing else on the cores.

1. The sweep. `quadjax sweep` with its defaults (4 096 vehicles × 2 500 ticks, RP-1, figure-8,
   PID, gusts), float32, each run into a fresh folder with a warm XLA cache (a first run fills
   it; compile time is reported apart). Configurations:
   (a) one process, one CPU device (`--cpu-devices 1`; the native kernel spreads the physics of
       each tick over both cores, the rest of the tick runs on one);
   (b) one process, one CPU device per core (`--cpu-devices 2`, each device flown from its own
       thread; `quadjax sweep`'s default from 4e7 vehicle-ticks, where its extra compilation pays);
   (c) two processes, one CPU device each, sharing the two cores;
   (d) as (c), each process pinned to its own core (`taskset`), as on two one-core hosts.
   Per configuration, best of `--repeats`: wall time from launch to the last exit, CPU time of
   all its processes (user + system, from the kernel's accounting of the children), the
   slowest process's compile and flight time (manifest timings), throughput = vehicle-ticks /
   flight time, and whether vehicles.npz equals (a)'s bit for bit.
2. Coordination. Two processes join on 127.0.0.1 and time the calls a sweep makes
   (quadjax.distributed: initialize, agree on a 300-byte identity, broadcast a 9-int header and
   a chunk mask, gather the ok flags and the timings), 50 times each after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "DISTRIBUTED_RESULTS.md"
OUT: list[str] = []


def emit(line: str = "") -> None:
    print(line, flush=True)
    OUT.append(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_job(argvs, env, timeout=1800):
    """Start every argv at once, wait for all; (wall s, CPU s, return codes, stderr texts)."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    with tempfile.TemporaryDirectory() as logs:
        procs, files = [], []
        for i, argv in enumerate(argvs):
            err = open(Path(logs) / f"{i}.err", "w+")  # noqa: SIM115 — a file, not a pipe: no blocking
            files.append(err)
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT))
        try:
            codes = [p.wait(timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        texts = []
        for f in files:
            f.seek(0)
            texts.append(f.read())
            f.close()
    return time.perf_counter() - t0, children_cpu() - cpu0, codes, texts


def sweep_argv(out, extra=(), pin=None):
    argv = [sys.executable, "-m", "quadjax.cli", "sweep", "--out", str(out), "--no-plots", "--quiet", *extra]
    return (["taskset", "-c", str(pin)] + argv) if pin is not None else argv


def part_sweep(args, env, work: Path):
    extra = ["--vehicles", str(args.vehicles), "--duration", str(args.duration)]
    ticks = round(args.duration / 0.008)

    def job(processes: int, devices: int, pin: bool, out: Path):
        flags = extra + ["--cpu-devices", str(devices)]
        if processes == 1:
            return [sweep_argv(out, flags)]
        port = free_port()
        return [sweep_argv(out, flags + ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
                                         "--process-id", str(i)], pin=i if pin else None) for i in range(processes)]

    cores = len(os.sched_getaffinity(0))
    # (name, processes, CPU devices per process, pinned)
    configs = [("(a) 1 process, 1 device", 1, 1, False),
               (f"(b) 1 process, {cores} devices", 1, cores, False),
               ("(c) 2 processes, 1 device each", 2, 1, False)]
    if shutil.which("taskset") and cores >= 2:
        configs.append(("(d) 2 processes, each pinned to one core", 2, 1, True))
    # warm the XLA cache for every layout (process 0's entries serve every later run; (d)
    # compiles what (c) does)
    for name, processes, devices, pin in configs:
        if not pin:
            run_job(job(processes, devices, pin, work / f"warm{name[1]}"), env)
    rows, reference = [], None
    for name, processes, devices, pin in configs:
        best = None
        for r in range(args.repeats):
            out = work / f"{name[1]}_{r}"
            wall, cpu, codes, errs = run_job(job(processes, devices, pin, out), env)
            if codes != [0] * processes:
                raise SystemExit(f"{name}: exit codes {codes}\n" + "\n".join(e[-2000:] for e in errs))
            timings = json.loads((out / "manifest.json").read_text())["timings_s"]
            with np.load(out / "vehicles.npz") as z:
                arrays = {k: z[k] for k in z.files}
            if reference is None:
                reference = arrays
            same = all(arrays[k].tobytes() == reference[k].tobytes() for k in reference)
            row = dict(name=name, wall=wall, cpu=cpu, compile=timings["compile_s"], flight=timings["flight_s"],
                       same=same)
            if best is None or row["wall"] < best["wall"]:
                best = row
            shutil.rmtree(out)
        rows.append(best)
    base = rows[0]
    emit(f"## 1. The default sweep, {args.vehicles} vehicles × {ticks} ticks, float32 (best of {args.repeats})")
    emit()
    emit("| configuration | wall s | CPU s | compile s | flight s | M vehicle-ticks/s | flight vs (a) | bits equal (a) |")
    emit("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        rate = args.vehicles * ticks / r["flight"] / 1e6
        emit(f"| {r['name']} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['compile']:.1f} | {r['flight']:.2f} | "
             f"{rate:.2f} | {base['flight'] / r['flight']:.2f}× | {'yes' if r['same'] else 'NO'} |")
    emit()
    emit("Wall: launch to the last exit (imports, joining, compile from the warm cache, flight, aggregation, "
         "writing). CPU: user + system of every process of the job. Compile and flight: the slowest process's "
         "(the manifest's timings_s).")
    emit()


COORDINATION = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
from quadjax import distributed as qd
index, count = qd.initialize(sys.argv[1], 2, int(sys.argv[2]))
joined = time.perf_counter() - t0
identity = json.dumps({"config": "f63d52e9332d16f0", "quadjax": "0.1.0", "jax": "0.10.2", "pad": "x" * 200})
calls = {
    "agree (identity, 4 kB buffer)": lambda: qd.agree(identity, "the sweep"),
    "broadcast (header, 9 int32)": lambda: qd.broadcast(np.zeros(9, np.int32)),
    "broadcast (chunk mask, 256 int32)": lambda: qd.broadcast(np.zeros(256, np.int32)),
    "failed (ok flags)": lambda: qd.failed(True),
    "gather (timings, 4 float64)": lambda: qd.gather(np.zeros(4)),
}
out = {"initialize": joined}
for name, call in calls.items():
    call(); call()  # warm-up: the first call compiles its tiny program
    t = time.perf_counter()
    for _ in range(50):
        call()
    out[name] = (time.perf_counter() - t) / 50
if index == 0:
    print(json.dumps(out))
"""


def part_coordination(env):
    port = free_port()
    argvs = [[sys.executable, "-c", COORDINATION, f"127.0.0.1:{port}", str(i)] for i in range(2)]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        procs = [subprocess.Popen(a, env=env, stdout=open(out, "w") if i == 0 else subprocess.DEVNULL,  # noqa: SIM115
                                  stderr=subprocess.DEVNULL, cwd=ROOT) for i, a in enumerate(argvs)]
        codes = [p.wait(300) for p in procs]
        if codes != [0, 0]:
            raise SystemExit(f"coordination job: exit codes {codes}")
        figures = json.loads(out.read_text().strip().splitlines()[-1])
    emit("## 2. Coordination between two processes (127.0.0.1)")
    emit()
    emit("| call | time |")
    emit("|---|---:|")
    emit(f"| initialize (connect to the coordinator, both processes) | {figures.pop('initialize') * 1e3:.0f} ms |")
    for name, seconds in figures.items():
        emit(f"| {name} | {seconds * 1e3:.2f} ms |")
    emit()
    emit("A sweep makes one agree, two broadcasts, two ok-flag gathers, one timings gather and one more "
         "broadcast (missing chunks): the coordination of a whole sweep is the join plus about 7 of these calls.")
    emit()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vehicles", type=int, default=4096)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory(prefix="quadjax-distributed-") as work:
        work = Path(work)
        env.update(JAX_COMPILATION_CACHE_DIR=str(work / "xla_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        emit("# Sweeps over processes: measured")
        emit()
        emit(f"`python benchmarks/distributed.py{' ' + ' '.join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ''}`, "
             f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one run; this machine only (no second host).")
        emit()
        part_sweep(args, env, work)
        part_coordination(env)
    RESULTS.write_text("\n".join(OUT) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
