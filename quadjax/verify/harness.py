"""The scenario harness: named scenarios, their metrics, thresholds with cited sources, verdicts.

A :class:`Scenario` flies something (its ``run`` returns an :class:`Outcome`: metric values
and, optionally, a plot), and each of its :class:`Check` s compares one metric with a
threshold whose source is named: a seed, a paper, an analytic result, or a documented
quadjax specification. A verdict line reads like the seeds' harness::

    ✓ pass  mixer_throttle_sweep  BB-T1 rotor_thrust_step_per_collective_step = 0.5 (<= 1)  [seed 002]

A scenario that raises fails every one of its checks with the error as the note (one broken
scenario never stops the others); a scenario whose optional dependency is missing is skipped.
Scenarios compute in float64: :func:`run` enters ``jax.enable_x64`` for their duration (a
context manager: the caller's global configuration is not changed).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import operator
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from quadjax.files import write_atomic

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


@dataclasses.dataclass(frozen=True)
class Check:
    """``metric op threshold``, e.g. ``Check("settle_s", "<=", 2.0, "PIDGains.default", unit="s")``.

    ``label``: the name printed (default: the metric's), e.g. the seed's "BB-T1 …"."""

    metric: str
    op: str
    threshold: float
    source: str
    unit: str = ""
    label: str = ""

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"Check({self.metric!r}): op {self.op!r}, expected one of {sorted(OPS)}")

    def judge(self, value) -> bool:
        """True when the value meets the threshold (a non-finite value never does)."""
        return value is not None and math.isfinite(value) and bool(OPS[self.op](value, self.threshold))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a scenario's ``run`` returns: ``metrics`` name → float, and optionally a plot:
    ``plot = {"x": (T,), "xlabel": str, "ylabel": str, "lines": {label: (T,)}, "log": bool}``."""

    metrics: dict
    plot: dict | None = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A named scenario: ``run(backend) -> Outcome``; ``fast``: part of the default subset;
    ``needs``: an optional module it imports (skipped without it)."""

    name: str
    title: str
    checks: tuple
    run: Callable[[str], Outcome]
    fast: bool = True
    needs: str | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    scenario: str
    check: Check
    value: float | None
    status: str  # "pass", "fail" or "skip"
    note: str = ""

    def line(self) -> str:
        mark = {"pass": "✓ pass", "fail": "✗ FAIL", "skip": "- skip"}[self.status]
        c = self.check
        label = c.label or c.metric
        value = "—" if self.value is None else f"{self.value:.4g}"
        unit = f" {c.unit}" if c.unit else ""
        tail = f"  ({self.note})" if self.note else ""
        return f"{mark}  {self.scenario}  {label} = {value}{unit} ({c.op} {c.threshold:g}{unit})  [{c.source}]{tail}"


@dataclasses.dataclass(frozen=True)
class Result:
    """One scenario's verdicts, all its metrics (checked or not), its plot and its run time [s]."""

    scenario: Scenario
    verdicts: tuple
    metrics: dict
    plot: dict | None
    seconds: float
    error: str = ""

    @property
    def status(self) -> str:
        states = {v.status for v in self.verdicts}
        return "fail" if "fail" in states else "skip" if states == {"skip"} else "pass"


def run_scenario(scenario: Scenario, backend: str = "xla") -> Result:
    """Run one scenario and judge its checks (never raises for the scenario's own failure)."""
    if scenario.needs and importlib.util.find_spec(scenario.needs) is None:
        note = f"{scenario.needs} is not installed"
        return Result(scenario, tuple(Verdict(scenario.name, c, None, "skip", note) for c in scenario.checks), {}, None, 0.0)
    t0 = time.perf_counter()
    try:
        with jax.enable_x64(True):
            outcome = scenario.run(backend)
        metrics = {k: float(v) for k, v in outcome.metrics.items()}
        plot, error = outcome.plot, ""
    except Exception as err:  # a broken scenario is a failed one, and the others still run
        metrics, plot = {}, None
        error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    seconds = time.perf_counter() - t0
    verdicts = []
    for c in scenario.checks:
        value = metrics.get(c.metric)
        if error:
            verdicts.append(Verdict(scenario.name, c, None, "fail", error))
        elif value is None:
            verdicts.append(Verdict(scenario.name, c, None, "fail", f"the scenario gave no metric {c.metric!r}"))
        else:
            verdicts.append(Verdict(scenario.name, c, value, "pass" if c.judge(value) else "fail"))
    return Result(scenario, tuple(verdicts), metrics, plot, seconds, error)


def run(scenarios, backend: str = "xla", progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Run ``scenarios`` in order; ``progress(result)`` after each."""
    results = []
    for s in scenarios:
        r = run_scenario(s, backend)
        results.append(r)
        if progress is not None:
            progress(r)
    return results


def summary_line(results) -> str:
    verdicts = [v for r in results for v in r.verdicts]
    count = {k: sum(v.status == k for v in verdicts) for k in ("pass", "fail", "skip")}
    took = sum(r.seconds for r in results)
    return (f"{count['pass']} passed, {count['fail']} failed, {count['skip']} skipped "
            f"({len(verdicts)} checks in {len(results)} scenarios, {took:.1f} s)")


def to_json(results, meta: dict) -> dict:
    return {
        **meta,
        "summary": summary_line(results),
        "passed": all(r.status != "fail" for r in results),
        "scenarios": [
            {"name": r.scenario.name, "title": r.scenario.title, "status": r.status, "seconds": round(r.seconds, 3),
             "error": r.error, "metrics": r.metrics,
             "checks": [{"metric": v.check.metric, "label": v.check.label or v.check.metric, "op": v.check.op,
                         "threshold": v.check.threshold, "unit": v.check.unit, "source": v.check.source,
                         "value": v.value, "status": v.status, "note": v.note} for v in r.verdicts]}
            for r in results
        ],
    }


def to_markdown(results, meta: dict, plots: dict | None = None) -> str:
    lines = [f"# quadjax verify: {summary_line(results)}", "",
             f"quadjax {meta.get('version', '?')}, backend {meta.get('backend', '?')}, float64, "
             f"{meta.get('date', '')}; command `{meta.get('command', 'quadjax verify')}`.", "",
             "| | scenario | check | value | threshold | source |", "|---|---|---|---:|---|---|"]
    for r in results:
        for v in r.verdicts:
            c = v.check
            mark = {"pass": "✓ pass", "fail": "✗ **FAIL**", "skip": "skip"}[v.status]
            value = "—" if v.value is None else f"{v.value:.4g}"
            note = f" ({v.note})" if v.note else ""
            lines.append(f"| {mark} | {r.scenario.name} | {c.label or c.metric}{note} | {value} {c.unit} | "
                         f"{c.op} {c.threshold:g} {c.unit} | {c.source} |")
    lines += ["", "## Scenarios", ""]
    for r in results:
        lines.append(f"- **{r.scenario.name}** ({r.seconds:.1f} s): {r.scenario.title}")
        unchecked = {k: v for k, v in r.metrics.items() if k not in {c.metric for c in r.scenario.checks}}
        if unchecked:
            lines.append("  Also measured: " + ", ".join(f"{k} = {v:.4g}" for k, v in unchecked.items()) + ".")
        if plots and r.scenario.name in plots:
            lines.append(f"  ![{r.scenario.name}]({plots[r.scenario.name]})")
    return "\n".join(lines) + "\n"


def write_plot(path: Path, result: Result) -> Path | None:
    """The scenario's plot as a PNG, written atomically; None when it has none."""
    p = result.plot
    if not p:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=100)
    for label, y in p["lines"].items():
        y = np.asarray(y)
        ax.plot(np.asarray(p["x"])[: len(y)], np.abs(y) if p.get("log") else y, label=label, lw=1.2)
    if p.get("log"):
        ax.set_yscale("log")
    ax.set_xlabel(p["xlabel"])
    ax.set_ylabel(p["ylabel"])
    ax.set_title(f"{result.scenario.name}: {result.status}", fontsize=10)
    ax.grid(alpha=0.3)
    if len(p["lines"]) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return path


def write_report(out: Path, results, meta: dict, *, plots: bool = True) -> dict:
    """verify.json, VERIFY.md and plots/<scenario>.png under ``out``; returns {kind: path}."""
    out = Path(out)
    written = {}
    if plots:
        (out / "plots").mkdir(parents=True, exist_ok=True)
        for r in results:
            if write_plot(out / "plots" / f"{r.scenario.name}.png", r):
                written[r.scenario.name] = f"plots/{r.scenario.name}.png"
    out.mkdir(parents=True, exist_ok=True)
    doc = to_json(results, {**meta, "plots": written})
    write_atomic(out / "verify.json", lambda f: f.write(json.dumps(doc, indent=2).encode()))
    write_atomic(out / "VERIFY.md", lambda f: f.write(to_markdown(results, meta, written).encode()))
    return {"json": out / "verify.json", "markdown": out / "VERIFY.md", "plots": written}
