"""What an un-jitted (op-by-op) call of the model costs, and how much of it is compiling.

The library leaves jit to the caller, but a reader trying the model in a notebook calls it
directly. Each function is called once to warm up (each primitive's own executable), then
``--calls`` times with new commands; the table gives the median milliseconds per call and the
XLA backend compiles per call (JAX's own compile events). RP-1, float32, on this machine's
default JAX device:

* ``qj.derivative``;
* the XLA form of the RK4 step (``quadjax.integrators.rk4_step_xla``: what ``qj.rk4_step`` is
  where no native kernel runs, e.g. on a GPU);
* ``qj.rk4_step`` (on the CPU, one native kernel call).

    python benchmarks/unjitted_calls.py [--calls 20]
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import quadjax as qj
from quadjax.integrators import rk4_step_xla

COMPILE = "/jax/core/compile/backend_compile_duration"


def measure(f, commands):
    """(median ms per call, compiles per call, compile ms per call) over ``commands``."""
    compiles = []

    def count(event, duration, **_):
        if event == COMPILE:
            compiles.append(duration)

    jax.block_until_ready(f(commands[0]))  # warm
    times = []
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        for u in commands:
            t = time.perf_counter()
            jax.block_until_ready(f(u))
            times.append(time.perf_counter() - t)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    n = len(commands)
    return statistics.median(times) * 1e3, len(compiles) / n, sum(compiles) / n * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    p = qj.presets.rp1(jnp.float32)
    s = qj.hover_state(p)
    commands = [qj.hover_rotor_speed(p) * (1 + 0.001 * k) for k in range(args.calls)]
    rows = {"qj.derivative": lambda u: qj.derivative(p, s, u),
            "rk4_step_xla (XLA form)": lambda u: rk4_step_xla(p, s, u, 1e-3),
            "qj.rk4_step": lambda u: qj.rk4_step(p, s, u, 1e-3)}
    print(f"jax {jax.__version__}, {jax.default_backend()}, {args.calls} calls after one warm-up\n")
    print("| un-jitted call | ms per call (median) | compiles per call | compile ms per call |")
    print("|---|---:|---:|---:|")
    for name, f in rows.items():
        ms, n, c = measure(f, commands)
        print(f"| `{name}` | {ms:.1f} | {n:.1f} | {c:.1f} |")


if __name__ == "__main__":
    main()
