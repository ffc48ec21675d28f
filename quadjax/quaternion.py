"""Quaternion algebra on trailing axes, scalar first (w, x, y, z).

Every function works on a single quaternion ``(4,)`` or on any leading batch
shape ``(..., 4)``; vectors are ``(..., 3)``. Written component by component:
small stacks and matmuls inside vmapped code cost more than the arithmetic
(GUIDE §3).
"""

import jax.numpy as jnp


def quat_multiply(a, b):
    """Hamilton product a ⊗ b. a, b: (..., 4) → (..., 4)."""
    aw, ax, ay, az = a[..., 0], a[..., 1], a[..., 2], a[..., 3]
    bw, bx, by, bz = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return jnp.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_conjugate(q):
    """q* = (w, −x, −y, −z): the inverse rotation of a unit quaternion."""
    return q * jnp.asarray([1, -1, -1, -1], dtype=q.dtype)


def quat_normalize(q):
    """q / ‖q‖. Pre: q ≠ 0 (a unit quaternion from a valid state)."""
    return q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True))


def quat_rotate(q, v):
    """Rotate body vector v into the world frame: R(q) v = q ⊗ (0, v) ⊗ q*.

    Uses v' = v + 2w (u × v) + 2 u × (u × v), u = (x, y, z); exact for unit q.
    """
    w = q[..., 0:1]
    u = q[..., 1:4]
    t = 2.0 * jnp.cross(u, v)
    return v + w * t + jnp.cross(u, t)


def quat_rotate_inverse(q, v):
    """Rotate world vector v into the body frame: R(q)ᵀ v."""
    return quat_rotate(quat_conjugate(q), v)


def quat_to_matrix(q):
    """R(q), the body→world rotation matrix of a unit quaternion. (..., 4) → (..., 3, 3)."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def quat_kinematics(q, body_rates):
    """q̇ = ½ q ⊗ (0, ω) for body rates ω [rad/s]. (..., 4), (..., 3) → (..., 4)."""
    zero = jnp.zeros_like(body_rates[..., :1])
    return 0.5 * quat_multiply(q, jnp.concatenate([zero, body_rates], axis=-1))


def quat_from_axis_angle(axis, angle):
    """Unit quaternion of a rotation by ``angle`` [rad] about unit ``axis`` (..., 3)."""
    half = 0.5 * jnp.asarray(angle)[..., None]
    return jnp.concatenate([jnp.cos(half), jnp.sin(half) * axis], axis=-1)


def quat_angle_between(a, b):
    """Geodesic angle [rad] between two attitudes, in [0, π]; sign of q ignored."""
    d = jnp.abs(jnp.sum(a * b, axis=-1))
    return 2.0 * jnp.arccos(jnp.clip(d, 0.0, 1.0))
