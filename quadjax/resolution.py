"""Whether a time step resolves the dynamics: the guard against finite wrong answers.

A fixed-step integrator gives finite nonsense, not NaN, when its step h is too long for the
fastest rate λ [1/s] of the dynamics: explicit RK4 on ẋ = −λx is unstable past λh = 2.79
(Euler past 2), and well inside that its error grows as (λh)⁵. The rates:

    linear drag          λ = max D_lin / m
    rotational drag      λ = max A_r / J_min
    gyroscopic coupling  λ = I_r · R ω_max / J_min          (all rotors one way, at ω_max)
    rotor damping        λ = max((k_h + k_in) R ω_max / m, k_in ω_max Σ|rᵢ|² / J_min,
                             √(k_β R ω_max g / J_min))
                         (H-force and inflow on the velocity; inflow on roll and pitch; the
                         flapping moment's coupling of tilt and velocity)
    quadratic drag       λ = 2 max D_quad · |v − wind| / m  (its linearisation; state)
    rotation             |ω|: the angle turned per step is |ω| h                 (state)
    rotor transient      (3/τ) · max |clamp(u) − ω| / ω_max                      (state)
    battery sag          4 · sag · Σ k_p ω_hi³ / capacity, ω_hi = max(ω, clamp(u))  (state)
    torque               √(α / 2), α = (|M(T)| + Σ |Tᵢ(u) − Tᵢ| (|rᵢ| + k_m)) / J_min  (state)

The torque rate bounds the body rates a step reaches from rest (ω = αh, so √(α/2)·h ≤ 0.5
is |ω| h ≤ 0.5 at the end): the state after a step cannot show them when ground contact
has zeroed them, and RK4's inner stages see them all the same.

The rotor lag itself is integrated exactly (:func:`quadjax.quadrotor.lagged_rotor_speeds_c`),
so it is stable at any h; but the thrust and power it drives are RK4 quadratures over the
step, and a spin-up much shorter than the step (h ≫ τ) is seen by one stage only: up to 1/6
of the change of thrust is misplaced. Thrust goes as ω² and power as ω³, so their transients
decay at up to 3/τ; the rotor rate weighs that by how far the rotors are from their command,
so a steady rotor never limits the step. The battery's thrust scale
1 − sag · min(E / capacity, 1) has a kink where E reaches the capacity; a step across
it is first order, so the battery rate is 4× the fraction of thrust it takes per second: a
step may lose at most 1/8 of the thrust to it.

J_min is the smallest principal moment. Two guards use them:

* :func:`start_code` (before the first step): the parameters' own rates (the first four)
  times h beyond the stepper's stability limit (×0.9) means the run cannot be right. The
  engine raises for concrete inputs and gives status ``coarse_step`` to traced ones.
* :func:`step_resolved` (the monitor, every step): every rate, with the state's on both sides
  of the step, times h ≤ :data:`STEP_BOUND`. An unreported step then agrees with a 16-substep
  reference to within 3 % of what one step may change (tests/test_reliability.py checks
  that over 10⁵ generated cases; RK4 alone would give (λh)⁴/120 ≈ 5e-4 of it, the couplings
  between rotation, thrust and drag the rest).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from quadjax import status as codes
from quadjax._components import join, split
from quadjax.params import QuadParams, params_valid
from quadjax.quadrotor import clamp_command_c, has_motor_lag, rotor_moment, rotor_thrusts
from quadjax.state import QuadState

#: the largest λ·h (and |ω|·h [rad]) a monitored step may take
STEP_BOUND = 0.5
#: λ·h at which each library stepper turns unstable on ẋ = −λx, with a 10 % margin
STABILITY = {"rk4": 0.9 * 2.785, "euler": 0.9 * 2.0, "semi_implicit_euler": 0.9 * 2.0}


def _smallest_moment(params: QuadParams):
    """J_min [kg·m²]: the smallest eigenvalue of the inertia (per vehicle)."""
    return jnp.linalg.eigvalsh(params.inertia)[..., 0]


class Fixed(NamedTuple):
    """What the parameters alone set, computed once per run (not every step): ``rate`` [1/s]
    (drags and gyroscopic coupling, :func:`fixed_rate`) and ``j_min`` [kg·m²]."""

    rate: jax.Array
    j_min: jax.Array


def fixed(params: QuadParams) -> Fixed:
    """:class:`Fixed` of ``params`` (per vehicle)."""
    j_min = _smallest_moment(params)
    linear = jnp.max(params.drag_linear, axis=-1) / params.mass
    rotational = jnp.max(params.drag_rotational, axis=-1) / j_min
    gyroscopic = params.rotor_inertia * params.num_rotors * params.omega_max / j_min
    return Fixed(jnp.maximum(jnp.maximum(linear, rotational), jnp.maximum(gyroscopic, rotor_damping(params, j_min))),
                 j_min)


def rotor_damping(params: QuadParams, j_min):
    """The fastest rate [1/s] the rotors' aerodynamics set: (k_h + k_in) R ω_max / m, the H-force's and
    inflow's damping of the velocity; k_in ω_max Σ|rᵢ|² / J_min, the inflow's of roll and pitch; and
    √(k_β R ω_max g / J_min), the flapping moment's coupling of tilt (which accelerates the vehicle
    at g per radian) and velocity (which tilts it); every rotor at ω_max; 0 with all three off."""
    omega = params.num_rotors * params.omega_max
    velocity = (params.rotor_drag + params.k_inflow) * omega / params.mass
    lever = jnp.sum(jnp.sum(params.rotor_positions ** 2, axis=-1), axis=-1)
    rates = params.k_inflow * params.omega_max * lever / j_min
    flapping = jnp.sqrt(params.blade_flapping * omega * params.gravity / j_min)
    return jnp.maximum(jnp.maximum(velocity, rates), flapping)


def fixed_rate(params: QuadParams):
    """The fastest rate the parameters alone set [1/s] (per vehicle): drags, gyroscopic coupling and
    rotor damping."""
    return fixed(params).rate


def state_rate(params: QuadParams, state: QuadState, wind=None):
    """The fastest rate the state adds [1/s]: quadratic drag at its airspeed, and |ω|."""
    wind = params.wind if wind is None else wind
    airspeed = jnp.linalg.norm(state.velocity - wind, axis=-1)
    quadratic = 2.0 * jnp.max(params.drag_quadratic, axis=-1) * airspeed / params.mass
    return jnp.maximum(quadratic, jnp.linalg.norm(state.body_rates, axis=-1))


def rotor_transient_rate(params: QuadParams, state: QuadState, target):
    """(3/τ) · max |u − ω| / ω_max [1/s], ``target`` u the clamped command: how fast the power
    (∝ ω³) of rotors still settling on their command changes; 0 without lag."""
    lag = has_motor_lag(params)
    gap = jnp.max(jnp.abs(target - state.rotor_speeds), axis=-1) / params.omega_max
    return jnp.where(lag, 3.0 * gap / jnp.where(lag, params.motor_tau, 1.0), 0.0)


def battery_rate(params: QuadParams, state: QuadState, target):
    """4 · sag · Σ k_p ω_hi³ / capacity [1/s], ω_hi the higher of each rotor's speed and its
    clamped command ``target``: four times the fraction of thrust the battery takes per second
    (4: the sag's kink at full charge is crossed to first order)."""
    w = jnp.maximum(state.rotor_speeds, target)
    power = jnp.sum(params.k_p[..., None] * w * w * w, axis=-1)
    return 4.0 * params.battery_sag * power / params.battery_capacity


def torque_rate(params: QuadParams, state: QuadState, target, j_min):
    """√(α/2) [1/s], α [rad/s²] a bound on the angular acceleration the rotors give over the
    step: the moment of the state's thrusts plus what the change to the clamped command's
    (``target``) could add, over ``j_min``."""
    now = rotor_thrusts(params, state.rotor_speeds, state.energy)
    change = jnp.abs(rotor_thrusts(params, target, state.energy) - now)
    lever = jnp.linalg.norm(params.rotor_positions, axis=-1) + params.k_m[..., None]
    moment = jnp.linalg.norm(rotor_moment(params, now), axis=-1) + jnp.sum(change * lever, axis=-1)
    return jnp.sqrt(0.5 * moment / j_min)


def step_rates(params: QuadParams, fix: Fixed, before: QuadState, after: QuadState, command, wind=None) -> dict:
    """Each rate [1/s] of the step from ``before`` to ``after`` under ``command`` (R,), by what
    sets it (the table in the module docstring); ``fix``: :func:`fixed` of ``params``."""
    target = join(clamp_command_c(params, split(command)))
    return {
        "drag or gyroscopic coupling of the params": fix.rate,
        "the body rates or the quadratic drag": jnp.maximum(state_rate(params, before, wind),
                                                            state_rate(params, after, wind)),
        "a rotor transient faster than the step (motor_tau)": rotor_transient_rate(params, before, target),
        "the battery sag (power / capacity)": battery_rate(params, before, target),
        "the rotors' torque (angular acceleration)": torque_rate(params, before, target, fix.j_min),
    }


def step_rate(params: QuadParams, fix: Fixed, before: QuadState, after: QuadState, command, wind=None):
    """The fastest of :func:`step_rates` [1/s]."""
    return functools.reduce(jnp.maximum, step_rates(params, fix, before, after, command, wind).values())


def step_resolved(params: QuadParams, fix: Fixed, before: QuadState, after: QuadState, command, h, wind=None):
    """True where the step's fastest rate (:func:`step_rate`) times ``h`` [s] is at most
    :data:`STEP_BOUND` (per vehicle; NaN counts as unresolved)."""
    return step_rate(params, fix, before, after, command, wind) * h <= STEP_BOUND


def start_code(params: QuadParams, h, stability: float | None):
    """The status a vehicle starts with (per vehicle, int32): ``params_invalid`` for params
    that break I1 or a step h [s] that is not finite and > 0; ``coarse_step`` where the
    parameters' own rates make the stepper unstable at h (``stability``: its limit on λh,
    :data:`STABILITY`; None for a stepper of the caller's, not judged); else ``ok``."""
    return status_at_start(params_valid(params), fixed_rate(params), h, stability)


def status_at_start(valid, rate, h, stability: float | None):
    """:func:`start_code` from its facts, for any vehicle: ``valid`` (its params pass their
    checks) and ``rate`` [1/s] (their fastest rate)."""
    ok = valid & jnp.isfinite(h) & (h > 0)
    stable = True if stability is None else rate * h <= stability
    code = jnp.where(ok, jnp.where(stable, codes.OK, codes.COARSE_STEP), codes.PARAMS_INVALID)
    return code.astype(jnp.int32)
