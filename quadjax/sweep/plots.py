"""Figures of a sweep (matplotlib's object API: no pyplot state, works headless).

Each ``figure_*`` returns a :class:`matplotlib.figure.Figure`; :func:`save_plots` writes
them as PNG files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from quadjax.sweep.stats import CRASH_IDS


def figure_trajectories(result) -> Figure:
    """Top view and altitude of the kept vehicles over the reference; crashes marked ×."""
    tr = result.trajectories
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    top, alt = fig.subplots(1, 2, width_ratios=(1.2, 1))
    ref, t = tr["reference"], tr["time"]
    top.plot(ref[:, 0], ref[:, 1], "k--", lw=1.5, label="reference", zorder=3)
    alt.plot(t, ref[:, 2], "k--", lw=1.5, label="reference", zorder=3)
    code = result.vehicles["crash_code"]
    for j, i in enumerate(tr["index"]):
        alive = tr["alive"][j]
        p = tr["position"][j][alive]
        crashed = code[i] != 0
        colour = "tab:red" if crashed else "tab:blue"
        top.plot(p[:, 0], p[:, 1], color=colour, lw=0.8, alpha=0.6)
        alt.plot(t[alive], p[:, 2], color=colour, lw=0.8, alpha=0.6)
        if crashed and len(p):
            top.plot(p[-1, 0], p[-1, 1], "x", color="tab:red")
    top.set(xlabel="x east [m]", ylabel="y north [m]", title=f"{len(tr['index'])} kept vehicles (red: crashed)")
    top.set_aspect("equal", adjustable="datalim")
    alt.set(xlabel="time [s]", ylabel="z up [m]", title="altitude")
    top.legend(loc="upper right")
    return fig


def figure_distributions(result) -> Figure:
    """Histograms over vehicles: RMS tracking error, max tilt, energy, time saturated."""
    v = result.vehicles
    ok = v["crash_code"] == 0
    flew = v["samples"] > 0
    panels = [
        (v["rms_error"][ok], "RMS tracking error [m] (finished)"),
        (np.degrees(v["max_tilt"][flew]), "max tilt [deg]"),
        (v["energy"][ok] / 1e3, "energy used [kJ] (finished)"),
        (v["saturation_time"][flew], "time saturated [s]"),
    ]
    fig = Figure(figsize=(10, 6), layout="constrained")
    for ax, (x, label) in zip(fig.subplots(2, 2).ravel(), panels):
        x = np.asarray(x, np.float64)
        if x.size and np.ptp(x) > 0:
            # one filled outline per panel, not a patch per bar (a quarter of the drawing time)
            ax.hist(x, bins=min(60, max(10, x.size // 20)), color="tab:blue", alpha=0.8, histtype="stepfilled")
        elif x.size:  # every vehicle alike (e.g. none saturated): say so instead of an empty panel
            ax.text(0.5, 0.5, f"all {x.size} vehicles: {x[0]:.3g}", transform=ax.transAxes, ha="center")
        ax.set(xlabel=label, ylabel="vehicles")
    fig.suptitle(f"{v['crash_code'].size} vehicles, {int((~ok).sum())} crashed")
    return fig


def figure_error_and_survival(result) -> Figure:
    """Tracking error exceedance from the streaming histogram; vehicles still flying vs time."""
    h = result.config.histogram
    counts = np.asarray(result.counts, np.float64)
    fig = Figure(figsize=(11, 4), layout="constrained")
    ccdf_ax, surv_ax = fig.subplots(1, 2)
    n = counts.sum()
    if n > 0:
        edges = h.edges()
        above = 1.0 - np.cumsum(counts)[:-1] / n  # P(e ≥ upper edge of bin k), k = 0 … bD
        keep = above > 0
        ccdf_ax.loglog(edges[keep], above[keep], color="tab:blue")
    ccdf_ax.set(xlabel="tracking error e [m]", ylabel="P(error > e)",
                title=f"all vehicle-ticks ({int(n):,}), streaming histogram")
    ccdf_ax.grid(True, which="both", alpha=0.3)
    code, tick = result.vehicles["crash_code"], result.vehicles["crash_tick"]
    T, dt = result.config.num_ticks, result.config.control_dt
    t = np.arange(T + 1) * dt
    for c in sorted(set(code.tolist()) - {0}):
        ticks = np.sort(tick[code == c])
        surv_ax.step(t, np.searchsorted(ticks, np.arange(T + 1), side="right") / code.size, where="post",
                     label=CRASH_IDS[c])
    flying = 1.0 - np.searchsorted(np.sort(tick[code != 0]), np.arange(T + 1), side="right") / code.size
    surv_ax.step(t, flying, where="post", color="k", label="still flying")
    surv_ax.set(xlabel="time [s]", ylabel="fraction of vehicles", ylim=(-0.02, 1.02), title="survival and crash causes")
    surv_ax.legend(loc="center right")
    return fig


def save_plots(result, folder) -> list[Path]:
    """Write the three figures as PNG files into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in (("trajectories", figure_trajectories), ("distributions", figure_distributions),
                       ("error_and_survival", figure_error_and_survival)):
        path = folder / f"{name}.png"
        make(result).savefig(path, dpi=110)
        paths.append(path)
    return paths
