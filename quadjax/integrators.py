"""Fixed-step integrators and the ground-contact constraint.

Every stepper maps (params, state, command, dt) → state for one vehicle or a
batch; the command is held constant over the step (zero-order hold).
"""

import jax.numpy as jnp

from quadjax.model import derivative
from quadjax.params import QuadParams
from quadjax.quadrotor import clamp_command, has_motor_lag, rotor_thrusts
from quadjax.quaternion import quat_kinematics, quat_normalize
from quadjax.state import QuadState, state_axpy


def _finish(params: QuadParams, before: QuadState, after: QuadState, command) -> QuadState:
    """Post-step projection shared by every stepper, then ground contact.

    Renormalise the attitude (I2); rotors without lag take the clamped command;
    rotor speeds are kept in [0, ω_max] and energy ≥ 0 (I3), which a stiff
    motor lag (dt > 2.8 τ under RK4) would otherwise break.
    """
    instant = clamp_command(params, command)
    rotors = jnp.where(has_motor_lag(params)[..., None], after.rotor_speeds, instant)
    rotors = jnp.clip(rotors, 0.0, params.omega_max[..., None])
    after = after.replace(
        attitude=quat_normalize(after.attitude),
        rotor_speeds=rotors,
        energy=jnp.maximum(after.energy, 0.0),
    )
    return ground_contact(params, before, after)


def vertical_thrust(params: QuadParams, state: QuadState):
    """World-vertical component of the rotor thrust [N]: R₃₃(q) ΣTᵢ."""
    x, y = state.attitude[..., 1], state.attitude[..., 2]
    r33 = 1.0 - 2.0 * (x * x + y * y)
    return r33 * jnp.sum(rotor_thrusts(params, state.rotor_speeds, state.energy), axis=-1)


def ground_contact(params: QuadParams, before: QuadState, after: QuadState) -> QuadState:
    """Contact as a stop (seed 000): no friction, bounce or tip-over.

    A grounded vehicle stays put (position, attitude held; velocity and body
    rates zero) while its world-vertical thrust does not exceed its weight; above
    it, it lifts off. A vehicle that ends a step below ``ground_z`` stops there:
    z = ground_z, velocity and body rates zero, ``on_ground`` = 1.
    """
    weight = params.mass * params.gravity
    stays = (before.on_ground > 0.5) & (vertical_thrust(params, after) <= weight)
    lands = (~stays) & (after.position[..., 2] <= params.ground_z)
    grounded = stays | lands
    col = grounded[..., None]
    landed_pos = after.position.at[..., 2].set(jnp.where(lands, params.ground_z, after.position[..., 2]))
    position = jnp.where(stays[..., None], before.position, landed_pos)
    attitude = jnp.where(stays[..., None], before.attitude, after.attitude)
    return after.replace(
        position=position,
        velocity=jnp.where(col, 0.0, after.velocity),
        attitude=attitude,
        body_rates=jnp.where(col, 0.0, after.body_rates),
        on_ground=grounded.astype(after.on_ground.dtype),
    )


def euler_step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
    """Explicit Euler: x' = x + dt f(x). First order."""
    return _finish(params, state, state_axpy(state, dt, derivative(params, state, command)), command)


def semi_implicit_euler_step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
    """Semi-implicit (symplectic) Euler, as Elodin's six_dof integrator (seed 001). First order.

    Velocities first, v' = v + dt v̇(x), ω' = ω + dt ω̇(x); then positions from
    the new velocities, p' = p + dt v', q' = q + dt ½ q ⊗ (0, ω'). Rotor speeds
    and energy step explicitly.
    """
    d = derivative(params, state, command)
    velocity = state.velocity + dt * d.velocity
    body_rates = state.body_rates + dt * d.body_rates
    after = state.replace(
        position=state.position + dt * velocity,
        velocity=velocity,
        attitude=state.attitude + dt * quat_kinematics(state.attitude, body_rates),
        body_rates=body_rates,
        rotor_speeds=state.rotor_speeds + dt * d.rotor_speeds,
        energy=state.energy + dt * d.energy,
    )
    return _finish(params, state, after, command)


def rk4_step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
    """Classical 4th-order Runge–Kutta, then attitude renormalisation and ground contact.

    k₁ = f(x), k₂ = f(x + dt/2 k₁), k₃ = f(x + dt/2 k₂), k₄ = f(x + dt k₃),
    x' = x + dt/6 (k₁ + 2k₂ + 2k₃ + k₄).
    """
    half = 0.5 * dt
    k1 = derivative(params, state, command)
    k2 = derivative(params, state_axpy(state, half, k1), command)
    k3 = derivative(params, state_axpy(state, half, k2), command)
    k4 = derivative(params, state_axpy(state, dt, k3), command)
    after = state_axpy(state, dt / 6.0, k1)
    after = state_axpy(after, dt / 3.0, k2)
    after = state_axpy(after, dt / 3.0, k3)
    after = state_axpy(after, dt / 6.0, k4)
    return _finish(params, state, after, command)
