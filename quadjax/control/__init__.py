"""Controllers and reference trajectories: pure functions with their gains as pytrees.

Each controller is a pair (init, control) with ``control(ctrl_params, ctrl_state,
observation, t) → (rotor command, ctrl_state)``, the signature of
``quadjax.simulate(..., controller=...)``; gains are float leaves (vmap over gain sets, grad).
"""

from quadjax.control._common import ControllerModel
from quadjax.control.geometric import (
    GeometricController,
    GeometricGains,
    GeometricState,
    geometric_control,
    geometric_init,
)
from quadjax.control.pid import CascadeRates, PIDController, PIDGains, PIDState, pid_control, pid_init
from quadjax.control.trajectories import (
    C4dFigure8,
    Circle,
    Figure8,
    Hover,
    PiecewisePolynomial,
    Reference,
    Step,
    minimum_snap,
    reference_from,
)

__all__ = [
    "C4dFigure8", "CascadeRates", "Circle", "ControllerModel", "Figure8", "GeometricController",
    "GeometricGains", "GeometricState", "Hover", "PIDController", "PIDGains", "PIDState",
    "PiecewisePolynomial", "Reference", "Step", "geometric_control", "geometric_init", "minimum_snap",
    "pid_control", "pid_init", "reference_from",
]
