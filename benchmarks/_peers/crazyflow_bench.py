"""crazyflow 0.4.0 throughput, run by benchmarks/throughput.py in the peers' venv.

    python crazyflow_bench.py '{"sizes": [[1, 2000], [4096, 50]], "repeats": 5}'

Prints one JSON line per size: ns per vehicle-step of ``Sim.step(T)`` (a jitted
``lax.scan``), first-principles dynamics, RK4, rotor-velocity control, 1 kHz, float32
(JAX's default), one drone per world, N worlds on the CPU.
"""

import json
import sys
import time

import jax
import numpy as np
from crazyflow.control import Control
from crazyflow.dynamics import Dynamics
from crazyflow.sim import Sim
from crazyflow.sim.integration import Integrator


def main():
    cfg = json.loads(sys.argv[1])
    for n, t in cfg["sizes"]:
        sim = Sim(n_worlds=n, n_drones=1, dynamics=Dynamics.first_principles, control=Control.rotor_vel,
                  integrator=Integrator.rk4, freq=1000, device="cpu")
        hover = float(cfg.get("rotor_vel", 15000.0))
        sim.rotor_vel_control(np.full((n, 1, 4), hover, np.float32))
        t0 = time.perf_counter()
        sim.step(t)
        jax.block_until_ready(sim.data)
        compile_s = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(cfg.get("repeats", 5)):
            t0, c0 = time.perf_counter(), time.process_time()
            sim.step(t)
            jax.block_until_ready(sim.data)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        pos = np.asarray(sim.data.states.pos)
        print(json.dumps({
            "peer": "crazyflow", "version": "0.4.0", "N": n, "T": t, "dtype": "float32",
            "wall_ns": 1e9 * float(np.median(times)) / (n * t), "cpu_ns": 1e9 * float(np.median(cpu)) / (n * t),
            "compile_s": compile_s, "finite": bool(np.all(np.isfinite(pos))),
        }), flush=True)


if __name__ == "__main__":
    main()
