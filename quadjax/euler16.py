"""Seed 003's 16-state Euler-angle quadrotor ("Motor Model and Dynamics Simulation"), exactly as
the seed states it, as another :class:`quadjax.Vehicle` for the same engine.

State (16,), the seed's vector::

    0:3    position [x, y, z] m, world (z up)        3:6    velocity m/s, world
    6:9    Euler angles [φ, θ, ψ] rad (Z-Y-X)         9:12   body rates [p, q, r] rad/s (FLU)
    12:16  motor speeds [ω₁ … ω₄] RPM

Command (4,): the desired wrench [F N, Mx, My, Mz N·m] (body frame). Motors in the seed's
order, a "+" layout: 1 front (+x, CCW), 2 left (+y, CW), 3 rear (−x, CCW), 4 right (−y, CW).

Motor model (the seed's steps 1–5): the allocation A (:func:`allocation`) maps squared RPM to
the wrench; rpm²_des = A⁻¹ [F, M]; rpm_des = clip(√max(rpm²_des, 0), rpm_min, rpm_max);
rpm_dot = k_motor (rpm_des − rpm); the wrench that acts is A rpm².

Dynamics, with the seed's deliberate simplifications:

    ṗ = v;   v̇ = (0, 0, −g) + R_zyx(φ, θ, ψ) (0, 0, F/m);   (φ̇, θ̇, ψ̇) = (p, q, r);   ω̇ = J⁻¹ M.

The two simplifications ("Euler rates = body rates", no ω × Jω) can be undone one by one
(``corrections``, for the study in benchmarks/euler16_divergence.py); with both undone the
model is the full quaternion model of :func:`quadjax.derivative` (no drag, no battery, away
from θ = ±90°), which tests/test_euler16.py checks.

Units: the seed's model works in RPM (cT N/RPM², cQ N·m/RPM²), the one exception to the SI
rule, as the seed states it; :func:`to_quad_state`, :func:`from_quad_state`,
:func:`from_quad_params` and :func:`quad_command` convert to and from the quadjax model at the
edge, RPM ↔ rad/s by :func:`quadjax.frames.rpm_to_rad_s`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass
from quadjax.control.trajectories import Reference
from quadjax.frames import RPM_PER_RAD_S, euler321_to_quat, euler_rates, quat_to_euler321, rpm_to_rad_s, rad_s_to_rpm
from quadjax.params import QuadParams, float_dtype
from quadjax.rigid_body import angular_acceleration
from quadjax.state import QuadState
from quadjax.vehicles import VectorVehicle, create, nonnegative, positive

#: the seed's simplifications that ``Euler16Params.corrections`` can undo
CORRECTIONS = ("euler_rates", "gyroscopic")
STATE_SIZE = 16
_SCALARS = ("mass", "gravity", "c_t", "c_q", "arm", "k_motor", "rpm_min", "rpm_max")


@pytree_dataclass
class Euler16Params:
    """The seed-003 vehicle: mass () kg, inertia (3, 3) kg·m² (body), gravity () m/s²,
    c_t () N/RPM², c_q () N·m/RPM², arm d () m, k_motor () 1/s (motor lag gain),
    rpm_min, rpm_max () RPM. ``corrections`` (static): which of :data:`CORRECTIONS` to undo
    (the seed's model: none)."""

    mass: jax.Array
    inertia: jax.Array
    gravity: jax.Array
    c_t: jax.Array
    c_q: jax.Array
    arm: jax.Array
    k_motor: jax.Array
    rpm_min: jax.Array
    rpm_max: jax.Array
    corrections: tuple = dataclasses.field(default=(), metadata={"static": True})

    @classmethod
    def create(cls, *, mass, inertia, c_t, c_q, arm, k_motor, rpm_min, rpm_max, gravity=9.80665,
               corrections=(), dtype=None) -> "Euler16Params":
        """Checked constructor (``inertia`` may be its diagonal); ValueError naming the first bad field."""
        inertia = np.asarray(inertia, np.float64)
        values = dict(mass=mass, inertia=np.diag(inertia) if inertia.shape == (3,) else inertia, gravity=gravity,
                      c_t=c_t, c_q=c_q, arm=arm, k_motor=k_motor, rpm_min=rpm_min, rpm_max=rpm_max)
        return create(cls, EULER16, values, dtype).replace(corrections=_corrections(corrections))

    def astype(self, dtype) -> "Euler16Params":
        dtype = float_dtype(dtype, "Euler16Params.astype")
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), self)


def _corrections(names) -> tuple:
    names = tuple(names)
    unknown = [n for n in names if n not in CORRECTIONS]
    if unknown:
        raise ValueError(f"Euler16Params.corrections: unknown {unknown}; choose from {CORRECTIONS}")
    return tuple(n for n in CORRECTIONS if n in names)


def _value_checks(p: Euler16Params) -> dict:
    """Field name → bool (per vehicle) that it is within bounds (I1 for this model)."""
    J = p.inertia
    sym = jnp.all(jnp.abs(J - jnp.swapaxes(J, -1, -2)) <= 1e-6 * jnp.max(jnp.abs(J), axis=(-2, -1))[..., None, None],
                  axis=(-2, -1))
    pd = jnp.all(jnp.isfinite(J), axis=(-2, -1)) & (jnp.linalg.eigvalsh(jnp.where(sym[..., None, None], J, 1.0))[..., 0] > 0)
    return {
        "mass": positive(p.mass),
        "inertia": sym & pd,
        "gravity": nonnegative(p.gravity),
        "c_t": positive(p.c_t),
        "c_q": positive(p.c_q),
        "arm": positive(p.arm),
        "k_motor": positive(p.k_motor),
        "rpm_min": nonnegative(p.rpm_min),
        "rpm_max": positive(p.rpm_max - p.rpm_min),
    }


_BOUNDS = {"mass": "> 0", "inertia": "symmetric positive definite", "gravity": ">= 0", "c_t": "> 0",
           "c_q": "> 0", "arm": "> 0", "k_motor": "> 0", "rpm_min": ">= 0", "rpm_max": "> rpm_min"}


def params_valid(params: Euler16Params) -> jax.Array:
    """Every field finite and within bounds (per vehicle; works under jit and vmap)."""
    return EULER16.params_valid(params)


def check_params(params: Euler16Params) -> None:
    """ValueError naming the first field out of bounds (concrete params)."""
    EULER16.check_params(params)


# --------------------------------------------------------------------------- the motor model


def allocation(params: Euler16Params) -> jax.Array:
    """The seed's 4×4 prop_matrix A: [F, Mx, My, Mz] = A rpm² (rpm² in RPM², motors 1–4)::

        F :   cT     cT     cT     cT
        Mx:   0      d·cT   0     −d·cT
        My:  −d·cT   0      d·cT   0
        Mz:  −cQ     cQ    −cQ     cQ
    """
    ct, cq, dct = params.c_t, params.c_q, params.arm * params.c_t
    z = jnp.zeros_like(ct)
    return jnp.stack([
        jnp.stack([ct, ct, ct, ct]),
        jnp.stack([z, dct, z, -dct]),
        jnp.stack([-dct, z, dct, z]),
        jnp.stack([-cq, cq, -cq, cq]),
    ])


def _sqrt_nonnegative(x):
    """√max(x, 0), with a finite gradient (0) where x ≤ 0 (√ has an infinite one at 0)."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def desired_rpm(params: Euler16Params, wrench) -> jax.Array:
    """The seed's steps 2–3: solve A rpm² = [F, M], clamp negatives to 0, √, clip to
    [rpm_min, rpm_max] → (4,) RPM."""
    rpm_sq = jnp.linalg.solve(allocation(params), wrench)
    return jnp.clip(_sqrt_nonnegative(rpm_sq), params.rpm_min, params.rpm_max)


def motor_model(params: Euler16Params, rpm, wrench):
    """The seed's motor model: (F N, M (3,) N·m, rpm_dot (4,) RPM/s) from the motor speeds
    ``rpm`` (4,) and the desired ``wrench`` (4,): rpm_dot = k_motor (rpm_des − rpm), and the
    wrench the motors make, A rpm²."""
    return _motor_response(params, rpm, desired_rpm(params, wrench))


def _motor_response(params: Euler16Params, rpm, rpm_des):
    """:func:`motor_model` from the desired speeds (the lag and the wrench the motors make)."""
    rpm_dot = params.k_motor * (rpm_des - rpm)
    actual = allocation(params) @ (rpm * rpm)
    return actual[0], actual[1:], rpm_dot


# --------------------------------------------------------------------------- the dynamics


def thrust_direction(euler) -> jax.Array:
    """Body z in the world, the third column of R = R_z(ψ) R_y(θ) R_x(φ):
    (cφ sθ cψ + sφ sψ, cφ sθ sψ − sφ cψ, cφ cθ)."""
    sr, cr = jnp.sin(euler[0]), jnp.cos(euler[0])
    sp, cp = jnp.sin(euler[1]), jnp.cos(euler[1])
    sy, cy = jnp.sin(euler[2]), jnp.cos(euler[2])
    return jnp.stack([cr * sp * cy + sr * sy, cr * sp * sy - sr * cy, cr * cp])


def derivative(params: Euler16Params, x, command) -> jax.Array:
    """The seed's state_dot (16,) from the state ``x`` (16,) and desired wrench ``command`` (4,)."""
    return _dynamics(params, x, desired_rpm(params, command))


def _dynamics(params: Euler16Params, x, rpm_des) -> jax.Array:
    """:func:`derivative` from the desired motor speeds: a step computes them (a 4×4 solve) once
    for its command, not at every stage."""
    velocity, euler, rates, rpm = x[3:6], x[6:9], x[9:12], x[12:16]
    force, moment, rpm_dot = _motor_response(params, rpm, rpm_des)
    gravity = jnp.stack([jnp.zeros_like(params.gravity), jnp.zeros_like(params.gravity), -params.gravity])
    v_dot = gravity + thrust_direction(euler) * (force / params.mass)
    euler_dot = euler_rates(euler, rates) if "euler_rates" in params.corrections else rates
    # angular_acceleration is J⁻¹(M − ω × Jω); the seed drops ω × Jω: ω = 0 in that term
    gyro_rates = rates if "gyroscopic" in params.corrections else jnp.zeros_like(rates)
    w_dot = angular_acceleration(params.inertia, gyro_rates, moment)
    return jnp.concatenate([velocity, v_dot, euler_dot, w_dot, rpm_dot])


# --------------------------------------------------------------------------- trim and conversions


def hover_rpm(params: Euler16Params) -> jax.Array:
    """The motor speed [RPM] at which four motors carry the weight: √(m g / (4 cT))."""
    return jnp.sqrt(params.mass * params.gravity / (4.0 * params.c_t))


def hover_wrench(params: Euler16Params) -> jax.Array:
    """[m g, 0, 0, 0]: the command that holds hover."""
    weight = params.mass * params.gravity
    return jnp.stack([weight, jnp.zeros_like(weight), jnp.zeros_like(weight), jnp.zeros_like(weight)])


def hover_state(params: Euler16Params, position=(0.0, 0.0, 0.0), yaw=0.0) -> jax.Array:
    """The 16-state at rest at ``position`` with heading ``yaw``, motors at :func:`hover_rpm`."""
    dtype = jnp.result_type(params.mass)
    x = jnp.zeros((STATE_SIZE,), dtype)
    x = x.at[0:3].set(jnp.asarray(position, dtype)).at[8].set(jnp.asarray(yaw, dtype))
    return x.at[12:16].set(hover_rpm(params))


def from_quad_params(params: QuadParams, corrections=()) -> Euler16Params:
    """The seed-003 params of a quadjax vehicle in the seed's "+" layout (e.g.
    :func:`quadjax.presets.cmu_plus`): cT = k_f / (60/2π)², cQ = k_m cT, k_motor = 1/τ, the RPM
    limits from ω_min, ω_max. ValueError if the vehicle is not that layout, or has drag, rotor
    inertia or a battery model, which the seed's model lacks."""
    arm = float(np.linalg.norm(np.asarray(params.rotor_positions)[0]))
    plus = np.array([[arm, 0, 0], [0, arm, 0], [-arm, 0, 0], [0, -arm, 0]])
    if np.shape(params.rotor_positions) != (4, 3) or not np.allclose(params.rotor_positions, plus, atol=1e-6):
        raise ValueError("from_quad_params: the seed-003 model is the '+' layout, motors at "
                         f"(d,0,0), (0,d,0), (−d,0,0), (0,−d,0); got {np.asarray(params.rotor_positions).tolist()}")
    if not np.allclose(params.rotor_spins, (1.0, -1.0, 1.0, -1.0)):
        raise ValueError(f"from_quad_params: spins must be (CCW, CW, CCW, CW) = (1, −1, 1, −1); got "
                         f"{np.asarray(params.rotor_spins).tolist()}")
    absent = [f for f in ("drag_linear", "drag_quadratic", "drag_rotational", "rotor_inertia", "battery_sag",
                          "rotor_reaction_inertia", "rotor_drag", "blade_flapping", "k_inflow", "rotor_radius")
              if np.any(np.asarray(getattr(params, f)) != 0)]
    if float(params.motor_tau_down_ratio) != 1:
        absent.append("motor_tau_down_ratio (set it to 1)")
    if absent:
        raise ValueError(f"from_quad_params: the seed-003 model has no {absent}; set them to 0")
    if not float(params.motor_tau) > 0:
        raise ValueError("from_quad_params: the seed-003 motors have a lag (motor_tau > 0)")
    c_t = float(params.k_f) / RPM_PER_RAD_S**2
    return Euler16Params.create(
        mass=float(params.mass), inertia=np.asarray(params.inertia), gravity=float(params.gravity),
        c_t=c_t, c_q=float(params.k_m) * c_t, arm=arm, k_motor=1.0 / float(params.motor_tau),
        rpm_min=float(rad_s_to_rpm(params.omega_min)), rpm_max=float(rad_s_to_rpm(params.omega_max)),
        corrections=corrections, dtype=jnp.result_type(params.mass))


def to_quad_state(x) -> QuadState:
    """The 16-state as a :class:`quadjax.QuadState`: Z-Y-X angles → quaternion, RPM → rad/s,
    energy 0, airborne. Batched over leading axes."""
    x = jnp.asarray(x)
    zero = jnp.zeros(x.shape[:-1], x.dtype)
    return QuadState(position=x[..., 0:3], velocity=x[..., 3:6], attitude=euler321_to_quat(x[..., 6:9]),
                     body_rates=x[..., 9:12], rotor_speeds=rpm_to_rad_s(x[..., 12:16]), energy=zero,
                     on_ground=zero)


def from_quad_state(state: QuadState) -> jax.Array:
    """A four-rotor :class:`quadjax.QuadState` as the 16-state (θ ∈ [−π/2, π/2]; rad/s → RPM)."""
    return jnp.concatenate([state.position, state.velocity, quat_to_euler321(state.attitude), state.body_rates,
                            rad_s_to_rpm(state.rotor_speeds)], axis=-1)


def quad_command(params: Euler16Params, wrench) -> jax.Array:
    """The quadjax model's rotor-speed command [rad/s] for the desired ``wrench``: the seed's
    allocation, clamp and clip (:func:`desired_rpm`), in rad/s. The full model's first-order lag
    (τ = 1/k_motor) then does what the seed's motor lag does, and both models fly one command
    sequence."""
    return rpm_to_rad_s(desired_rpm(params, wrench))


# --------------------------------------------------------------------------- a controller


@pytree_dataclass
class PDGains:
    """Gains of :func:`pd_control` (each (3,), per axis): position kp [1/s²], kd [1/s];
    attitude kp [1/s²], kd [1/s]; max_tilt () rad, the limit on the commanded roll and pitch."""

    kp_position: jax.Array
    kd_position: jax.Array
    kp_attitude: jax.Array
    kd_attitude: jax.Array
    max_tilt: jax.Array

    @classmethod
    def default(cls, dtype=None) -> "PDGains":
        """Gains for cmu_plus: position ζ ≈ 0.9, ~0.6 Hz; attitude ζ ≈ 0.9, ~3 Hz."""
        f = lambda v: jnp.asarray(v, dtype)  # noqa: E731
        return cls(kp_position=f([12.0, 12.0, 16.0]), kd_position=f([6.0, 6.0, 8.0]),
                   kp_attitude=f([360.0, 360.0, 100.0]), kd_attitude=f([34.0, 34.0, 18.0]), max_tilt=f(0.5))


@pytree_dataclass
class PDController:
    """The linearised hover controller of the course seed 003 comes from: ``model`` is what it
    believes of the vehicle, ``reference`` a trajectory t → :class:`Reference`."""

    model: Euler16Params
    gains: PDGains
    reference: object


def pd_control(ctrl: PDController, cs, x, t):
    """(wrench command (4,), cs) for the 16-state ``x`` at time t [s].

    Position loop: a = a_ref + kd (v_ref − v) + kp (p_ref − p). Small-angle inversion of
    v̇ = R e₃ F/m − g e₃ about hover at heading ψ: F = m (g + a_z), φ_des = (a_x sψ − a_y cψ)/g,
    θ_des = (a_x cψ + a_y sψ)/g, both clipped to ±max_tilt. Attitude loop: M = J (kp (η_des − η) + kd (ω_des − ω)), with
    ω_des = (0, 0, ψ̇_ref). The controller state is unused (None).
    """
    ref: Reference = ctrl.reference(t)
    m, g, k = ctrl.model.mass, ctrl.model.gravity, ctrl.gains
    a = ref.acceleration + k.kd_position * (ref.velocity - x[3:6]) + k.kp_position * (ref.position - x[0:3])
    s, c = jnp.sin(ref.yaw), jnp.cos(ref.yaw)
    tilt = jnp.clip(jnp.stack([(a[0] * s - a[1] * c) / g, (a[0] * c + a[1] * s) / g]), -k.max_tilt, k.max_tilt)
    angles = jnp.concatenate([tilt, ref.yaw[None]])
    error = angles - x[6:9]
    error = error.at[2].set(jnp.arctan2(jnp.sin(error[2]), jnp.cos(error[2])))  # heading error, wrapped
    rates = jnp.stack([jnp.zeros_like(ref.yaw_rate), jnp.zeros_like(ref.yaw_rate), ref.yaw_rate])
    moment = ctrl.model.inertia @ (k.kp_attitude * error + k.kd_attitude * (rates - x[9:12]))
    force = jnp.maximum(m * (g + a[2]), 0.0)
    return jnp.concatenate([force[None], moment]), cs


# --------------------------------------------------------------------------- the engine's view

EULER16 = VectorVehicle("the seed-003 Euler16 model", _dynamics, STATE_SIZE, 4,
                        {k: () for k in _SCALARS} | {"inertia": (3, 3)}, _value_checks, _BOUNDS,
                        rate=lambda p: p.k_motor, rate_name="the motor lag k_motor", prepare=desired_rpm)
Euler16Params.vehicle = EULER16
#: one RK4 step (:func:`quadjax.integrators.runge_kutta4`) of the seed's ODE, command held
rk4_step = EULER16.rk4_step
#: one explicit Euler step x + dt f(x)
euler_step = EULER16.euler_step
