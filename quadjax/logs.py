"""Flight logs in the project's conventions: a loader for the nano-drone benchmark and a generic CSV.

Everything a log holds is converted here, once, on the way in (GUIDE §2): SI
units, world ENU (z up), body FLU, quaternion (w, x, y, z) body → world, rotor
order PX4 Quad X (0 FR, 1 RL, 2 FL, 3 RR), rotor speeds in rad/s.

Generic CSV schema (:func:`load_csv`, :func:`save_csv`)
-------------------------------------------------------
One header line of column names, then one row per sample on a uniform time
grid; lines starting with ``#`` are comments. Column order is free.

======================  ========  ===============================================
column                  unit      meaning
======================  ========  ===============================================
``t``                   s         time, uniform steps (required)
``x, y, z``             m         position, world ENU (required)
``vx, vy, vz``          m/s       velocity, world ENU (required)
``qw, qx, qy, qz``      1         attitude, body (FLU) → world, scalar first (required)
``wx, wy, wz``          rad/s     body rates, body frame FLU (required)
``omega0 .. omega{R-1}`` rad/s    measured rotor speeds, PX4 order (optional)
``u0 .. u{R-1}``        any       motor commands, PX4 order (optional; a
                                  :class:`quadjax.sysid.MotorMap` maps them to rad/s)
``ax, ay, az``          m/s²      specific force (acceleration + g e_z), world (optional)
``vbat``                V         battery voltage (optional)
======================  ========  ===============================================

Logs in other conventions (NED, scalar-last quaternions, other motor orders,
RPM) are converted before writing, with :mod:`quadjax.frames`. Loading refuses
rotor speeds that cannot be rad/s magnitudes (:func:`check_rotor_speeds`):
negative ones, and ones faster than any multirotor spins (RPM or eRPM fed as rad/s).

The nano-drone benchmark (:func:`load_nanodrone`)
-------------------------------------------------
Crazyflie 2.1 Brushless flights (Busetto et al., CEP 2026), one parquet file
per flight, described in ``../shared/data/nanodrone/README.md``. The loader
repeats the processing of the paper's repository, in its order: fill NaNs,
despike the eRPM telemetry, eRPM → rad/s, align the motor columns by the run's
lag, crop to the trajectory window, zero-phase Butterworth low-pass filters.
Not repeated: the subtraction of the mean offset to the planner's simulated
flight (those simulations are not part of the data). Reading parquet needs
pandas and pyarrow (``pip install quadjax[logs]``); the filters need scipy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import numpy as np

from quadjax.frames import reorder_rotors, rpm_to_rad_s
from quadjax.quaternion import quat_rotate_inverse

# --- the log container --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FlightLog:
    """One flight on a uniform time grid, in the project's conventions (numpy arrays).

    Fields (T samples, R rotors):
        name: str, where it came from.
        t: (T,) s, uniform steps of ``dt``.
        position: (T, 3) m, world ENU.
        velocity: (T, 3) m/s, world ENU.
        attitude: (T, 4) unit quaternion (w, x, y, z), body (FLU) → world.
        body_rates: (T, 3) rad/s, body frame.
        rotor_speeds: (T, R) rad/s, measured, PX4 order; or None.
        motor_commands: (T, R) motor commands, PX4 order (unit of the source); or None.
        specific_force: (T, 3) m/s², world, acceleration + g e_z; or None.
        battery_voltage: (T,) V; or None.
        stale: (T,) bool, True where the state row repeats the previous one
            exactly in the raw log (a dropped packet filled by resampling).
    """

    name: str
    t: np.ndarray
    position: np.ndarray
    velocity: np.ndarray
    attitude: np.ndarray
    body_rates: np.ndarray
    rotor_speeds: np.ndarray | None = None
    motor_commands: np.ndarray | None = None
    specific_force: np.ndarray | None = None
    battery_voltage: np.ndarray | None = None
    stale: np.ndarray | None = None

    def __post_init__(self):
        T = np.shape(self.t)[0] if np.ndim(self.t) == 1 else -1
        if T < 2:
            raise ValueError(f"FlightLog.t: need a 1-D time axis of at least 2 samples, got shape {np.shape(self.t)}")
        want = {"position": 3, "velocity": 3, "attitude": 4, "body_rates": 3, "specific_force": 3}
        for name in ("position", "velocity", "attitude", "body_rates", "rotor_speeds", "motor_commands",
                     "specific_force", "battery_voltage", "stale"):
            value = getattr(self, name)
            if value is None:
                continue
            shape = np.shape(value)
            if shape[:1] != (T,):
                raise ValueError(f"FlightLog.{name}: {shape[0] if shape else 'no'} samples, t has {T}")
            if name in want and shape[1:] != (want[name],):
                raise ValueError(f"FlightLog.{name}: shape {shape}, expected ({T}, {want[name]})")
            if name in ("rotor_speeds", "motor_commands") and len(shape) != 2:
                raise ValueError(f"FlightLog.{name}: shape {shape}, expected ({T}, R)")
            if name != "stale" and not np.all(np.isfinite(value)):
                raise ValueError(f"FlightLog.{name}: contains NaN or inf (fill gaps before building a log)")
        steps = np.diff(self.t)
        if not np.allclose(steps, steps[0], rtol=1e-6, atol=1e-9) or steps[0] <= 0:
            raise ValueError("FlightLog.t: time steps must be uniform and positive")

    @property
    def dt(self) -> float:
        """Sample period [s]."""
        return float(self.t[1] - self.t[0])

    def __len__(self) -> int:
        return int(np.shape(self.t)[0])

    def crop(self, start: int, stop: int | None = None) -> "FlightLog":
        """Rows ``start:stop`` of every field."""
        sl = slice(start, stop)
        changes = {
            f.name: getattr(self, f.name)[sl]
            for f in dataclasses.fields(self)
            if f.name != "name" and getattr(self, f.name) is not None
        }
        return dataclasses.replace(self, **changes)

    def replace(self, **changes) -> "FlightLog":
        """A copy with some fields replaced (checked again)."""
        return dataclasses.replace(self, **changes)


# --- small conversions at the edge --------------------------------------------------


def quat_xyzw_to_wxyz(q):
    """Scalar-last (x, y, z, w) → scalar-first (w, x, y, z) quaternion, (..., 4)."""
    q = np.asarray(q)
    return np.concatenate([q[..., 3:4], q[..., 0:3]], axis=-1)


def erpm_to_rad_s(erpm, pole_pairs: int = 6):
    """Electrical RPM (DSHOT telemetry) → rotor speed [rad/s]: ω = eRPM / pole_pairs · 2π/60."""
    return np.asarray(rpm_to_rad_s(np.asarray(erpm, dtype=np.float64) / pole_pairs))


def quat_log(q):
    """Rotation vector [rad] (..., 3) of unit quaternions (..., 4) (w, x, y, z); angle in [0, π]."""
    q = np.where(q[..., :1] < 0, -q, q)
    v = q[..., 1:]
    s = np.linalg.norm(v, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(s, q[..., :1])
    # angle/s → 2 as s → 0 (first-order series), avoiding 0/0
    scale = np.where(s > 1e-12, angle / np.where(s > 1e-12, s, 1.0), 2.0)
    return v * scale


def quat_exp(r):
    """Unit quaternion (w, x, y, z) of rotation vectors r (..., 3) [rad]."""
    angle = np.linalg.norm(r, axis=-1, keepdims=True)
    half = 0.5 * angle
    scale = np.where(angle > 1e-12, np.sin(half) / np.where(angle > 1e-12, angle, 1.0), 0.5)
    return np.concatenate([np.cos(half), r * scale], axis=-1)


def stale_rows(*columns) -> np.ndarray:
    """(T,) True where every given (T, k) column repeats its previous row exactly (row 0: False)."""
    stacked = np.concatenate([np.asarray(c).reshape(len(c), -1) for c in columns], axis=1)
    same = np.all(stacked[1:] == stacked[:-1], axis=1)
    return np.concatenate([[False], same])


# --- plausibility of rotor speeds ------------------------------------------------------

#: [rad/s] no multirotor spins faster: the smallest props (~31 mm, r ≈ 15 mm) reach Mach 1 at the
#: tip near 22 000 rad/s, and nothing flies with supersonic tips. Log speeds above it are in another
#: unit (RPM is 9.55× the rad/s figure, eRPM more); a big vehicle's RPM can stay below it, which is
#: what the params-aware check of ``quadjax.sysid.fit`` (``omega_max=``) is for.
MAX_ROTOR_SPEED = 2.0e4

#: with the params known, speeds above this many times omega_max are a unit error: measured speeds
#: overshoot the command clamp a little, and a start guess may be tens of % off, but the smallest unit
#: mistake (RPM for rad/s) is 9.55×
OMEGA_MAX_FACTOR = 3.0

#: measured speeds are magnitudes ≥ 0; sensor noise at standstill and a filter's ringing at a
#: spin-up dip slightly below 0 (the real nano-drone flights: −9 rad/s of a 2 500 rad/s peak, 0.4 %).
#: A log that signs speeds by spin direction dips to −peak.
NEGATIVE_TOLERANCE = 0.05


def check_rotor_speeds(speeds, source, *, columns=None, omega_max=None) -> None:
    """``ValueError`` naming ``source`` (a file or a log), the column and the value where rotor
    speeds (T, R) [rad/s] are negative beyond noise (more than :data:`NEGATIVE_TOLERANCE` of the
    column's peak, and 1 rad/s) or too fast to be rad/s: above :data:`MAX_ROTOR_SPEED`, or above
    :data:`OMEGA_MAX_FACTOR` × ``omega_max`` where the vehicle's params are known.

    ``columns``: the names to report (default ``omega0 .. omega{R-1}``, the generic CSV's).
    """
    speeds = np.asarray(speeds, np.float64).reshape(np.shape(speeds)[0], -1)
    columns = columns or [f"omega{i}" for i in range(speeds.shape[1])]
    if omega_max is None:
        limit, why = MAX_ROTOR_SPEED, f"faster than any multirotor's rotors ({MAX_ROTOR_SPEED:.0f} rad/s)"
    else:
        limit = OMEGA_MAX_FACTOR * float(omega_max)
        why = f"over {OMEGA_MAX_FACTOR:g} × the params' omega_max ({float(omega_max):.6g} rad/s)"
    for j, name in enumerate(columns):
        col = speeds[:, j]
        peak, low = float(np.max(np.abs(col))), float(np.min(col))
        if low < -max(1.0, NEGATIVE_TOLERANCE * peak):
            raise ValueError(f"{source}: column {name}: rotor speeds down to {low:.6g} rad/s; they must be "
                             "magnitudes >= 0 (write the absolute values of speeds signed by spin direction)")
        if float(np.max(col)) > limit:
            raise ValueError(f"{source}: column {name}: rotor speeds up to {float(np.max(col)):.6g}, {why}: "
                             "not rad/s? RPM → rad/s: quadjax.frames.rpm_to_rad_s (× 2π/60); eRPM: "
                             "quadjax.logs.erpm_to_rad_s")


@contextlib.contextmanager
def _reading(path: Path):
    """Turn a failure to read or parse ``path`` into ``ValueError`` "<path>: <reason>"."""
    try:
        yield
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror or err})") from None
    except ValueError as err:  # numpy's and pyarrow's parse errors (UnicodeDecodeError too)
        text = str(err)
        if text.startswith((f"{path}:", f"{path.name}:")):
            raise
        raise ValueError(f"{path}: {text}") from None


# --- generic CSV ----------------------------------------------------------------------

_REQUIRED = {
    "position": ("x", "y", "z"),
    "velocity": ("vx", "vy", "vz"),
    "attitude": ("qw", "qx", "qy", "qz"),
    "body_rates": ("wx", "wy", "wz"),
}


def load_csv(path, name: str | None = None) -> FlightLog:
    """A :class:`FlightLog` from a CSV in the generic schema (module docstring). numpy only.

    Raises ``ValueError`` naming the file and the problem: unreadable, not numbers, a
    missing or repeated column, a NaN, a non-uniform time grid, or rotor speeds that
    are negative or not in rad/s (:func:`check_rotor_speeds`).
    """
    path = Path(path)
    with _reading(path):
        return _csv_log(path, name)


def _csv_log(path: Path, name: str | None) -> FlightLog:
    with open(path, encoding="utf-8") as fh:
        lines = [ln for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) < 3:
        raise ValueError(f"{path}: need a header and at least 2 rows")
    header = [h.strip() for h in lines[0].split(",")]
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise ValueError(f"{path}: column(s) {repeated} appear more than once")
    data = np.loadtxt(lines[1:], delimiter=",", ndmin=2)
    if data.shape[1] != len(header):
        raise ValueError(f"{path}: {len(header)} column names but {data.shape[1]} values per row")
    col = {h: data[:, i] for i, h in enumerate(header)}
    for needed in ("t",) + sum(_REQUIRED.values(), ()):
        if needed not in col:
            raise ValueError(f"{path}: missing required column {needed!r}")

    def group(prefix):
        names = sorted((h for h in header if h.startswith(prefix) and h[len(prefix):].isdigit()),
                       key=lambda h: int(h[len(prefix):]))
        if not names:
            return None
        if [int(h[len(prefix):]) for h in names] != list(range(len(names))):
            raise ValueError(f"{path}: columns {names} must be numbered {prefix}0..{prefix}{len(names) - 1}")
        return np.stack([col[h] for h in names], axis=1)

    def maybe(names):
        return np.stack([col[h] for h in names], axis=1) if all(h in col for h in names) else None

    q = np.stack([col[h] for h in _REQUIRED["attitude"]], axis=1)
    omega = group("omega")
    if omega is not None:
        check_rotor_speeds(omega, path)
    return FlightLog(
        name=name or path.stem,
        t=col["t"],
        position=np.stack([col[h] for h in _REQUIRED["position"]], axis=1),
        velocity=np.stack([col[h] for h in _REQUIRED["velocity"]], axis=1),
        attitude=q / np.linalg.norm(q, axis=1, keepdims=True),
        body_rates=np.stack([col[h] for h in _REQUIRED["body_rates"]], axis=1),
        rotor_speeds=omega,
        motor_commands=group("u"),
        specific_force=maybe(("ax", "ay", "az")),
        battery_voltage=col.get("vbat"),
    )


def save_csv(log: FlightLog, path) -> None:
    """Write ``log`` in the generic CSV schema (the inverse of :func:`load_csv`)."""
    names = ["t"] + list(sum(_REQUIRED.values(), ()))
    cols = [log.t[:, None], log.position, log.velocity, log.attitude, log.body_rates]
    if log.rotor_speeds is not None:
        names += [f"omega{i}" for i in range(log.rotor_speeds.shape[1])]
        cols.append(log.rotor_speeds)
    if log.motor_commands is not None:
        names += [f"u{i}" for i in range(log.motor_commands.shape[1])]
        cols.append(log.motor_commands)
    if log.specific_force is not None:
        names += ["ax", "ay", "az"]
        cols.append(log.specific_force)
    if log.battery_voltage is not None:
        names.append("vbat")
        cols.append(log.battery_voltage[:, None])
    header = f"# quadjax flight log {log.name}: SI, world ENU, body FLU, q (w,x,y,z) body->world, PX4 rotor order\n"
    np.savetxt(path, np.concatenate(cols, axis=1), delimiter=",", header=",".join(names), comments=header,
               fmt="%.9g")


# --- the nano-drone benchmark -----------------------------------------------------------

#: file stem → (trajectory window start row, rows, motor lag in samples), from the data README
NANODRONE_RUNS = {
    "multisine_20251017_run1": (256, 6000, 0),
    "multisine_20251017_run2": (251, 6000, 0),
    "multisine_20251017_run3": (247, 6000, 1),
    "multisine_20251017_run4": (250, 6000, 0),
    "random1_20251017_run1": (251, 6000, 2),
    "random1_20251017_run2": (247, 6000, -3),
    "random1_20251017_run3": (264, 6000, 0),
    "random1_20251017_run4": (253, 6000, 0),
    "random2_20251017_run1": (254, 6000, 1),
    "random2_20251017_run2": (264, 6000, 0),
    "random2_20251017_run3": (250, 6000, 1),
    "random2_20251017_run4": (252, 6000, 0),
    "square_20251017_run1": (4906, 1900, 3),
    "square_20251017_run2": (240, 1900, 0),
    "square_20251017_run3": (245, 1900, 0),
    "square_20251017_run4": (249, 1900, 2),
    "square_20251017_run5": (243, 1900, 0),
}

#: the paper's training flights (multisine = "chirp", random2 = "random", square; runs 1–4)
NANODRONE_TRAIN = tuple(f"{k}_20251017_run{r}" for k in ("multisine", "random2", "square") for r in (1, 2, 3, 4))
#: held-out flights: every random1 run and square run 5
NANODRONE_TEST = tuple(f"random1_20251017_run{r}" for r in (1, 2, 3, 4)) + ("square_20251017_run5",)

#: zero-phase 4th-order Butterworth cut-offs [Hz] of the paper's processing
NANODRONE_LOWPASS_HZ = {"position": 10.0, "attitude": 12.0, "velocity": 18.0, "body_rates": 18.0,
                        "specific_force": 25.0, "rotor_speeds": 20.0, "motor_commands": 20.0}

_ERPM_SPIKE_JUMP = 1e5
_ERPM_SPIKE_MAX = 3e5


def nanodrone_dir(repo_root=None) -> Path | None:
    """The nano-drone data folder, or None where it is absent.

    ``$QUADJAX_NANODRONE_DIR`` if set, else ``<repo>/../shared/data/nanodrone``.
    """
    env = os.environ.get("QUADJAX_NANODRONE_DIR")
    if env:
        path = Path(env)
    else:
        root = Path(repo_root) if repo_root is not None else Path(__file__).resolve().parents[1]
        path = root.parent / "shared" / "data" / "nanodrone"
    return path if path.is_dir() and any(path.glob("*.parquet")) else None


def despike_erpm(erpm: np.ndarray) -> np.ndarray:
    """The benchmark repository's eRPM cleaning rule, on (T, 4) telemetry.

    A row is marked when any motor jumps by more than 1e5 eRPM from the previous
    row (rows i−1, i, i+1 are marked) or exceeds 3e5 eRPM; every motor column of
    a marked row is then filled backward, then forward, from unmarked rows.
    """
    erpm = np.array(erpm, dtype=np.float64)
    jump = np.any(np.abs(np.diff(erpm, axis=0)) > _ERPM_SPIKE_JUMP, axis=1)
    marked = np.any(erpm > _ERPM_SPIKE_MAX, axis=1)
    idx = np.flatnonzero(jump) + 1
    for k in (-1, 0, 1):
        marked[np.clip(idx + k, 0, len(erpm) - 1)] = True
    erpm[marked] = np.nan
    return fill_gaps(erpm)


def fill_gaps(x: np.ndarray) -> np.ndarray:
    """Fill NaNs backward (next valid row), then forward (previous valid row), column by column."""
    x = np.array(x, dtype=np.float64)
    flat = x.reshape(len(x), -1)
    for j in range(flat.shape[1]):
        col = flat[:, j]
        good = np.flatnonzero(np.isfinite(col))
        if good.size == 0:
            raise ValueError("column with no finite value")
        # the next valid row (backward fill); past the last valid row, the last one (forward fill)
        source = good[np.minimum(np.searchsorted(good, np.arange(len(col))), good.size - 1)]
        col[:] = col[source]
    return flat.reshape(x.shape)


def shift_rows(x: np.ndarray, lag: int) -> np.ndarray:
    """y[k] = x[k − lag] (edges repeat the first/last row): delays ``x`` by ``lag`` samples."""
    idx = np.clip(np.arange(len(x)) - int(lag), 0, len(x) - 1)
    return np.asarray(x)[idx]


def estimate_motor_lag(mass_specific_force_z, rotor_speeds, max_lag: int = 10) -> int:
    """Samples by which the motor columns lag the IMU: argmax of the cross-correlation
    between m·a_body,z (or any series proportional to the thrust) and Σωᵢ² (mean removed).

    The benchmark repository aligns motor columns this way; a positive lag means
    the motor series must be delayed (``shift_rows(x, lag)``) to match the thrust.
    """
    a = np.asarray(mass_specific_force_z, dtype=np.float64)
    w2 = np.sum(np.asarray(rotor_speeds, dtype=np.float64) ** 2, axis=1)
    a, w2 = a - a.mean(), w2 - w2.mean()
    n = len(a)
    # c(lag) = Σₙ a[n + lag] w2[n] over the whole overlap
    corr = {lag: np.dot(a[max(lag, 0): n + min(lag, 0)], w2[max(-lag, 0): n - max(lag, 0)])
            for lag in range(-max_lag, max_lag + 1)}
    return max(corr, key=corr.get)


def lowpass(x: np.ndarray, cutoff_hz: float, dt: float, order: int = 4) -> np.ndarray:
    """Zero-phase Butterworth low-pass along axis 0 (``scipy.signal.sosfiltfilt``)."""
    try:
        from scipy.signal import butter, sosfiltfilt
    except ImportError as err:  # pragma: no cover - scipy ships with the test extra
        raise ImportError("lowpass filtering needs scipy (pip install scipy)") from err
    sos = butter(order, cutoff_hz, btype="low", fs=1.0 / dt, output="sos")
    return sosfiltfilt(sos, np.asarray(x, dtype=np.float64), axis=0)


def lowpass_attitude(q: np.ndarray, cutoff_hz: float, dt: float) -> np.ndarray:
    """Low-pass a quaternion series (T, 4) on its rotation-vector log map, then map back.

    The sign of each quaternion is first made continuous with its predecessor
    (q and −q are one attitude), so the log map does not jump.
    """
    q = np.array(q, dtype=np.float64)
    flips = np.cumsum(np.concatenate([[0], (np.sum(q[1:] * q[:-1], axis=1) < 0).astype(int)])) % 2
    q = np.where(flips[:, None] == 1, -q, q)
    return quat_exp(lowpass(quat_log(q), cutoff_hz, dt))


def _require_pandas():
    try:
        import pandas as pd
    except ImportError as err:
        raise ImportError("reading parquet logs needs pandas and pyarrow: pip install 'quadjax[logs]'") from err
    return pd


def load_nanodrone(path, *, window: bool = True, align_motors: bool = True, filtered: bool = True) -> FlightLog:
    """One flight of the nano-drone benchmark as a :class:`FlightLog` (PX4 order, rad/s, q wxyz).

    Args:
        path: a ``*.parquet`` file of ``../shared/data/nanodrone``.
        window: crop to the trajectory window of the README table (files not in
            the table keep every row).
        align_motors: delay the motor columns by the run's lag (README table; for
            other files, :func:`estimate_motor_lag`).
        filtered: apply the paper's zero-phase low-pass filters
            (:data:`NANODRONE_LOWPASS_HZ`, needs scipy). The body rates, velocity
            and attitude stay consistent with each other; ``stale`` is computed
            on the raw rows either way.

    Motor commands are kept normalised (0..1, 65535 counts = 1). ``ValueError`` naming the
    file where it cannot be read, lacks a column, or has implausible rotor speeds.
    """
    pd = _require_pandas()
    path = Path(path)
    with _reading(path):
        return _nanodrone_log(pd.read_parquet(path), path, window, align_motors, filtered)


def _nanodrone_log(df, path: Path, window: bool, align_motors: bool, filtered: bool) -> FlightLog:
    """:func:`load_nanodrone` on the read DataFrame ``df``."""
    cf = [f"m{i}" for i in range(1, 5)]
    state_cols = ["x", "y", "z", "vx", "vy", "vz", "qx", "qy", "qz", "qw", "wx", "wy", "wz"]
    for c in ["t"] + state_cols + [f"{m}_erpm" for m in cf]:
        if c not in df.columns:
            raise ValueError(f"{path.name}: missing column {c!r}; not a nano-drone benchmark log")
    raw = {c: fill_gaps(df[c].to_numpy(np.float64)) for c in state_cols}
    stale = stale_rows(*[raw[c] for c in ("x", "y", "z", "vx", "vy", "vz", "wx", "wy", "wz")])
    erpm = despike_erpm(fill_gaps(df[[f"{m}_erpm" for m in cf]].to_numpy(np.float64)))
    omega = erpm_to_rad_s(erpm)
    # checked before the low-pass filter: its ringing is ours, not the log's
    check_rotor_speeds(omega, path, columns=[f"{m}_erpm" for m in cf])
    thrust_cols = [f"{m}_thrust" for m in cf]
    cmd = fill_gaps(df[thrust_cols].to_numpy(np.float64)) if all(c in df for c in thrust_cols) else None
    q = quat_xyzw_to_wxyz(np.stack([raw[c] for c in ("qx", "qy", "qz", "qw")], axis=1))
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    acc = fill_gaps(df[["ax", "ay", "az"]].to_numpy(np.float64)) if all(c in df for c in ("ax", "ay", "az")) else None
    vbat = fill_gaps(df["Vbat"].to_numpy(np.float64)) if "Vbat" in df else None

    start, rows, lag = NANODRONE_RUNS.get(path.stem, (0, len(df), None))
    if align_motors:
        if lag is None:
            lag = 0 if acc is None else estimate_motor_lag(np.asarray(quat_rotate_inverse(q, acc))[:, 2], omega)
        omega = shift_rows(omega, lag)
        cmd = None if cmd is None else shift_rows(cmd, lag)

    log = FlightLog(
        name=path.stem,
        t=df["t"].to_numpy(np.float64),
        position=np.stack([raw[c] for c in ("x", "y", "z")], axis=1),
        velocity=np.stack([raw[c] for c in ("vx", "vy", "vz")], axis=1),
        attitude=q,
        body_rates=np.stack([raw[c] for c in ("wx", "wy", "wz")], axis=1),
        rotor_speeds=np.asarray(reorder_rotors(omega, "crazyflie", "px4")),
        motor_commands=None if cmd is None else np.asarray(reorder_rotors(cmd, "crazyflie", "px4")),
        specific_force=acc,
        battery_voltage=vbat,
        stale=stale,
    )
    if window:
        log = log.crop(start, start + rows)
    if filtered:
        log = filter_log(log, NANODRONE_LOWPASS_HZ)
    return log


def filter_log(log: FlightLog, cutoffs_hz: dict) -> FlightLog:
    """Zero-phase low-pass each named field of ``log`` at its cut-off [Hz] (attitude on its log map)."""
    changes = {}
    for name, fc in cutoffs_hz.items():
        value = getattr(log, name)
        if value is None:
            continue
        changes[name] = lowpass_attitude(value, fc, log.dt) if name == "attitude" else lowpass(value, fc, log.dt)
    return log.replace(**changes)


def load_log(path, **kwargs) -> FlightLog:
    """A log by file type: ``.parquet`` → :func:`load_nanodrone` (with ``kwargs``), ``.csv`` → :func:`load_csv`."""
    path = Path(path)
    if path.suffix == ".parquet":
        return load_nanodrone(path, **kwargs)
    if path.suffix == ".csv":
        return load_csv(path)
    raise ValueError(f"{path}: unknown log type {path.suffix!r} (expected .parquet or .csv)")


def load_logs(paths, **kwargs) -> list[FlightLog]:
    """:func:`load_log` for each path; a directory expands to its ``*.parquet`` and ``*.csv`` files, sorted."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            if not os.access(p, os.R_OK | os.X_OK):  # glob would find nothing and hide why
                raise ValueError(f"{p}: folder not readable")
            files = sorted(list(p.glob("*.parquet")) + list(p.glob("*.csv")))
            if not files:
                raise ValueError(f"{p}: no .parquet or .csv logs in this folder")
            out += [load_log(f, **kwargs) for f in files]
        elif p.exists():
            out.append(load_log(p, **kwargs))
        else:
            raise ValueError(f"{p}: no such file or folder")
    return out


__all__ = [
    "FlightLog", "MAX_ROTOR_SPEED", "NANODRONE_LOWPASS_HZ", "NANODRONE_RUNS", "NANODRONE_TEST",
    "NANODRONE_TRAIN", "NEGATIVE_TOLERANCE", "OMEGA_MAX_FACTOR", "check_rotor_speeds", "despike_erpm",
    "erpm_to_rad_s", "estimate_motor_lag", "filter_log", "load_csv", "load_log", "load_logs",
    "load_nanodrone", "lowpass", "lowpass_attitude", "nanodrone_dir", "quat_exp", "quat_log",
    "quat_xyzw_to_wxyz", "save_csv", "shift_rows", "stale_rows",
]
