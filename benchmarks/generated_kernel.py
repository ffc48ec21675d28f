"""CPU time of the C generated from the JAX model (quadjax.native.generate), one core.

    python benchmarks/generated_kernel.py [--vehicles 4096] [--steps 200] [--lanes 4 8 16] [--dtype float32]

For each lane count W: generate ``rk4_step``'s lane rollout for rp1, compile it with the
system C compiler (``-O3 -march=native -ffp-contract=off``), run N vehicles for T steps in
N/W calls through ctypes, and print CPU ns per vehicle-step, with the result checked against
the engine's XLA rollout. Not yet the engine's kernel (issue 13): a measurement of the
generator's code as it stands; compare with ``benchmarks/throughput.py`` run in the same
session for the hand-written kernel.
"""

import argparse
import ctypes
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import quadjax as qj
from quadjax.native.generate import generate_rollout


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def measure(lanes: int, dtype: str, vehicles: int, steps: int, folder: Path) -> dict:
    p = qj.presets.rp1(dtype=dtype)
    s = qj.hover_state(p, (0.0, 0.0, 1.0))
    u = qj.hover_rotor_speed(p) * 1.01
    dt = jnp.asarray(1e-3, dtype)
    t0 = time.perf_counter()
    source, _, _ = generate_rollout(qj.rk4_step, p, s, u, dt, "roll", lanes=lanes)
    generate_s = time.perf_counter() - t0
    c, lib = folder / f"roll_{lanes}_{dtype}.c", folder / f"roll_{lanes}_{dtype}.so"
    c.write_text(source)
    cc = shutil.which("cc") or "gcc"
    t0 = time.perf_counter()
    subprocess.run([cc, "-O3", "-march=native", "-fopenmp-simd", "-ffp-contract=off", "-fno-math-errno",
                    "-fno-trapping-math", "-shared", "-fPIC", "-o", str(lib), str(c), "-lm"], check=True)
    compile_s = time.perf_counter() - t0
    roll = ctypes.CDLL(str(lib)).roll
    roll.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long]
    blocks = vehicles // lanes
    P = np.ascontiguousarray(np.broadcast_to(_flat((p, dt))[None, :, None], (blocks, _flat((p, dt)).size, lanes)))
    S = np.ascontiguousarray(np.broadcast_to(_flat(s)[None, :, None], (blocks, _flat(s).size, lanes))).astype(dtype)
    U = np.ascontiguousarray(np.broadcast_to(np.asarray(u)[None, None, :, None], (blocks, steps, u.shape[0], lanes)))
    t0 = time.process_time()
    for b in range(blocks):
        roll(P[b].ctypes.data, S[b].ctypes.data, U[b].ctypes.data, steps)
    cpu = time.process_time() - t0
    ref = qj.simulate(p, s, dt, commands=jnp.tile(u, (steps, 1)), config=qj.SimConfig(backend="xla", save_every=0))
    error = float(np.abs(S[0, :, 0] - _flat(ref.final)).max())
    return dict(lanes=lanes, dtype=dtype, ns=cpu / (blocks * lanes * steps) * 1e9, generate_s=generate_s,
                compile_s=compile_s, error=error)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lanes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--dtype", nargs="+", default=["float32", "float64"])
    args = ap.parse_args()
    if "float64" in args.dtype:
        jax.config.update("jax_enable_x64", True)  # a script, not the library: it may set x64
    print("| dtype | W | CPU ns / vehicle-step | generate s | cc -O3 s | max |Δ| vs XLA |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtype:
            for lanes in args.lanes:
                r = measure(lanes, dtype, args.vehicles, args.steps, Path(tmp))
                print(f"| {dtype} | {lanes} | {r['ns']:.1f} | {r['generate_s']:.2f} | {r['compile_s']:.1f} "
                      f"| {r['error']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
