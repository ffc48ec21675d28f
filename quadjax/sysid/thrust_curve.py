"""Motor characterisation: the throttle → thrust curve, the thrust coefficient and the torque ratio,
from thrust-stand data and from flight logs (the Elodin seed's motor model).

The curve, normalised throttle x ∈ [0, 1] → thrust per rotor [N]:

    T(x, V) = T_max (V / V_ref)^n (a x² + (1 − a) x)

a is the "motor thrust coefficient" (a = 0: linear, a = 1: quadratic), T_max the thrust at full
throttle and the reference voltage V_ref. n = 2 is an uncompensated motor (ω ∝ K_v V, T ∝ ω²);
n = 0 a firmware that scales its output with the battery voltage. The rotor speed it asks for,
the model's rotor-speed command, is ω = √(T / k_f) (:func:`throttle_rotor_speed`): the conversion
at the edge for throttle-driven inputs (GUIDE §2).

The torque ratio k_m [m] is the rotor's reaction torque per unit thrust, ``QuadParams.k_m``. On a
stand it is measured by a torque cell, or estimated as the Elodin post does from the current and
the motor's K_v: Q = K_t (I − I₀), K_t = 60 / (2π K_v) [N·m/A] for K_v in rpm/V.

Thrust-stand CSV (:func:`read_stand_csv`, :func:`write_stand_csv`)
------------------------------------------------------------------
One header line of column names, then one row per steady operating point; lines starting with
``#`` are comments; column order is free; other columns are ignored.

=============  ======  =====================================================================
column         unit    meaning
=============  ======  =====================================================================
``throttle``   1       normalised command, 0 to 1 (required; convert µs or counts first)
``thrust_N``   N       thrust, along the rotor axis (required)
``torque_Nm``  N·m     reaction torque magnitude (optional; sign conventions vary by stand)
``rpm``        rev/min mechanical rotor speed (optional; electrical RPM ÷ pole pairs first)
``current_A``  A       motor (ESC input) current (optional)
``voltage_V``  V       supply voltage (optional)
=============  ======  =====================================================================
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass
from quadjax.files import write_atomic
from quadjax.frames import rad_s_to_rpm, rpm_to_rad_s
from quadjax.logs import FlightLog
from quadjax.params import QuadParams
from quadjax.quadrotor import lag_decay, lagged_rotor_speeds_c


@pytree_dataclass
class ThrustCurve:
    """T(x, V) = T_max (V / V_ref)^n (a x² + (1 − a) x) [N] per rotor (module docstring).

    Fields: a (1, in [0, 1]), max_thrust T_max [N] at V_ref, reference_voltage V_ref [V],
    voltage_exponent n (1; 0: thrust does not depend on the voltage). Build it with
    :meth:`create` (checked); the fields are leaves, so a fit can trace them.
    """

    a: jax.Array
    max_thrust: jax.Array
    reference_voltage: jax.Array
    voltage_exponent: jax.Array

    @classmethod
    def create(cls, a, max_thrust, *, reference_voltage=None, voltage_exponent=2.0) -> "ThrustCurve":
        """Checked constructor; ``reference_voltage`` None: the voltage is not modelled (n = 0).
        ``ValueError`` names a bad field."""
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"ThrustCurve.a = {a}: must be in [0, 1] (a thrust that grows from 0 at x = 0)")
        if not (np.isfinite(max_thrust) and max_thrust > 0):
            raise ValueError(f"ThrustCurve.max_thrust = {max_thrust}: must be > 0 [N]")
        if reference_voltage is None:
            reference_voltage, voltage_exponent = 1.0, 0.0
        if not (np.isfinite(reference_voltage) and reference_voltage > 0):
            raise ValueError(f"ThrustCurve.reference_voltage = {reference_voltage}: must be > 0 [V] or None")
        if not np.isfinite(voltage_exponent):
            raise ValueError(f"ThrustCurve.voltage_exponent = {voltage_exponent}: must be finite")
        return cls(*(float(v) for v in (a, max_thrust, reference_voltage, voltage_exponent)))


def throttle_thrust(curve: ThrustCurve, throttle, voltage=None):
    """T = T_max (V / V_ref)^n (a x² + (1 − a) x) [N] for throttle x (numpy or JAX, any shape);
    ``voltage`` [V] broadcasts with x (None: the thrust at V_ref)."""
    x = throttle
    thrust = curve.max_thrust * (curve.a * x * x + (1.0 - curve.a) * x)
    if voltage is None:
        return thrust
    return thrust * (voltage / curve.reference_voltage) ** curve.voltage_exponent


def throttle_rotor_speed(curve: ThrustCurve, k_f, throttle, voltage=None):
    """ω = √(T(x, V) / k_f) [rad/s]: the rotor-speed command of a throttle x, for the model's
    rotors of thrust coefficient k_f [N/(rad/s)²] (``QuadParams.k_f``)."""
    return (throttle_thrust(curve, throttle, voltage) / k_f) ** 0.5


def kv_torque_constant(kv_rpm_per_volt: float) -> float:
    """K_t = 60 / (2π K_v) [N·m/A]: the torque constant of a motor of velocity constant K_v [rpm/V]."""
    if not kv_rpm_per_volt > 0:
        raise ValueError(f"kv = {kv_rpm_per_volt}: the motor's K_v must be > 0 [rpm/V]")
    return 1.0 / float(rpm_to_rad_s(kv_rpm_per_volt))  # an ideal motor: K_t = 1 / K_v in rad/s/V


# --- thrust-stand data ------------------------------------------------------------------------

_STAND_COLUMNS = {"throttle": "throttle", "thrust": "thrust_N", "torque": "torque_Nm", "rpm": "rpm",
                  "current": "current_A", "voltage": "voltage_V"}


@dataclasses.dataclass(frozen=True)
class StandData:
    """Steady operating points of one motor and propeller on a thrust stand (numpy, SI but rpm).

    throttle (n,) in [0, 1]; thrust (n,) N; torque, rpm (mechanical rev/min), current (A),
    voltage (V): (n,) or None."""

    throttle: np.ndarray
    thrust: np.ndarray
    torque: np.ndarray | None = None
    rpm: np.ndarray | None = None
    current: np.ndarray | None = None
    voltage: np.ndarray | None = None

    def __post_init__(self):
        n = np.shape(self.throttle)
        if len(n) != 1:
            raise ValueError(f"StandData.throttle: a 1-D column is needed, got shape {n}")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            column = _STAND_COLUMNS[f.name]
            if np.shape(v) != n:
                raise ValueError(f"StandData.{f.name}: shape {np.shape(v)}, throttle has {n}")
            bad = np.flatnonzero(~np.isfinite(v))
            if bad.size:
                raise ValueError(f"stand data column {column!r}: NaN or inf at row {int(bad[0])}")
        outside = np.flatnonzero((self.throttle < 0) | (self.throttle > 1))
        if outside.size:
            raise ValueError(f"stand data column 'throttle': {self.throttle[outside[0]]} at row {int(outside[0])} is "
                             "outside [0, 1] (normalise µs or counts to 0..1 first)")
        for name in ("rpm", "current", "voltage"):
            v = getattr(self, name)
            if v is not None and np.any(v < 0):
                raise ValueError(f"stand data column {_STAND_COLUMNS[name]!r}: negative values (give magnitudes)")
        if np.count_nonzero(self.throttle > 0) < 3:
            raise ValueError("stand data: at least 3 rows with throttle > 0 are needed to fit a curve")


def read_stand_csv(path) -> StandData:
    """Thrust-stand data from a CSV in the module docstring's format; ``ValueError`` names the file
    and what is wrong (a missing required column, a bad value and its row)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror or err})") from None
    if not lines:
        raise ValueError(f"{path}: no header line")
    header = [h.strip() for h in lines[0].split(",")]
    for name in ("throttle", "thrust_N"):
        if name not in header:
            raise ValueError(f"{path}: missing column {name!r} (a thrust-stand CSV needs throttle and thrust_N)")
    rows = []
    for k, line in enumerate(lines[1:], 1):
        cells = line.split(",")
        if len(cells) != len(header):
            raise ValueError(f"{path}: data row {k} has {len(cells)} cells, the header {len(header)}")
        try:
            rows.append([float(c) if c.strip() else np.nan for c in cells])
        except ValueError:
            raise ValueError(f"{path}: data row {k} is not numeric: {line.strip()!r}") from None
    table = np.asarray(rows, np.float64).reshape(len(rows), len(header))
    columns = {field: table[:, header.index(column)] for field, column in _STAND_COLUMNS.items() if column in header}
    try:
        return StandData(**columns)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def write_stand_csv(data: StandData, path) -> Path:
    """Write ``data`` in the thrust-stand CSV format (atomically); returns the path."""
    fields = [f.name for f in dataclasses.fields(data) if getattr(data, f.name) is not None]
    table = np.stack([getattr(data, f) for f in fields], axis=1)

    def write(f):
        f.write(b"# quadjax thrust-stand data: throttle 0..1, thrust N, torque N*m, rpm mechanical, A, V\n")
        np.savetxt(f, table, delimiter=",", header=",".join(_STAND_COLUMNS[n] for n in fields), comments="",
                   fmt="%.10g")

    return write_atomic(path, write)


# --- fits ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StandFit:
    """What a thrust stand identifies, each with its standard error (``std``, same keys).

    curve: the throttle → thrust curve (V_ref: the stand's mean supply voltage if logged).
    k_f [N/(rad/s)²] (needs rpm), torque_ratio [m] (needs torque), torque_ratio_kv [m]
    (needs current and K_v): None where the data lacks the column. thrust_rms [N]: the curve's
    residual."""

    curve: ThrustCurve
    k_f: float | None
    torque_ratio: float | None
    torque_ratio_kv: float | None
    std: dict
    thrust_rms: float
    rows: int


def _through_origin(x, y) -> tuple[float, float]:
    """y = c x by least squares: c and its standard error."""
    c = float(np.sum(x * y) / np.sum(x * x))
    dof = max(x.size - 1, 1)
    return c, float(np.sqrt(np.sum((y - c * x) ** 2) / dof / np.sum(x * x)))


def _curve_coefficients(x, t):
    """T = c₂ x² + c₁ x by least squares: (c₁, c₂), their covariance and the residual RMS."""
    design = np.stack([x, x * x], axis=1)
    coef, *_ = np.linalg.lstsq(design, t, rcond=None)
    resid = t - design @ coef
    dof = max(x.size - 2, 1)
    cov = np.linalg.inv(design.T @ design) * (np.sum(resid ** 2) / dof)
    return coef, cov, float(np.sqrt(np.mean(resid ** 2)))


def _curve_from_coefficients(c, cov, reference_voltage, exponent):
    """a = c₂ / (c₁ + c₂), T_max = c₁ + c₂ and their standard errors (delta method). An a outside
    [0, 1] (a curve that is not monotone from 0) is held at the bound, with a warning."""
    c1, c2 = c
    t_max = c1 + c2
    a = c2 / t_max
    grad_a = np.array([-c2, c1]) / t_max ** 2  # ∂a/∂(c₁, c₂)
    std_a = float(np.sqrt(grad_a @ cov @ grad_a))
    std_t = float(np.sqrt(np.ones(2) @ cov @ np.ones(2)))
    if not 0.0 <= a <= 1.0:
        warnings.warn(f"thrust curve: the fitted a = {a:.3g} is outside [0, 1]; held at the bound", RuntimeWarning,
                      stacklevel=3)
        a = float(np.clip(a, 0.0, 1.0))
    curve = ThrustCurve.create(a, t_max, reference_voltage=reference_voltage, voltage_exponent=exponent)
    return curve, {"a": std_a, "max_thrust": std_t}


def fit_stand(data: StandData, *, kv: float | None = None, no_load_current: float = 0.0,
              voltage_exponent: float = 2.0) -> StandFit:
    """The curve, k_f and the torque ratio from thrust-stand data, each ± its standard error.

    * curve: T = c₂ x² + c₁ x by linear least squares, a = c₂/(c₁ + c₂), T_max = c₁ + c₂; with a
      ``voltage`` column every thrust is first scaled to the mean voltage V_ref by (V_ref/V)^n,
      n = ``voltage_exponent`` (the supply of a stand is steady: this corrects a drifting one).
    * k_f: T = k_f ω² through the origin, ω from ``rpm``.
    * torque_ratio: Q = k_m T through the origin, from ``torque``.
    * torque_ratio_kv: the same line with Q = K_t (I − I₀) (:func:`kv_torque_constant` of ``kv``
      [rpm/V], I₀ = ``no_load_current`` [A]): the estimate of a stand without a torque cell.
    """
    x, thrust = np.asarray(data.throttle, np.float64), np.asarray(data.thrust, np.float64)
    t, v_ref = thrust, None
    if data.voltage is not None:
        v_ref = float(np.mean(data.voltage))
        t = thrust * (v_ref / data.voltage) ** voltage_exponent
    coef, cov, rms = _curve_coefficients(x, t)
    curve, std = _curve_from_coefficients(coef, cov, v_ref, voltage_exponent)
    k_f = torque_ratio = torque_ratio_kv = None
    if data.rpm is not None:
        omega = np.asarray(rpm_to_rad_s(data.rpm), np.float64)
        k_f, std["k_f"] = _through_origin(omega * omega, thrust)
    if data.torque is not None:
        torque_ratio, std["torque_ratio"] = _through_origin(thrust, data.torque)
    if data.current is not None and kv is not None:
        q = kv_torque_constant(kv) * (np.asarray(data.current, np.float64) - no_load_current)
        torque_ratio_kv, std["torque_ratio_kv"] = _through_origin(thrust, q)
    elif kv is not None:
        raise ValueError("fit_stand: kv= was given but the data has no current_A column")
    return StandFit(curve, k_f, torque_ratio, torque_ratio_kv, std, rms, int(x.size))


@dataclasses.dataclass(frozen=True)
class FlightMotorFit:
    """The curve and the rotor lag from flight logs (:func:`fit_flight_motors`).

    curve: the throttle → thrust curve (V_ref: the logs' mean voltage; n fitted or as given);
    params: the vehicle with the fitted ``motor_tau`` [s] (and ``motor_tau_down_ratio``);
    std: standard errors by name (``a``, ``max_thrust``, ``motor_tau``, ...), white-noise ones:
    the residuals are correlated in time, so they are lower bounds (refit per flight for the
    spread); rms [rad/s]: the one-step rotor-speed prediction error; rows: rotor samples used."""

    curve: ThrustCurve
    params: QuadParams
    std: dict
    rms: float
    rows: int


def _flight_samples(logs, min_throttle):
    """(x_k, ω_k, ω_k+1, V_k) of every rotor sample whose command is above ``min_throttle``."""
    xs, w0, w1, vs = [], [], [], []
    for log in logs:
        if log.motor_commands is None or log.rotor_speeds is None:
            raise ValueError(f"fit_flight_motors: log {log.name!r} lacks motor commands or measured rotor speeds")
        x = np.asarray(log.motor_commands, np.float64)
        if np.any(x < 0) or np.any(x > 1):
            raise ValueError(f"fit_flight_motors: log {log.name!r} has motor commands outside [0, 1]; normalise them")
        w = np.asarray(log.rotor_speeds, np.float64)
        v = np.ones(len(log)) if log.battery_voltage is None else np.asarray(log.battery_voltage, np.float64)
        on = x[:-1] > min_throttle
        xs.append(x[:-1][on])
        w0.append(w[:-1][on])
        w1.append(w[1:][on])
        vs.append(np.broadcast_to(v[:-1, None], x[:-1].shape)[on])
    return tuple(np.concatenate(a) for a in (xs, w0, w1, vs))


def _one_step(params: QuadParams, curve: ThrustCurve, x, w0, volts, dt):
    """ω_k+1 of the model's rotor lag (:func:`quadjax.quadrotor.lagged_rotor_speeds_c`, exact over
    the sample with the command held) commanded by the curve's rotor speed at (x_k, V_k)."""
    command = throttle_rotor_speed(curve, params.k_f, x, volts)
    (w1,) = lagged_rotor_speeds_c(params, (w0,), (command,), lag_decay(params, dt))
    return w1


def free_run_rotor_speeds(params: QuadParams, command, rotor_speed0, dt):
    """ω_k+1 = lag(ω_k, u_k) from ω_0 = ``rotor_speed0`` (R,) [rad/s] over the rotor-speed commands
    ``command`` (T, R) [rad/s] (e.g. :func:`throttle_rotor_speed` of a log's throttles), the model's
    exact lag with ``params`` (τ, spin-down ratio, ω clamp): the (T, R) speeds after each command,
    what a simulator fed the autopilot's motor outputs flies. Validates a motor fit on a flight."""
    decay = lag_decay(params, dt)

    def step(omega, u):
        nxt = jnp.stack(lagged_rotor_speeds_c(params, tuple(omega), tuple(u), decay))
        return nxt, nxt

    return jax.lax.scan(step, jnp.asarray(rotor_speed0), jnp.asarray(command))[1]


def fit_flight_motors(logs: FlightLog | Sequence[FlightLog], params: QuadParams, *,
                      voltage_exponent: float | None = 0.0, asymmetric: bool = False,
                      min_throttle: float = 0.0, iterations: int = 50) -> FlightMotorFit:
    """The throttle → thrust curve and the rotor lag from flight logs with motor commands (0..1)
    and measured rotor speeds, by Levenberg–Marquardt on the one-step rotor-speed prediction

        ω_k+1 = u_k + (ω_k − u_k) e^(−dt/τ),   u_k = √(T(x_k, V_k) / k_f),

    the model's own lag (:func:`_one_step`) with k_f = ``params.k_f`` (e.g. from
    :func:`quadjax.sysid.k_f_from_specific_force`); ``asymmetric``: τ spinning down is r τ, r
    fitted as ``motor_tau_down_ratio``. The battery voltage enters as (V/V_ref)^n: n =
    ``voltage_exponent`` fixed (0: not modelled), or None to fit it (needs battery voltages that
    vary by more than 2 %). Samples with commands at or below ``min_throttle`` are left out.
    ``ValueError`` on logs without the signals."""
    logs = [logs] if isinstance(logs, FlightLog) else list(logs)
    if not logs:
        raise ValueError("fit_flight_motors: no logs")
    dts = {round(log.dt, 9) for log in logs}
    if len(dts) != 1:
        raise ValueError(f"fit_flight_motors: logs with different sample periods {sorted(dts)}")
    dt = dts.pop()
    x, w0, w1, volts = _flight_samples(logs, min_throttle)
    if x.size < 10:
        raise ValueError(f"fit_flight_motors: {x.size} samples with the motors on; at least 10 are needed")
    fit_exponent = voltage_exponent is None
    v_ref = float(np.mean(volts)) if all(log.battery_voltage is not None for log in logs) else None
    if fit_exponent and (v_ref is None or np.ptp(volts) < 0.02 * v_ref):
        raise ValueError("fit_flight_motors: the voltage exponent cannot be identified without battery voltages "
                         "that vary by more than 2 % (pass voltage_exponent= a value)")
    exponent = 0.0 if fit_exponent else float(voltage_exponent)
    # the fit's rotors are not clamped: the curve is what is measured, ω_max is the vehicle's
    base = params.replace(omega_min=jnp.zeros_like(params.omega_min), omega_max=jnp.full_like(params.omega_max, 1e9))
    names = ["log_tau", "a", "max_thrust"] + (["voltage_exponent"] if fit_exponent else []) + \
        (["log_down_ratio"] if asymmetric else [])

    def unpack(theta):
        v = dict(zip(names, theta))
        p = base.replace(motor_tau=jnp.exp(v["log_tau"]),
                         motor_tau_down_ratio=jnp.exp(v["log_down_ratio"]) if asymmetric else base.motor_tau_down_ratio)
        curve = ThrustCurve(v["a"], v["max_thrust"], jnp.asarray(v_ref or 1.0), v.get("voltage_exponent", exponent))
        return p, curve

    x_j, w0_j, w1_j, v_j = (jnp.asarray(a, base.k_f.dtype) for a in (x, w0, w1, volts))

    @jax.jit
    def residuals(theta):
        p, curve = unpack(theta)
        return w1_j - _one_step(p, curve, x_j, w0_j, v_j, dt)

    jacobian = jax.jit(jax.jacfwd(residuals))
    # start: τ = 50 ms and the lag-free curve T = k_f ω_k+1²
    c, *_ = np.linalg.lstsq(np.stack([x, x * x], axis=1), float(params.k_f) * w1 * w1, rcond=None)
    a0 = float(np.clip(c[1] / (c[0] + c[1]), 0.05, 0.95))
    theta = np.array([np.log(0.05), a0, c[0] + c[1]] + [exponent] * fit_exponent + [0.0] * asymmetric)

    def valid(t):  # a curve that grows from 0
        return 0.0 <= t[1] <= 1.0 and t[2] > 0

    r = np.asarray(residuals(theta), np.float64)
    J = np.asarray(jacobian(theta), np.float64)
    cost, damping = float(r @ r), 1e-3
    for _ in range(iterations):  # Levenberg–Marquardt
        A = J.T @ J
        trial = theta + np.linalg.solve(A + damping * np.diag(np.diag(A)), -J.T @ r)
        r_t = np.asarray(residuals(trial), np.float64) if valid(trial) else None
        if r_t is not None and np.all(np.isfinite(r_t)) and float(r_t @ r_t) < cost:
            done = cost - float(r_t @ r_t) < 1e-10 * cost
            theta, r, cost, damping = trial, r_t, float(r_t @ r_t), max(damping / 10.0, 1e-12)
            J = np.asarray(jacobian(theta), np.float64)
            if done:
                break
        else:
            damping *= 10.0
    cov = np.linalg.inv(J.T @ J) * (cost / max(x.size - theta.size, 1))
    se = dict(zip(names, np.sqrt(np.diag(cov))))
    v = dict(zip(names, theta))
    curve = ThrustCurve.create(float(np.clip(v["a"], 0.0, 1.0)), float(v["max_thrust"]), reference_voltage=v_ref,
                               voltage_exponent=float(v.get("voltage_exponent", exponent)))
    tau = float(np.exp(v["log_tau"]))
    std = {"a": float(se["a"]), "max_thrust": float(se["max_thrust"]), "motor_tau": tau * float(se["log_tau"])}
    if fit_exponent:
        std["voltage_exponent"] = float(se["voltage_exponent"])
    if asymmetric:
        std["motor_tau_down_ratio"] = float(np.exp(v["log_down_ratio"]) * se["log_down_ratio"])
    ratio = np.exp(v["log_down_ratio"]) if asymmetric else params.motor_tau_down_ratio
    fitted = params.replace(motor_tau=jnp.asarray(tau, params.motor_tau.dtype),
                            motor_tau_down_ratio=jnp.asarray(ratio, params.motor_tau.dtype))
    return FlightMotorFit(curve, fitted, std, float(np.sqrt(cost / x.size)), int(x.size))


def synthetic_stand(curve: ThrustCurve, *, k_f: float, torque_ratio: float, kv: float, no_load_current: float = 0.0,
                    voltage: float = 12.0, points: int = 21, noise: float = 0.0, seed: int = 0) -> StandData:
    """A throttle sweep of a motor that follows ``curve``, k_f, the torque ratio and K_v [rpm/V]
    exactly (current I = Q / K_t + I₀), with Gaussian noise on every measured column of standard
    deviation ``noise`` × the column's largest value: the known truth the stand fit is tested
    against."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 1.0, points)
    thrust = np.asarray(throttle_thrust(curve, x, voltage))
    torque = torque_ratio * thrust
    rpm = np.asarray(rad_s_to_rpm(np.sqrt(thrust / k_f)), np.float64)
    current = torque / kv_torque_constant(kv) + no_load_current

    def measured(v):
        return v + noise * np.max(np.abs(v)) * rng.standard_normal(v.shape)

    return StandData(throttle=x, thrust=measured(thrust), torque=measured(torque), rpm=np.abs(measured(rpm)),
                     current=np.abs(measured(current)), voltage=np.full_like(x, voltage))
