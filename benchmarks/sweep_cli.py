"""`quadjax sweep` (the main job, the default sweep) before and after a change, in one run.

    python benchmarks/sweep_cli.py --before /path/to/an/older/checkout [--rounds 3]

Each round runs the default sweep once with the older checkout's quadjax (``PYTHONPATH``) and
once with this tree's, alternated, each in a fresh empty folder, so that both see the same
machine state. The first round warms both native kernel caches and both XLA compilation caches
(the older checkout gets ``JAX_COMPILATION_CACHE_DIR`` of its own, as its README advised; this
tree's command keeps its own cache), all in a cache folder made for the run, and is reported
apart as "cold". Reported per run: the
command's own line (compile, flight, vehicle-ticks/s, its total) and the wall time of the
process (imports included). Writes ``benchmarks/SWEEP_RESULTS.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"time: ([\d.]+) s \(compile ([\d.]+) s, flight ([\d.]+) s = ([\d.]+) M vehicle-ticks/s\)")


def run_once(tree: Path, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="quadjax-sweep-bench-") as folder:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "quadjax.cli", "sweep"], cwd=folder, capture_output=True,
                              text=True, env=dict(env, PYTHONPATH=str(tree)), timeout=900)
        wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{tree}: quadjax sweep failed:\n{done.stderr[-2000:]}")
    m = LINE.search(done.stdout)
    total, compile_s, flight, rate = (float(x) for x in m.groups())
    return {"wall_s": wall, "total_s": total, "compile_s": compile_s, "flight_s": flight, "mvts": rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="an older checkout of quadjax (its root folder)")
    ap.add_argument("--rounds", type=int, default=3, help="warm rounds after the cold one")
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": HERE.parent}
    # a fresh cache folder for this run: round 0 is a true cold start for both
    cache = Path(tempfile.mkdtemp(prefix="quadjax-sweep-bench-cache-"))
    base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {"QUADJAX_CACHE_DIR": str(cache)}
    envs = {"before": dict(base, JAX_COMPILATION_CACHE_DIR=str(cache / "xla-before")), "after": base}
    runs: dict = {"before": [], "after": []}
    for r in range(args.rounds + 1):
        for name in ("before", "after"):
            row = run_once(trees[name], envs[name])
            row["round"] = r
            runs[name].append(row)
            print(f"round {r} {name:6s} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "round"),
                  flush=True)

    def med(name, key):
        return statistics.median(x[key] for x in runs[name][1:])

    commit = subprocess.run(["git", "-C", str(trees["before"]), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    lines = ["# `quadjax sweep`: before and after (benchmarks/sweep_cli.py)", "",
             f"The default sweep (4 096 vehicles × 2 500 ticks = 10.24 M vehicle-ticks), commit {commit} "
             f"(`{trees['before']}`) "
             "against this tree, alternated in one run on this 2-core machine; round 0 cold (kernel and XLA "
             "caches filled), then the median of the warm rounds. Flight: the command's own figure "
             "(vehicle-ticks / flight time); total: the command's; wall: the process, imports included.", "",
             "| | flight [s] | M vehicle-ticks/s | compile [s] | total [s] | wall [s] |", "|---|---:|---:|---:|---:|---:|"]
    for name in ("before", "after"):
        c = runs[name][0]
        lines.append(f"| {name}, cold | {c['flight_s']:.2f} | {c['mvts']:.2f} | {c['compile_s']:.1f} | "
                     f"{c['total_s']:.1f} | {c['wall_s']:.1f} |")
        lines.append(f"| {name}, warm (median of {args.rounds}) | {med(name, 'flight_s'):.2f} | {med(name, 'mvts'):.2f} | "
                     f"{med(name, 'compile_s'):.1f} | {med(name, 'total_s'):.1f} | {med(name, 'wall_s'):.1f} |")
    # from the vehicle-ticks/s figure: the command prints its flight time to 0.1 s only
    ratio = [a["mvts"] / b["mvts"] for b, a in zip(runs["before"][1:], runs["after"][1:])]
    lines += ["", f"Flight speed, after / before, per warm round: {', '.join(f'{x:.2f}×' for x in ratio)} "
              f"(median {statistics.median(ratio):.2f}×)."]
    (HERE / "SWEEP_RESULTS.md").write_text("\n".join(lines) + "\n")
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    (HERE / "SWEEP_RESULTS.json").write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()},
                                                         "runs": runs}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
