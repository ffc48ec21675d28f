"""Draw seed 002's throttle sweep on RP-1: thrusts, σ and s, and the saturation report against F.

τ = (0.5, 0.2, 0.1) N·m held, the collective demand F from 0 to 52 N (float64). Dashed
lines: the transitions the seed lists (9.0, 15.4, 38.0, 41.6 N).

    python benchmarks/plot_mixer_sweep.py [--out benchmarks/out/mixer_sweep.png]
"""

import argparse
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from quadjax import presets
from quadjax.mixer import mix, mixer_params_from, saturation_from

SEED_TRANSITIONS = (9.0, 15.4, 38.0, 41.6)
ROTORS = ("0 FR (CCW)", "1 RL (CCW)", "2 FL (CW)", "3 RR (CW)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "mixer_sweep.png")
    args = parser.parse_args()

    with jax.enable_x64(True):
        mp = mixer_params_from(presets.rp1(dtype="float64"))
        F = np.linspace(0.0, 52.0, 5201)
        w = np.stack([F, np.full_like(F, 0.5), np.full_like(F, 0.2), np.full_like(F, 0.1)], axis=-1)
        out = jax.jit(mix)(mp, w)
        report = np.asarray(saturation_from(w, out))
        thrusts, achieved = np.asarray(out.thrusts), np.asarray(out.achieved)
        sigma, s = np.asarray(out.rp_scale), np.asarray(out.yaw_scale)
        t_max = float(mp.t_max)

    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(8, 10), gridspec_kw=dict(height_ratios=[3, 2, 1.5, 2]))
    ax = axes[0]
    for i, name in enumerate(ROTORS):
        ax.plot(F, thrusts[:, i], label=name)
    ax.axhline(t_max, color="k", lw=0.8)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_ylabel("rotor thrust [N]")
    ax.legend(ncol=2, fontsize=8, loc="upper left")
    ax.set_title("RP-1 mixer, τ = (0.5, 0.2, 0.1) N·m held (seed 002 throttle sweep)")

    ax = axes[1]
    ax.plot(F, achieved[:, 0], label="achieved F")
    ax.plot(F, F, "k:", lw=0.8, label="demanded F")
    ax.set_ylabel("collective [N]")
    ax.legend(fontsize=8, loc="upper left")

    ax = axes[2]
    ax.plot(F, sigma, label="σ (roll/pitch scale)")
    ax.plot(F, s, label="s (yaw scale)")
    ax.set_ylim(-0.05, 1.1)
    ax.set_ylabel("scale")
    ax.legend(fontsize=8, loc="center right")

    ax = axes[3]
    for k, (name, offset) in enumerate(zip(("roll", "pitch", "yaw", "collective"), (-0.15, -0.05, 0.05, 0.15), strict=True)):
        ax.step(F, report[:, k] + offset, where="post", label=name)
    ax.set_yticks([-1, 0, 1])
    ax.set_ylabel("saturation report")
    ax.set_xlabel("collective demand F [N]")
    ax.legend(ncol=4, fontsize=8, loc="lower right")

    for ax in axes:
        for x in SEED_TRANSITIONS:
            ax.axvline(x, color="grey", ls="--", lw=0.7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
