"""The quadrotor model: state derivative, hover trim."""

import jax.numpy as jnp

from quadjax.params import QuadParams
from quadjax.quadrotor import (
    body_wrench,
    effective_rotor_speeds,
    energy_rate,
    rotor_speed_derivative,
)
from quadjax.rigid_body import rigid_body_derivative
from quadjax.state import QuadState


def derivative(params: QuadParams, state: QuadState, command) -> QuadState:
    """Time derivative of ``state`` under rotor-speed ``command`` (..., R) [rad/s].

    The seed-000 model plus wind, rotational drag and rotor gyroscopic term (seed 004):

        ω̇ᵢ = (clamp(uᵢ, ω_min, ω_max) − ωᵢ) / τ          (ωᵢ := clamp(uᵢ) when τ = 0)
        Tᵢ = s k_f ωᵢ²,  s = 1 − sag · min(E / capacity, 1)
        ṗ = v
        v̇ = R(q) F_b / m − g e_z,  F_b = (0, 0, ΣTᵢ) − D_lin ⊙ v_b − D_quad ⊙ v_b ⊙ |v_b|,
             v_b = Rᵀ (v − wind)
        q̇ = ½ q ⊗ (0, ω)
        ω̇ = J⁻¹ (M − ω × J ω),  M = Σ rᵢ × (0, 0, Tᵢ) − (0, 0, Σ spinᵢ k_m Tᵢ) − A_r ⊙ ω
             − ω × (0, 0, I_R Σ spinᵢ ωᵢ)
        Ė = Σ k_p ωᵢ³

    Returns a :class:`QuadState` of rates (``on_ground`` rate is 0; ground
    contact is a constraint applied by the steppers, not a force).
    """
    rotors = effective_rotor_speeds(params, state.rotor_speeds, command)
    force, moment = body_wrench(
        params, state.attitude, state.velocity, state.body_rates, rotors, state.energy
    )
    p_dot, v_dot, q_dot, w_dot = rigid_body_derivative(
        params.mass, params.inertia, params.gravity, state.attitude, state.velocity,
        state.body_rates, force, moment,
    )
    return QuadState(
        position=p_dot,
        velocity=v_dot,
        attitude=q_dot,
        body_rates=w_dot,
        rotor_speeds=rotor_speed_derivative(params, state.rotor_speeds, command),
        energy=energy_rate(params, rotors),
        on_ground=jnp.zeros_like(state.on_ground),
    )


def hover_thrusts(params: QuadParams):
    """Rotor thrusts (R,) [N] that hold the vehicle level and still, full battery.

    The minimum-norm T with ΣTᵢ = m g and zero roll, pitch and yaw moment:
    T = Bᵀ (B Bᵀ)⁻¹ (m g, 0, 0, 0), B the 4×R map from thrusts to (F, τx, τy, τz).
    Equal thrusts for a symmetric layout. Per vehicle (vmap for batches).
    """
    x, y = params.rotor_positions[:, 0], params.rotor_positions[:, 1]
    B = jnp.stack([jnp.ones_like(x), y, -x, -params.k_m * params.rotor_spins])
    target = jnp.zeros(4, dtype=x.dtype).at[0].set(params.mass * params.gravity)
    return B.T @ jnp.linalg.solve(B @ B.T, target)


def hover_rotor_speed(params: QuadParams):
    """Rotor speeds (R,) [rad/s] that hover the vehicle at full battery: ωᵢ = √(Tᵢ / k_f)."""
    return jnp.sqrt(hover_thrusts(params) / params.k_f)


def hover_state(params: QuadParams, position=(0.0, 0.0, 0.0)) -> QuadState:
    """Level, still, airborne at ``position`` (3,) [m], rotors at hover speed, full battery."""
    w = hover_rotor_speed(params)
    dtype = w.dtype
    zero3 = jnp.zeros(3, dtype)
    return QuadState(
        position=jnp.asarray(position, dtype),
        velocity=zero3,
        attitude=jnp.asarray([1.0, 0.0, 0.0, 0.0], dtype),
        body_rates=zero3,
        rotor_speeds=w,
        energy=jnp.zeros((), dtype),
        on_ground=jnp.zeros((), dtype),
    )
