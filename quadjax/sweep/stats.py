"""Sweep statistics: the streaming tracking-error histogram and the summary of a sweep.

Streaming quantiles (fleet-wide tracking error, every vehicle at every tick)
---------------------------------------------------------------------------
A sweep of 10⁶ vehicles × 4 000 ticks has 4·10⁹ error samples: too many to keep. Each
sample is counted instead in a fixed histogram with log-spaced bins, carried in the scan
as integer counts (so chunk order, chunk size and device count cannot change it: integer
addition is exact and associative). Bins, for ``minimum`` m₀, ``bins_per_decade`` b and
``decades`` D (ratio r = 10^(1/b)):

    bin 0          [0, m₀)                    underflow
    bin k, 1..bD   [m₀ r^(k−1), m₀ r^k)
    bin bD + 1     [m₀ 10^D, ∞) and non-finite overflow

The q-quantile is taken as the order statistic x₍ₖ₎, k = max(1, ⌈q n⌉) (numpy's
``method="inverted_cdf"``). Binning is monotone, so the histogram finds the bin that
holds x₍ₖ₎ exactly; the estimate is that bin's geometric centre. Documented error:

    inside the range:  |x̂ / x₍ₖ₎ − 1| ≤ √r − 1   (0.90 % for the default b = 128)
    underflow bin:     x̂ = m₀/2, |x̂ − x₍ₖ₎| ≤ m₀/2
    overflow bin:      x̂ = m₀ 10^D, a lower bound (reported as such)

The default range 10⁻⁵ m … 10³ m (D = 8) spans every error a vehicle can have before it
is declared lost (``crash.max_error``, default 5 m). Memory: bD + 2 = 1 026 int32 counters
per chunk, whatever the number of samples.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from quadjax.status import STATUS_IDS, VIOLATION_CODES

#: crash causes are the engine's status codes (the one table, :mod:`quadjax.status`)
CRASH_IDS = STATUS_IDS


@dataclasses.dataclass(frozen=True)
class ErrorHistogram:
    """Fixed log-spaced bins for streaming quantiles (see the module docstring)."""

    minimum: float = 1e-5
    bins_per_decade: int = 128
    decades: int = 8

    def __post_init__(self):
        if not (math.isfinite(self.minimum) and self.minimum > 0):
            raise ValueError(f"stats.error_min = {self.minimum}: must be a positive number of metres")
        if not (isinstance(self.bins_per_decade, int) and 1 <= self.bins_per_decade <= 4096):
            raise ValueError(f"stats.bins_per_decade = {self.bins_per_decade}: must be an integer in [1, 4096]")
        if not (isinstance(self.decades, int) and 1 <= self.decades <= 30):
            raise ValueError(f"stats.decades = {self.decades}: must be an integer in [1, 30]")

    @property
    def num_bins(self) -> int:
        """bD + 2: underflow, bD log bins, overflow."""
        return self.bins_per_decade * self.decades + 2

    @property
    def ratio(self) -> float:
        """r = 10^(1/b), the ratio of a bin's upper to lower edge."""
        return 10.0 ** (1.0 / self.bins_per_decade)

    @property
    def relative_error(self) -> float:
        """√r − 1: the documented bound on |x̂/x − 1| inside the range."""
        return math.sqrt(self.ratio) - 1.0

    @property
    def maximum(self) -> float:
        return self.minimum * 10.0 ** self.decades

    def edges(self) -> np.ndarray:
        """The bD + 1 edges m₀ r^k [m], k = 0..bD (float64)."""
        k = np.arange(self.bins_per_decade * self.decades + 1)
        return self.minimum * 10.0 ** (k / self.bins_per_decade)

    def index(self, error):
        """Bin of each error [m] (any shape, jnp): 0 underflow, bD + 1 overflow or non-finite."""
        error = jnp.asarray(error)
        top = self.num_bins - 1
        safe = jnp.where(error > 0, error, 1.0)
        u = jnp.floor(jnp.log10(safe / self.minimum) * self.bins_per_decade)
        k = jnp.clip(u, -1.0, float(top)).astype(jnp.int32) + 1
        k = jnp.where(error < self.minimum, 0, jnp.minimum(k, top))
        return jnp.where(jnp.isfinite(error), k, top)

    def quantiles(self, counts, qs) -> np.ndarray:
        """Estimates of the q-quantiles (float64) from bin ``counts``; NaN where empty."""
        counts = np.asarray(counts, dtype=np.int64)
        n = int(counts.sum())
        qs = np.atleast_1d(np.asarray(qs, dtype=np.float64))
        if n == 0:
            return np.full(qs.shape, np.nan)
        edges = self.edges()
        centres = np.concatenate([[0.5 * self.minimum], np.sqrt(edges[:-1] * edges[1:]), [self.maximum]])
        rank = np.maximum(1, np.ceil(qs * n)).astype(np.int64)  # as numpy's inverted_cdf
        return centres[np.searchsorted(np.cumsum(counts), rank, side="left")]


def exact_quantiles(samples, qs) -> np.ndarray:
    """x₍ₖ₎, k = max(1, ⌈q n⌉): the definition the histogram estimates (inverted CDF)."""
    return np.quantile(np.asarray(samples, np.float64), qs, method="inverted_cdf")


QUANTILES = (0.5, 0.95, 0.99)


def _q(x, qs=QUANTILES):
    x = np.asarray(x, np.float64)
    return [float(v) for v in np.quantile(x, qs)] if x.size else [None] * len(qs)


def _mean(x):
    x = np.asarray(x, np.float64)
    return float(x.mean()) if x.size else None


def summarise(vehicles: dict, counts, histogram: ErrorHistogram, dt: float, num_ticks: int) -> dict:
    """The sweep's figures from its per-vehicle arrays (every vehicle, in index order) and the
    summed error-histogram ``counts``. Quantiles over vehicles are exact (numpy, float64,
    linear interpolation); those of the instantaneous error come from the histogram."""
    code = np.asarray(vehicles["crash_code"])
    n = int(code.size)
    ok = code == 0
    crashed = int((~ok).sum())
    violations = int(np.isin(code, VIOLATION_CODES).sum())
    causes = {CRASH_IDS[c]: int((code == c).sum()) for c in sorted(set(code.tolist()) - {0})}
    ticks = np.asarray(vehicles["crash_tick"])
    crash_times = ticks[~ok] * dt
    airborne = np.asarray(vehicles["samples"]) > 0
    qs = np.asarray(QUANTILES + (0.999,))
    streaming = histogram.quantiles(counts, qs)
    return {
        "vehicles": n,
        "duration_s": num_ticks * dt,
        "crashed": crashed,
        "crash_rate": crashed / n if n else 0.0,
        "violations": violations,
        "violation_rate": violations / n if n else 0.0,
        "crash_causes": causes,
        "crash_time_s": {"median": float(np.median(crash_times)) if crashed else None},
        "rms_error_m": _spread(vehicles["rms_error"][ok]),
        "max_error_m": _spread(vehicles["max_error"][ok]),
        "error_m": {
            "p50": _none_if_nan(streaming[0]), "p95": _none_if_nan(streaming[1]),
            "p99": _none_if_nan(streaming[2]), "p99.9": _none_if_nan(streaming[3]),
            "samples": int(np.asarray(counts).sum()), "relative_error": histogram.relative_error,
        },
        "max_tilt_deg": dict(zip(("p50", "p95", "p99"), _q(np.degrees(vehicles["max_tilt"][airborne]))),
                             max=float(np.degrees(vehicles["max_tilt"][airborne].max())) if airborne.any() else None),
        "energy_J": dict(zip(("p50", "p95", "p99"), _q(vehicles["energy"][ok])), mean=_mean(vehicles["energy"][ok])),
        "saturation_s": dict(zip(("p50", "p95", "p99"), _q(vehicles["saturation_time"][airborne])),
                             mean=_mean(vehicles["saturation_time"][airborne]),
                             any_rate=_mean(vehicles["saturation_time"][airborne] > 0)),
        **({"estimation": _estimation(vehicles, ok)} if "est_nees" in vehicles else {}),
    }


def _spread(x) -> dict:
    """p50, p95, p99 and max of the per-vehicle values ``x`` (None where there are none)."""
    x = np.asarray(x)
    return dict(zip(("p50", "p95", "p99"), _q(x)), max=float(x.max()) if x.size else None)


def _estimation(vehicles: dict, ok) -> dict:
    """The estimator's figures over the vehicles that finished: RMS position [m] and attitude
    [deg] errors of the estimate the controller flew on, and the mean NEES (15 dof when consistent)."""
    nees = np.asarray(vehicles["est_nees"])[ok]
    return {"rms_position_m": _spread(np.asarray(vehicles["est_rms_position"])[ok]),
            "rms_attitude_deg": _spread(np.degrees(np.asarray(vehicles["est_rms_attitude"])[ok])),
            "nees": {**_spread(nees), "mean": _mean(nees)}}


def _none_if_nan(x):
    return None if not np.isfinite(x) else float(x)


def _fmt(x, scale=1.0, digits=3):
    if x is None:
        return "—"
    v = x * scale
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 10 ** (-digits):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{max(0, digits - 1 - int(math.floor(math.log10(abs(v)))))}f}"


def format_table(summary: dict) -> str:
    """The summary as a plain-text table (what ``quadjax sweep`` prints)."""
    n = summary["vehicles"]
    lines = []
    causes = ", ".join(f"{k} {v}" for k, v in summary["crash_causes"].items()) or "none"
    rate = 100 * summary["crash_rate"]
    lines.append(f"crashed               {summary['crashed']:>8d} / {n}  ({rate:.2f} %)   causes: {causes}")
    lines.append(f"invariant violations  {summary['violations']:>8d} / {n}  ({100 * summary['violation_rate']:.2f} %)")
    lines.append("")
    lines.append(f"{'':30s}{'p50':>10s}{'p95':>10s}{'p99':>10s}{'max/mean':>12s}")

    def row(label, d, last_key, scale=1.0):
        cells = "".join(f"{_fmt(d.get(k), scale):>10s}" for k in ("p50", "p95", "p99"))
        tail = _fmt(d.get(last_key), scale)
        return f"{label:30s}{cells}{tail:>10s} {'(' + last_key + ')':s}"

    lines.append(row("RMS tracking error [m]", summary["rms_error_m"], "max"))
    lines.append(row("max tracking error [m]", summary["max_error_m"], "max"))
    e = summary["error_m"]
    lines.append(row("tracking error, all ticks [m]", e, "p99.9"))
    lines.append(row("max tilt [deg]", summary["max_tilt_deg"], "max"))
    lines.append(row("energy used [kJ]", summary["energy_J"], "mean", 1e-3))
    lines.append(row("time saturated [s]", summary["saturation_s"], "mean"))
    if "estimation" in summary:
        est = summary["estimation"]
        lines.append(row("estimate RMS position [m]", est["rms_position_m"], "max"))
        lines.append(row("estimate RMS attitude [deg]", est["rms_attitude_deg"], "max"))
        lines.append(row("estimator NEES (15 dof)", est["nees"], "mean"))
    lines.append("")
    lines.append(
        f"RMS/max error and energy over the {n - summary['crashed']} vehicles that finished (exact); "
        f"'all ticks' over {e['samples']:,} vehicle-ticks from a streaming histogram "
        f"(±{100 * e['relative_error']:.2f} %); tilt and saturation over every vehicle that flew."
    )
    return "\n".join(lines)
