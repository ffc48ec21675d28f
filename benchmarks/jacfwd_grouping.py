"""``jax.jacfwd`` of a rollout through the native kernel: tangents pushed ``native.TANGENTS`` at a
time (the multi-tangent kernel, one primal per group) against one at a time (the one-tangent
kernel, one primal each), with respect to the parameters (a user's sensitivities; sysid's
Gauss-Newton pushes one tangent per ``lax.map`` step instead) and to the initial state (the
parameters fixed, as iLQR's linearisation). Same results, one process, alternated.

    python benchmarks/jacfwd_grouping.py [--vehicles 64] [--ticks 1000] [--rounds 2]

The grouping is chosen when ``joint_p`` is batched, at trace time, from ``native.TANGENTS``:
this script sets it before each trace (a benchmark's lever, not an API). Since 2026-12-06 the
parameters' tangents always go one at a time (``native._joint_batched`` says why), so their two
rows time the same program; run the script with an older checkout first on ``PYTHONPATH`` for
the grouped form.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import quadjax as qj
from quadjax import native


def timed(f, *args, calls: int = 7) -> float:
    """Median of ``calls`` calls after 0.3 s of warm-up calls [ms]."""
    until = time.perf_counter() + 0.3
    while time.perf_counter() < until:
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vehicles", type=int, default=64)
    ap.add_argument("--ticks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    p = qj.presets.rp1("float32")
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    u = qj.hover_rotor_speed(p) * jnp.full((args.vehicles, args.ticks, 4), 1.01, jnp.float32)
    config = qj.SimConfig(save_every=0, backend="native")

    def loss(p, s0, u):
        final = qj.map_vehicles(lambda u: qj.simulate(p, s0, 1e-3, commands=u, config=config), (u,), (0,)).final
        return jnp.sum(final.position ** 2) + jnp.sum(final.body_rates ** 2)

    grouped = native.TANGENTS
    fns = {}
    for wrt, argnum in (("parameters", 0), ("initial state", 1)):
        for label, k in ((f"groups of {grouped}", grouped), ("one tangent each", 10 ** 9)):
            native.TANGENTS = k  # read when the jacfwd's vmap batches joint_p, i.e. at this trace
            fns[wrt, label] = jax.jit(jax.jacfwd(loss, argnums=argnum)).lower(p, s0, u).compile()
        native.TANGENTS = grouped
        a, b = (jax.tree_util.tree_leaves(fns[wrt, label](p, s0, u)) for label in
                (f"groups of {grouped}", "one tangent each"))
        worst = max(float(jnp.max(jnp.abs(x - y) / (jnp.abs(x) + 1e-30))) for x, y in zip(a, b))
        print(f"jacfwd with respect to the {wrt}: {sum(x.size for x in jax.tree_util.tree_leaves(a))} values, "
              f"largest relative difference between the two {worst:.1e}")
    forward = jax.jit(loss).lower(p, s0, u).compile()
    print(f"{args.vehicles} vehicles, {args.ticks} ticks, float32, median of 7 calls [ms]")
    for r in range(args.rounds):
        row = {f"{wrt}, {label}": timed(f, p, s0, u) for (wrt, label), f in fns.items()}
        row["forward"] = timed(forward, p, s0, u)
        print(f"round {r + 1}: " + "; ".join(f"{k} {v:.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
