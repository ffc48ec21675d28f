"""RotorPy 3.0 batched (PyTorch) throughput, run by benchmarks/throughput.py in the peers' venv.

    python rotorpy_bench.py '{"sizes": [[1, 200], [1024, 20]], "repeats": 3}'

Prints one JSON line per size: ns per vehicle-step of ``BatchedMultirotor.step`` with
its fixed-step RK4 (torchdiffeq), motor-speed commands, aerodynamics on, float64 (its
expected dtype), Crazyflie parameters, on the CPU, dt = 1 ms.
"""

import json
import sys
import time

import numpy as np
import torch
from rotorpy.vehicles.crazyflie_params import quad_params
from rotorpy.vehicles.multirotor import BatchedMultirotor, BatchedMultirotorParams


def main():
    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(cfg.get("threads", 2))
    device = torch.device("cpu")
    for n, t in cfg["sizes"]:
        params = BatchedMultirotorParams([quad_params] * n, n, device)
        hover = float(np.sqrt(quad_params["mass"] * 9.81 / (4 * quad_params["k_eta"])))
        z = lambda *s: torch.zeros(*s, dtype=torch.double, device=device)  # noqa: E731
        state = {"x": z(n, 3) + torch.tensor([0.0, 0.0, 1.0], dtype=torch.double), "v": z(n, 3),
                 "q": z(n, 4) + torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.double), "w": z(n, 3),
                 "wind": z(n, 3), "rotor_speeds": z(n, 4) + hover}
        quads = BatchedMultirotor(params, n, state, device, control_abstraction="cmd_motor_speeds", aero=True,
                                  integrator="rk4")
        control = {"cmd_motor_speeds": z(n, 4) + 1.01 * hover}

        def run(s):
            for _ in range(t):
                s = quads.step(s, control, 1e-3)
            return s

        t0 = time.perf_counter()
        state = run(state)
        first_s = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(cfg.get("repeats", 3)):
            t0, c0 = time.perf_counter(), time.process_time()
            state = run(state)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        print(json.dumps({
            "peer": "rotorpy", "version": "3.0.0", "N": n, "T": t, "dtype": "float64",
            "wall_ns": 1e9 * float(np.median(times)) / (n * t), "cpu_ns": 1e9 * float(np.median(cpu)) / (n * t),
            "compile_s": first_s, "finite": bool(torch.isfinite(state["x"]).all()),
        }), flush=True)


if __name__ == "__main__":
    main()
