"""Verification: named scenarios with metrics, thresholds and cited sources (``quadjax verify``).

:mod:`quadjax.verify.harness` runs them and writes the report; :mod:`quadjax.verify.scenarios`
holds the set (:data:`~quadjax.verify.scenarios.SCENARIOS`, :func:`~quadjax.verify.scenarios.select`).
:mod:`quadjax.verify.precision` characterises the model in float32, bfloat16 and float16 against
float64 (docs/precision.md); :mod:`quadjax.verify.opcount` counts the operations of one RK4 step.
"""

from quadjax.verify.opcount import operation_count
from quadjax.verify.precision import characterise, format_markdown, plot
from quadjax.verify.harness import Check, Outcome, Result, Scenario, Verdict, run, run_scenario, write_report
from quadjax.verify.scenarios import SCENARIOS, select

__all__ = ["SCENARIOS", "Check", "Outcome", "Result", "Scenario", "Verdict", "characterise", "format_markdown",
           "operation_count", "plot", "run", "run_scenario", "select", "write_report"]
