"""The generated native kernel against its targets (issue 13), in one run on this machine.

    python benchmarks/native_kernel.py [--repeats 5] [--out benchmarks/out/native_kernel.md]

float32, RK4, dt = 1 ms, RP-1 (motor lag on), final state only, per-vehicle commands 1 % above
hover. Each row is the median of ``--repeats`` timed calls after a compile-and-warm-up call,
wall and process-CPU time per vehicle-step, each configuration in its own subprocess; "1 core"
rows pin that subprocess to one CPU (``os.sched_setaffinity``) so CPU time compares like for
like with the single-threaded C reference (``../shared/perf``, built with ``-ffast-math``,
fixed parameters; quadjax is IEEE, per-vehicle parameters). Rows:

* ``rollout``: ``simulate`` batched by ``map_vehicles`` (the kernel's whole horizon in one call);
  also with one command series for the whole fleet (``jax.vmap`` over the states, the (T, 4)
  commands unbatched): like the C reference, which holds its commands, no per-vehicle command
  stream (65 MB at N = 4096, T = 1000) is read;
  and the same with every state saved (``save_every=1``: 295 MB of trajectory at N = 4096);
* ``scan(vmap(rk4_step))``: a user's own loop over the library's step (one kernel call per
  step on the CPU), and the same loop over the XLA form of the step; the commands are made (N, T, 4)
  like the rollout's and the loop swaps their axes for ``lax.scan`` (a transposing copy inside the
  timed call), except in the "commands time-major" rows, where they are laid out (T, N, 4) before;
  the fleet shares one params, except in the "params per vehicle" row (a sweep's shape: every
  params leaf per vehicle, the masses ±10 %);
* ``grad`` / ``jvp``: reverse mode (the generated adjoint kernel) and forward mode (the generated
  tangent kernel) of a 1 000-step rollout loss at N = 256, against the native forward of the same
  loss; ``jvp`` with one tangent and with four and eight at once (``jax.vmap`` over the tangents, as
  ``jax.jacfwd`` pushes them: the multi-tangent kernel, four per primal; issue 13 asks (1 + k)x the
  forward); the same ``grad`` on the XLA
  backend; and grad at 10 000 steps, where the reverse sweep recomputes segments from checkpoints. Each row reports the
  subprocess's peak resident memory (``ru_maxrss``) and its first call (compile included).

``--only SUBSTRING`` runs the rows whose name contains it (the C reference is then skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PERF = HERE.parent.parent / "shared" / "perf"


def worker(case: dict) -> dict:
    if case.get("one_core"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import jax
    import jax.numpy as jnp

    import quadjax as qj
    from quadjax.integrators import rk4_step_xla

    N, T, kind = case["N"], case["T"], case["kind"]
    p = qj.presets.rp1("float32")
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    u = qj.hover_rotor_speed(p) * jnp.full((N, T, 4), 1.01, jnp.float32)
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), s0)
    # the default SimConfig saves every state: "unused" cases read only what save_every=0 keeps
    config = qj.SimConfig(save_every=1 if kind in ("rollout_saved", "rollout_positions", "grad_saved", "forward_unused",
                                                   "grad_unused") else 0,
                          backend="xla" if kind == "grad_xla" else "native")

    def rollout(u):
        tr = qj.map_vehicles(lambda u: qj.simulate(p, s0, 1e-3, commands=u, config=config), (u,), (0,))
        if kind == "rollout_positions":  # the other leaves unused: not saved (native._unsaved)
            return tr.states.position
        return tr.states if kind == "rollout_saved" else tr.final

    def rollout_fleet(u1):  # one (T, 4) series for the whole fleet, as the C reference holds one command
        return jax.vmap(lambda s: qj.simulate(p, s, 1e-3, commands=u1, config=config).final)(states)

    if kind == "rollout_one_series":
        u = u[0]
    if kind in ("scan_time_major", "scan_params"):  # the commands as scan takes them, (T, N, 4), laid out before timing
        u = jnp.swapaxes(u, 0, 1).copy()
    # a sweep's shape: every params leaf per vehicle (the wind too), the masses ±10 %
    swept = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (N,) + x.shape), p)
    swept = swept.replace(mass=swept.mass * jnp.linspace(0.9, 1.1, N, dtype=jnp.float32))

    def scan_of(step, swap=True, params=p, params_axis=None):
        def fly(u):
            tick = lambda s, u_t: (jax.vmap(step, in_axes=(params_axis, 0, 0, None))(params, s, u_t, 1e-3), None)
            return jax.lax.scan(tick, states, jnp.swapaxes(u, 0, 1) if swap else u)[0]
        return fly

    def loss(u):
        final = rollout(u)
        return jnp.sum(final.position ** 2) + jnp.sum(final.body_rates ** 2)

    def loss_saved(u):  # a system identification's shape: every saved position, and the final rates
        tr = qj.map_vehicles(lambda u: qj.simulate(p, s0, 1e-3, commands=u, config=config), (u,), (0,))
        return jnp.sum(tr.states.position ** 2) + jnp.sum(tr.final.body_rates ** 2)

    direction = jnp.ones_like(u)
    fn = {"rollout": rollout, "rollout_saved": rollout, "rollout_one_series": rollout_fleet,
          "scan_kernel": scan_of(qj.rk4_step), "scan_xla": scan_of(rk4_step_xla),
          "scan_time_major": scan_of(qj.rk4_step, swap=False),
          "scan_params": scan_of(qj.rk4_step, swap=False, params=swept, params_axis=0),
          "grad": jax.grad(loss), "grad_xla": jax.grad(loss), "forward": loss, "grad_saved": jax.grad(loss_saved),
          "forward_unused": loss, "grad_unused": jax.grad(loss), "rollout_positions": rollout,
          "jvp": lambda u: jax.jvp(loss, (u,), (direction,)),
          # k tangents at once, as jax.jacfwd pushes them (vmap over the tangent)
          **{f"jvp{k}": lambda u, k=k: jax.vmap(lambda d: jax.jvp(loss, (u,), (d,)))(
              direction * jnp.arange(1.0, k + 1.0, dtype=u.dtype)[:, None, None, None]) for k in (4, 8)}}[kind]
    f = jax.jit(fn)
    t0 = time.perf_counter()
    jax.block_until_ready(f(u))
    first_s = time.perf_counter() - t0
    # keep calling for a while before timing: on this project's VM an idle second vCPU sleeps in the
    # host, and the first ~25 calls (~60 ms) after a pause ran on one thread (N = 384, T = 1 000:
    # 8.5-9.5 ns wall per vehicle-step, then 4.8 from there on)
    warm_until = time.perf_counter() + 0.3
    while time.perf_counter() < warm_until:
        jax.block_until_ready(f(u))
    walls, cpus = [], []
    for _ in range(case["repeats"]):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(f(u))
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    steps = N * T
    return {**case, "wall_ns": statistics.median(walls) / steps * 1e9, "cpu_ns": statistics.median(cpus) / steps * 1e9,
            "wall_s": statistics.median(walls), "first_call_s": first_s,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB


def run(case: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(case)], capture_output=True, text=True,
                         timeout=1800)
    if out.returncode:
        return {**case, "error": out.stderr.strip()[-500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def c_reference(n: int, steps: int) -> float | None:
    script = PERF / "run_limit.sh"
    if not script.exists():
        return None
    out = subprocess.run(["bash", str(script), str(n), str(steps)], capture_output=True, text=True, timeout=900)
    m = re.search(r"([0-9.]+) ns/vehicle-step", out.stdout)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "native_kernel.md")
    ap.add_argument("--only", default="")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    r = args.repeats
    cases = {
        "rollout N=4096, 1 core": dict(kind="rollout", N=4096, T=1000, one_core=True),
        "rollout N=4096, 1 core, one command series for the fleet": dict(kind="rollout_one_series", N=4096, T=1000,
                                                                          one_core=True),
        "rollout N=4096, 2 threads": dict(kind="rollout", N=4096, T=1000),
        "rollout N=4096, 2 threads, every state saved": dict(kind="rollout_saved", N=4096, T=1000),
        "rollout N=4096, 2 threads, every state saved, the positions read": dict(kind="rollout_positions", N=4096,
                                                                                 T=1000),
        "rollout N=1": dict(kind="rollout", N=1, T=20000),
        "scan(vmap(rk4_step)) N=4096, kernel": dict(kind="scan_kernel", N=4096, T=500),
        "scan(vmap(rk4_step)) N=4096, kernel, commands time-major": dict(kind="scan_time_major", N=4096, T=500),
        "scan(vmap(rk4_step)) N=4096, kernel, commands time-major, params per vehicle": dict(kind="scan_params",
                                                                                            N=4096, T=500),
        "scan(vmap(rk4_step)) N=4096, XLA form": dict(kind="scan_xla", N=4096, T=200),
        "rollout forward N=256, T=1000 (loss)": dict(kind="forward", N=256, T=1000),
        "grad of it (native adjoint)": dict(kind="grad", N=256, T=1000),
        "grad of a loss on every saved state, N=256, T=1000": dict(kind="grad_saved", N=256, T=1000),
        "rollout forward N=256, T=1000 (loss), SimConfig's default save_every=1, unused": dict(
            kind="forward_unused", N=256, T=1000),
        "grad of it, SimConfig's default save_every=1, unused": dict(kind="grad_unused", N=256, T=1000),
        "rollout forward N=256, T=10000 (loss)": dict(kind="forward", N=256, T=10000),
        "grad of it, T=10000 (native adjoint, 3 recomputed segments)": dict(kind="grad", N=256, T=10000),
        "jvp of it, one tangent (native tangent)": dict(kind="jvp", N=256, T=1000),
        "jvp of it, 4 tangents (vmap over tangents, as jax.jacfwd)": dict(kind="jvp4", N=256, T=1000),
        "jvp of it, 8 tangents": dict(kind="jvp8", N=256, T=1000),
        "grad of it on the XLA backend": dict(kind="grad_xla", N=256, T=1000),
    }
    cases = {k: v for k, v in cases.items() if args.only in k or (args.only and k.startswith("rollout forward"))}
    forward_of = {T: name for name, c in cases.items() if c["kind"] == "forward" for T in [c["T"]]}
    load0 = os.getloadavg()[0]
    ref = None if args.only else c_reference(4096, 2000)
    rows = {name: run({**c, "repeats": r}) for name, c in cases.items()}
    load1 = os.getloadavg()[0]
    lines = [f"float32, RK4, dt 1 ms, RP-1, final state only; medians of {r}; load average {load0:.2f} -> {load1:.2f}",
             "", "| configuration | wall ns / vehicle-step | CPU ns / vehicle-step | ratio | peak RSS MB | first call s |",
             "|---|---:|---:|---|---:|---:|"]
    if ref:
        lines.append(f"| C reference (../shared/perf, 1 core, -ffast-math), N=4096 | {ref:.1f} | {ref:.1f} | 1 | | |")
    base = rows.get("rollout N=4096, 2 threads", {"error": "not run"})
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | error: {row['error'][-120:]} | | |")
            continue
        if "every state saved" in name and "error" not in base:
            ratio = f"{row['wall_ns'] / base['wall_ns']:.2f}x the final-state rollout (wall)"
        elif name.startswith("rollout N=4096") and ref:
            ratio = f"{row['cpu_ns'] / ref:.2f}x the C reference (CPU)"
        elif name.startswith("scan(") and "error" not in base:
            ratio = f"{row['wall_ns'] / base['wall_ns']:.2f}x rollout (wall)"
        elif name.startswith(("grad", "jvp")):
            fwd = rows[forward_of[row["T"]]]
            ratio = (f"{row['wall_s'] / fwd['wall_s']:.1f}x the native forward (wall), "
                     f"{row['cpu_ns'] / fwd['cpu_ns']:.1f}x (CPU)")
        else:
            ratio = ""
        lines.append(f"| {name} | {row['wall_ns']:.1f} | {row['cpu_ns']:.1f} | {ratio} | {row['peak_mb']:.0f} | "
                     f"{row['first_call_s']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
