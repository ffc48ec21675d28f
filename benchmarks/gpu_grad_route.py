"""How the engine differentiates its GPU open loop, measured where no GPU is (one run, ratios).

    python benchmarks/gpu_grad_route.py [--n 1000] [--steps 1000] [--repeats 3]

On an H200 (GPU_RESULTS.md) ``jax.grad`` through the kernel path took 3.4x ``backend="xla"``:
the derivative went through rollout_p's rule, i.e. XLA on the kernel's packed parameter rows,
where every parameter is per vehicle. The engine now differentiates its XLA open loop on the
caller's pytrees instead (``quadjax.engine._open_loop_gpu``). This script takes the engine's GPU
branch on the CPU (``jax.default_backend`` faked; rollout_p lowers to the C kernel here, so the
forward is the C kernel, the derivatives exactly what a GPU would run) and times, in one run, the
gradient of a rollout loss (d/d mass of Σ z_final, per-vehicle mass, vmap over vehicles, RK4,
dt 1 ms, float32) three ways: the packed-row route (the engine before the change: native.rollout
with rollout_p's rule), the engine's route now, and ``backend="xla"``. Medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    import quadjax as qj
    from quadjax import native

    if not native.available(jnp.float32, 4):
        print(f"no native kernel here: {native.unavailable_reason(jnp.float32, 4)}")
        return 2
    jax.default_backend = lambda: "gpu"  # the engine's GPU branch; the kernel still lowers to the C one
    p = qj.presets.rp1(jnp.float32)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    masses = p.mass * jnp.linspace(0.9, 1.1, a.n).astype(jnp.float32)
    t = jnp.arange(a.steps, dtype=jnp.float32)[:, None] * 1e-3
    U = qj.hover_rotor_speed(p) * (1 + 0.02 * jnp.sin(2 * jnp.pi * 3.0 * t + jnp.arange(4.0)[None]))

    def engine(backend):
        cfg = qj.SimConfig(save_every=0, backend=backend)
        return lambda m: qj.simulate(p.replace(mass=m), s0, 1e-3, commands=U, config=cfg).final.position[2]

    def packed_rows(m):  # the engine's GPU open loop before the change
        final, _ = native.rollout(p.replace(mass=m), native.pack_state(s0), U, 1e-3, None, None,
                                  substeps=1, save_every=0)
        return final[2]

    routes = {"packed rows (before)": packed_rows, "engine now": engine("native"), 'backend="xla"': engine("xla")}
    rows = {}
    for name, one in routes.items():
        grad = jax.jit(jax.grad(lambda m, one=one: jnp.sum(jax.vmap(one)(m))))
        value = jax.block_until_ready(grad(masses))
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(grad(masses))
            times.append(time.perf_counter() - t0)
        rows[name] = (statistics.median(times), float(value[0]))
    xla = rows['backend="xla"'][0]
    print(f"grad of Σ z_final w.r.t. per-vehicle mass, N = {a.n}, T = {a.steps}, float32, "
          f"{jax.device_count()} CPU device(s), median of {a.repeats}")
    print("| route | grad s | vs backend=\"xla\" | d/dm of vehicle 0 |\n|---|---:|---:|---:|")
    for name, (sec, g0) in rows.items():
        print(f"| {name} | {sec:.3f} | {sec / xla:.2f}x | {g0:.6g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
