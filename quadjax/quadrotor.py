"""The quadrotor force model: rotors, battery, drag and gyroscopic effects.

Each function is one effect; :func:`quadjax.derivative` composes them with the
rigid body. R rotors, any layout; arrays may carry leading batch axes (scalar
parameters then carry the same batch shape).
"""

import jax.numpy as jnp

from quadjax.params import QuadParams
from quadjax.quaternion import quat_rotate_inverse


def _per_rotor(x):
    """A per-vehicle scalar (...,) broadcast against a per-rotor array (..., R)."""
    return jnp.asarray(x)[..., None]


def clamp_command(params: QuadParams, command):
    """uᶜ = clamp(u, ω_min, ω_max) [rad/s]: what the motor controller accepts."""
    return jnp.clip(command, _per_rotor(params.omega_min), _per_rotor(params.omega_max))


def has_motor_lag(params: QuadParams):
    """True where rotors lag their command (τ > 0); (...,) bool."""
    return params.motor_tau > 0


def rotor_speed_derivative(params: QuadParams, rotor_speeds, command):
    """ω̇ᵢ = (clamp(uᵢ) − ωᵢ) / τ [rad/s²]; 0 where τ = 0 (rotors follow instantly)."""
    lag = has_motor_lag(params)
    tau = jnp.where(lag, params.motor_tau, 1.0)  # a safe divisor keeps grad finite at τ = 0
    rate = (clamp_command(params, command) - rotor_speeds) / _per_rotor(tau)
    return jnp.where(_per_rotor(lag), rate, 0.0)


def effective_rotor_speeds(params: QuadParams, rotor_speeds, command):
    """The rotor speeds that make thrust: the state's where τ > 0, else the clamped command."""
    return jnp.where(_per_rotor(has_motor_lag(params)), rotor_speeds, clamp_command(params, command))


def battery_scale(params: QuadParams, energy):
    """s = 1 − sag · min(E / capacity, 1): thrust lost as the battery drains (dimensionless)."""
    return 1.0 - params.battery_sag * jnp.minimum(energy / params.battery_capacity, 1.0)


def rotor_thrusts(params: QuadParams, rotor_speeds, energy):
    """Tᵢ = s · k_f · ωᵢ² [N], along body +z."""
    return _per_rotor(battery_scale(params, energy) * params.k_f) * rotor_speeds * rotor_speeds


def energy_rate(params: QuadParams, rotor_speeds):
    """Ė = Σ k_p ωᵢ³ [W]: electrical power drawn by the rotors."""
    return params.k_p * jnp.sum(rotor_speeds * rotor_speeds * rotor_speeds, axis=-1)


def aero_drag_force(params: QuadParams, attitude, velocity):
    """F_d = −D_lin ⊙ v_b − D_quad ⊙ v_b ⊙ |v_b| [N], body frame.

    v_b = Rᵀ (v − wind) is the air-relative velocity in the body frame.
    """
    v_b = quat_rotate_inverse(attitude, velocity - params.wind)
    return -params.drag_linear * v_b - params.drag_quadratic * v_b * jnp.abs(v_b)


def thrust_force(thrusts):
    """(0, 0, ΣTᵢ) [N], body frame: every rotor pushes along body +z."""
    total = jnp.sum(thrusts, axis=-1)
    zero = jnp.zeros_like(total)
    return jnp.stack([zero, zero, total], axis=-1)


def rotor_moment(params: QuadParams, thrusts):
    """Σ rᵢ × (0, 0, Tᵢ) + (0, 0, −spinᵢ k_m Tᵢ) [N·m], body frame.

    The first term is (Σ yᵢTᵢ, −Σ xᵢTᵢ, 0); a CCW rotor (spin +1) pushes the body CW.
    """
    x, y = params.rotor_positions[..., 0], params.rotor_positions[..., 1]
    roll = jnp.sum(y * thrusts, axis=-1)
    pitch = -jnp.sum(x * thrusts, axis=-1)
    yaw = -params.k_m * jnp.sum(params.rotor_spins * thrusts, axis=-1)
    return jnp.stack([roll, pitch, yaw], axis=-1)


def rotational_drag_moment(params: QuadParams, body_rates):
    """−A_r ⊙ ω [N·m], body frame."""
    return -params.drag_rotational * body_rates


def gyroscopic_moment(params: QuadParams, rotor_speeds, body_rates):
    """−ω × (0, 0, h) = (−q h, p h, 0) [N·m], h = I_R Σ spinᵢ ωᵢ the rotors' angular momentum."""
    h = params.rotor_inertia * jnp.sum(params.rotor_spins * rotor_speeds, axis=-1)
    p, q = body_rates[..., 0], body_rates[..., 1]
    return jnp.stack([-q * h, p * h, jnp.zeros_like(h)], axis=-1)


def body_wrench(params: QuadParams, attitude, velocity, body_rates, rotor_speeds, energy):
    """Body-frame force [N] (thrust + drag, no weight) and moment [N·m] on the vehicle."""
    thrusts = rotor_thrusts(params, rotor_speeds, energy)
    force = thrust_force(thrusts) + aero_drag_force(params, attitude, velocity)
    moment = (
        rotor_moment(params, thrusts)
        + rotational_drag_moment(params, body_rates)
        + gyroscopic_moment(params, rotor_speeds, body_rates)
    )
    return force, moment
