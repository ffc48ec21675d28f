"""The quadrotor force model: rotors, battery, drag and gyroscopic effects.

Each function is one effect; :func:`quadjax.derivative` composes them with the
rigid body. R rotors, any layout; arrays may carry leading batch axes (scalar
parameters then carry the same batch shape). The ``*_c`` functions are the component
form (:mod:`quadjax._components`) used by the steppers: they take parameters from
:func:`quadjax._components.split_params` and per-rotor values as tuples of R arrays.
The array forms split, call them and join.
"""

import jax.numpy as jnp

from quadjax._components import join, split, split_params, total
from quadjax.params import QuadParams
from quadjax.quaternion import quat_rotate_inverse_c


def clamp_command_c(params: QuadParams, command):
    """uᶜᵢ = clamp(uᵢ, ω_min, ω_max) on components."""
    return tuple(jnp.clip(u, params.omega_min, params.omega_max) for u in command)


def has_motor_lag(params: QuadParams):
    """True where rotors lag their command (τ > 0); (...,) bool."""
    return params.motor_tau > 0


def rotor_speed_derivative_c(params: QuadParams, rotor_speeds, command):
    """ω̇ᵢ = (clamp(uᵢ) − ωᵢ) / τ on components; 0 where τ = 0."""
    lag = has_motor_lag(params)
    inv_tau = 1.0 / jnp.where(lag, params.motor_tau, 1.0)  # a safe divisor keeps grad finite at τ = 0
    return tuple(
        jnp.where(lag, (u - w) * inv_tau, 0.0)
        for u, w in zip(clamp_command_c(params, command), rotor_speeds)
    )


def lag_decay(params: QuadParams, h):
    """e^(−h/τ): what is left of a rotor's speed error after h [s] of the first-order lag; 0 where τ = 0."""
    lag = has_motor_lag(params)
    tau = jnp.where(lag, params.motor_tau, 1.0)  # a safe divisor keeps grad finite at τ = 0
    return jnp.where(lag, jnp.exp(-h / tau), 0.0)


def lagged_rotor_speeds_c(params: QuadParams, rotor_speeds, command, decay):
    """ωᵢ(t + h) = uᵢ + (ωᵢ(t) − uᵢ) e^(−h/τ), uᵢ = clamp(commandᵢ): the lag ω̇ = (u − ω)/τ solved
    exactly with the command held (``decay`` = :func:`lag_decay` (h)). The steppers take the
    rotors from it: RK4 on the lag is unstable past h = 2.79 τ (and Euler past 2 τ), exact is
    stable and exact at every h."""
    lag = has_motor_lag(params)
    return tuple(jnp.where(lag, u + (w - u) * decay, w)
                 for w, u in zip(rotor_speeds, clamp_command_c(params, command)))


def effective_rotor_speeds_c(params: QuadParams, rotor_speeds, command):
    """The rotor speeds that make thrust, on components."""
    lag = has_motor_lag(params)
    return tuple(jnp.where(lag, w, u) for w, u in zip(rotor_speeds, clamp_command_c(params, command)))


def effective_rotor_speeds(params: QuadParams, rotor_speeds, command):
    """The rotor speeds that make thrust: the state's where τ > 0, else the clamped command."""
    return join(effective_rotor_speeds_c(split_params(params), split(rotor_speeds), split(command)))


def battery_scale(params: QuadParams, energy):
    """s = 1 − sag · min(E / capacity, 1): thrust lost as the battery drains (dimensionless).

    A 16-bit state keeps its energy in float32 (the accumulator,
    :func:`quadjax.state.energy_dtype`): with 16-bit params the charge fraction is rounded back
    to their dtype here, so that the thrust, and with it the rest of the state, stays 16-bit.
    """
    charge = jnp.minimum(energy / params.battery_capacity, 1.0)
    dtype = jnp.result_type(params.battery_capacity)
    if jnp.finfo(dtype).bits < 32:
        charge = charge.astype(dtype)
    return 1.0 - params.battery_sag * charge


def rotor_thrusts_c(params: QuadParams, rotor_speeds, energy):
    """Tᵢ = s · k_f · ωᵢ² on components."""
    c = battery_scale(params, energy) * params.k_f
    return tuple(c * w * w for w in rotor_speeds)


def rotor_thrusts(params: QuadParams, rotor_speeds, energy):
    """Tᵢ = s · k_f · ωᵢ² [N], along body +z."""
    return join(rotor_thrusts_c(params, split(rotor_speeds), energy))


def energy_rate_c(params: QuadParams, rotor_speeds):
    """Ė = Σ k_p ωᵢ³ on components."""
    # k_p inside the sum: outside it, XLA may fold a constant k_p into the RK weight in one
    # program and not in another (last-bit differences between sharded and unsharded runs)
    return total(tuple(params.k_p * (w * w * w) for w in rotor_speeds))


def aero_drag_force_c(params: QuadParams, attitude, velocity):
    """F_d = −D_lin ⊙ v_b − D_quad ⊙ v_b ⊙ |v_b| on components (params split)."""
    v_b = quat_rotate_inverse_c(attitude, tuple(v - w for v, w in zip(velocity, params.wind)))
    return tuple(
        -dl * v - dq * v * jnp.abs(v) for dl, dq, v in zip(params.drag_linear, params.drag_quadratic, v_b)
    )


def thrust_force_c(thrusts):
    """(0, 0, ΣTᵢ) on components."""
    t = total(thrusts)
    zero = jnp.zeros_like(t)
    return (zero, zero, t)


def rotor_moment_c(params: QuadParams, thrusts):
    """Σ rᵢ × (0, 0, Tᵢ) + (0, 0, −spinᵢ k_m Tᵢ) on components (params split)."""
    roll = total(tuple(r[1] * t for r, t in zip(params.rotor_positions, thrusts)))
    pitch = -total(tuple(r[0] * t for r, t in zip(params.rotor_positions, thrusts)))
    yaw = -params.k_m * total(tuple(s * t for s, t in zip(params.rotor_spins, thrusts)))
    return (roll, pitch, yaw)


def rotor_moment(params: QuadParams, thrusts):
    """Σ rᵢ × (0, 0, Tᵢ) + (0, 0, −spinᵢ k_m Tᵢ) [N·m], body frame.

    The first term is (Σ yᵢTᵢ, −Σ xᵢTᵢ, 0); a CCW rotor (spin +1) pushes the body CW.
    """
    return join(rotor_moment_c(split_params(params), split(thrusts)))


def rotational_drag_moment_c(params: QuadParams, body_rates):
    """−A_r ⊙ ω on components (params split)."""
    return tuple(-a * w for a, w in zip(params.drag_rotational, body_rates))


def gyroscopic_moment_c(params: QuadParams, rotor_speeds, body_rates):
    """−ω × (0, 0, h) = (−q h, p h, 0) on components (params split)."""
    h = params.rotor_inertia * total(tuple(s * w for s, w in zip(params.rotor_spins, rotor_speeds)))
    p, q = body_rates[0], body_rates[1]
    return (-q * h, p * h, jnp.zeros_like(h))


def body_wrench_c(params: QuadParams, attitude, velocity, body_rates, rotor_speeds, energy):
    """Body-frame force and moment on components (params split)."""
    thrusts = rotor_thrusts_c(params, rotor_speeds, energy)
    force = tuple(a + b for a, b in zip(thrust_force_c(thrusts), aero_drag_force_c(params, attitude, velocity)))
    moment = tuple(
        a + b + c
        for a, b, c in zip(
            rotor_moment_c(params, thrusts),
            rotational_drag_moment_c(params, body_rates),
            gyroscopic_moment_c(params, rotor_speeds, body_rates),
        )
    )
    return force, moment


def body_wrench(params: QuadParams, attitude, velocity, body_rates, rotor_speeds, energy):
    """Body-frame force [N] (thrust + drag, no weight) and moment [N·m] on the vehicle."""
    force, moment = body_wrench_c(
        split_params(params), split(attitude), split(velocity), split(body_rates), split(rotor_speeds), energy
    )
    return join(force), join(moment)
