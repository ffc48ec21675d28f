"""Throughput of the mixer: demands per second of jit(vmap(mix)) beside jit(vmap(clip ∘ allocate)).

Float32, on this machine's default JAX device. For each batch size N: warm up (compile),
then R repeats, each timing enough calls to last ≳ 50 ms; the table gives the median
time per call as demands/s = N / time for the full MixerOutput, for its thrusts alone
(what a rate loop feeding the motors uses; XLA then drops the rest), and for
allocate + clip, with the ratios to allocate + clip measured in the same run. Demands saturate every way (F from −20 % to 120 % of the range, torques up to
3× reach), so every branch of the priority is exercised. RP-1 (Quad X, closed form) and
PX4 iris (generic layout, pseudo-inverse fallback).

    python benchmarks/mixer_throughput.py [--sizes 1 1000 100000] [--repeats 7]

Writes benchmarks/out/mixer_throughput.json.
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from quadjax import presets
from quadjax.mixer import allocate, mix, mixer_params_from

OUT = Path(__file__).resolve().parent / "out"


def demands(mp, n, seed=0):
    """(n, 4) float32 demands that saturate every way."""
    rng = np.random.default_rng(seed)
    t_max = float(mp.t_max)
    arm = float(np.abs(np.asarray(mp.rotor_positions)[:, :2]).max())
    reach = np.array([4 * t_max, 2 * arm * t_max, 2 * arm * t_max, 2 * float(mp.k_m) * t_max])
    w = rng.uniform(-1.0, 1.0, (n, 4)) * reach * rng.choice([0.1, 0.5, 1.0, 3.0], size=(n, 1))
    w[:, 0] = rng.uniform(-0.2, 1.2, n) * reach[0]
    return jnp.asarray(w, jnp.float32)


def seconds_per_call(f, *args, repeats):
    """Median over ``repeats`` of the time per call [s], each repeat ≳ 50 ms."""
    jax.block_until_ready(f(*args))  # compile
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    once = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(0.05 / once))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    mixed = jax.jit(jax.vmap(mix, in_axes=(None, 0)))
    mixed_thrusts = jax.jit(jax.vmap(lambda mp, w: mix(mp, w).thrusts, in_axes=(None, 0)))
    clipped = jax.jit(
        jax.vmap(lambda mp, w: jnp.clip(allocate(mp, w), mp.t_min, mp.t_max), in_axes=(None, 0))
    )
    rows = []
    for vehicle in ("rp1", "iris"):
        mp = mixer_params_from(presets.get(vehicle, dtype=jnp.float32))
        for n in args.sizes:
            w = demands(mp, n)
            t_mix = seconds_per_call(mixed, mp, w, repeats=args.repeats)
            t_thrusts = seconds_per_call(mixed_thrusts, mp, w, repeats=args.repeats)
            t_clip = seconds_per_call(clipped, mp, w, repeats=args.repeats)
            rows.append(
                {
                    "vehicle": vehicle, "layout": mp.layout.kind, "N": n, "dtype": "float32",
                    "mix_s": t_mix, "mix_thrusts_only_s": t_thrusts, "allocate_clip_s": t_clip,
                    "mix_demands_per_s": n / t_mix, "mix_thrusts_only_demands_per_s": n / t_thrusts,
                    "allocate_clip_demands_per_s": n / t_clip,
                    "ratio_mix_over_clip": t_mix / t_clip, "ratio_thrusts_only_over_clip": t_thrusts / t_clip,
                }
            )
            print(
                f"{vehicle:5s} {mp.layout.kind:8s} N={n:>7d}  mix {n / t_mix:9.3g}/s  "
                f"mix→thrusts {n / t_thrusts:9.3g}/s  allocate+clip {n / t_clip:9.3g}/s  "
                f"ratios {t_mix / t_clip:7.2f} {t_thrusts / t_clip:7.2f}",
                flush=True,
            )
    machine = dict(
        platform=platform.platform(), processor=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(), jax=jax.__version__, device=str(jax.devices()[0]),
        load_average_1_5_15_min=os.getloadavg(),  # other work on the machine skews the medians
    )
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "mixer_throughput.json"
    path.write_text(json.dumps(dict(machine=machine, repeats=args.repeats, statistic="median", rows=rows), indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
