"""quadjax: a JAX-accelerated, batched, differentiable quadrotor simulator.

Conventions (one set): SI units; world ENU (z up), body FLU; quaternion
(w, x, y, z) rotating body → world; PX4 Quad X rotor order. Core functions are
pure and un-jitted: the caller jits the outermost call.

Day one: the types (:class:`QuadParams`, :class:`QuadState`), the model
(:func:`derivative`, :func:`rk4_step`), the engine (:func:`simulate` with a
:class:`SimConfig`, batched by :func:`map_vehicles` / :func:`vehicle_axes`), the mixer
(:func:`mix`), presets and hover trim, the invariants and status codes, and :func:`view`
(the trace player, ``quadjax.player``). Everything else
lives in its module: ``quadjax.control``, ``quadjax.mixer``, ``quadjax.monitor``,
``quadjax.sweep``, ``quadjax.sysid`` (imports optax), ``quadjax.mpc``, ``quadjax.native``,
``quadjax.sharding`` and ``quadjax.distributed`` (devices and processes), ``quadjax.frames``, ``quadjax.sensors`` and ``quadjax.estimation`` (IMU,
magnetometer, barometer, GPS/mocap, and the error-state EKF for the engine's observer slot,
:class:`Observer`), ``quadjax.euler16`` (seed 003's 16-state
Euler-angle model) and ``quadjax.vehicles`` (seed 004's missile, car and helicopter): other
:class:`Vehicle` s for the same engine.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from quadjax import control, frames, presets, status
from quadjax.engine import (
    Hook, Inputs, Observer, Reduce, Sense, SimConfig, Tick, Trajectory, Vehicle, map_vehicles, simulate, vehicle_axes,
)
from quadjax.integrators import euler_step, rk4_step, semi_implicit_euler_step
from quadjax.invariants import INVARIANT_IDS, invariant_id, state_valid, state_violation
from quadjax.mixer import MixerParams, mix
from quadjax.model import derivative, hover_rotor_speed, hover_state, hover_thrusts
from quadjax.params import QuadParams, check_params, params_valid
from quadjax.player import view
from quadjax.state import QuadState
from quadjax.status import STATUS_IDS

try:
    __version__ = _version("quadjax")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "INVARIANT_IDS",
    "STATUS_IDS",
    "Hook",
    "Inputs",
    "MixerParams",
    "Observer",
    "QuadParams",
    "QuadState",
    "Reduce",
    "Sense",
    "SimConfig",
    "Tick",
    "Trajectory",
    "Vehicle",
    "__version__",
    "check_params",
    "control",
    "derivative",
    "euler_step",
    "frames",
    "hover_rotor_speed",
    "hover_state",
    "hover_thrusts",
    "invariant_id",
    "map_vehicles",
    "mix",
    "params_valid",
    "presets",
    "rk4_step",
    "semi_implicit_euler_step",
    "simulate",
    "state_valid",
    "state_violation",
    "status",
    "vehicle_axes",
    "view",
]
