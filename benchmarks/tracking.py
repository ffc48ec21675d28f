"""Figure-8 tracking per controller and preset, and the c4dynamics cascade-PID mission side by side.

    python benchmarks/tracking.py [--quick] [--skip-c4d]

Writes benchmarks/out/tracking.json and tracking.png, and prints Markdown tables.

1. Figure-8 p = (0, 0, 2) + (2 sin 0.5t, 1 sin t, 0) m flown by the cascaded PID and the
   geometric controller on every preset, in still air and in a constant 3 m/s wind along
   +x (the controllers do not know the wind). Start on the path at hover; RK4 at 2 ms,
   controller every tick; RMSE and max position error over t ∈ [3, 15] s.
2. The c4dynamics 2.6 example mission (its vehicle, A = 4, B = 2, ω = 0.1, z = 2 m, 8 s
   take-off, 8 s landing, 90 s): c4dynamics' own cascade PID (run_fig8_pid, solve_ivp,
   dt 5 ms) against quadjax's PID on the same vehicle and reference, RMSE over the
   figure-8 phase as c4dynamics' compute_metrics defines it, with wall time for both.
"""

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import quadjax as qj
from quadjax import control as C

DT = 2e-3
OUT = "benchmarks/out"


def _law(kind, params, ref):
    if kind == "pid":
        ctrl = C.PIDController.create(params, ref)
        return ctrl, functools.partial(C.pid_control, rates=C.CascadeRates(dt=DT)), C.pid_init
    ctrl = C.GeometricController.create(params, ref)
    return ctrl, C.geometric_control, C.geometric_init


def fly(kind, params, ref, state0, seconds, plant=None):
    ctrl, law, init = _law(kind, params, ref)
    n = int(round(seconds / DT))
    plant = plant if plant is not None else params
    run = jax.jit(lambda c, s: qj.simulate(plant, s, DT, controller=law, ctrl_params=c, ctrl_state=init(c, s),
                                           num_ticks=n).states)
    t0 = time.perf_counter()
    states = jax.block_until_ready(run(ctrl, state0))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    states = jax.block_until_ready(run(ctrl, state0))
    return states, first, time.perf_counter() - t0


def figure8_table(seconds):
    f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    ref = C.Figure8(center=f64([0.0, 0.0, 2.0]), a=f64(2.0), b=f64(1.0), omega=f64(0.5), yaw=f64(0.0))
    rows = []
    for name in qj.presets.PRESETS:
        p = qj.presets.get(name, dtype=jnp.float64)
        r0 = ref(0.0)
        s0 = qj.hover_state(p, r0.position).replace(velocity=r0.velocity)
        for wind in (0.0, 3.0):
            plant = p.replace(wind=f64([wind, 0.0, 0.0]))
            for kind in ("pid", "geometric"):
                states, _, wall = fly(kind, p, ref, s0, seconds, plant=plant)
                t = DT * np.arange(1, len(states.position) + 1)
                target = np.asarray(jax.vmap(ref)(jnp.asarray(t)).position)
                err = np.linalg.norm(np.asarray(states.position) - target, axis=-1)[t >= 3.0]
                rows.append({"preset": name, "controller": kind, "wind_mps": wind,
                             "rmse_m": float(np.sqrt(np.mean(err**2))), "max_m": float(err.max()),
                             "crashed": bool(np.isnan(err).any() or np.asarray(states.on_ground).any()),
                             "sim_wall_s": wall})
    return rows


def c4d_mission():
    from c4dynamics.controllers import quad_pid as qp
    from c4dynamics.controllers.cascade_pid_config import default_controller_config
    from c4dynamics.models.quad import default_quad_config

    traj = {"A": 4.0, "B": 2.0, "omega": 0.1, "z_ref": 2.0, "t_takeoff": 8.0, "t_land": 8.0, "t_sim": 90.0}
    config = {"quad": default_quad_config(), "controller": default_controller_config(), "trajectory": traj,
              "sim": {"dt": 0.005, "tf": 90.0}}
    t0 = time.perf_counter()
    quad = qp.run_fig8_pid(config)
    c4d_wall = time.perf_counter() - t0
    c4d_metrics = qp.compute_metrics(quad, traj)

    p = qj.presets.c4dynamics_reference(dtype=jnp.float64).replace(omega_max=jnp.asarray(1000.0, jnp.float64))
    f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    ref = C.C4dFigure8(a=f64(4.0), b=f64(2.0), omega=f64(0.1), z_ref=f64(2.0), t_takeoff=f64(8.0),
                       t_land=f64(8.0), t_end=f64(90.0))
    s0 = qj.hover_state(p, (0.0, 0.0, 0.0)).replace(on_ground=f64(1.0))
    states, first, wall = fly("pid", p, ref, s0, 90.0)
    t = DT * np.arange(1, len(states.position) + 1)
    idx = (t >= 8.0) & (t <= 82.0)
    target = np.asarray(jax.vmap(ref)(jnp.asarray(t[idx])).position)
    e = np.asarray(states.position)[idx] - target
    ours = {f"rmse_{k}": float(np.sqrt(np.mean(e[:, i] ** 2))) for i, k in enumerate("xyz")}
    ours["max_z_dev"] = float(np.max(np.abs(e[:, 2])))
    keys = ("rmse_x", "rmse_y", "rmse_z", "max_z_dev")
    return {"c4dynamics": {**{k: float(c4d_metrics[k]) for k in keys}, "wall_s": c4d_wall},
            "quadjax": {**ours, "wall_s": wall, "compile_and_first_run_s": first}}


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = sorted({r["preset"] for r in rows})
    x = np.arange(len(labels))
    for k, (kind, wind) in enumerate([("pid", 0.0), ("pid", 3.0), ("geometric", 0.0), ("geometric", 3.0)]):
        vals = [next(r["rmse_m"] for r in rows if r["preset"] == n and r["controller"] == kind and r["wind_mps"] == wind)
                for n in labels]
        ax.bar(x + 0.2 * k - 0.3, vals, 0.2, label=f"{kind}, wind {wind:g} m/s")
    ax.set_xticks(x, labels, rotation=20)
    ax.set_ylabel("figure-8 RMSE [m]")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 s figure-8 instead of 15 s")
    ap.add_argument("--skip-c4d", action="store_true")
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)  # a benchmark script, not the library: float64 references
    os.makedirs(OUT, exist_ok=True)
    rows = figure8_table(8.0 if args.quick else 15.0)
    print("| preset | controller | wind m/s | RMSE m | max m | crashed |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['controller']} | {r['wind_mps']:g} | {r['rmse_m']:.4f} | {r['max_m']:.4f} | {r['crashed']} |")
    result = {"figure8": rows, "machine": {"cores": os.cpu_count(), "jax": jax.__version__}}
    if not args.skip_c4d:
        m = c4d_mission()
        result["c4dynamics_mission"] = m
        print("\n| c4dynamics mission | RMSE x m | RMSE y m | RMSE z m | max z dev m | wall s |\n|---|---|---|---|---|---|")
        for who, v in m.items():
            print(f"| {who} | {v['rmse_x']:.4f} | {v['rmse_y']:.4f} | {v['rmse_z']:.4f} | {v['max_z_dev']:.4f} | {v['wall_s']:.2f} |")
    with open(os.path.join(OUT, "tracking.json"), "w") as f:
        json.dump(result, f, indent=2)
    plot(rows, os.path.join(OUT, "tracking.png"))


if __name__ == "__main__":
    main()
