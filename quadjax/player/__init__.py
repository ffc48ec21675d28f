"""The trace player: replay a run in a browser, from one self-contained HTML file.

``quadjax.view(source, ...)`` (or ``quadjax view RUN`` on the command line) writes the page and
returns a :class:`Page`, which a notebook displays inline. The page has a 3-D view (WebGL; a
top and side view on a 2-D canvas where WebGL is missing), synced plots of position, attitude,
body rates, rotor speeds, the mixer's saturation report and the tracking error, the run's
events marked on the time axis and listed, and the keys of the seed documents (with the
player focused): Space play/pause · ← → one sample (Shift: ten) · Home/End · [ ] speed
(halves / doubles, 1/16× … 16×). Play at the end starts over.

What it replays (:func:`trace_of` picks by type):

* an engine :class:`quadjax.Trajectory` (one vehicle or a batch) — pass ``params`` and ``dt``;
* a sweep (:class:`quadjax.sweep.SweepResult` or its results folder): the kept vehicles;
* a monitor repro file (``.npz``, :func:`quadjax.monitor.write_repro`);
* a flight log (:class:`quadjax.logs.FlightLog`, ``.parquet`` or ``.csv``), and, with
  ``fit=`` params (or a fit file of ``quadjax fit``), the model's prediction against it;
* a :class:`Trace` built by hand.

The script and style sheet are quadjax's own (``quadjax/player/assets``), under the package's
licence; the page needs no server, no network and no third-party code. Sizes and the
decimation and quantisation that bound them: :mod:`quadjax.player.page`.
"""

from __future__ import annotations

import html as html_lib
from pathlib import Path

from quadjax.player.page import Event, Trace, Track, render_html, write_html, write_page
from quadjax.player.sources import (
    MixerReport, log_trace, repro_trace, sweep_trace, trajectory_trace, validation_trace,
)

#: where :func:`view` writes when no path is given
DEFAULT_PATH = "quadjax-view.html"


class Page:
    """A written player page: ``path``, and inline display in a notebook (an iframe of the page)."""

    def __init__(self, path: Path, html: str, height: int = 900):
        self.path = Path(path)
        self.html = html
        self.height = height

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html_lib.escape(self.html, quote=True)}" style="width: 100%; '
                f'height: {self.height}px; border: 1px solid #ddd" sandbox="allow-scripts"></iframe>')

    def __repr__(self) -> str:
        return f"Page({str(self.path)!r})"


def _fit_of(fit) -> dict:
    """{"params", "motor_map", "inputs"} of fitted params or a fit file (None: no fit)."""
    if fit is None:
        return {}
    if hasattr(fit, "mass"):
        return {"params": fit}
    from quadjax.sysid.io import load_fit

    doc = load_fit(fit)
    return {"params": doc["params"], "motor_map": doc["motor_map"], "inputs": doc["inputs"]}


def trace_of(source, params=None, *, dt=None, fit=None, **options) -> Trace:
    """The :class:`Trace` of ``source`` (module docstring); ``options`` go to the builder."""
    from quadjax.engine import Trajectory

    if isinstance(source, Trace):
        return source
    if isinstance(source, Trajectory):
        if params is None or dt is None:
            raise ValueError("view(Trajectory): pass params= (those flown) and dt= (the tick given to simulate)")
        return trajectory_trace(source, params, dt, **options)
    if hasattr(source, "trajectories") and hasattr(source, "vehicles"):
        return sweep_trace(source, **options)
    from quadjax.logs import FlightLog, load_log

    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            return sweep_trace(path, **options)
        if not path.is_file():
            raise ValueError(f"{path}: no such file or folder")
        if path.suffix == ".npz":
            return repro_trace(path, **options)
        source = load_log(path)
    if isinstance(source, FlightLog):
        fitted = _fit_of(fit)
        if fitted:
            return validation_trace(source, **{**fitted, **options})
        return log_trace(source, params, **options)
    raise ValueError(f"view: cannot replay a {type(source).__name__} (a Trajectory, a sweep, a repro file, "
                     "a flight log or a Trace)")


def view(source, params=None, *, dt=None, path=DEFAULT_PATH, fit=None, max_rate: float = 100.0,
         max_bytes: float = 12e6, **options) -> Page:
    """Write the player page of ``source`` to ``path`` and return it (displayed inline by a
    notebook). ``params``, ``dt``: what a Trajectory was flown with; ``fit``: fitted params or a
    fit file, to replay a log's prediction against it; ``max_rate`` [Hz], ``max_bytes``: the
    page's decimation (:mod:`quadjax.player.page`); ``options`` go to the trace builder
    (``state0``, ``saturation``, ``reference``, ``events``, ``names``, ``title``, …)."""
    trace = trace_of(source, params, dt=dt, fit=fit, **options)
    text = render_html(trace, max_rate=max_rate, max_bytes=max_bytes)
    return Page(write_html(text, path), text)


__all__ = [
    "DEFAULT_PATH", "Event", "MixerReport", "Page", "Trace", "Track", "log_trace", "render_html", "repro_trace",
    "sweep_trace", "trace_of", "trajectory_trace", "validation_trace", "view", "write_html", "write_page",
]
