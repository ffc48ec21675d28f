"""The fit: multiple shooting, Adam, then an L-BFGS polish, then the uncertainty."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from quadjax.logs import FlightLog, check_rotor_speeds
from quadjax.params import QuadParams, check_params
from quadjax.sysid.motor import MotorMap
from quadjax.sysid._engine import MAX_ITERATIONS, data_count, run
from quadjax.sysid.objective import LossWeights
from quadjax.sysid.parameters import ParamSpec, parse_names
from quadjax.sysid.uncertainty import Uncertainty, information_from, uncertainty
from quadjax.sysid.windows import Windows, make_windows


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :func:`fit` found.

    Fields: params (QuadParams) and motor_map (MotorMap) at the optimum; spec
    (ParamSpec); theta (P,); values, start, std (P,) in SI (std from the chosen
    covariance; inf where unidentifiable); uncertainty (Uncertainty);
    loss_history, one value per optimiser step (Adam, then L-BFGS), the iterates that
    diverged included; objective, f at the returned (best valid) iterate; inputs,
    horizon, windows, covariance: the settings.
    """

    params: QuadParams
    motor_map: MotorMap
    spec: ParamSpec
    theta: np.ndarray
    values: np.ndarray
    start: np.ndarray
    std: np.ndarray
    uncertainty: Uncertainty
    loss_history: np.ndarray
    inputs: str
    horizon: int
    windows: int
    covariance: str
    objective: float

    @property
    def labels(self) -> tuple[str, ...]:
        return self.spec.labels

    def estimates(self) -> list[dict]:
        """One dict per fitted scalar: label, value, std, start, identifiable (JSON-ready)."""
        bad = set(self.uncertainty.unidentifiable)
        return [
            {"label": lab, "value": float(v), "std": float(s) if np.isfinite(s) else None, "start": float(v0),
             "identifiable": lab not in bad}
            for lab, v, s, v0 in zip(self.labels, self.values, self.std, self.start)
        ]

    def table(self) -> str:
        """A plain-text table of estimates ± std (relative std in %), start values and flags."""
        lines = [f"{'parameter':22s} {'estimate':>13s} {'± std':>11s} {'rel':>8s} {'start':>13s}"]
        for e in self.estimates():
            std = e["std"]
            rel = f"{100 * std / abs(e['value']):7.2f}%" if std is not None and e["value"] != 0 else "    —  "
            s = f"{std:11.4g}" if std is not None else f"{'inf':>11s}"
            flag = "" if e["identifiable"] else "  UNIDENTIFIABLE"
            lines.append(f"{e['label']:22s} {e['value']:13.6g} {s} {rel:>8s} {e['start']:13.6g}{flag}")
        u = self.uncertainty
        lines.append(f"({self.covariance} covariance; Fisher rank {u.rank}/{len(self.labels)}; "
                     f"{self.windows} windows × {self.horizon} steps; residual variance {u.residual_variance:.3g})")
        return "\n".join(lines)


def _check_log(log: FlightLog, params0: QuadParams) -> None:
    """The log fits the vehicle: one column per rotor, and speeds in rad/s (a unit error would
    fit a wildly wrong k_f without complaint)."""
    if not isinstance(log, FlightLog):
        raise ValueError(f"fit: data must be FlightLogs or Windows, got {type(log).__name__}")
    R = params0.num_rotors
    for name in ("rotor_speeds", "motor_commands"):
        value = getattr(log, name)
        if value is not None and value.shape[1] != R:
            raise ValueError(f"fit: log {log.name!r}: {name} has {value.shape[1]} columns, params0 has {R} rotors")
    if log.rotor_speeds is not None:
        check_rotor_speeds(log.rotor_speeds, f"fit: log {log.name!r}", omega_max=float(params0.omega_max))


def _check_windows(windows: Windows, params0: QuadParams, inputs: str) -> None:
    """As :func:`_check_log`, for windows cut beforehand."""
    R = params0.num_rotors
    if windows.inputs.shape[-1] != R:
        raise ValueError(f"fit: windows have {windows.inputs.shape[-1]} inputs per step, params0 has {R} rotors")
    if inputs == "rotor_speeds":
        check_rotor_speeds(np.asarray(windows.inputs).reshape(-1, R), "fit: windows",
                           omega_max=float(params0.omega_max))


def fit(
    data: Windows | FlightLog | Sequence[FlightLog],
    names,
    params0: QuadParams,
    *,
    motor_map0: MotorMap | None = None,
    inputs: str = "rotor_speeds",
    horizon: int = 50,
    stride: int | None = None,
    input_delay: int = 0,
    max_windows: int | None = None,
    dt: float | None = None,
    weights: LossWeights | None = None,
    priors: dict | None = None,
    bounds: dict | None = None,
    adam_steps: int = 300,
    adam_lr: float = 0.05,
    lbfgs_steps: int = 200,
    gtol: float = 1e-10,
    ftol: float = 1e-13,
    substeps: int = 1,
    covariance: str = "sandwich",
    rank_rtol: float = 1e-9,
    max_rel_std: float = 1.0,
    warn: bool = True,
    verbose: bool = False,
) -> FitResult:
    """Fit the chosen parameters to flight data by differentiating multi-step rollouts.

    The objective is multiple shooting: every window starts from its measured
    state, is predicted open loop over ``horizon`` steps (vmapped over windows,
    which span all flights), and scores the weighted errors of position,
    velocity, attitude and body rates at every step (plus rotor speeds in
    'commands' mode when ``weights.rotor_speeds`` is set):

        f(θ) = [½ Σ r(θ)² + ½ Σ ((θ − θ_prior)/σ_prior)²] / n

    minimised over θ (log-parameters for positive quantities) by optax's Adam
    (``adam_steps`` at ``adam_lr``) and then optax's L-BFGS (at most
    ``lbfgs_steps``, backtracking Armijo line search; stops when ‖∇f‖ < ``gtol``
    or when three steps in a row change f by at most ``ftol``·|f|), projecting
    onto the bounds after every step. The best finite iterate is returned; a
    non-finite objective ends the loop. Gradients come from forward-mode
    Jacobians of each window's residuals, which also give, at the optimum, the
    Fisher information, the covariances and the identifiability test
    (:mod:`quadjax.sysid.uncertainty`). The whole loop is one compiled function:
    fits with the same parameter names, data shapes, dtype, input mode and
    substeps reuse it (weights, priors, bounds and step counts are data).

    Args:
        data: flight logs (cut into windows here) or ready :class:`Windows` (then give ``dt``).
        names: what to fit (:mod:`quadjax.sysid.parameters`), e.g. "k_f,inertia,drag_linear".
        params0: the start and every value not fitted (its rotor order is the data's: PX4).
        motor_map0: map from logged inputs to rotor-speed commands (default identity).
        inputs: 'rotor_speeds' (measured speeds drive the model, τ = 0) or 'commands'
            (motor commands through the MotorMap and the rotor lag ``motor_tau``).
        horizon, stride, input_delay, max_windows: how windows are cut (:func:`make_windows`).
        weights: residual scales (:class:`LossWeights`).
        priors, bounds: see :meth:`ParamSpec.create`.
        covariance: 'sandwich' (default, robust to correlated errors within a window)
            or 'gauss_newton'; both are in the result's ``uncertainty``.
        rank_rtol, max_rel_std: the identifiability test (:func:`uncertainty`).

    Raises ``ValueError`` for an unknown name, a parameter the inputs cannot
    identify (``motor_tau`` from measured rotor speeds), data that gives no window,
    a log whose rotor count differs from ``params0``'s, or measured rotor speeds that
    are negative or far above ``params0.omega_max`` (RPM fed as rad/s; see
    :func:`quadjax.logs.check_rotor_speeds`).
    """
    weights = weights or LossWeights()
    if covariance not in ("sandwich", "gauss_newton"):
        raise ValueError(f"covariance={covariance!r}: choose 'sandwich' or 'gauss_newton'")
    lagged = [n for n in ("motor_tau", "motor_tau_down_ratio", "rotor_reaction_inertia")
              if n in parse_names(names, params0.num_rotors)]
    if inputs == "rotor_speeds" and lagged:
        raise ValueError(f"{lagged[0]} cannot be identified when measured rotor speeds drive the model "
                         "(inputs='rotor_speeds' sets τ = 0: no rotor lag, no rotor acceleration); "
                         "fit it with inputs='commands'")
    try:
        check_params(params0)
    except ValueError as err:
        raise ValueError(f"fit: params0: {err}") from None
    dtype = params0.mass.dtype
    if isinstance(data, Windows):
        if dt is None:
            raise ValueError("fit: give dt when passing Windows")
        _check_windows(data, params0, inputs)
        windows = data
    else:
        logs = [data] if isinstance(data, FlightLog) else list(data)
        if not logs:
            raise ValueError("fit: no logs given")
        for log in logs:
            _check_log(log, params0)
        dt = logs[0].dt if dt is None else dt
        windows = make_windows(logs, horizon, stride=stride, inputs=inputs, input_delay=input_delay,
                               max_windows=max_windows, dtype=dtype)
    horizon = windows.horizon
    spec = ParamSpec.create(names, params0, motor_map0, priors=priors, bounds=bounds)
    n_data = data_count(windows, weights, inputs)
    if n_data <= spec.size:
        raise ValueError(f"fit: {n_data:.0f} residuals for {spec.size} parameters; give more data")

    theta0 = spec.theta0(dtype)
    if not (0 <= adam_steps and 0 <= lbfgs_steps and adam_steps + lbfgs_steps < MAX_ITERATIONS):
        raise ValueError(f"fit: need adam_steps, lbfgs_steps >= 0 with a sum below {MAX_ITERATIONS}")
    theta, f_best, S, history, iters = run(
        theta0, spec, windows, jnp.asarray(dt, dtype), jnp.asarray(n_data, dtype), jnp.asarray(adam_lr, dtype),
        jnp.asarray(gtol, dtype), jnp.asarray(ftol, dtype), int(adam_steps), int(lbfgs_steps), weights,
        mode=inputs, substeps=substeps)
    history = np.asarray(history)[: int(iters)]
    if verbose:
        print(f"  {int(iters)} iterations (Adam {adam_steps}, L-BFGS ≤ {lbfgs_steps}): "
              f"f = {history[0]:.6g} → best {float(f_best):.6g}", flush=True)
    info = information_from(S, spec, n_data, windows.num_windows)
    unc = uncertainty(np.asarray(theta), spec, info, rtol=rank_rtol, max_rel_std=max_rel_std,
                      covariance=covariance, warn=warn, stacklevel=3)
    params, motor_map = spec.unpack(theta)
    values = np.asarray(spec.values(theta), np.float64)
    start = np.asarray(spec.values(theta0), np.float64)
    std = unc.std_sandwich if covariance == "sandwich" else unc.std_gauss_newton
    return FitResult(params, motor_map, spec, np.asarray(theta), values, start, std, unc, history, inputs,
                     horizon, windows.num_windows, covariance, float(f_best))
