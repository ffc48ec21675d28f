"""What the trace player shows (:class:`Trace`) and the one self-contained HTML page it becomes.

A trace is one time grid shared by every track: ``t0 + i·dt`` for i = 0 … T − 1 [s]. A track
is one vehicle's (or one prediction's) history on that grid, in the core's conventions
(world ENU, body FLU, quaternion (w, x, y, z) body → world, SI units).

**Size.** The page holds the trace, the player's script and its style sheet inline: it opens
from disk with no server and no network. Two steps bound its size:

* decimation: an integer stride keeps every ``stride``-th sample, counted back from the last
  (kept: where a run ends or breaks), the smallest stride that brings the rate to at most
  ``max_rate`` [Hz] and the channel data to at most ``max_bytes``; the events keep their
  exact times;
* quantisation: each channel component is stored as 16 bits over its own range,
  ``x = lo + q·(hi − lo)/65534``, q = 65535 marking a missing (non-finite) value, so a value is
  off by at most (hi − lo)/131068 (3 · 10⁻⁵ m over a 4 m flight); saturation codes are stored
  as int8, exactly.

16 vehicles × 20 s at 100 Hz with every channel take about 2 MB.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import html as html_lib
import json
import math
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from quadjax.files import write_atomic

ROLES = ("flown", "measured", "predicted")
#: a Track's channels (shapes: :func:`_shape_of`)
_CHANNELS = ("position", "attitude", "body_rates", "rotor_speeds", "commands", "thrust", "saturation", "error")
FORMAT = "quadjax-trace/1"
MISSING = 65535
_LEVELS = 65534


@dataclasses.dataclass(frozen=True)
class Event:
    """Something that happened at time ``t`` [s]: a label, and the track it belongs to (None: the run)."""

    t: float
    label: str
    track: int | None = None


@dataclasses.dataclass(frozen=True)
class Track:
    """One vehicle's history on the trace's time grid (T samples, R rotors; None where unknown).

    position (T, 3) m, world ENU; attitude (T, 4) (w, x, y, z) body → world; body_rates (T, 3)
    rad/s, body; rotor_speeds (T, R) rad/s; commands (T, R) rotor-speed commands [rad/s];
    thrust (T, R) N per rotor; saturation (T, 4) the mixer's report (roll, pitch, yaw,
    collective ∈ {−1, 0, +1}); error (T,) tracking error [m]. ``role``: ``"flown"`` (a
    simulation), ``"measured"`` (a flight log) or ``"predicted"``; ``of``: for a prediction,
    the index of the track it predicts (drawn dashed beside it).
    """

    name: str
    position: np.ndarray
    attitude: np.ndarray | None = None
    body_rates: np.ndarray | None = None
    rotor_speeds: np.ndarray | None = None
    commands: np.ndarray | None = None
    thrust: np.ndarray | None = None
    saturation: np.ndarray | None = None
    error: np.ndarray | None = None
    role: str = "flown"
    of: int | None = None


@dataclasses.dataclass(frozen=True)
class Trace:
    """What the player replays: ``tracks`` on the grid ``t0 + i·dt`` [s] (every track has the same
    number of samples), ``events``, an optional ``reference`` path (T, 3) [m], the ground height
    ``ground_z`` [m], the rotor layout (``rotor_positions`` (R, 3) m body FLU, ``rotor_spins``
    (R,) ±1) and the hover thrust per rotor [N] that scales the thrust arrows."""

    tracks: Sequence[Track]
    dt: float
    t0: float = 0.0
    title: str = "quadjax trace"
    kind: str = "trajectory"
    description: Sequence[str] = ()
    events: Sequence[Event] = ()
    reference: np.ndarray | None = None
    ground_z: float = 0.0
    rotor_positions: np.ndarray | None = None
    rotor_spins: np.ndarray | None = None
    hover_thrust: float | None = None

    def __post_init__(self):
        check_trace(self)

    @property
    def num_samples(self) -> int:
        return int(np.shape(self.tracks[0].position)[0])

    @property
    def num_rotors(self) -> int | None:
        """R: from the rotor layout, else from the first per-rotor channel (None: no such channel)."""
        if self.rotor_positions is not None:
            return int(np.shape(self.rotor_positions)[0])
        return next((np.shape(getattr(tr, n))[1] for tr in self.tracks for n in _PER_ROTOR
                     if getattr(tr, n) is not None and np.ndim(getattr(tr, n)) == 2), None)


#: the channels a track's field is stored as: (stored name, field, components (R: the rotor
#: count), encoding); the Euler angles are derived from the attitude for the plots
_STORED = (("position", "position", 3, "u16"), ("attitude", "attitude", 4, "u16"),
           ("euler", "attitude", 3, "u16"), ("body_rates", "body_rates", 3, "u16"),
           ("rotor_speeds", "rotor_speeds", "R", "u16"), ("commands", "commands", "R", "u16"),
           ("thrust", "thrust", "R", "u16"), ("saturation", "saturation", 4, "i8"), ("error", "error", 1, "u16"))
_BYTES = {"u16": 2, "i8": 1}
_PER_ROTOR = ("rotor_speeds", "commands", "thrust")


def _shape_of(name, R):
    """The trailing shape of a Track field."""
    width = next(w for stored, field, w, _ in _STORED if field == name)
    return () if name == "error" else (R if width == "R" else width,)


def check_trace(trace: Trace) -> None:
    """A ValueError naming the field for a trace the player cannot show as given."""
    if not trace.tracks:
        raise ValueError("Trace.tracks: no tracks")
    if not (isinstance(trace.dt, (int, float, np.floating)) and math.isfinite(trace.dt) and trace.dt > 0):
        raise ValueError(f"Trace.dt={trace.dt!r}: expected a finite time step > 0 [s]")
    if not math.isfinite(trace.t0):
        raise ValueError(f"Trace.t0={trace.t0!r}: expected a finite start time [s]")
    T = int(np.shape(trace.tracks[0].position)[0]) if np.ndim(trace.tracks[0].position) == 2 else 0
    if T < 1:
        raise ValueError(f"Trace.tracks[0].position: shape {np.shape(trace.tracks[0].position)}, expected (T, 3)")
    R = trace.num_rotors
    for k, tr in enumerate(trace.tracks):
        if tr.role not in ROLES:
            raise ValueError(f"Trace.tracks[{k}].role={tr.role!r}: expected one of {ROLES}")
        if tr.of is not None and not (0 <= tr.of < len(trace.tracks) and tr.of != k):
            raise ValueError(f"Trace.tracks[{k}].of={tr.of!r}: expected the index of another track")
        for name in _CHANNELS:
            x = getattr(tr, name)
            if x is None:
                continue
            shape = np.shape(x)
            want = (T,) + _shape_of(name, R)
            if shape != want:
                raise ValueError(f"Trace.tracks[{k}].{name}: shape {shape}, expected {want}")
    if trace.reference is not None and np.shape(trace.reference) != (T, 3):
        raise ValueError(f"Trace.reference: shape {np.shape(trace.reference)}, expected ({T}, 3)")
    for e in trace.events:
        if not (isinstance(e, Event) and math.isfinite(e.t)):
            raise ValueError(f"Trace.events: {e!r} is not an Event with a finite time")
        if e.track is not None and not 0 <= e.track < len(trace.tracks):
            raise ValueError(f"Trace.events: {e!r} names track {e.track}, the trace has {len(trace.tracks)}")


# --------------------------------------------------------------------------- encoding


def quantise(x) -> dict:
    """(T, C) or (T,) floats → 16 bits per value over each component's range (module docstring)."""
    x = np.asarray(x, np.float64)
    flat = x.reshape(x.shape[0], -1)
    finite = np.isfinite(flat)
    lo = np.where(finite, flat, np.inf).min(axis=0)
    hi = np.where(finite, flat, -np.inf).max(axis=0)
    empty = ~np.isfinite(lo)
    lo, hi = np.where(empty, 0.0, lo), np.where(empty, 0.0, hi)
    span = np.where(hi > lo, hi - lo, 1.0)
    q = np.rint((np.where(finite, flat, lo) - lo) / span * _LEVELS)
    q = np.where(finite, q, MISSING).astype("<u2")
    return {"type": "u16", "shape": list(flat.shape), "lo": lo.tolist(), "hi": hi.tolist(),
            "data": base64.b64encode(q.tobytes()).decode("ascii")}


def dequantise(enc: dict) -> np.ndarray:
    """The inverse of :func:`quantise` (and of the int8 codes): (T, C) float64, NaN where missing."""
    raw = base64.b64decode(enc["data"])
    shape = tuple(enc["shape"])
    if enc["type"] == "i8":
        return np.frombuffer(raw, np.int8).reshape(shape).astype(np.float64)
    q = np.frombuffer(raw, "<u2").reshape(shape).astype(np.float64)
    lo, hi = np.asarray(enc["lo"]), np.asarray(enc["hi"])
    return np.where(q == MISSING, np.nan, lo + q * (hi - lo) / _LEVELS)


def _codes(x) -> dict:
    x = np.asarray(x)
    flat = np.clip(np.rint(np.nan_to_num(x.reshape(x.shape[0], -1))), -128, 127).astype(np.int8)
    return {"type": "i8", "shape": list(flat.shape), "data": base64.b64encode(flat.tobytes()).decode("ascii")}


@functools.cache
def _euler_fn():
    import jax

    from quadjax.frames import quat_to_euler321

    return jax.jit(quat_to_euler321)


def _euler_deg(attitude) -> np.ndarray:
    """(T, 4) quaternions → (T, 3) roll, pitch, yaw [deg], by :func:`quadjax.frames.quat_to_euler321`
    (in the attitude's dtype: float32 where JAX runs without x64)."""
    return np.degrees(np.asarray(_euler_fn()(np.asarray(attitude)), np.float64))


def _unwrapped(degrees) -> np.ndarray:
    """Angles (T, C) [deg] without the ±180° jumps (a flip, a turn past south draws no vertical
    line), across gaps of missing values."""
    out = np.array(degrees, np.float64)
    for c in range(out.shape[1]):
        ok = np.isfinite(out[:, c])
        if ok.any():
            out[ok, c] = np.unwrap(out[ok, c], period=360.0)
    return out


def _channels(tr: Track, rows) -> dict:
    out = {}
    for stored, field, _, encoding in _STORED:
        x = getattr(tr, field)
        if x is None:
            continue
        x = _unwrapped(_euler_deg(np.asarray(x))) if stored == "euler" else np.asarray(x)
        out[stored] = (_codes if encoding == "i8" else quantise)(x[rows])
    return out


def _bytes_per_sample(trace: Trace) -> int:
    R = trace.num_rotors or 0
    n = sum((R if width == "R" else width) * _BYTES[encoding]
            for tr in trace.tracks for _, field, width, encoding in _STORED if getattr(tr, field) is not None)
    return n + (3 * _BYTES["u16"] if trace.reference is not None else 0)


def stride_for(trace: Trace, max_rate: float, max_bytes: float) -> int:
    """The smallest integer stride that keeps the rate ≤ ``max_rate`` and the data ≤ ``max_bytes``."""
    if not (max_rate > 0 and max_bytes > 0):
        raise ValueError(f"max_rate={max_rate!r}, max_bytes={max_bytes!r}: expected both > 0")
    by_rate = math.ceil(1.0 / (trace.dt * max_rate) - 1e-9)
    by_size = math.ceil(trace.num_samples * _bytes_per_sample(trace) / max_bytes - 1e-9)
    return max(1, by_rate, by_size)


def _panels(trace: Trace) -> list[dict]:
    have = {name for tr in trace.tracks for name in _CHANNELS if getattr(tr, name) is not None}
    rotors = [str(i) for i in range(trace.num_rotors or 4)]
    # min_span: the smallest y range shown, so that rounding noise is not blown up to full height
    panels = [{"title": "position [m]", "channel": "position", "labels": ["x", "y", "z"], "min_span": 0.1,
               "reference": trace.reference is not None, "note": "dashed: reference" if trace.reference is not None
               else ""}]
    if "attitude" in have:
        panels.append({"title": "attitude [deg]", "channel": "euler", "labels": ["roll", "pitch", "yaw"],
                       "min_span": 2.0})
    if "body_rates" in have:
        panels.append({"title": "body rates [rad/s]", "channel": "body_rates", "labels": ["p", "q", "r"], "min_span": 0.2})
    if "rotor_speeds" in have:
        panels.append({"title": "rotor speeds [rad/s]", "channel": "rotor_speeds", "labels": rotors, "min_span": 10.0,
                       "dashed": "commands" if "commands" in have else None,
                       "note": "dotted: command" if "commands" in have else ""})
    elif "commands" in have:
        panels.append({"title": "rotor-speed commands [rad/s]", "channel": "commands", "labels": rotors})
    if "saturation" in have:
        panels.append({"title": "mixer saturation", "channel": "saturation",
                       "labels": ["roll", "pitch", "yaw", "collective"], "step": True,
                       "note": "+1 delivered less, −1 more"})
    if "error" in have:
        panels.append({"title": "tracking error [m]", "channel": "error", "labels": ["|e|"], "min_span": 0.01})
    if any(tr.role == "predicted" for tr in trace.tracks):
        panels[0]["note"] = (panels[0]["note"] + "; " if panels[0]["note"] else "") + "dashed: predicted"
    return panels


def page_data(trace: Trace, *, max_rate: float = 100.0, max_bytes: float = 12e6) -> dict:
    """The JSON the page carries: the decimated, quantised trace (module docstring)."""
    stride = stride_for(trace, max_rate, max_bytes)
    first = (trace.num_samples - 1) % stride  # the last sample is always kept: where a run ends or breaks
    rows = slice(first, None, stride)
    T = len(range(trace.num_samples)[rows])
    tracks = [{"name": tr.name, "role": tr.role, "of": tr.of, "channels": _channels(tr, rows)} for tr in trace.tracks]
    rotors = None
    if trace.rotor_positions is not None:
        spins = trace.rotor_spins if trace.rotor_spins is not None else np.ones(len(trace.rotor_positions))
        rotors = {"positions": np.asarray(trace.rotor_positions, float).tolist(), "spins": np.asarray(spins).tolist()}
    return {
        "format": FORMAT, "title": trace.title, "kind": trace.kind, "description": list(trace.description),
        "t0": float(trace.t0 + first * trace.dt), "dt": float(trace.dt) * stride, "count": T, "stride": stride,
        "source_dt": float(trace.dt), "ground_z": float(trace.ground_z), "rotors": rotors,
        "hover_thrust": None if trace.hover_thrust is None else float(trace.hover_thrust),
        "reference": None if trace.reference is None else quantise(np.asarray(trace.reference)[rows]),
        "tracks": tracks, "selected": 0, "panels": _panels(trace),
        "events": [{"t": float(e.t), "label": e.label, "track": e.track} for e in sorted(trace.events, key=lambda e: e.t)],
    }


def _asset(name: str) -> str:
    return resources.files("quadjax.player").joinpath("assets", name).read_text(encoding="utf-8")


def render_html(trace: Trace, **kw) -> str:
    """The whole page: the trace as JSON, the player's script and style inline."""
    data = json.dumps(page_data(trace, **kw), separators=(",", ":"), allow_nan=False)
    data = data.replace("<", "\\u003c")  # nothing in the JSON can close the <script> element
    script = _asset("player.js").replace("</script", "<\\/script")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html_lib.escape(trace.title)}</title>\n"
        "<meta name=\"generator\" content=\"quadjax.player\">\n"
        f"<style>\n{_asset('player.css')}</style>\n</head>\n<body>\n"
        "<div id=\"quadjax-player\" class=\"qj\"></div>\n"
        f"<script type=\"application/json\" id=\"quadjax-trace\">{data}</script>\n"
        f"<script>\n{script}</script>\n</body>\n</html>\n"
    )


def write_html(text: str, path) -> Path:
    """Write a page's text to ``path`` atomically; returns the path."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"{path}: folder {path.parent} does not exist")
    data = text.encode("utf-8")
    return write_atomic(path, lambda f: f.write(data))


def write_page(trace: Trace, path, **kw) -> Path:
    """Write the page for ``trace`` to ``path`` atomically (``kw``: :func:`page_data`'s); returns the path."""
    return write_html(render_html(trace, **kw), path)
