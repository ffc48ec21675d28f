"""Open-loop validation in the protocol of the nano-drone benchmark (Busetto et al., CEP 2026).

From every start index i of a held-out flight: take the measured state at i,
feed the measured inputs held over each step (zero-order hold), predict h steps
open loop, and compare with the measured state at i + h. Reported per horizon
h = 1..H, averaged over all start indices (of all flights given):

    e_p(h) = mean_i ‖p̂ − p‖ [m],  e_v(h) = mean_i ‖v̂ − v‖ [m/s],
    e_q(h) = mean_i ∠(q̂, q) [rad] (geodesic angle),  e_ω(h) = mean_i ‖ω̂ − ω‖ [rad/s],

and the sum over h = 1..H of each. The naive predictor holds the start state
constant (x̂(i + h) = x(i)).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.logs import FlightLog
from quadjax.params import QuadParams, params_valid
from quadjax.quaternion import quat_angle_between
from quadjax.sysid.motor import MotorMap
from quadjax.sysid.objective import predict
from quadjax.sysid.windows import Windows, make_windows

QUANTITIES = ("position", "velocity", "attitude", "body_rates")
UNITS = {"position": "m", "velocity": "m/s", "attitude": "rad", "body_rates": "rad/s"}


@dataclasses.dataclass(frozen=True)
class OpenLoopErrors:
    """Mean open-loop errors per horizon h = 1..H (each (H,) array), over ``n_starts`` start indices."""

    position: np.ndarray
    velocity: np.ndarray
    attitude: np.ndarray
    body_rates: np.ndarray
    n_starts: int

    @property
    def max_horizon(self) -> int:
        return len(self.position)

    def at(self, h: int) -> dict:
        """{quantity: mean error} at horizon h (1-based)."""
        if not 1 <= h <= self.max_horizon:
            raise ValueError(f"horizon {h} outside 1..{self.max_horizon}")
        return {q: float(getattr(self, q)[h - 1]) for q in QUANTITIES}

    def total(self) -> dict:
        """{quantity: Σ_{h=1..H} mean error}."""
        return {q: float(np.sum(getattr(self, q))) for q in QUANTITIES}

    def summary(self, horizons=(1, 10, 50)) -> dict:
        """{"h1": {...}, "h10": {...}, "h50": {...}, "sum": {...}, "n_starts": N} for the horizons that exist."""
        out = {f"h{h}": self.at(h) for h in horizons if h <= self.max_horizon}
        out["sum"] = self.total()
        out["n_starts"] = self.n_starts
        return out


def _errors(pred_p, pred_v, pred_q, pred_w, w: Windows):
    """Per-window, per-step errors (4, H): Euclidean norms and the geodesic angle."""
    return jnp.stack([
        jnp.linalg.norm(pred_p - w.position, axis=-1),
        jnp.linalg.norm(pred_v - w.velocity, axis=-1),
        quat_angle_between(pred_q, w.attitude),
        jnp.linalg.norm(pred_w - w.body_rates, axis=-1),
    ])


def _summed_errors(params, motor_map, windows: Windows, valid, dt, mode, substeps, batch_size, naive):
    """Σ over the valid windows of the (4, H) errors, in batches of ``batch_size`` to bound memory
    (W is a multiple of it: see :func:`_pad`)."""
    def one(w):
        if naive:
            H = w.inputs.shape[0]
            s = w.state0
            rep = lambda x: jnp.broadcast_to(x, (H,) + x.shape)  # noqa: E731
            return _errors(rep(s.position), rep(s.velocity), rep(s.attitude), rep(s.body_rates), w)
        pred = predict(params, motor_map, w.state0, w.inputs, dt, mode=mode, substeps=substeps,
                       rotor0_known=w.rotor0_known)
        return _errors(pred.position, pred.velocity, pred.attitude, pred.body_rates, w)

    per = jax.lax.map(one, windows, batch_size=batch_size)
    return jnp.sum(per * valid[:, None, None], axis=0)


def _pad(windows: Windows, batch_size: int):
    """Windows padded (with copies of the first) to a multiple of ``batch_size``, and the valid mask (W',).

    ``lax.map`` would otherwise compile the model a second time for the remainder.
    """
    W = windows.num_windows
    batch = min(batch_size, W)
    extra = -W % batch
    idx = np.concatenate([np.arange(W), np.zeros(extra, int)])
    valid = np.concatenate([np.ones(W), np.zeros(extra)])
    return windows.take(idx), valid, batch


_summed_errors_jit = jax.jit(_summed_errors, static_argnames=("mode", "substeps", "batch_size", "naive"))


def open_loop_errors(
    params: QuadParams | None,
    logs: FlightLog | Sequence[FlightLog],
    *,
    motor_map: MotorMap | None = None,
    inputs: str = "rotor_speeds",
    max_horizon: int = 50,
    stride: int = 1,
    substeps: int = 1,
    input_delay: int = 0,
    batch_size: int = 512,
    dtype=None,
) -> OpenLoopErrors:
    """Mean open-loop prediction errors of ``params`` on ``logs`` for h = 1..max_horizon.

    ``params=None`` gives the naive (constant-state) predictor. ``stride`` > 1
    subsamples the start indices (1 = every start index, the benchmark
    protocol). Every start with a full horizon inside a log counts, stale rows
    included. ``input_delay`` d: input k of the start at row i is row i + k − d (d < 0 for
    telemetry that trails the response it drives, as in :func:`make_windows`). Jitted inside
    (one compilation per shape and mode).
    """
    logs = [logs] if isinstance(logs, FlightLog) else list(logs)
    if params is not None and not bool(params_valid(params)):
        raise ValueError("open_loop_errors: params are not valid (see quadjax.params_valid)")
    dtype = dtype or (params.mass.dtype if params is not None else None)
    total, count = None, 0
    for log in logs:
        w = make_windows(log, max_horizon, stride=stride, inputs=inputs, input_delay=input_delay, mask_stale=False,
                         dtype=dtype)
        if params is None:
            mm, p = None, None
        else:
            p = params
            mm = motor_map if motor_map is not None else MotorMap.identity(params.num_rotors, dtype=params.mass.dtype)
        padded, valid, batch = _pad(w, batch_size)
        s = _summed_errors_jit(p, mm, padded, jnp.asarray(valid, padded.inputs.dtype), log.dt, inputs, substeps,
                               batch, params is None)
        total = s if total is None else total + s
        count += w.num_windows
    mean = np.asarray(total) / count
    return OpenLoopErrors(*mean, n_starts=count)


def naive_errors(logs, *, max_horizon: int = 50, stride: int = 1) -> OpenLoopErrors:
    """The constant-state predictor's errors on ``logs`` (same protocol as :func:`open_loop_errors`)."""
    return open_loop_errors(None, logs, max_horizon=max_horizon, stride=stride)


#: the isotropic inertia [kg·m²] of :func:`physics_baseline`: the rotors' moments then turn the
#: body rates by under 1e-5 rad/s over a 50-step horizon (a Crazyflie's ~1e-3 N·m)
_RATES_HELD = 1.0e3


def physics_baseline(params: QuadParams) -> QuadParams:
    """The nano-drone paper's physics baseline as params of this model: thrust k_f Σωᵢ² along body z
    and gravity, no drag, and zero angular acceleration, i.e. position, velocity and attitude
    integrated with the body rates held at their start.

    The rates are held by an isotropic inertia of :data:`_RATES_HELD` kg·m² (ω × Jω = 0 for an
    isotropic J, and M / J vanishes), so the prediction runs through the same engine and
    protocol as every other row."""
    dtype = params.mass.dtype
    zero3 = jnp.zeros(3, dtype)
    return params.replace(inertia=jnp.eye(3, dtype=dtype) * _RATES_HELD, drag_linear=zero3, drag_quadratic=zero3,
                          drag_rotational=zero3, rotor_inertia=jnp.zeros((), dtype))


def format_table(rows: dict, horizons=(1, 10, 50), published: dict | None = None) -> str:
    """A Markdown table: one row per model (name → OpenLoopErrors), columns per horizon and the sum."""
    cols = []
    for h in horizons:
        cols += [(f"h{h}", q) for q in QUANTITIES]
    head = ["model"] + [f"{q.replace('_', ' ')} h={k[1:]} [{UNITS[q]}]" for k, q in cols] + \
        [f"Σ {q.replace('_', ' ')} [{UNITS[q]}]" for q in QUANTITIES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, err in rows.items():
        s = err.summary(horizons)
        cells = [name] + [f"{s[k][q]:.4f}" if k in s else "—" for k, q in cols] + \
            [f"{s['sum'][q]:.3f}" for q in QUANTITIES]
        lines.append("| " + " | ".join(cells) + " |")
    for name, vals in (published or {}).items():
        cells = [name] + [f"{vals[(k, q)]:.3f}" if (k, q) in vals else "—" for k, q in cols] + ["—"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
