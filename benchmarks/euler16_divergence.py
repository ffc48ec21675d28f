"""What seed 003's simplifications cost: the 16-state Euler-angle model against the full
quaternion model, flying the same commands (issue 25).

    python benchmarks/euler16_divergence.py [--quick]

Writes benchmarks/EULER16_RESULTS.md (the tables) and benchmarks/euler16_divergence.png (the
plot); the raw numbers go to benchmarks/out/euler16_divergence.json.

The vehicle is cmu_plus (seed 003's own numbers, :func:`quadjax.presets.cmu_plus`), float64,
RK4, dt = 1 ms, both models through :func:`quadjax.simulate`. Each manoeuvre is a sequence of
desired wrenches [F, M] replayed open loop in four models from the same state:

* ``seed``: seed 003's model as the seed states it (:mod:`quadjax.euler16`);
* ``+rates``: the same with the true Z-Y-X Euler-angle rates (only ω × Jω dropped);
* ``+gyro``: the same with ω × Jω (only "Euler rates = body rates" kept);
* ``full``: quadjax's quaternion model (:func:`quadjax.derivative`), the reference, fed the
  same motor commands (:func:`quadjax.euler16.quad_command`).

Closed-loop manoeuvres (steps, figure-8) are flown by the seed-003 PD controller on the full
model; its wrenches are then replayed in all four. Divergence: the attitude error (the geodesic angle
between q_model and q_full, resolved to ~3e-8 rad), the position error and the body-rate error, over time. The relative error of
a run is its largest attitude error over the horizon divided by the largest rotation the full
model makes from its start over the same horizon; "within 5 %" means that ratio ≤ 0.05.

The envelope: torque-free coning, the motors at hover, from a bank of α about body x with body
rates of magnitude Ω along (1, 1, 1)/√3, for 1 s: where each simplification breaks, over α and Ω.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)  # a benchmark script, not the library: float64 references

import quadjax as qj  # noqa: E402
from quadjax import euler16 as e16  # noqa: E402
from quadjax import presets  # noqa: E402
from quadjax.control.trajectories import Figure8, Step  # noqa: E402
from quadjax.quaternion import quat_angle_between as angle_between  # noqa: E402

HERE = Path(__file__).resolve().parent
DT = 1e-3
OPEN_LOOP_TICKS = 2000  # closed-loop manoeuvres: their first 2 s of wrenches replayed open loop
VARIANTS = {"seed": (), "+rates": ("euler_rates",), "+gyro": ("gyroscopic",)}


def models():
    qp = presets.cmu_plus(jnp.float64)
    return qp, {name: e16.from_quad_params(qp, corrections=c) for name, c in VARIANTS.items()}


@jax.jit
def _fly16(p, x0, wrenches):
    return qj.simulate(p, x0, DT, commands=wrenches).states


@jax.jit
def _fly_full(qp, p, x0, wrenches):
    commands = jax.vmap(lambda w: e16.quad_command(p, w))(wrenches)
    return qj.simulate(qp, e16.to_quad_state(x0), DT, commands=commands).states


def compare(qp, ps, x0, wrenches):
    """Per variant: attitude, position and rate errors over time (T,), against the full model;
    and the full model's rotation from its start, tilt [°] and ‖ω‖ (arrays only: vmappable)."""
    full = _fly_full(qp, ps["seed"], x0, wrenches)
    q0 = e16.to_quad_state(x0).attitude
    r33 = 1 - 2 * (full.attitude[:, 1] ** 2 + full.attitude[:, 2] ** 2)
    out = {"t": (jnp.arange(wrenches.shape[0]) + 1) * DT,
           "rotation": angle_between(q0, full.attitude),
           "tilt": jnp.degrees(jnp.arccos(jnp.clip(r33, -1, 1))),
           "rate": jnp.linalg.norm(full.body_rates, axis=-1)}
    for name, p in ps.items():
        s = e16.to_quad_state(_fly16(p, x0, wrenches))
        out[name] = {"attitude": angle_between(s.attitude, full.attitude),
                     "position": jnp.linalg.norm(s.position - full.position, axis=-1),
                     "rates": jnp.linalg.norm(s.body_rates - full.body_rates, axis=-1)}
    return out


# --------------------------------------------------------------------------- the manoeuvres


def hover(p, seconds):
    return jnp.tile(e16.hover_wrench(p), (round(seconds / DT), 1))


def _on_full(c, cs, obs, t):
    """The seed-003 PD controller flying the full model: it reads the 16-state, its wrench
    becomes motor commands."""
    w, cs = e16.pd_control(c, cs, e16.from_quad_state(obs), t)
    return e16.quad_command(c.model, w), cs


def closed_loop(qp, p, reference, seconds, x0):
    """The seed-003 PD controller flying ``reference`` on each model, from ``x0``: (the wrenches
    it commanded on the full model, reconstructed from its motor commands as A rpm², which the
    seed's solve maps back to them; the attitude and position errors of the seed model's own
    closed loop against the full model's, over time)."""
    ctrl = e16.PDController(model=p, gains=e16.PDGains.default(), reference=reference)
    n = round(seconds / DT)
    full = jax.jit(lambda s: qj.simulate(qp, s, DT, controller=_on_full, ctrl_params=ctrl, num_ticks=n))(
        e16.to_quad_state(x0))
    seed = e16.to_quad_state(jax.jit(lambda x: qj.simulate(p, x, DT, controller=e16.pd_control, ctrl_params=ctrl,
                                                           num_ticks=n))(x0).states)
    rpm = qj.frames.rad_s_to_rpm(full.commands)
    errors = {"attitude": np.asarray(angle_between(seed.attitude, full.states.attitude)),
              "position": np.asarray(jnp.linalg.norm(seed.position - full.states.position, axis=-1))}
    return (e16.allocation(p) @ (rpm**2).T).T, errors


def flip(p, angle, axis_deg, seconds=0.6, t_push=0.25):
    """Bang-bang moment about a body axis at ``axis_deg`` from x in the xy-plane that turns the
    vehicle by ``angle`` [rad] in 2 t_push (J ω̇ = ±M), hover thrust, then coast."""
    J = float(p.inertia[0, 0])
    m = angle * J / t_push**2
    a = math.radians(axis_deg)
    t = np.arange(round(seconds / DT)) * DT
    sign = np.where(t < t_push, 1.0, np.where(t < 2 * t_push, -1.0, 0.0))
    w = np.tile(np.asarray(e16.hover_wrench(p)), (t.size, 1))
    w[:, 1], w[:, 2] = sign * m * math.cos(a), sign * m * math.sin(a)
    return jnp.asarray(w)


def yaw_spin(p, rate, seconds=1.5):
    """Spin up about body z to ``rate`` [rad/s] at 0.08 N·m, then coast, hover thrust."""
    J = float(p.inertia[2, 2])
    t = np.arange(round(seconds / DT)) * DT
    w = np.tile(np.asarray(e16.hover_wrench(p)), (t.size, 1))
    w[:, 3] = np.where(t < rate * J / 0.08, 0.08, 0.0)
    return jnp.asarray(w)


def manoeuvres(qp, p, quick):
    x0 = e16.hover_state(p, position=(0.0, 0.0, 10.0))
    banked = x0.at[6].set(math.radians(5.0)).at[9].set(0.2)  # 5° bank, a small roll rate
    cases = [("hover", "2 s", x0, hover(p, 2.0), None)]
    steps = (0.1, 1.0) if quick else (0.1, 0.3, 1.0, 3.0)
    for s in steps:
        ref = Step(start=jnp.asarray([0.0, 0.0, 10.0]), end=jnp.asarray([s, s / 2, 10.0 + s / 2]),
                   t_step=jnp.asarray(0.1), yaw=jnp.asarray(0.0))
        wrenches, closed = closed_loop(qp, p, ref, 3.0, x0)
        cases.append(("step", f"{s:g} m", x0, wrenches[:OPEN_LOOP_TICKS], closed))
    for axis in (0.0, 45.0):
        for deg in ((90, 360) if quick else (30, 90, 180, 360)):
            cases.append((f"flip {'roll' if axis == 0 else 'diagonal'}", f"{deg}°", x0,
                          flip(p, math.radians(deg), axis), None))
    for rate in ((5.0, 20.0) if quick else (2.0, 5.0, 10.0, 20.0)):
        cases.append(("yaw spin (5° bank)", f"{rate:g} rad/s", banked, yaw_spin(p, rate), None))
    for omega in ((0.8,) if quick else (0.4, 0.8, 1.2)):
        ref = Figure8(center=jnp.asarray([0.0, 0.0, 10.0]), a=jnp.asarray(2.0), b=jnp.asarray(1.0),
                      omega=jnp.asarray(omega), yaw=jnp.asarray(0.0))
        start = x0.at[3:6].set(ref(0.0).velocity)
        wrenches, closed = closed_loop(qp, p, ref, 2 * math.pi / omega, start)  # one lap
        cases.append(("figure-8", f"ω {omega:g} rad/s", start, wrenches[:OPEN_LOOP_TICKS], closed))
    return cases


# --------------------------------------------------------------------------- the envelope


def envelope(qp, ps, quick):
    tilts = np.array([0, 3, 10, 30, 60.0] if quick else [0, 1, 2, 5, 10, 20, 30, 45, 60.0])
    rates = np.array([0.1, 1, 10.0] if quick else [0.03, 0.1, 0.3, 1, 3, 10, 30.0])
    A, W = np.meshgrid(np.radians(tilts), rates, indexing="ij")
    base = e16.hover_state(ps["seed"], position=(0.0, 0.0, 10.0))
    direction = np.ones(3) / math.sqrt(3)
    x0 = jnp.stack([base.at[6].set(a).at[9:12].set(w * direction) for a, w in zip(A.ravel(), W.ravel())])
    wrenches = hover(ps["seed"], 1.0)
    runs = jax.tree_util.tree_map(np.asarray, jax.vmap(lambda x: compare(qp, ps, x, wrenches))(x0))
    shape = A.shape
    rel = {name: (np.max(runs[name]["attitude"], axis=-1) / np.maximum(np.max(runs["rotation"], axis=-1), 1e-12)
                  ).reshape(shape) for name in ps}
    return tilts, rates, rel


# --------------------------------------------------------------------------- report


def summarise(name, amplitude, r, closed):
    rows = {"manoeuvre": name, "amplitude": amplitude, "horizon_s": float(r["t"][-1]),
            "max_tilt_deg": float(np.max(r["tilt"])), "max_rate": float(np.max(r["rate"])),
            "max_rotation_deg": float(np.degrees(np.max(r["rotation"])))}
    for v in VARIANTS:
        rows[v] = {"attitude_deg": float(np.degrees(np.max(r[v]["attitude"]))),
                   "position_m": float(np.max(r[v]["position"])), "rates": float(np.max(r[v]["rates"])),
                   "relative": float(np.max(r[v]["attitude"]) / max(np.max(r["rotation"]), 1e-12))}
    # when the seed model first leaves 5 %: its attitude error beyond 5 % of the rotation so far
    so_far = np.maximum.accumulate(r["rotation"])
    bad = np.nonzero(r["seed"]["attitude"] > 0.05 * np.maximum(so_far, 1e-12))[0]
    rows["seed_5pct_at_s"] = float(r["t"][bad[0]]) if bad.size and np.max(r["rotation"]) > 1e-9 else None
    if closed is not None:
        rows["closed_loop"] = {"seconds": len(closed["position"]) * DT,
                               "attitude_deg": float(np.degrees(np.max(closed["attitude"]))),
                               "position_m": float(np.max(closed["position"]))}
    return rows


def markdown(rows, tilts, rates, rel, quick):
    lines = ["# Seed 003's simplifications, measured (issue 25)", "",
             "`python benchmarks/euler16_divergence.py" + (" --quick" if quick else "") + "` (float64, RK4, dt 1 ms, "
             "cmu_plus; the protocol is in the script's docstring). Errors are the largest over the horizon, against "
             "quadjax's full quaternion model flying the same commands. *relative* = largest attitude error ÷ largest "
             "rotation of the full model over the horizon. `+rates`: true Euler-angle rates, no ω × Jω; `+gyro`: "
             "ω × Jω, Euler rates = body rates.", "",
             "## Manoeuvres", "",
             "| manoeuvre | amplitude | horizon s | max tilt ° | max ‖ω‖ rad/s | seed: attitude ° | seed: position m "
             "| seed: ‖Δω‖ rad/s | seed: relative | +rates: relative | +gyro: relative | seed > 5 % after s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t5 = "never" if r["seed_5pct_at_s"] is None else f"{r['seed_5pct_at_s']:.3f}"
        lines.append(f"| {r['manoeuvre']} | {r['amplitude']} | {r['horizon_s']:.1f} | {r['max_tilt_deg']:.1f} | "
                     f"{r['max_rate']:.2f} | {r['seed']['attitude_deg']:.3g} | {r['seed']['position_m']:.3g} | "
                     f"{r['seed']['rates']:.3g} | {r['seed']['relative']:.3g} | {r['+rates']['relative']:.3g} | "
                     f"{r['+gyro']['relative']:.3g} | {t5} |")
    lines += ["", "## Closed loop: the same controller flying each model", "",
              "The seed-003 PD controller (`quadjax.euler16.pd_control`) closes its loop on the seed model and, "
              "through the conversions, on the full model; the largest gap between the two flights.", "",
              "| manoeuvre | amplitude | flight s | attitude gap ° | position gap m |", "|---|---|---:|---:|---:|"]
    for r in rows:
        if "closed_loop" in r:
            c = r["closed_loop"]
            lines.append(f"| {r['manoeuvre']} | {r['amplitude']} | {c['seconds']:.1f} | {c['attitude_deg']:.3g} | "
                         f"{c['position_m']:.3g} |")
    lines += ["", "## Envelope: torque-free coning for 1 s, relative attitude error", "",
              "Start banked α about body x, body rates Ω (1, 1, 1)/√3, motors at hover. Cells ≤ 0.05 are within 5 %.", ""]
    for name in VARIANTS:
        lines += [f"**{name}**", "", "| α \\ Ω rad/s | " + " | ".join(f"{w:g}" for w in rates) + " |",
                  "|---|" + "---:|" * len(rates)]
        for i, a in enumerate(tilts):
            cells = [f"**{v:.3g}**" if v <= 0.05 else f"{v:.3g}" for v in rel[name][i]]
            lines.append(f"| {a:g}° | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(cases, results, rows, tilts, rates, rel, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({name for name, *_ in cases if name != "hover"})
    colour = dict(zip(groups, plt.cm.tab10.colors))
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    ax = axes[0, 0]
    seen = {}
    for (name, amp, *_), r in zip(cases, results):
        if name == "hover":
            continue
        k = seen[name] = seen.get(name, -1) + 1
        ax.semilogy(r["t"], np.degrees(np.maximum(r["seed"]["attitude"], 1e-12)), color=colour[name], lw=1,
                    ls=("-", "--", ":", "-.")[k % 4], label=f"{name} {amp}")
    ax.set(xlabel="t [s]", ylabel="attitude error [°]", title="seed model vs full model, same commands",
           ylim=(1e-4, 360))
    ax.legend(fontsize=6, ncol=2)
    ax = axes[0, 1]
    labelled = set()
    for r in rows[1:]:
        name = r["manoeuvre"]
        ax.scatter(max(r["max_tilt_deg"], 0.1), max(r["seed"]["relative"], 1e-6), s=20 + 12 * r["max_rate"],
                   color=colour[name], alpha=0.8, edgecolors="k", linewidths=0.5,
                   label=None if name in labelled else name)
        labelled.add(name)
    ax.legend(fontsize=7, loc="lower right")
    ax.axhline(0.05, color="k", ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="largest tilt of the full model [°]",
           ylabel="relative attitude error over the horizon",
           title="each manoeuvre (marker area ∝ largest ‖ω‖; 5 %: dashed)")
    for ax, name in zip(axes[1], ("+gyro", "+rates")):
        im = ax.pcolormesh(np.arange(len(rates) + 1), np.arange(len(tilts) + 1), np.log10(np.maximum(rel[name], 1e-8)),
                           cmap="viridis", vmin=-3, vmax=0)
        ax.contour(np.arange(len(rates)) + 0.5, np.arange(len(tilts)) + 0.5, rel[name], levels=[0.05], colors="w")
        ax.set_xticks(np.arange(len(rates)) + 0.5, [f"{w:g}" for w in rates])
        ax.set_yticks(np.arange(len(tilts)) + 0.5, [f"{a:g}" for a in tilts])
        what = "Euler rates = body rates only" if name == "+gyro" else "ω × Jω dropped only"
        ax.set(xlabel="Ω [rad/s]", ylabel="bank α [°]", title=f"coning 1 s, {what}\nlog10 relative error (5 %: white)")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases (a smoke run)")
    args = ap.parse_args()
    qp, ps = models()
    cases = manoeuvres(qp, ps["seed"], args.quick)
    results = [jax.tree_util.tree_map(np.asarray, compare(qp, ps, x0, w)) for _, _, x0, w, _ in cases]
    rows = [summarise(name, amp, r, closed) for (name, amp, _, _, closed), r in zip(cases, results)]
    tilts, rates, rel = envelope(qp, ps, args.quick)
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "euler16_divergence.json").write_text(json.dumps(
        {"manoeuvres": rows, "envelope": {"tilt_deg": tilts.tolist(), "rate": rates.tolist(),
                                          "relative": {k: v.tolist() for k, v in rel.items()}}}, indent=1))
    # a quick run is a smoke test: its files stay in the ignored out/ folder
    (HERE / ("out/EULER16_RESULTS_quick.md" if args.quick else "EULER16_RESULTS.md")).write_text(
        markdown(rows, tilts, rates, rel, args.quick))
    plot(cases, results, rows, tilts, rates, rel, HERE / ("out/euler16_divergence_quick.png" if args.quick
                                                    else "euler16_divergence.png"))
    print(markdown(rows, tilts, rates, rel, args.quick))


if __name__ == "__main__":
    main()
