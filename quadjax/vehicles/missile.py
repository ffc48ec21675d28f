"""The missile of seed 004: a 6-DoF rigid body with a rocket motor, aerodynamics and fins; and
its target, a 3-DoF point mass.

State, ENU world / FLU body: ``attitude="euler"`` (13,) = [p (3), v (3), (φ, θ, ψ) 3-2-1,
ω (3), τ]; ``attitude="quaternion"`` (14,) = [p, v, q (w, x, y, z) body→world, ω, τ]. τ [s] is
the time since ignition: the burn schedule is a function of it (τ̇ = 1). Command: the fin
deflections δ = [δ_roll, δ_pitch, δ_yaw] [rad], clipped to ±fin_limit; each makes a positive
moment about its body axis.

Forces and moments (body), with v_b = Rᵀ(v − wind), V = ‖v_b‖, q̄ = ½ ρ V², S = π d²/4:

    thrust      (T(τ), 0, 0): T while τ < burn_time, then 0
    axial       −q̄ S (C_A0 + C_A2 (v² + w²)/V²) along x            (drag)
    normal      −q̄ S C_Nα (0, v, w)/V                               (lift: it opposes the cross flow)
    static      (0, ℓ F_z, −ℓ F_y): the normal force acting ℓ = static_margin behind the centre
                of mass (ℓ > 0: weathercock stable)
    damping     q̄ S d · d/(2V) · (C_lp p, C_mq q, C_mq r)
    fins        q̄ S d · (C_lδ δ_roll, C_mδ δ_pitch, C_mδ δ_yaw)
    gravity     −m g e_z (world)

Mass and inertia (principal, diagonal) go linearly from full to burnt-out over the burn:
m(τ) = m_full − propellant · min(τ, t_b)/t_b, J(τ) likewise. As in c4dynamics, the rigid body
sees the current m and J (the rate terms J̇ ω and jet damping are neglected).

The rigid-body core is quadjax's (:func:`quadjax.rigid_body.rigid_body_derivative` on the
quaternion, :func:`quadjax.frames.euler12_rigid_body` on Euler angles). :func:`seed_example`
is the seed's launch (NED data converted at the edge); :func:`pn_control` a proportional
navigation guidance with a trim-feedforward autopilot.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from quadjax import status as codes
from quadjax._pytree import pytree_dataclass
from quadjax.frames import euler12_rigid_body, euler321_to_quat
from quadjax.invariants import ATTITUDE_NOT_UNIT, unit_quaternion
from quadjax.quaternion import quat_normalize, quat_rotate, quat_rotate_inverse
from quadjax.rigid_body import rigid_body_derivative
from quadjax.vehicles import VectorVehicle, create, finite, nonnegative, positive

ATTITUDES = ("euler", "quaternion")
_SCALARS = ("mass_full", "propellant", "thrust", "burn_time", "air_density", "diameter", "c_a0", "c_a2",
            "c_n_alpha", "static_margin", "c_mq", "c_lp", "c_m_delta", "c_l_delta", "fin_limit", "gravity")


@pytree_dataclass
class MissileParams:
    """mass_full [kg] at ignition, propellant [kg] burnt over burn_time [s] at thrust [N];
    inertia_full, inertia_dry (3,) [kg·m²] principal moments at ignition and burn-out;
    air_density [kg/m³]; diameter d [m] (reference length; S = π d²/4); c_a0, c_a2 axial
    (drag) coefficients; c_n_alpha [1/rad] normal-force slope; static_margin ℓ [m]; c_mq, c_lp
    damping derivatives (≤ 0); c_m_delta, c_l_delta [1/rad] fin moment derivatives;
    fin_limit [rad]; gravity [m/s²]; wind (3,) [m/s] world. ``attitude`` (static): the
    state's attitude, ``"euler"`` or ``"quaternion"``."""

    mass_full: jax.Array
    propellant: jax.Array
    inertia_full: jax.Array
    inertia_dry: jax.Array
    thrust: jax.Array
    burn_time: jax.Array
    air_density: jax.Array
    diameter: jax.Array
    c_a0: jax.Array
    c_a2: jax.Array
    c_n_alpha: jax.Array
    static_margin: jax.Array
    c_mq: jax.Array
    c_lp: jax.Array
    c_m_delta: jax.Array
    c_l_delta: jax.Array
    fin_limit: jax.Array
    gravity: jax.Array
    wind: jax.Array
    attitude: str = dataclasses.field(default="euler", metadata={"static": True})

    @classmethod
    def create(cls, *, attitude="euler", dtype=None, **values) -> "MissileParams":
        """Checked constructor; every numeric field by name (``wind`` defaults to still air)."""
        if attitude not in ATTITUDES:
            raise ValueError(f"MissileParams.attitude={attitude!r}: choose one of {ATTITUDES}")
        values.setdefault("wind", (0.0, 0.0, 0.0))
        params = create(cls, MISSILES["euler"], values, dtype)
        return params.replace(attitude=attitude)

    @property
    def vehicle(self) -> VectorVehicle:
        return MISSILES[self.attitude]


def reference_missile(attitude="euler", dtype=None) -> MissileParams:
    """A short-range surface-to-air missile (assumed, plausible numbers): the seed's 85 kg and
    J = (0.5, 61, 61) kg·m² at ignition, 8000 N for 4 s burning 14 kg (I_sp ≈ 233 s), d = 0.2 m, C_A0 0.3,
    C_A2 1.0, C_Nα 20 /rad, static margin 0.3 m (1.5 calibres), C_mq −200, C_lp −5,
    C_mδ 30 /rad, C_lδ 2 /rad, fins ±0.3 rad, sea-level air."""
    return MissileParams.create(
        mass_full=85.0, propellant=14.0, inertia_full=(0.5, 61.0, 61.0), inertia_dry=(0.43, 53.0, 53.0),
        thrust=8000.0, burn_time=4.0, air_density=1.225, diameter=0.2, c_a0=0.3, c_a2=1.0, c_n_alpha=20.0,
        static_margin=0.3, c_mq=-200.0, c_lp=-5.0, c_m_delta=30.0, c_l_delta=2.0, fin_limit=0.3, gravity=9.80665,
        attitude=attitude, dtype=dtype)


# --------------------------------------------------------------------------- the physics


def schedule(params: MissileParams, tau):
    """(thrust [N], mass [kg], inertia (3,) [kg·m²]) at τ [s] after ignition."""
    burnt = jnp.clip(tau / params.burn_time, 0.0, 1.0)
    thrust = jnp.where(tau < params.burn_time, params.thrust, 0.0)
    mass = params.mass_full - params.propellant * burnt
    inertia = params.inertia_full + (params.inertia_dry - params.inertia_full) * burnt
    return thrust, mass, inertia


def reference_area(params: MissileParams):
    """S = π d² / 4 [m²]."""
    return 0.25 * jnp.pi * params.diameter**2


def aerodynamics(params: MissileParams, v_body, rates, fins):
    """(force (3,) [N], moment (3,) [N·m]) of the air on the body (FLU) and of the fins."""
    speed2 = jnp.sum(v_body**2)
    moving = speed2 > 0
    speed = jnp.sqrt(jnp.where(moving, speed2, 1.0))  # V; the 1 is never used (q̄ = 0 at rest)
    qbar = jnp.where(moving, 0.5 * params.air_density * speed2, 0.0)
    area = reference_area(params)
    cross = v_body[1:] / speed  # (v, w) / V
    axial = -qbar * area * (params.c_a0 + params.c_a2 * jnp.sum(cross**2))
    normal = -qbar * area * params.c_n_alpha * cross  # (F_y, F_z)
    force = jnp.concatenate([axial[None], normal])
    static = params.static_margin * jnp.stack([jnp.zeros_like(axial), normal[1], -normal[0]])
    qsd = qbar * area * params.diameter
    damping = qsd * params.diameter / (2.0 * speed) * rates * jnp.stack([params.c_lp, params.c_mq, params.c_mq])
    delta = jnp.clip(fins, -params.fin_limit, params.fin_limit)
    control = qsd * delta * jnp.stack([params.c_l_delta, params.c_m_delta, params.c_m_delta])
    return force, static + damping + control


def _body_wrench(params: MissileParams, q, velocity, rates, tau, fins):
    """(mass, inertia (3, 3), body force, body moment) at this instant."""
    thrust, mass, inertia = schedule(params, tau)
    force, moment = aerodynamics(params, quat_rotate_inverse(q, velocity - params.wind), rates, fins)
    force = force + jnp.stack([thrust, jnp.zeros_like(thrust), jnp.zeros_like(thrust)])
    return mass, jnp.diag(inertia), force, moment


def derivative_euler(params: MissileParams, x, command) -> jax.Array:
    """ẋ (13,) on the Euler-angle state."""
    q = euler321_to_quat(x[6:9])
    mass, inertia, force, moment = _body_wrench(params, q, x[3:6], x[9:12], x[12], command)
    body = euler12_rigid_body(mass, inertia, params.gravity, x[:12], force, moment)
    return jnp.concatenate([body, jnp.ones_like(x[12:])])


def derivative_quaternion(params: MissileParams, x, command) -> jax.Array:
    """ẋ (14,) on the quaternion state (q̇ = ½ q ⊗ (0, ω))."""
    q = x[6:10]
    mass, inertia, force, moment = _body_wrench(params, q, x[3:6], x[10:13], x[13], command)
    p_dot, v_dot, q_dot, w_dot = rigid_body_derivative(mass, inertia, params.gravity, q, x[3:6], x[10:13],
                                                       force, moment)
    return jnp.concatenate([p_dot, v_dot, q_dot, w_dot, jnp.ones_like(x[13:])])


def derivative(params: MissileParams, x, command) -> jax.Array:
    """ẋ of the state of ``params.attitude`` under fin deflections ``command`` (3,) [rad]."""
    return (derivative_euler if params.attitude == "euler" else derivative_quaternion)(params, x, command)


def attitude_quaternion(params: MissileParams, x) -> jax.Array:
    """q (4,) body→world of either state."""
    return euler321_to_quat(x[6:9]) if params.attitude == "euler" else quat_normalize(x[6:10])


def body_rates(params: MissileParams, x) -> jax.Array:
    return x[9:12] if params.attitude == "euler" else x[10:13]


def launch_state(params: MissileParams, position, speed, euler) -> jax.Array:
    """At ``position`` (3,) [m], flying ``speed`` [m/s] along its nose with attitude ``euler``
    (φ, θ, ψ) [rad], not rotating, at ignition (τ = 0), in the state of ``params.attitude``."""
    dtype = jnp.result_type(params.mass_full)
    euler = jnp.asarray(euler, dtype)
    q = euler321_to_quat(euler)
    v = quat_rotate(q, jnp.stack([jnp.asarray(speed, dtype), jnp.zeros((), dtype), jnp.zeros((), dtype)]))
    attitude = euler if params.attitude == "euler" else q
    return jnp.concatenate([jnp.asarray(position, dtype), v, attitude, jnp.zeros(3, dtype), jnp.zeros(1, dtype)])


def _checks(p: MissileParams) -> dict:
    return {
        "mass_full": positive(p.mass_full), "propellant": nonnegative(p.propellant) & (p.propellant < p.mass_full),
        "inertia_full": jnp.all(positive(p.inertia_full)), "inertia_dry": jnp.all(positive(p.inertia_dry)),
        "thrust": nonnegative(p.thrust), "burn_time": positive(p.burn_time), "air_density": nonnegative(p.air_density),
        "diameter": positive(p.diameter), "c_a0": finite(p.c_a0), "c_a2": finite(p.c_a2),
        "c_n_alpha": finite(p.c_n_alpha), "static_margin": finite(p.static_margin), "c_mq": finite(p.c_mq),
        "c_lp": finite(p.c_lp), "c_m_delta": finite(p.c_m_delta), "c_l_delta": finite(p.c_l_delta),
        "fin_limit": nonnegative(p.fin_limit), "gravity": nonnegative(p.gravity), "wind": jnp.all(finite(p.wind)),
    }


_BOUNDS = {k: "finite" for k in _SCALARS} | {
    "mass_full": "> 0", "propellant": ">= 0 and < mass_full", "inertia_full": "> 0", "inertia_dry": "> 0",
    "thrust": ">= 0", "burn_time": "> 0", "air_density": ">= 0", "diameter": "> 0", "fin_limit": ">= 0",
    "gravity": ">= 0", "wind": "finite"}
_SHAPES = {k: () for k in _SCALARS} | {"inertia_full": (3,), "inertia_dry": (3,), "wind": (3,)}

def _renormalise(params, x):
    """The quaternion back to unit norm after a step (I2), as the quadrotor's steppers do."""
    return x.at[6:10].set(quat_normalize(x[6:10]))


def _attitude_unit(params, x):
    """I2 on the quaternion state (the quadrotor monitor's bound)."""
    return jnp.where(unit_quaternion(x[6:10]), codes.OK, ATTITUDE_NOT_UNIT).astype(jnp.int32)


MISSILES = {
    "euler": VectorVehicle("the missile (Euler angles)", derivative_euler, 13, 3, _SHAPES, _checks, _BOUNDS),
    "quaternion": VectorVehicle("the missile (quaternion)", derivative_quaternion, 14, 3, _SHAPES, _checks, _BOUNDS,
                                finish=_renormalise, violation=_attitude_unit),
}


# --------------------------------------------------------------------------- the target


@pytree_dataclass
class PointMassParams:
    """A 3-DoF point mass (seed 004's ``datapoint``): mass [kg]. State [p (3), v (3)] world;
    command: the force (3,) [N] on it (gravity not included: add it to the force)."""

    mass: jax.Array

    @classmethod
    def create(cls, mass, dtype=None) -> "PointMassParams":
        return create(cls, POINT_MASS, {"mass": mass}, dtype)


def point_mass_derivative(params: PointMassParams, x, command) -> jax.Array:
    """[v, F/m] (6,)."""
    return jnp.concatenate([x[3:6], command / params.mass])


POINT_MASS = VectorVehicle("the point mass", point_mass_derivative, 6, 3, {"mass": ()},
                           lambda p: {"mass": positive(p.mass)}, {"mass": "> 0"})
PointMassParams.vehicle = POINT_MASS


# --------------------------------------------------------------------------- guidance


@pytree_dataclass
class PNGuidance:
    """Proportional navigation against a non-manoeuvring target (position ``target0`` (3,) [m]
    at t = 0, velocity ``target_velocity`` (3,) [m/s]), navigation constant ``gain`` (3–5), and
    ``model``: the missile the autopilot believes in; ``rate_gain`` [1/s] its body-rate damping
    (a moment −rate_gain · J ω); ``tick`` [s] the control period (the engine's dt), over which
    the miss distance is resolved."""

    model: MissileParams
    target0: jax.Array
    target_velocity: jax.Array
    gain: jax.Array
    rate_gain: jax.Array
    tick: jax.Array


def target_position(ctrl: PNGuidance, t):
    return ctrl.target0 + ctrl.target_velocity * t


def closest_approach(rel, rel_v, dt):
    """The smallest distance [m] over the next ``dt`` [s] between two points that are ``rel``
    (3,) apart with relative velocity ``rel_v`` (3,), both held: ‖r + v t*‖, t* = clip(−r·v/‖v‖², 0, dt)."""
    t_star = jnp.clip(-jnp.dot(rel, rel_v) / jnp.maximum(jnp.dot(rel_v, rel_v), 1e-12), 0.0, dt)
    return jnp.linalg.norm(rel + rel_v * t_star)


def pn_control(ctrl: PNGuidance, cs, x, t):
    """(fins (3,) [rad], cs): true PN with gravity compensation, a = N V_c (Ω × r̂) + g e_z, with
    Ω = r × ṙ / ‖r‖² the line-of-sight rate and V_c = −ṙ·r̂ the closing speed; the autopilot
    holds the body-frame normal acceleration of ``a`` by the fin deflection that trims it (the
    fin moment balancing the normal force's static moment, from the model) and damps the body
    rates (the fins' share of a moment −rate_gain · J ω).

    The controller state ``cs`` is the closest approach so far [m] (start it at ``jnp.inf``):
    each call folds in the closest approach over the next ``ctrl.tick`` seconds, so the final
    ``Trajectory.ctrl_state`` is the miss distance, resolved within each tick."""
    m = ctrl.model
    rel = target_position(ctrl, t) - x[0:3]
    rel_v = ctrl.target_velocity - x[3:6]
    cs = jnp.minimum(cs, closest_approach(rel, rel_v, ctrl.tick))
    r2 = jnp.maximum(jnp.sum(rel**2), 1e-6)
    los = rel / jnp.sqrt(r2)
    omega = jnp.cross(rel, rel_v) / r2
    closing = -jnp.dot(rel_v, los)
    gravity = jnp.stack([0.0 * m.gravity, 0.0 * m.gravity, m.gravity])
    accel = ctrl.gain * closing * jnp.cross(omega, los) + gravity
    q = attitude_quaternion(m, x)
    a_body = quat_rotate_inverse(q, accel)
    v_body = quat_rotate_inverse(q, x[3:6] - m.wind)
    _, mass, inertia = schedule(m, x[-1])
    qsd = jnp.maximum(0.5 * m.air_density * jnp.sum(v_body**2), 1.0) * reference_area(m) * m.diameter
    # the fin moment that cancels the static moment of the normal force F = m a_body: (0, ℓF_z, −ℓF_y)
    trim = m.static_margin * mass / (qsd * m.c_m_delta) * jnp.stack([0.0 * a_body[0], -a_body[2], a_body[1]])
    rates = body_rates(m, x)
    authority = qsd * jnp.abs(jnp.stack([m.c_l_delta, m.c_m_delta, m.c_m_delta]))
    damping = -ctrl.rate_gain * inertia * rates / authority  # the fins' share of a moment −k J ω
    return trim + damping, cs
