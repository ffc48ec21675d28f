"""Conversions at the edges: frames, rotor orders, Euler angles, units, throttle.

The core is ENU world / FLU body, quaternion (w, x, y, z) body→world, PX4 Quad X
rotor order, rad/s. Data in any other convention is converted here, once, on
the way in or out — never inside :func:`quadjax.derivative`.
"""

import math

import jax.numpy as jnp
import numpy as np

from quadjax.params import QuadParams
from quadjax.quadrotor import body_wrench
from quadjax.quaternion import quat_multiply
from quadjax.rigid_body import rigid_body_derivative
from quadjax.state import QuadState

_S = math.sqrt(0.5)

# --- ENU/FLU <-> NED/FRD -------------------------------------------------------------


def enu_to_ned(v):
    """World vector ENU → NED: (e, n, u) → (n, e, −u). Its own inverse."""
    return jnp.stack([v[..., 1], v[..., 0], -v[..., 2]], axis=-1)


ned_to_enu = enu_to_ned


def flu_to_frd(v):
    """Body vector FLU → FRD: (x, y, z) → (x, −y, −z). Its own inverse."""
    return jnp.stack([v[..., 0], -v[..., 1], -v[..., 2]], axis=-1)


frd_to_flu = flu_to_frd


def quat_enu_flu_to_ned_frd(q):
    """Attitude quaternion body(FLU)→ENU as body(FRD)→NED, and back (an involution).

    q_NED = q_M ⊗ q ⊗ q_F*, with q_M = (0, √½, √½, 0) the ENU→NED rotation and
    q_F = (1·0, 1, 0, 0) the FLU→FRD rotation (180° about x).
    """
    qm = jnp.asarray([0.0, _S, _S, 0.0], dtype=q.dtype)
    qf_conj = jnp.asarray([0.0, -1.0, 0.0, 0.0], dtype=q.dtype)
    out = quat_multiply(quat_multiply(jnp.broadcast_to(qm, q.shape), q), jnp.broadcast_to(qf_conj, q.shape))
    # keep w ≥ 0 by convention (q and −q are the same attitude)
    return jnp.where(out[..., :1] < 0, -out, out)


quat_ned_frd_to_enu_flu = quat_enu_flu_to_ned_frd


def state_enu_to_ned(state: QuadState) -> QuadState:
    """A whole state with NED world / FRD body components (and back: an involution).

    Only for export and comparison: the library's functions expect ENU/FLU.
    """
    return state.replace(
        position=enu_to_ned(state.position),
        velocity=enu_to_ned(state.velocity),
        attitude=quat_enu_flu_to_ned_frd(state.attitude),
        body_rates=flu_to_frd(state.body_rates),
    )


state_ned_to_enu = state_enu_to_ned

# --- rotor orders -------------------------------------------------------------------

#: rotor corners in each autopilot's motor order (index 0 = its motor 1)
ROTOR_ORDERS = {
    "px4": ("FR", "RL", "FL", "RR"),
    "ardupilot": ("FR", "RL", "FL", "RR"),
    "betaflight": ("RR", "FR", "RL", "FL"),
    "crazyflie": ("FR", "RR", "RL", "FL"),
}


def rotor_permutation(source: str, target: str = "px4") -> np.ndarray:
    """Index array ``idx`` with ``x_target = x_source[..., idx]`` for Quad X motor orders.

    Orders: 'px4' and 'ardupilot' (the same Quad X order: FR, RL, FL, RR),
    'betaflight' (RR, FR, RL, FL), 'crazyflie' (M1 FR, M2 RR, M3 RL, M4 FL).
    """
    for name in (source, target):
        if name not in ROTOR_ORDERS:
            raise ValueError(f"unknown rotor order {name!r}; choose one of {sorted(ROTOR_ORDERS)}")
    src = ROTOR_ORDERS[source]
    return np.asarray([src.index(corner) for corner in ROTOR_ORDERS[target]])


def reorder_rotors(x, source: str, target: str = "px4"):
    """Per-rotor values (..., 4) from one motor order to another."""
    return jnp.asarray(x)[..., rotor_permutation(source, target)]


# --- Euler angles ---------------------------------------------------------------------


def euler321_to_quat(euler):
    """3-2-1 (yaw ψ, pitch θ, roll φ; intrinsic Z-Y-X) angles (..., 3) = (φ, θ, ψ) [rad] → q."""
    hr, hp, hy = 0.5 * euler[..., 0], 0.5 * euler[..., 1], 0.5 * euler[..., 2]
    cr, sr, cp, sp, cy, sy = jnp.cos(hr), jnp.sin(hr), jnp.cos(hp), jnp.sin(hp), jnp.cos(hy), jnp.sin(hy)
    return jnp.stack(
        [
            cr * cp * cy + sr * sp * sy,
            sr * cp * cy - cr * sp * sy,
            cr * sp * cy + sr * cp * sy,
            cr * cp * sy - sr * sp * cy,
        ],
        axis=-1,
    )


def quat_to_euler321(q):
    """Unit q → (φ, θ, ψ) [rad], θ ∈ [−π/2, π/2] (gimbal lock at ±π/2)."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    roll = jnp.arctan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    pitch = jnp.arcsin(jnp.clip(2 * (w * y - x * z), -1.0, 1.0))
    yaw = jnp.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
    return jnp.stack([roll, pitch, yaw], axis=-1)


def euler_rates(euler, body_rates):
    """3-2-1 Euler angle rates from body rates (p, q, r) [rad/s]:

    φ̇ = p + tanθ (q sinφ + r cosφ),  θ̇ = q cosφ − r sinφ,  ψ̇ = (q sinφ + r cosφ) / cosθ.
    """
    phi, theta = euler[..., 0], euler[..., 1]
    p, q, r = body_rates[..., 0], body_rates[..., 1], body_rates[..., 2]
    s, c = jnp.sin(phi), jnp.cos(phi)
    return jnp.stack(
        [p + jnp.tan(theta) * (q * s + r * c), q * c - r * s, (q * s + r * c) / jnp.cos(theta)], axis=-1
    )


def euler12_derivative(params: QuadParams, x12, rotor_speeds):
    """The 12-state Euler-angle model, c4dynamics' ``rigidbody`` path, in ENU/FLU.

    x12 = [x, y, z, vx, vy, vz, φ, θ, ψ, p, q, r]; ``rotor_speeds`` (..., R)
    [rad/s] act directly (no motor lag, full battery). Same forces and rigid body
    as :func:`quadjax.derivative`; the attitude rate is :func:`euler_rates`.
    """
    q = euler321_to_quat(x12[..., 6:9])
    energy = jnp.zeros(x12.shape[:-1], x12.dtype)
    force, moment = body_wrench(params, x12[..., 0:3], q, x12[..., 3:6], x12[..., 9:12], rotor_speeds, energy)
    return euler12_rigid_body(params.mass, params.inertia, params.gravity, x12, force, moment)


def euler12_rigid_body(mass, inertia, gravity, x12, body_force, moment):
    """ẋ (12,) of a rigid body on the Euler-angle state x12 = [p, v, (φ, θ, ψ), ω] under a
    body-frame force [N] and moment [N·m]: the quaternion core
    (:func:`quadjax.rigid_body.rigid_body_derivative`) with the 3-2-1 angle rates
    (:func:`euler_rates`) in place of q̇. Singular at θ = ±90°."""
    euler, w = x12[..., 6:9], x12[..., 9:12]
    p_dot, v_dot, _, w_dot = rigid_body_derivative(
        mass, inertia, gravity, euler321_to_quat(euler), x12[..., 3:6], w, body_force, moment
    )
    return jnp.concatenate([p_dot, v_dot, euler_rates(euler, w), w_dot], axis=-1)


# --- units and throttle -----------------------------------------------------------------

RPM_PER_RAD_S = 60.0 / (2.0 * math.pi)


def rpm_to_rad_s(rpm):
    """Revolutions per minute → rad/s."""
    return jnp.asarray(rpm) / RPM_PER_RAD_S


def rad_s_to_rpm(omega):
    """rad/s → revolutions per minute."""
    return jnp.asarray(omega) * RPM_PER_RAD_S


def throttle_to_rotor_speed(throttle, omega_max, a):
    """Elodin's normalised throttle x ∈ [0, 1] → rotor-speed command [rad/s] (seed 001).

    Normalised thrust y = a x² + (1 − a) x, so T = y T_max and, with T = k_f ω²,
    ω = ω_max √y. x is clipped to [0, 1]; the gradient is finite at x = 0.
    """
    x = jnp.clip(throttle, 0.0, 1.0)
    y = a * x * x + (1.0 - a) * x
    positive = y > 0
    return jnp.where(positive, omega_max * jnp.sqrt(jnp.where(positive, y, 1.0)), 0.0)


# --- geodetic position and pressure altitude (GPS receivers, barometers) ------------------

#: WGS-84 equatorial radius [m] and flattening: the local flat-earth conversion's ellipsoid
WGS84_A, WGS84_F = 6378137.0, 1.0 / 298.257223563


def enu_to_geodetic(position, home=(0.0, 0.0, 0.0)):
    """Local ENU position (..., 3) [m] → (longitude [deg], latitude [deg], altitude [m]) near
    ``home`` = (longitude, latitude, altitude) of the ENU origin, on the WGS-84 ellipsoid's
    local radii of curvature (flat earth: a metre-level error needs ~10 km from home):
    lat = lat₀ + n / R_N, lon = lon₀ + e / (R_E cos lat₀), R_N = a(1 − e²)/(1 − e² sin²lat₀)^{3/2},
    R_E = a/(1 − e² sin²lat₀)^{1/2}. Computed in float64 (a float32 degree resolves ~1 m)."""
    p = np.asarray(position, np.float64)
    lon0, lat0, alt0 = (float(x) for x in home)
    e2 = WGS84_F * (2.0 - WGS84_F)
    s = math.sin(math.radians(lat0))
    r_north = WGS84_A * (1.0 - e2) / (1.0 - e2 * s * s) ** 1.5
    r_east = WGS84_A / math.sqrt(1.0 - e2 * s * s)
    lat = lat0 + np.degrees(p[..., 1] / r_north)
    lon = lon0 + np.degrees(p[..., 0] / (r_east * math.cos(math.radians(lat0))))
    return np.stack([lon, lat, alt0 + p[..., 2]], axis=-1)


def isa_pressure(altitude):
    """Static pressure [Pa] at geopotential ``altitude`` [m] in the International Standard
    Atmosphere's troposphere (below 11 km): p = p₀ (1 − L h / T₀)^{g M/(R L)}, p₀ 101 325 Pa,
    T₀ 288.15 K, L 0.0065 K/m, exponent 5.25588 — what a barometer reads."""
    return 101325.0 * (1.0 - 2.25577e-5 * np.asarray(altitude, np.float64)) ** 5.25588
