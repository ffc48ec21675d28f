"""System identification: fit ``QuadParams`` to flight logs by differentiating rollouts.

    result = fit(logs, "k_f,inertia,k_m,drag_linear", presets.crazyflie21_brushless())
    print(result.table())
    errors = open_loop_errors(result.params, held_out_logs)

Pieces: :class:`MotorMap` (logged inputs → rotor-speed commands), :func:`make_windows`
(multiple-shooting windows from measured states), :class:`ParamSpec` (θ ↔
parameters, log-positivity, priors, bounds), :func:`fit` (Adam, then L-BFGS,
then the Fisher information, Gauss–Newton and sandwich covariances and the
identifiability warning), :func:`k_f_from_specific_force` (k_f from the IMU alone), the motor
characterisation (:class:`ThrustCurve`: throttle → thrust a·x² + (1−a)·x, :func:`fit_stand` on
thrust-stand data, :func:`fit_flight_motors` on logged commands and rotor speeds),
:func:`open_loop_errors` (the nano-drone benchmark's
validation protocol), :func:`save_fit` / :func:`load_params` (JSON), and
:func:`fit_main`, the ``quadjax fit`` command.
"""

from quadjax.sysid.cli import fit_main
from quadjax.sysid.io import load_fit, load_params, save_fit
from quadjax.sysid.motor import MotorMap, motor_speed_command, nanodrone_motor_map
from quadjax.sysid.objective import LossWeights, attitude_error, model_params, predict, residuals, window_residuals
from quadjax.sysid.optimize import FitResult, fit
from quadjax.sysid.parameters import GROUPS, ParamSpec, parse_names
from quadjax.sysid.synthetic import excitation, mixer_directions, random_state, simulate_log
from quadjax.sysid.thrust import ThrustFit, k_f_from_specific_force
from quadjax.sysid.thrust_curve import (
    FlightMotorFit, StandData, StandFit, ThrustCurve, fit_flight_motors, fit_stand, free_run_rotor_speeds,
    kv_torque_constant, read_stand_csv, synthetic_stand, throttle_rotor_speed, throttle_thrust, write_stand_csv,
)
from quadjax.sysid.uncertainty import Information, Uncertainty, UnidentifiableWarning, information, uncertainty
from quadjax.sysid.validation import OpenLoopErrors, format_table, naive_errors, open_loop_errors, physics_baseline
from quadjax.sysid.windows import INPUT_MODES, Windows, make_windows

__all__ = [
    "GROUPS", "INPUT_MODES", "FitResult", "Information", "LossWeights", "MotorMap", "OpenLoopErrors", "ParamSpec",
    "ThrustFit", "k_f_from_specific_force",
    "FlightMotorFit", "StandData", "StandFit", "ThrustCurve", "fit_flight_motors", "fit_stand", "free_run_rotor_speeds",
    "kv_torque_constant",
    "read_stand_csv", "synthetic_stand", "throttle_rotor_speed", "throttle_thrust", "write_stand_csv",
    "Uncertainty", "UnidentifiableWarning", "Windows", "attitude_error", "excitation", "fit", "fit_main",
    "format_table", "information", "load_fit", "load_params", "make_windows", "mixer_directions", "model_params",
    "motor_speed_command", "naive_errors", "nanodrone_motor_map", "open_loop_errors", "parse_names",
    "physics_baseline", "predict",
    "random_state", "residuals", "save_fit", "simulate_log", "uncertainty", "window_residuals",
]
