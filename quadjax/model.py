"""The quadrotor model: state derivative, hover trim."""

import jax.numpy as jnp

from quadjax._components import join_state, split, split_params, split_state
from quadjax.mixer import allocation_matrix  # mixer does not import model: no cycle
from quadjax.params import QuadParams, model_dtype
from quadjax.quadrotor import (
    body_wrench_c,
    effective_rotor_speeds_c,
    energy_rate_c,
    rotor_speed_derivative_c,
)
from quadjax.rigid_body import rigid_body_derivative_c
from quadjax.state import QuadState, energy_dtype


def derivative_c(params: QuadParams, state: QuadState, command, external=None) -> QuadState:
    """:func:`derivative` in component form (params, state and command split).

    ``external``: optional ``(force, moment)`` body-frame wrench [N], [N·m] in
    component form, added to the vehicle's own (a disturbance or a payload).
    """
    rotors = effective_rotor_speeds_c(params, state.rotor_speeds, command)
    rotor_rates = rotor_speed_derivative_c(params, state.rotor_speeds, command)
    force, moment = body_wrench_c(
        params, state.position, state.attitude, state.velocity, state.body_rates, rotors, state.energy, rotor_rates
    )
    if external is not None:
        force = tuple(a + b for a, b in zip(force, external[0]))
        moment = tuple(a + b for a, b in zip(moment, external[1]))
    p_dot, v_dot, q_dot, w_dot = rigid_body_derivative_c(
        params.mass, params.inertia, params.gravity, state.attitude, state.velocity,
        state.body_rates, force, moment,
    )
    return QuadState(
        position=p_dot,
        velocity=v_dot,
        attitude=q_dot,
        body_rates=w_dot,
        rotor_speeds=rotor_rates,
        energy=energy_rate_c(params, rotors),
        on_ground=jnp.zeros_like(state.on_ground),
    )


def derivative(params: QuadParams, state: QuadState, command) -> QuadState:
    """Time derivative of ``state`` under rotor-speed ``command`` (..., R) [rad/s].

    The seed-000 model plus wind, rotational drag and rotor gyroscopic term (seed 004), and
    the small-vehicle effects of :mod:`quadjax.quadrotor` (each off at its default):

        ω̇ᵢ = (clamp(uᵢ, ω_min, ω_max) − ωᵢ) / τᵢ         (ωᵢ := clamp(uᵢ) when τ = 0;
             τᵢ = τ spinning up, r τ spinning down)
        Tᵢ = g(z) (s k_f ωᵢ² − k_in ωᵢ v_z,i),  s = 1 − sag · min(E / capacity, 1),
             v_z,i = v_b,z + p yᵢ − q xᵢ,  g(z) = 1 / (1 − (ρ / 4z)²)
        ṗ = v
        v̇ = R(q) F_b / m − g e_z,  F_b = (0, 0, ΣTᵢ) − D_lin ⊙ v_b − D_quad ⊙ v_b ⊙ |v_b|
             − k_h Σωᵢ (v_b,x, v_b,y, 0),  v_b = Rᵀ (v − wind)
        q̇ = ½ q ⊗ (0, ω)
        ω̇ = J⁻¹ (M − ω × J ω),  M = Σ rᵢ × (0, 0, Tᵢ) − (0, 0, Σ spinᵢ k_m Tᵢ) − A_r ⊙ ω
             − ω × (0, 0, I_R Σ spinᵢ ωᵢ) − (0, 0, I_a Σ spinᵢ ω̇ᵢ) + Σ rᵢ × F_H,i
             + k_β Σωᵢ (v_b,y, −v_b,x, 0)
        Ė = Σ k_p ωᵢ³

    Returns a :class:`QuadState` of rates (``on_ground`` rate is 0; ground
    contact is a constraint applied by the steppers, not a force).
    """
    return join_state(derivative_c(split_params(params), split_state(state), split(command)))


def hover_thrusts(params: QuadParams):
    """Rotor thrusts (R,) [N] that hold the vehicle level and still, full battery.

    The minimum-norm T with ΣTᵢ = m g and zero roll, pitch and yaw moment:
    T = Bᵀ (B Bᵀ)⁻¹ (m g, 0, 0, 0), B the 4×R map from thrusts to (F, τx, τy, τz)
    (:func:`quadjax.mixer.allocation_matrix`).
    Equal thrusts for a symmetric layout. Per vehicle (vmap for batches). In the params'
    dtype; 16-bit params are trimmed in float32 and the result rounded once.
    """
    return _hover_thrusts_wide(params).astype(params.mass.dtype)


def _hover_thrusts_wide(params: QuadParams):
    """:func:`hover_thrusts` in the params' dtype, or float32 for 16-bit params (the trim solve,
    LAPACK's, has no reduced-precision form)."""
    wide = params.astype(jnp.promote_types(params.mass.dtype, jnp.float32))
    B = allocation_matrix(wide)  # the mixer's B: it reads only rotor_positions, rotor_spins and k_m
    target = jnp.zeros(4, dtype=B.dtype).at[0].set(wide.mass * wide.gravity)
    return B.T @ jnp.linalg.solve(B @ B.T, target)


def hover_rotor_speed(params: QuadParams):
    """Rotor speeds (R,) [rad/s] that hover the vehicle at full battery: ωᵢ = √(Tᵢ / k_f), in
    the params' dtype (for 16-bit params: computed in float32, rounded once)."""
    wide = _hover_thrusts_wide(params)
    return jnp.sqrt(wide / params.k_f.astype(wide.dtype)).astype(params.mass.dtype)


def hover_state(params: QuadParams, position=(0.0, 0.0, 0.0)) -> QuadState:
    """Level, still, airborne at ``position`` (3,) [m], rotors at hover speed, full battery.

    In the params' dtype (any of :data:`quadjax.params.MODEL_DTYPES`), the energy in
    :func:`quadjax.state.energy_dtype` of it (float32 for 16-bit params: the wider accumulator).
    """
    dtype = model_dtype(params.mass.dtype, "hover_state: params")
    w = hover_rotor_speed(params)
    zero3 = jnp.zeros(3, dtype)
    return QuadState(
        position=jnp.asarray(position, dtype),
        velocity=zero3,
        attitude=jnp.asarray([1.0, 0.0, 0.0, 0.0], dtype),
        body_rates=zero3,
        rotor_speeds=w,
        energy=jnp.zeros((), energy_dtype(dtype)),
        on_ground=jnp.zeros((), dtype),
    )
