"""Tune the cascaded PID's gains by gradient (optax Adam on log-gains) on a figure-8 in wind.

    python benchmarks/tune_pid_gains.py [--iters 40]

RP-1, figure-8 (2 sin 0.5t, sin t) m at 2 m, constant 3 m/s wind the controller does not
know, 8 s flights, float64. Loss: mean squared position error over the flight. The gains
are exp(θ) (positive by construction); θ starts at the defaults. Prints RMSE before/after
on the training flight and on a 15 s validation flight, and the tuned gains.
"""

import argparse
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import quadjax as qj
from quadjax import control as C

DT = 2e-3


def make(seconds):
    f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    p = qj.presets.rp1(dtype=jnp.float64)
    plant = p.replace(wind=f64([3.0, 0.0, 0.0]))
    ref = C.Figure8(center=f64([0.0, 0.0, 2.0]), a=f64(2.0), b=f64(1.0), omega=f64(0.5), yaw=f64(0.0))
    ctrl = C.PIDController.create(p, ref)
    r0 = ref(0.0)
    s0 = qj.hover_state(p, r0.position).replace(velocity=r0.velocity)
    n = int(round(seconds / DT))
    law = functools.partial(C.pid_control, rates=C.CascadeRates(dt=DT))
    t = DT * jnp.arange(1, n + 1)
    target = jax.vmap(ref)(t).position

    def mse(gains):
        c = ctrl.replace(gains=gains)
        states = qj.simulate(plant, s0, DT, controller=law, ctrl_params=c, ctrl_state=C.pid_init(c, s0),
                             num_ticks=n, config=qj.SimConfig(save=("state",))).states
        return jnp.mean(jnp.sum((states.position - target) ** 2, axis=-1))

    return ctrl.gains, mse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_x64", True)  # a script, not the library
    gains0, train = make(8.0)
    _, valid = make(15.0)
    train_vg = jax.jit(jax.value_and_grad(lambda th: train(jax.tree_util.tree_map(jnp.exp, th))))
    valid_loss = jax.jit(valid)
    theta = jax.tree_util.tree_map(jnp.log, gains0)
    opt = optax.adam(args.lr)
    state = opt.init(theta)
    best = (np.inf, theta)
    history = []
    for k in range(args.iters):
        value, g = train_vg(theta)
        history.append(float(value))
        if value < best[0]:
            best = (float(value), theta)
        updates, state = opt.update(g, state)
        theta = optax.apply_updates(theta, updates)
        print(f"iter {k:3d}  train RMSE {np.sqrt(float(value)):.4f} m")
    tuned = jax.tree_util.tree_map(jnp.exp, best[1])
    result = {
        "train_rmse_before_m": float(np.sqrt(history[0])), "train_rmse_after_m": float(np.sqrt(best[0])),
        "valid_rmse_before_m": float(np.sqrt(valid_loss(gains0))), "valid_rmse_after_m": float(np.sqrt(valid_loss(tuned))),
        "iters": args.iters, "lr": args.lr,
        "tuned_gains": {k: np.asarray(v).tolist() for k, v in vars(tuned).items()},
    }
    print(json.dumps({k: v for k, v in result.items() if k != "tuned_gains"}, indent=2))
    os.makedirs("benchmarks/out", exist_ok=True)
    with open("benchmarks/out/tune_pid_gains.json", "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
