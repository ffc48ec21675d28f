"""Prediction and the weighted multi-step least-squares residuals of multiple shooting."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from quadjax.params import QuadParams
from quadjax.quaternion import quat_conjugate, quat_multiply
from quadjax.engine import SimConfig, simulate
from quadjax.state import QuadState
from quadjax.sysid.motor import MotorMap, motor_speed_command
from quadjax.sysid.windows import INPUT_MODES, Windows

#: ω_max used when measured rotor speeds drive the model: the measurement is not clamped [rad/s]
_UNCLAMPED = 1.0e7


def model_params(params: QuadParams, inputs: str) -> QuadParams:
    """The parameters the rollout uses for an input mode.

    'rotor_speeds': τ = 0 and no clamp, so the rotors follow the (mapped)
    measured speeds exactly, held over each step. 'commands': unchanged.
    """
    if inputs == "rotor_speeds":
        zero = jnp.zeros_like(params.motor_tau)
        return params.replace(motor_tau=zero, omega_min=zero, omega_max=jnp.full_like(params.omega_max, _UNCLAMPED))
    return params


def predict(params: QuadParams, motor_map: MotorMap, state0: QuadState, inputs, dt, *, mode: str = "rotor_speeds",
            substeps: int = 1, rotor0_known=1.0) -> QuadState:
    """Open-loop prediction of one window: states after each of the H inputs (H, ...).

    ``inputs`` (H, R) are measured rotor speeds or motor commands (``mode``),
    mapped by ``motor_map`` to rotor-speed commands and each held for ``dt``
    (zero-order hold), integrated by :func:`quadjax.simulate` (RK4, ``substeps``
    per step). In 'commands' mode the rotors start at the measured speeds where
    ``rotor0_known``, else at the steady state of the first command.
    """
    if mode not in INPUT_MODES:
        raise ValueError(f"mode={mode!r}: choose one of {INPUT_MODES}")
    command = motor_speed_command(motor_map, inputs)
    p = model_params(params, mode)
    if mode == "commands":
        rotors = jnp.where(rotor0_known > 0.5, state0.rotor_speeds, command[0])
    else:
        rotors = command[0]
    config = SimConfig(substeps=substeps, save=("state",))
    return simulate(p, state0.replace(rotor_speeds=rotors), dt, commands=command, config=config).states


def attitude_error(q_measured, q_predicted):
    """Rotation vector [rad] (..., 3) of q_meas* ⊗ q_pred, by its small-angle form 2·sign(w)·(x, y, z).

    Its norm 2 sin(θ/2) equals the geodesic angle θ to second order and is smooth
    everywhere but at θ = π, which keeps it a well-behaved least-squares residual.
    """
    e = quat_multiply(quat_conjugate(q_measured), q_predicted)
    return 2.0 * jnp.where(e[..., :1] < 0, -1.0, 1.0) * e[..., 1:]


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """Residual scales: each error is divided by its scale (the expected error size).

    position [m], velocity [m/s], attitude [rad], body_rates [rad/s] and
    rotor_speeds [rad/s] (used only for windows with measured rotor speeds in
    'commands' mode; None leaves rotor speeds out). Equal scales weigh the
    channels by their physical size; the measurement noise std makes the
    objective a negative log-likelihood.

    A pytree (the scales are leaves, so changing them does not recompile a
    fit; a None rotor_speeds is structure).
    """

    position: float = 0.01
    velocity: float = 0.02
    attitude: float = 0.01
    body_rates: float = 0.05
    rotor_speeds: float | None = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not v > 0:
                raise ValueError(f"LossWeights.{f.name} = {v}: must be > 0 (or None for rotor_speeds)")


jax.tree_util.register_dataclass(
    LossWeights, data_fields=["position", "velocity", "attitude", "body_rates", "rotor_speeds"], meta_fields=[])


def window_residuals(params: QuadParams, motor_map: MotorMap, window: Windows, dt, weights: LossWeights, *,
                     mode: str = "rotor_speeds", substeps: int = 1):
    """Whitened residuals (H, C) of one window (leaves without the W axis).

    Per step: (p̂ − p)/σ_p, (v̂ − v)/σ_v, attitude_error(q, q̂)/σ_q, (ω̂ − ω)/σ_ω
    [, (Ω̂ − Ω)/σ_Ω rotor speeds], times √mask.
    """
    pred = predict(params, motor_map, window.state0, window.inputs, dt, mode=mode, substeps=substeps,
                   rotor0_known=window.rotor0_known)
    parts = [
        (pred.position - window.position) / weights.position,
        (pred.velocity - window.velocity) / weights.velocity,
        attitude_error(window.attitude, pred.attitude) / weights.attitude,
        (pred.body_rates - window.body_rates) / weights.body_rates,
    ]
    if mode == "commands" and weights.rotor_speeds is not None:
        parts.append(window.rotors_measured * (pred.rotor_speeds - window.rotor_speeds) / weights.rotor_speeds)
    r = jnp.concatenate(parts, axis=-1)
    return r * jnp.sqrt(window.mask)[:, None]


def residuals(params: QuadParams, motor_map: MotorMap, windows: Windows, dt, weights: LossWeights, *,
              mode: str = "rotor_speeds", substeps: int = 1):
    """Whitened residuals (W, H, C) of every window, vmapped."""
    return jax.vmap(lambda w: window_residuals(params, motor_map, w, dt, weights, mode=mode, substeps=substeps))(
        windows)
