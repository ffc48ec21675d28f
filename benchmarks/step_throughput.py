"""ns per vehicle-step of ``rk4_step`` in a jitted ``lax.scan`` (issue #2's baseline figure).

    python benchmarks/step_throughput.py [--out benchmarks/out/step_throughput.json]

Float32, RP-1 with motor lag, hover commands with a small per-vehicle spread, dt = 1 ms.
Each N is timed as the median of repeats after one compile-and-warm-up call. The full
peer comparison lives in benchmarks/throughput.py.
"""

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import quadjax as qj

SIZES = {1: 20_000, 1_000: 1_000, 10_000: 200, 100_000: 40}  # N → T


def make(n, t, dtype=jnp.float32):
    p = qj.presets.rp1(dtype=dtype)
    s = qj.hover_state(p, (0.0, 0.0, 5.0))
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), s)
    spread = 1.0 + 0.01 * jnp.asarray(np.random.default_rng(0).standard_normal((n, 4)), dtype)
    commands = qj.hover_rotor_speed(p) * spread

    def run(states, commands):
        def one(state, command):
            final, _ = jax.lax.scan(lambda x, _: (qj.rk4_step(p, x, command, 1e-3), None), state, None, length=t)
            return final

        return jax.vmap(one)(states, commands)

    return jax.jit(run), states, commands


def measure(n, t, repeats=5):
    run, states, commands = make(n, t)
    t0 = time.perf_counter()
    jax.block_until_ready(run(states, commands))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(states, commands))
        times.append(time.perf_counter() - t0)
    med = float(np.median(times))
    return {"N": n, "T": t, "dtype": "float32", "median_s": med, "ns_per_vehicle_step": 1e9 * med / (n * t),
            "compile_and_first_run_s": compile_s, "repeats": repeats}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/out/step_throughput.json")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    rows = [measure(n, t, args.repeats) for n, t in SIZES.items()]
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "backend": jax.default_backend(), "jax": jax.__version__}
    print(f"rk4_step in lax.scan, float32, dt 1 ms — {machine}")
    print(f"{'N':>8s} {'T':>7s} {'ns/vehicle-step':>16s} {'compile+1st s':>14s}")
    for r in rows:
        print(f"{r['N']:8d} {r['T']:7d} {r['ns_per_vehicle_step']:16.1f} {r['compile_and_first_run_s']:14.2f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"machine": machine, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
