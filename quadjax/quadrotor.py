"""The quadrotor force model: rotors, battery, drag and gyroscopic effects.

Each function is one effect; :func:`quadjax.derivative` composes them with the
rigid body. R rotors, any layout; arrays may carry leading batch axes (scalar
parameters then carry the same batch shape). The ``*_c`` functions are the component
form (:mod:`quadjax._components`) used by the steppers: they take parameters from
:func:`quadjax._components.split_params` and per-rotor values as tuples of R arrays.
The array forms split, call them and join.
"""

import jax.numpy as jnp

from quadjax._components import gated, join, split, split_params, total
from quadjax.params import QuadParams
from quadjax.quaternion import quat_rotate_inverse_c


def clamp_command_c(params: QuadParams, command):
    """uᶜᵢ = clamp(uᵢ, ω_min, ω_max) on components."""
    return tuple(jnp.clip(u, params.omega_min, params.omega_max) for u in command)


def has_motor_lag(params: QuadParams):
    """True where rotors lag their command (τ > 0); (...,) bool."""
    return params.motor_tau > 0


def _spin_down_c(params: QuadParams, rotor_speeds, command):
    """Per rotor: True where it slows down toward its clamped command (uᶜᵢ < ωᵢ)."""
    return tuple(u < w for u, w in zip(clamp_command_c(params, command), rotor_speeds))


def rotor_speed_derivative_c(params: QuadParams, rotor_speeds, command):
    """ω̇ᵢ = (clamp(uᵢ) − ωᵢ) / τᵢ on components, τᵢ = τ spinning up and r·τ spinning down
    (r = ``motor_tau_down_ratio``); 0 where τ = 0."""
    lag = has_motor_lag(params)
    tau = jnp.where(lag, params.motor_tau, 1.0)  # a safe divisor keeps grad finite at τ = 0
    inv_up, inv_down = 1.0 / tau, 1.0 / (tau * params.motor_tau_down_ratio)
    return tuple(
        jnp.where(lag, (u - w) * jnp.where(down, inv_down, inv_up), 0.0)
        for u, w, down in zip(clamp_command_c(params, command), rotor_speeds,
                              _spin_down_c(params, rotor_speeds, command))
    )


def lag_decay(params: QuadParams, h):
    """(e^(−h/τ), e^(−h/(r·τ))): what is left of a rotor's speed error after h [s] of the
    first-order lag spinning up and spinning down (r = ``motor_tau_down_ratio``); 0 where τ = 0."""
    lag = has_motor_lag(params)
    tau = jnp.where(lag, params.motor_tau, 1.0)  # a safe divisor keeps grad finite at τ = 0
    up = jnp.where(lag, jnp.exp(-h / tau), 0.0)
    down = jnp.where(lag, jnp.exp(-h / (tau * params.motor_tau_down_ratio)), 0.0)
    return up, down


def lagged_rotor_speeds_c(params: QuadParams, rotor_speeds, command, decay):
    """ωᵢ(t + h) = uᵢ + (ωᵢ(t) − uᵢ) e^(−h/τᵢ), uᵢ = clamp(commandᵢ): the lag ω̇ = (u − ω)/τᵢ solved
    exactly with the command held (``decay`` = :func:`lag_decay` (h), spin-up and spin-down).
    A rotor approaches its command without crossing it, so τᵢ stays the one it starts with and
    the asymmetric lag is exact too. The steppers take the rotors from it: RK4 on the lag is
    unstable past h = 2.79 τ (and Euler past 2 τ), exact is stable and exact at every h."""
    lag = has_motor_lag(params)
    up, down = decay
    decays = gated(params.motor_tau_down_ratio != 1, _decay_per_rotor, lambda p, w, c, up, down: (up,) * len(w),
                   params, rotor_speeds, command, up, down, coefficients=("motor_tau_down_ratio",))
    return tuple(jnp.where(lag, u + (w - u) * e, w)
                 for w, u, e in zip(rotor_speeds, clamp_command_c(params, command), decays))


def _decay_per_rotor(params: QuadParams, rotor_speeds, command, up, down):
    """e^(−h/τᵢ) of each rotor: spin-down's where it slows toward its command."""
    return tuple(jnp.where(d, down, up) for d in _spin_down_c(params, rotor_speeds, command))


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


def air_velocity_body_c(params: QuadParams, attitude, velocity):
    """v_b = Rᵀ (v − wind) on components: the air-relative velocity in the body frame [m/s]."""
    return quat_rotate_inverse_c(attitude, tuple(v - w for v, w in zip(velocity, params.wind)))


def aero_drag_force_c(params: QuadParams, v_b):
    """F_d = −D_lin ⊙ v_b − D_quad ⊙ v_b ⊙ |v_b| on components (params split), v_b the air-relative
    body velocity (:func:`air_velocity_body_c`)."""
    return tuple(
        -dl * v - dq * v * jnp.abs(v) for dl, dq, v in zip(params.drag_linear, params.drag_quadratic, v_b)
    )


def hub_axial_velocities_c(params: QuadParams, v_b, body_rates):
    """v_z,i = v_b,z + (ω × rᵢ)_z = v_b,z + p yᵢ − q xᵢ [m/s]: the air's speed through each rotor
    disc along body +z (climb > 0), rolling and pitching included (params split)."""
    p, q = body_rates[0], body_rates[1]
    return tuple(v_b[2] + p * r[1] - q * r[0] for r in params.rotor_positions)


def inflow_thrust_change_c(params: QuadParams, rotor_speeds, axial):
    """ΔTᵢ = −k_in ωᵢ v_z,i [N]: thrust lost climbing (gained descending) at rotor speed ωᵢ.

    The first-order term of momentum theory in the axial inflow v_z,i (:func:`hub_axial_velocities_c`):
    the blade's angle of attack falls by v_z/(ω r). It also damps roll and pitch, since a rolling
    vehicle's descending rotors gain thrust (−k_in ω Σ yᵢ² p). Envelope: |v_z,i| well below the
    induced velocity's scale k_f ωᵢ / k_in; no vortex-ring state."""
    return tuple(-params.k_inflow * w * v for w, v in zip(rotor_speeds, axial))


def ground_effect(params: QuadParams, height):
    """g = 1 / (1 − (ρ / 4z)²): the thrust gain near the ground (Cheeseman & Bennett 1955), ρ the
    rotor radius and z the height [m] of the centre of mass above ``ground_z``; 1 where ρ = 0.

    Envelope: the method of images for one rotor. Below z = ρ/2 it is held at its value there
    (4/3), where the formula leaves its range; from z = 3 ρ up the gain is under 1 %."""
    return gated(params.rotor_radius > 0, _ground_gain, 1.0, params.rotor_radius, height)


def _ground_gain(rho, height):
    z = jnp.maximum(height, 0.5 * rho)
    ratio = rho / (4.0 * jnp.where(rho > 0, z, 1.0))  # a safe divisor where ρ = 0 (a gradient there)
    return 1.0 / (1.0 - ratio * ratio)


def thrusts_c(params: QuadParams, rotor_speeds, energy, v_b, body_rates, height):
    """Tᵢ = g(z) (s k_f ωᵢ² + ΔTᵢ): :func:`rotor_thrusts_c` with the inflow
    (:func:`inflow_thrust_change_c` at :func:`hub_axial_velocities_c`) and ground effect
    (:func:`ground_effect`) [N]; v_b the air-relative body velocity. The two effects are
    :func:`quadjax._components.gated` together: computed only where one is on."""
    thrusts = rotor_thrusts_c(params, rotor_speeds, energy)
    on = (params.k_inflow != 0) | (params.rotor_radius > 0)
    return gated(on, _with_thrust_effects, _kept, params, thrusts, rotor_speeds, v_b, body_rates, height,
                 coefficients=("k_inflow", "rotor_radius"))


def _kept(params, values, *rest):
    """The effects' off branch: ``values`` as they are."""
    return values


def _with_thrust_effects(params: QuadParams, thrusts, rotor_speeds, v_b, body_rates, height):
    g = _ground_gain(params.rotor_radius, height)
    change = inflow_thrust_change_c(params, rotor_speeds, hub_axial_velocities_c(params, v_b, body_rates))
    return tuple(g * (t + d) for t, d in zip(thrusts, change))


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


def rotor_drag_c(params: QuadParams, v_b, rotor_speeds):
    """The H-force F_H,i = −k_h ωᵢ (v_b,x, v_b,y, 0) of each rotor, at its hub: the force
    Σ F_H,i [N] and moment Σ rᵢ × F_H,i [N·m] on components (params split).

    A blade advancing into the air makes more drag than the retreating one: the rotor's drag
    grows with its speed ωᵢ and the in-plane airspeed (Mahony, Kumar & Corke 2012). Hubs above
    the centre of mass (rᵢ,z > 0) turn it into a pitch-up moment."""
    kh, vx, vy = params.rotor_drag, v_b[0], v_b[1]
    wsum = total(rotor_speeds)
    wz = total(tuple(r[2] * w for r, w in zip(params.rotor_positions, rotor_speeds)))  # Σ zᵢ ωᵢ
    wx = total(tuple(r[0] * w for r, w in zip(params.rotor_positions, rotor_speeds)))
    wy = total(tuple(r[1] * w for r, w in zip(params.rotor_positions, rotor_speeds)))
    force = (-kh * wsum * vx, -kh * wsum * vy, jnp.zeros_like(wsum))
    moment = (kh * vy * wz, -kh * vx * wz, -kh * (vy * wx - vx * wy))
    return force, moment


def blade_flapping_moment_c(params: QuadParams, v_b, rotor_speeds):
    """M_β = k_β Σωᵢ (v_b,y, −v_b,x, 0) [N·m] on components (params split): the rotor discs tilt away
    from the in-plane airflow (the advancing blade lifts more and flaps up), and the tilted thrust
    and the hubs' stiffness turn the nose up into it (Mahony, Kumar & Corke 2012, lumped into one
    coefficient proportional to the rotor speed). Moving forward (v_b,x > 0) it pitches the nose up."""
    k = params.blade_flapping * total(rotor_speeds)
    return (k * v_b[1], -k * v_b[0], jnp.zeros_like(k))


def rotational_drag_moment_c(params: QuadParams, body_rates):
    """−A_r ⊙ ω on components (params split)."""
    return tuple(-a * w for a, w in zip(params.drag_rotational, body_rates))


def gyroscopic_moment_c(params: QuadParams, rotor_speeds, body_rates):
    """−ω × (0, 0, h) = (−q h, p h, 0) on components (params split)."""
    h = params.rotor_inertia * total(tuple(s * w for s, w in zip(params.rotor_spins, rotor_speeds)))
    p, q = body_rates[0], body_rates[1]
    return (-q * h, p * h, jnp.zeros_like(h))


def rotor_reaction_moment_c(params: QuadParams, rotor_accelerations):
    """(0, 0, −I_a Σ spinᵢ ω̇ᵢ) [N·m]: a rotor spun up CCW turns the body CW (the rest of −ḣ,
    whose −ω × h is :func:`gyroscopic_moment_c`); I_a = ``rotor_reaction_inertia`` (params split)."""
    yaw = -params.rotor_reaction_inertia * total(tuple(s * a for s, a in zip(params.rotor_spins,
                                                                            rotor_accelerations)))
    zero = jnp.zeros_like(yaw)
    return (zero, zero, yaw)


def body_wrench_c(params: QuadParams, position, attitude, velocity, body_rates, rotor_speeds, energy,
                  rotor_accelerations):
    """Body-frame force and moment on components (params split). The small-vehicle effects are
    :func:`quadjax._components.gated` by their coefficients: computed only where on."""
    v_b = air_velocity_body_c(params, attitude, velocity)
    thrusts = thrusts_c(params, rotor_speeds, energy, v_b, body_rates, position[2] - params.ground_z)
    force = tuple(a + b for a, b in zip(thrust_force_c(thrusts), aero_drag_force_c(params, v_b)))
    moment = tuple(a + b + c for a, b, c in zip(rotor_moment_c(params, thrusts),
                                                rotational_drag_moment_c(params, body_rates),
                                                gyroscopic_moment_c(params, rotor_speeds, body_rates)))
    on = (params.rotor_reaction_inertia != 0) | (params.rotor_drag != 0) | (params.blade_flapping != 0)
    return gated(on, _plus_rotor_effects, _kept, params, (force, moment), v_b, rotor_speeds, rotor_accelerations,
                 coefficients=("rotor_reaction_inertia", "rotor_drag", "blade_flapping"))


def _plus_rotor_effects(params: QuadParams, wrench, v_b, rotor_speeds, rotor_accelerations):
    """The wrench with the reaction torque, the H-force and its moment, and the blade flapping moment
    (in this order; each is 0 where its coefficient is)."""
    (force, moment), (h_force, h_moment) = wrench, rotor_drag_c(params, v_b, rotor_speeds)
    reaction = rotor_reaction_moment_c(params, rotor_accelerations)
    flapping = blade_flapping_moment_c(params, v_b, rotor_speeds)
    force = tuple(f + h for f, h in zip(force, h_force))
    moment = tuple(m + r + h + b for m, r, h, b in zip(moment, reaction, h_moment, flapping))
    return force, moment


def body_wrench(params: QuadParams, position, attitude, velocity, body_rates, rotor_speeds, energy,
                rotor_accelerations=None):
    """Body-frame force [N] (thrust + drag, no weight) and moment [N·m] on the vehicle at
    ``position`` (its height sets the ground effect). ``rotor_accelerations`` (..., R) [rad/s²]
    drive the reaction torque; None: steady rotors (no reaction torque)."""
    if rotor_accelerations is None:
        rotor_accelerations = jnp.zeros_like(jnp.asarray(rotor_speeds))
    force, moment = body_wrench_c(
        split_params(params), split(position), split(attitude), split(velocity), split(body_rates),
        split(rotor_speeds), energy, split(rotor_accelerations),
    )
    return join(force), join(moment)
