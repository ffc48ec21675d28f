"""Fixed-step integrators and the ground-contact constraint.

Every stepper maps (params, state, command, dt) → state for one vehicle or a
batch; the command is held constant over the step (zero-order hold). Each has a
component form (``*_c``, see :mod:`quadjax._components`) that rollouts scan with,
taking split params, state and command and an optional body-frame ``external``
wrench ``(force, moment)``; :func:`component_stepper` maps a stepper to it.
"""

import jax
import jax.numpy as jnp

from quadjax._components import join, join_params, join_state, op_by_op, split, split_params, split_state, total
from quadjax.model import derivative_c
from quadjax.params import QuadParams
from quadjax.quadrotor import (
    clamp_command_c, ground_effect, has_motor_lag, lag_decay, lagged_rotor_speeds_c, rotor_thrusts_c,
)
from quadjax.quaternion import quat_kinematics_c, quat_normalize_c
from quadjax.state import QuadState, state_axpy


def _finish_c(params: QuadParams, before: QuadState, after: QuadState, command) -> QuadState:
    """Post-step projection shared by every stepper, then ground contact (components).

    Renormalise the attitude (I2); rotors without lag take the clamped command;
    rotor speeds are kept in [0, ω_max] and energy ≥ 0 (I3) (the exact lag keeps the
    speeds between their start and the clamped command; the clip guards rounding).
    """
    lag = has_motor_lag(params)
    rotors = tuple(
        jnp.clip(jnp.where(lag, w, u), 0.0, params.omega_max)
        for w, u in zip(after.rotor_speeds, clamp_command_c(params, command))
    )
    after = after.replace(
        attitude=quat_normalize_c(after.attitude),
        rotor_speeds=rotors,
        energy=jnp.maximum(after.energy, 0.0),
    )
    return ground_contact_c(params, before, after)


def vertical_thrust_c(params: QuadParams, state: QuadState):
    """R₃₃(q) g(z) ΣTᵢ on a state in component form: the still vehicle's thrust (no inflow), with
    the ground effect g at its height."""
    _, x, y, _ = state.attitude
    r33 = 1.0 - 2.0 * (x * x + y * y)
    g = ground_effect(params, state.position[2] - params.ground_z)
    return r33 * (g * total(rotor_thrusts_c(params, state.rotor_speeds, state.energy)))


def ground_contact_c(params: QuadParams, before: QuadState, after: QuadState) -> QuadState:
    """:func:`ground_contact` on states in component form."""
    weight = params.mass * params.gravity
    stays = (before.on_ground > 0.5) & (vertical_thrust_c(params, after) <= weight)
    lands = (~stays) & (after.position[2] <= params.ground_z)
    grounded = stays | lands
    px, py, pz = after.position
    landed = (px, py, jnp.where(lands, params.ground_z, pz))
    return after.replace(
        position=tuple(jnp.where(stays, b, a) for b, a in zip(before.position, landed)),
        velocity=tuple(jnp.where(grounded, 0.0, v) for v in after.velocity),
        attitude=tuple(jnp.where(stays, b, a) for b, a in zip(before.attitude, after.attitude)),
        body_rates=tuple(jnp.where(grounded, 0.0, w) for w in after.body_rates),
        on_ground=grounded.astype(jnp.result_type(after.on_ground)),
    )


def ground_contact(params: QuadParams, before: QuadState, after: QuadState) -> QuadState:
    """Contact as a stop (seed 000): no friction, bounce or tip-over.

    A grounded vehicle stays put (position, attitude held; velocity and body
    rates zero) while its world-vertical thrust does not exceed its weight; above
    it, it lifts off. A vehicle that ends a step below ``ground_z`` stops there:
    z = ground_z, velocity and body rates zero, ``on_ground`` = 1.
    """
    return join_state(ground_contact_c(params, split_state(before), split_state(after)))


def euler_step_c(params: QuadParams, state: QuadState, command, dt, external=None) -> QuadState:
    """:func:`euler_step` in component form."""
    d = derivative_c(params, state, command, external)
    after = state_axpy(state, dt, d)
    after = after.replace(rotor_speeds=lagged_rotor_speeds_c(params, state.rotor_speeds, command, lag_decay(params, dt)))
    return _finish_c(params, state, after, command)


def semi_implicit_euler_step_c(params: QuadParams, state: QuadState, command, dt, external=None) -> QuadState:
    """:func:`semi_implicit_euler_step` in component form."""
    d = derivative_c(params, state, command, external)
    velocity = tuple(v + dt * a for v, a in zip(state.velocity, d.velocity))
    body_rates = tuple(w + dt * a for w, a in zip(state.body_rates, d.body_rates))
    after = state.replace(
        position=tuple(p + dt * v for p, v in zip(state.position, velocity)),
        velocity=velocity,
        attitude=tuple(q + dt * r for q, r in zip(state.attitude, quat_kinematics_c(state.attitude, body_rates))),
        body_rates=body_rates,
        rotor_speeds=lagged_rotor_speeds_c(params, state.rotor_speeds, command, lag_decay(params, dt)),
        energy=state.energy + dt * d.energy,
    )
    return _finish_c(params, state, after, command)


def runge_kutta4(f, x, h, *, axpy=None, at_stage=None):
    """One classical RK4 step of ẋ = f(x) from the pytree ``x`` over ``h``:

    k₁ = f(x), k₂ = f(x + h/2 k₁), k₃ = f(x + h/2 k₂), k₄ = f(x + h k₃),
    x' = x + h/6 (k₁ + 2k₂ + 2k₃ + k₄).

    The one statement of RK4 in the library: the quadrotor's :func:`rk4_step_c` and any other
    vehicle's vector field (:mod:`quadjax.euler16`) step with it. ``axpy(x, a, k)`` is
    x + a·k (default: leaf by leaf); ``at_stage(x_i, j)`` may replace parts of the state at
    which stage j = 1..3 (and j = 0: the end) is evaluated.

    The four stages run as a loop over the Butcher tableau, carrying the stage derivative
    kᵢ₋₁ and the running sum: XLA's CPU backend recomputes shared subexpressions in every
    fused consumer, and the loop carry is where it materialises each stage once (1.7× faster
    than the unrolled form at N = 4096, benchmarks/README.md). Sums are accumulated in the
    textbook order. Un-jitted, the same loop runs in Python: op by op, a scan of a new closure
    is compiled on every call (an un-jitted XLA-form step took 690 ms, 45 ms without).
    """
    if axpy is None:
        axpy = _tree_axpy
    dtype = jnp.result_type(jax.tree_util.tree_leaves(x)[0])
    a = jnp.asarray([0.0, 0.5, 0.5, 1.0], dtype)  # stage i evaluates f(x + aᵢ h kᵢ₋₁)
    b = jnp.asarray([1 / 6, 1 / 3, 1 / 3, 1 / 6], dtype)  # x' = x + h Σ bᵢ kᵢ

    def stage(carry, i):
        x_stage, acc = carry
        k = f(x_stage)
        j = (i + 1) % 4
        x_next = axpy(x, h * a[j], k)
        if at_stage is not None:
            x_next = at_stage(x_next, j)
        return (x_next, axpy(acc, h * b[i], k)), None

    if op_by_op((x, h)):  # un-jitted (a scan of this closure would be compiled on every call)
        carry = (x, x)
        for i in range(4):
            carry, _ = stage(carry, i)
        return carry[1]
    (_, after), _ = jax.lax.scan(stage, (x, x), jnp.arange(4))
    return after


def _tree_axpy(x, a, k):
    return jax.tree_util.tree_map(lambda xi, ki: xi + a * ki, x, k)


def rk4_step_c(params: QuadParams, state: QuadState, command, dt, external=None) -> QuadState:
    """:func:`rk4_step` in component form (:func:`runge_kutta4` on :func:`quadjax.model.derivative_c`).

    The rotor speeds are not RK4's: at each stage time and at the end they are the exact
    solution of the first-order lag with the command held (:func:`quadjax.quadrotor.
    lagged_rotor_speeds_c`), so the step stays stable and exact for a stiff lag (h ≫ τ),
    where RK4 on the lag diverges past h = 2.79 τ; the rest is RK4 with those speeds.
    """
    half, whole = lag_decay(params, dt * 0.5), lag_decay(params, dt)
    # at aⱼ dt, spin-up and spin-down
    decay = tuple(jnp.stack(jnp.broadcast_arrays(jnp.ones_like(h), h, h, w)) for h, w in zip(half, whole))

    def lagged(x, j):
        return x.replace(rotor_speeds=lagged_rotor_speeds_c(params, state.rotor_speeds, command,
                                                            (decay[0][j], decay[1][j])))

    after = runge_kutta4(lambda x: derivative_c(params, x, command, external), state, dt,
                         axpy=state_axpy, at_stage=lagged)
    after = after.replace(rotor_speeds=lagged_rotor_speeds_c(params, state.rotor_speeds, command, whole))
    return _finish_c(params, state, after, command)


def _array_form(step_c):
    def step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
        return join_state(step_c(split_params(params), split_state(state), split(command), dt))

    return step


def euler_step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
    """Explicit Euler: x' = x + dt f(x). First order."""
    return _array_form(euler_step_c)(params, state, command, dt)


def semi_implicit_euler_step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
    """Semi-implicit (symplectic) Euler, as Elodin's six_dof integrator (seed 001). First order.

    Velocities first, v' = v + dt v̇(x), ω' = ω + dt ω̇(x); then positions from
    the new velocities, p' = p + dt v', q' = q + dt ½ q ⊗ (0, ω'). Rotor speeds
    and energy step explicitly.
    """
    return _array_form(semi_implicit_euler_step_c)(params, state, command, dt)


#: :func:`rk4_step` as XLA operations: what it runs off the CPU kernel, and the form whose
#: operations :func:`quadjax.verify.opcount.operation_count` counts
rk4_step_xla = _array_form(rk4_step_c)


def rk4_step(params: QuadParams, state: QuadState, command, dt) -> QuadState:
    """Classical 4th-order Runge–Kutta, then attitude renormalisation and ground contact.

    k₁ = f(x), k₂ = f(x + dt/2 k₁), k₃ = f(x + dt/2 k₂), k₄ = f(x + dt k₃),
    x' = x + dt/6 (k₁ + 2k₂ + 2k₃ + k₄).

    On the CPU backend this runs in the native kernel generated from this very step
    (:func:`quadjax.native.kernel_rk4_step`), one call for a whole ``vmap``-ped batch, and so
    do its first derivatives; elsewhere as XLA operations. Both are the same function.
    """
    # imported here: quadjax.native generates its kernel from this module's rk4_step_c
    from quadjax.native import kernel_rk4_step

    return kernel_rk4_step(params, state, command, dt, fallback=rk4_step_xla)


#: the library's steppers and their component forms
COMPONENT_STEPPERS = {
    euler_step: euler_step_c,
    semi_implicit_euler_step: semi_implicit_euler_step_c,
    rk4_step: rk4_step_c,
}

#: steppers by name, for options and repro files
STEPPERS = {"euler": euler_step, "semi_implicit_euler": semi_implicit_euler_step, "rk4": rk4_step}


def component_stepper(step):
    """The component form of ``step``: a library stepper's own, else a wrapper that joins,
    calls the array-form ``step`` and splits (correct for any stepper, without the speed-up;
    it takes no ``external`` wrench)."""
    if step in COMPONENT_STEPPERS:
        return COMPONENT_STEPPERS[step]

    def wrapped(params, state, command, dt, external=None):
        if external is not None:
            raise ValueError("an external wrench needs one of the library's steppers (euler, semi-implicit, rk4)")
        return split_state(step(join_params(params), join_state(state), join(command), dt))

    return wrapped
