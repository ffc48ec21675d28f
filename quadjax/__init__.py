"""quadjax: a JAX-accelerated, batched, differentiable quadrotor simulator.

Conventions (one set): SI units; world ENU (z up), body FLU; quaternion
(w, x, y, z) rotating body → world; PX4 Quad X rotor order. Core functions are
pure and un-jitted: the caller jits the outermost call.
"""

from quadjax import control, frames, mpc, native, presets
from quadjax.integrators import euler_step, ground_contact, rk4_step, semi_implicit_euler_step
from quadjax.invariants import INVARIANT_IDS, invariant_id, state_valid, state_violation
from quadjax.mixer import (
    MixerLayout,
    MixerOutput,
    MixerParams,
    allocate,
    mix,
    mixer_params_from,
    mixer_params_valid,
    saturation_from,
    to_rotor_command,
    wrench,
)
from quadjax.model import derivative, hover_rotor_speed, hover_state, hover_thrusts
from quadjax.params import QuadParams, params_valid
from quadjax.rollout import rollout, rollout_closed_loop
from quadjax.state import QuadState
from quadjax.sysid.io import load_params

__all__ = [
    "MixerLayout",
    "MixerOutput",
    "MixerParams",
    "allocate",
    "mix",
    "mixer_params_from",
    "mixer_params_valid",
    "saturation_from",
    "to_rotor_command",
    "wrench",
    "QuadParams",
    "QuadState",
    "INVARIANT_IDS",
    "derivative",
    "euler_step",
    "frames",
    "control",
    "ground_contact",
    "hover_rotor_speed",
    "hover_state",
    "hover_thrusts",
    "invariant_id",
    "load_params",
    "mpc",
    "native",
    "params_valid",
    "presets",
    "rk4_step",
    "rollout",
    "rollout_closed_loop",
    "semi_implicit_euler_step",
    "state_valid",
    "state_violation",
]
