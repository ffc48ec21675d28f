"""Synthetic flight logs with known parameters: for recovery tests, examples and excitation design."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.logs import FlightLog
from quadjax.model import derivative, hover_rotor_speed
from quadjax.params import QuadParams
from quadjax.quadrotor import effective_rotor_speeds
from quadjax.quaternion import quat_from_axis_angle, quat_multiply, quat_normalize
from quadjax.engine import SimConfig, simulate
from quadjax.state import QuadState
from quadjax.sysid.motor import MotorMap, motor_speed_command


#: compiled once per shape (an eager ``lax.scan`` would compile again for every log)
_simulate_jit = jax.jit(lambda p, s, u, dt: simulate(p, s, dt, commands=u, config=SimConfig(save=("state",))).states)


def mixer_directions(params: QuadParams) -> np.ndarray:
    """(4, R) unit patterns in ω² that excite collective thrust, roll, pitch and yaw alone.

    Rows: collective (all +1); roll (sign yᵢ: +M_x); pitch (−sign xᵢ: +M_y);
    yaw (−spinᵢ: +M_z). For a symmetric Quad X each row moves only its own
    axis: e.g. Σ spinᵢ·sign(yᵢ) = 0, so the roll and pitch patterns make no yaw torque.
    """
    x = np.asarray(params.rotor_positions[:, 0])
    y = np.asarray(params.rotor_positions[:, 1])
    spins = np.asarray(params.rotor_spins)
    return np.stack([np.ones_like(x), np.sign(y), -np.sign(x), -spins])


def excitation(params: QuadParams, steps: int, dt: float, *, amplitude=(0.15, 0.08, 0.08, 0.15),
               frequencies_hz=(0.7, 1.3, 2.9, 4.1, 6.7), seed: int = 0) -> np.ndarray:
    """Rotor-speed commands (steps, R) [rad/s]: hover plus a random-phase multisine on each mixer axis.

        ωᵢ² = ω_hover,ᵢ² · (1 + Σ_c a_c s_c(t) D_cᵢ),  s_c(t) = mean over f of sin(2π f t + φ_{c,f})

    with D = :func:`mixer_directions` and a_c = ``amplitude`` per axis (collective,
    roll, pitch, yaw). An axis with amplitude 0 is not excited at all (its
    torque stays exactly zero with instantaneous rotors).
    """
    rng = np.random.default_rng(seed)
    t = np.arange(steps) * dt
    freqs = np.asarray(frequencies_hz)
    phases = rng.uniform(0, 2 * np.pi, (4, len(freqs)))
    s = np.mean(np.sin(2 * np.pi * freqs[None, :, None] * t[None, None, :] + phases[:, :, None]), axis=1)
    D = mixer_directions(params)
    w2 = np.asarray(hover_rotor_speed(params)) ** 2 * (1.0 + (np.asarray(amplitude)[:, None] * s).T @ D)
    return np.sqrt(np.maximum(w2, 0.0))


def random_state(params: QuadParams, rng: np.random.Generator, *, speed=2.0, tilt=0.4, rate=3.0,
                 altitude=10.0) -> QuadState:
    """A random airborne state: velocity uniform in a ±``speed`` box [m/s], attitude a random axis
    tilted by up to ``tilt`` [rad] then a random yaw, body rates uniform in ±``rate`` [rad/s]
    (per component, an array for per-axis limits), at ``altitude`` [m] (far from the ground)."""
    dtype = params.mass.dtype
    axis = rng.normal(size=3)
    axis[2] = 0.0
    axis /= np.linalg.norm(axis)
    q_tilt = quat_from_axis_angle(jnp.asarray(axis, dtype), rng.uniform(0, tilt))
    q_yaw = quat_from_axis_angle(jnp.asarray([0.0, 0.0, 1.0], dtype), rng.uniform(-np.pi, np.pi))
    return QuadState.create(
        position=(0.0, 0.0, altitude),
        velocity=rng.uniform(-speed, speed, 3),
        attitude=np.asarray(quat_multiply(q_yaw, q_tilt)),
        body_rates=rng.uniform(-1, 1, 3) * np.asarray(rate),
        rotor_speeds=np.asarray(hover_rotor_speed(params)),
        dtype=dtype,
    )


def simulate_log(params: QuadParams, state0: QuadState, inputs, dt: float, *, motor_map: MotorMap | None = None,
                 noise: dict | None = None, seed: int = 0, name: str = "synthetic") -> FlightLog:
    """A :class:`FlightLog` of an open-loop flight, optionally with measurement noise.

    ``inputs`` (T, R) are held over each ``dt``; through ``motor_map`` (default
    identity) they become rotor-speed commands. The log has T + 1 rows: the start
    and the state after each input. Row k of ``motor_commands`` is the input held
    over [t_k, t_k+1] (the last row repeats it); row k of ``rotor_speeds`` is the
    rotor speed that makes thrust at t_k (the state's with a lag, the clamped
    command without one), so a log of a lag-free vehicle replays exactly in
    'rotor_speeds' mode.

    ``specific_force`` is what an IMU reads, in the world frame as the nano-drone logs give it:
    v̇ + g e_z from the model at each row's state and input.

    ``noise``: std per channel, keys position [m], velocity [m/s], attitude
    [rad] (a random small rotation), body_rates [rad/s], rotor_speeds [rad/s],
    specific_force [m/s²]; independent Gaussian per sample (``seed``).
    """
    mm = motor_map if motor_map is not None else MotorMap.identity(params.num_rotors, dtype=params.mass.dtype)
    u = jnp.asarray(inputs, params.mass.dtype)
    command = motor_speed_command(mm, u)
    states = _simulate_jit(params, state0, command, dt)
    cat = lambda a, b: np.concatenate([np.asarray(a)[None], np.asarray(b)], axis=0)  # noqa: E731
    pos, vel = cat(state0.position, states.position), cat(state0.velocity, states.velocity)
    att, rates = cat(state0.attitude, states.attitude), cat(state0.body_rates, states.body_rates)
    rotor_state = cat(state0.rotor_speeds, states.rotor_speeds)
    cmd_rows = np.concatenate([np.asarray(command), np.asarray(command[-1:])], axis=0)
    rotors = np.asarray(effective_rotor_speeds(params, jnp.asarray(rotor_state), jnp.asarray(cmd_rows)))
    u_rows = np.concatenate([np.asarray(u), np.asarray(u[-1:])], axis=0)
    rows = QuadState(position=jnp.asarray(pos), velocity=jnp.asarray(vel), attitude=jnp.asarray(att),
                     body_rates=jnp.asarray(rates), rotor_speeds=jnp.asarray(rotor_state),
                     energy=jnp.asarray(cat(state0.energy, states.energy)),
                     on_ground=jnp.asarray(cat(state0.on_ground, states.on_ground)))
    accel = jax.vmap(lambda x, c: derivative(params, x, c).velocity)(rows, jnp.asarray(cmd_rows))
    force = np.asarray(accel) + np.array([0.0, 0.0, 1.0]) * float(params.gravity)
    if noise:
        rng = np.random.default_rng(seed)
        pos = pos + rng.normal(size=pos.shape) * noise.get("position", 0.0)
        vel = vel + rng.normal(size=vel.shape) * noise.get("velocity", 0.0)
        rates = rates + rng.normal(size=rates.shape) * noise.get("body_rates", 0.0)
        rotors = rotors + rng.normal(size=rotors.shape) * noise.get("rotor_speeds", 0.0)
        sigma = noise.get("attitude", 0.0)
        if sigma:
            small = rng.normal(size=(len(att), 3)) * sigma
            dq = np.concatenate([np.ones((len(att), 1)), 0.5 * small], axis=1)
            att = np.asarray(quat_normalize(quat_multiply(jnp.asarray(att), jnp.asarray(dq))))
        if "specific_force" in noise:  # drawn last: the other channels' noise is as it was before the IMU
            force = force + rng.normal(size=force.shape) * noise["specific_force"]
    T = len(pos)
    return FlightLog(
        name=name, t=np.arange(T) * dt, position=pos, velocity=vel, attitude=att, body_rates=rates,
        rotor_speeds=rotors, motor_commands=u_rows, specific_force=force, stale=np.zeros(T, bool),
    )
