"""Multiple-shooting windows: short open-loop predictions that start from measured states."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass
from quadjax.logs import FlightLog
from quadjax.state import QuadState

#: what drives the model: measured rotor speeds (rotors follow them exactly), or motor commands
#: (through a MotorMap and the rotor lag ``motor_tau``)
INPUT_MODES = ("rotor_speeds", "commands")


@pytree_dataclass
class Windows:
    """W windows of H steps, cut from flight logs (every leaf has leading axes (W, ...)).

    Fields:
        state0: QuadState (W, ...), the measured state at each window's start
            (rotor speeds: measured, or 0 where unmeasured — see ``rotor0_known``).
        inputs: (W, H, R), the input held over step k (rotor speeds [rad/s] or motor commands).
        position, velocity: (W, H, 3) measured at steps 1..H [m, m/s], world.
        attitude: (W, H, 4) measured quaternions (w, x, y, z).
        body_rates: (W, H, 3) [rad/s], body.
        rotor_speeds: (W, H, R) measured [rad/s] (0 where unmeasured).
        mask: (W, H) 1.0 where a target row counts, 0.0 where it is stale or missing.
        rotor0_known: (W,) 1.0 where the start's rotor speeds were measured.
        rotors_measured: (W,) 1.0 where the window has measured rotor speeds.
        flight: (W,) index of the log each window comes from (a float, for vmap).
    """

    state0: QuadState
    inputs: jax.Array
    position: jax.Array
    velocity: jax.Array
    attitude: jax.Array
    body_rates: jax.Array
    rotor_speeds: jax.Array
    mask: jax.Array
    rotor0_known: jax.Array
    rotors_measured: jax.Array
    flight: jax.Array

    @property
    def num_windows(self) -> int:
        return self.inputs.shape[0]

    @property
    def horizon(self) -> int:
        return self.inputs.shape[1]

    def take(self, index) -> "Windows":
        """A subset of the windows (index array or slice along W)."""
        return jax.tree_util.tree_map(lambda x: x[index], self)


def window_starts(length: int, horizon: int, stride: int) -> np.ndarray:
    """Start rows 0, stride, … of every window of ``horizon`` steps that fits in ``length`` rows."""
    if horizon < 1 or stride < 1:
        raise ValueError(f"horizon and stride must be >= 1, got {horizon}, {stride}")
    return np.arange(0, max(length - horizon, 0), stride)


def make_windows(
    logs: FlightLog | Sequence[FlightLog],
    horizon: int,
    *,
    stride: int | None = None,
    inputs: str = "rotor_speeds",
    input_delay: int = 0,
    mask_stale: bool = True,
    max_windows: int | None = None,
    dtype=None,
) -> Windows:
    """Cut windows of ``horizon`` steps from each log, vmappable over windows and flights alike.

    Args:
        logs: one log or several (all with the same dt and rotor count).
        horizon: H, prediction steps per window.
        stride: rows between window starts (default H: windows do not overlap,
            so their errors are independent — what the sandwich covariance assumes).
        inputs: 'rotor_speeds' (the log's measured speeds drive the model) or
            'commands' (the log's motor commands, through a MotorMap and the rotor lag).
        input_delay: d ≥ 0 or < 0 samples; input k of a window starting at row i is
            row i + k − d of the log (a transport delay between input and response).
        mask_stale: give no weight to target rows the log marks as stale.
        max_windows: keep at most this many, evenly spread over all windows.
        dtype: float dtype of the arrays (default: JAX's default float).
    """
    if inputs not in INPUT_MODES:
        raise ValueError(f"inputs={inputs!r}: choose one of {INPUT_MODES}")
    logs = [logs] if isinstance(logs, FlightLog) else list(logs)
    if not logs:
        raise ValueError("make_windows: no logs given")
    dt = logs[0].dt
    stride = horizon if stride is None else stride
    dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype
    parts = []
    for n, log in enumerate(logs):
        if abs(log.dt - dt) > 1e-9 * dt:
            raise ValueError(f"log {log.name}: dt {log.dt} differs from {dt} of the first log")
        u = log.rotor_speeds if inputs == "rotor_speeds" else log.motor_commands
        if u is None:
            what = "rotor speeds" if inputs == "rotor_speeds" else "motor commands"
            raise ValueError(f"log {log.name}: has no {what} for inputs={inputs!r}")
        starts = window_starts(len(log), horizon, stride)
        if starts.size == 0:
            continue
        k = np.arange(horizon)
        rows_in = np.clip(starts[:, None] + k[None, :] - input_delay, 0, len(log) - 1)
        rows_out = starts[:, None] + k[None, :] + 1
        R = u.shape[1]
        measured = log.rotor_speeds is not None
        rotors = log.rotor_speeds if measured else np.zeros((len(log), R))
        stale = log.stale if (mask_stale and log.stale is not None) else np.zeros(len(log), bool)
        parts.append(dict(
            position0=log.position[starts], velocity0=log.velocity[starts], attitude0=log.attitude[starts],
            body_rates0=log.body_rates[starts], rotors0=rotors[starts],
            inputs=u[rows_in], position=log.position[rows_out], velocity=log.velocity[rows_out],
            attitude=log.attitude[rows_out], body_rates=log.body_rates[rows_out], rotor_speeds=rotors[rows_out],
            mask=(~stale[rows_out]).astype(np.float64),
            rotor0_known=np.full(starts.size, float(measured)),
            rotors_measured=np.full(starts.size, float(measured)),
            flight=np.full(starts.size, float(n)),
        ))
    if not parts:
        raise ValueError(f"make_windows: no log is longer than horizon={horizon}")
    if len({p["inputs"].shape[-1] for p in parts}) != 1:
        raise ValueError("make_windows: logs have different rotor counts")
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    W = cat["inputs"].shape[0]
    if max_windows is not None and W > max_windows:
        keep = np.unique(np.linspace(0, W - 1, max_windows).round().astype(int))
        cat = {k: v[keep] for k, v in cat.items()}
        W = keep.size
    a = {k: jnp.asarray(v, dtype) for k, v in cat.items()}
    state0 = QuadState(
        position=a["position0"], velocity=a["velocity0"], attitude=a["attitude0"], body_rates=a["body_rates0"],
        rotor_speeds=a["rotors0"], energy=jnp.zeros(W, dtype), on_ground=jnp.zeros(W, dtype),
    )
    return Windows(
        state0=state0, inputs=a["inputs"], position=a["position"], velocity=a["velocity"],
        attitude=a["attitude"], body_rates=a["body_rates"], rotor_speeds=a["rotor_speeds"], mask=a["mask"],
        rotor0_known=a["rotor0_known"], rotors_measured=a["rotors_measured"], flight=a["flight"],
    )
