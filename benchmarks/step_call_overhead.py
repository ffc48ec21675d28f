"""What one native kernel call costs beyond its steps: why a user's own ``scan(vmap(rk4_step))``
is slower than ``simulate`` (issue 13's target: at most 1.5x).

    python benchmarks/step_call_overhead.py

float32, RP-1, one thread pool (this machine's 2 cores), N vehicles in one batch. For each N:
a single ``jax.vmap(rk4_step)`` call; ``simulate`` of 1 and of 10 ticks. The difference of the
last two over 9 is the cost of one step; the rest of the 1-tick call is the call's fixed cost,
given per vehicle. Minimum of 300 timed calls each, after a compile-and-warm-up call.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

import quadjax as qj


def best(f, *args, reps: int = 300) -> float:
    """The fastest of ``reps`` calls of the compiled ``f`` [µs]."""
    call = jax.jit(f).lower(*args).compile()
    jax.block_until_ready(call(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - t0)
    return 1e6 * min(times)


def main() -> None:
    p = qj.presets.rp1("float32")
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    config = qj.SimConfig(save_every=0)

    def flown(s, u):
        return jax.vmap(lambda s, u: qj.simulate(p, s, 1e-3, commands=u, config=config).final)(s, u)

    print("| N | vmap(rk4_step), one call [µs] | simulate, 1 tick [µs] | simulate, 10 ticks [µs] | a step [µs] "
          "| the call's fixed cost [µs] | per vehicle [ns] |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in (64, 512, 4096, 16384):
        states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape) + 0, s0)
        u = qj.hover_rotor_speed(p) * jnp.full((n, 4), 1.01, jnp.float32)
        step = best(lambda s, u: jax.vmap(lambda s, c: qj.rk4_step(p, s, c, 1e-3))(s, u), states, u)
        one = best(flown, states, u[:, None])
        ten = best(flown, states, jnp.repeat(u[:, None], 10, axis=1))
        per_step = (ten - one) / 9
        fixed = one - per_step
        print(f"| {n} | {step:.1f} | {one:.1f} | {ten:.1f} | {per_step:.1f} | {fixed:.1f} | {1e3 * fixed / n:.1f} |")


if __name__ == "__main__":
    main()
