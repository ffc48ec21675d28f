"""Quaternion algebra, scalar first (w, x, y, z).

Each hot operation has a component form (``*_c``: tuples of arrays, see
:mod:`quadjax._components`) that the steppers use, and an array form on trailing
axes, a single quaternion ``(4,)`` or any leading batch shape ``(..., 4)``; vectors
are ``(..., 3)``. Written component by component: small stacks and matmuls inside
vmapped code cost more than the arithmetic (GUIDE §3).
"""

import jax.numpy as jnp

from quadjax._components import cross_c, join, split


def quat_multiply_c(a, b):
    """Hamilton product a ⊗ b on components (w, x, y, z)."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return (
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    )


def quat_multiply(a, b):
    """Hamilton product a ⊗ b. a, b: (..., 4) → (..., 4)."""
    return join(quat_multiply_c(split(a), split(b)))


def quat_conjugate_c(q):
    """q* = (w, −x, −y, −z) on components."""
    w, x, y, z = q
    return (w, -x, -y, -z)


def quat_conjugate(q):
    """q* = (w, −x, −y, −z): the inverse rotation of a unit quaternion."""
    return join(quat_conjugate_c(split(q)))


def quat_normalize_c(q):
    """q / ‖q‖ on components. Pre: q ≠ 0."""
    w, x, y, z = q
    n = jnp.sqrt(w * w + x * x + y * y + z * z)
    return (w / n, x / n, y / n, z / n)


def quat_normalize(q):
    """q / ‖q‖. Pre: q ≠ 0 (a unit quaternion from a valid state)."""
    return join(quat_normalize_c(split(q)))


def quat_rotate_c(q, v):
    """R(q) v on components: v' = v + w t + u × t, t = 2 u × v, u = (x, y, z). Exact for unit q."""
    w, u = q[0], q[1:]
    t = tuple(2.0 * c for c in cross_c(u, v))
    ut = cross_c(u, t)
    return tuple(vi + w * ti + ci for vi, ti, ci in zip(v, t, ut))


def quat_rotate(q, v):
    """Rotate body vector v into the world frame: R(q) v = q ⊗ (0, v) ⊗ q*.

    Uses v' = v + 2w (u × v) + 2 u × (u × v), u = (x, y, z); exact for unit q.
    """
    return join(quat_rotate_c(split(q), split(v)))


def quat_rotate_inverse_c(q, v):
    """R(q)ᵀ v on components."""
    return quat_rotate_c(quat_conjugate_c(q), v)


def quat_rotate_inverse(q, v):
    """Rotate world vector v into the body frame: R(q)ᵀ v."""
    return join(quat_rotate_inverse_c(split(q), split(v)))


def quat_to_matrix(q):
    """R(q), the body→world rotation matrix of a unit quaternion. (..., 4) → (..., 3, 3)."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def quat_kinematics_c(q, body_rates):
    """q̇ = ½ q ⊗ (0, ω) on components: :func:`quat_multiply_c` with its zero terms dropped (they
    cost 8 of the step's operations per RK4 stage, and compilers may not drop x·0 themselves)."""
    w, x, y, z = q
    p, r, s = body_rates
    return tuple(0.5 * c for c in (-x * p - y * r - z * s, w * p + y * s - z * r, w * r - x * s + z * p,
                                   w * s + x * r - y * p))


def quat_from_axis_angle(axis, angle):
    """Unit quaternion of a rotation by ``angle`` [rad] about unit ``axis`` (..., 3)."""
    half = 0.5 * jnp.asarray(angle)[..., None]
    return jnp.concatenate([jnp.cos(half), jnp.sin(half) * axis], axis=-1)


def quat_angle_between(a, b):
    """Geodesic angle [rad] between two attitudes, in [0, π]; sign of q ignored.

    2 atan2(‖v‖, |w|) of (w, v) = a* ⊗ b, both normalised first: accurate to rounding at every
    angle, where 2 arccos(|a·b|) resolves no better than √(2ε) near 0 (5e-4 rad in float32) and
    a 16-bit dot product that rounds past 1 clips to 0. Its gradient is 0 (not NaN) at a = b."""
    d = quat_multiply(quat_conjugate(quat_normalize(a)), quat_normalize(b))
    v2 = jnp.sum(d[..., 1:] ** 2, axis=-1)
    moved = v2 > 0
    return jnp.where(moved, 2.0 * jnp.arctan2(jnp.sqrt(jnp.where(moved, v2, 1.0)), jnp.abs(d[..., 0])), 0.0)


def quat_from_matrix(R):
    """Unit quaternion (w ≥ 0 where possible) of a rotation matrix (..., 3, 3).

    Shepperd's method: of the four algebraically equal forms, use the one whose
    square root argument is largest (well conditioned); the others are computed
    on safe arguments so the gradient stays finite.
    """
    r00, r11, r22 = R[..., 0, 0], R[..., 1, 1], R[..., 2, 2]
    trace = r00 + r11 + r22
    cands = jnp.stack([trace, r00, r11, r22], axis=-1)
    k = jnp.argmax(cands, axis=-1)
    d21, d02, d10 = R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]
    s21, s02, s10 = R[..., 2, 1] + R[..., 1, 2], R[..., 0, 2] + R[..., 2, 0], R[..., 1, 0] + R[..., 0, 1]

    def form(diag_sum, a, b, c, order):
        s = 2.0 * jnp.sqrt(jnp.maximum(1.0 + diag_sum, 1e-12))
        q = [0.25 * s, a / s, b / s, c / s]
        return jnp.stack([q[i] for i in order], axis=-1)

    qs = jnp.stack(
        [
            form(trace, d21, d02, d10, (0, 1, 2, 3)),
            form(r00 - r11 - r22, d21, s10, s02, (1, 0, 2, 3)),
            form(r11 - r00 - r22, d02, s10, s21, (1, 2, 0, 3)),
            form(r22 - r00 - r11, d10, s02, s21, (1, 2, 3, 0)),
        ],
        axis=-2,
    )
    # the chosen form by selects, not a gather: the same values, and straight-line code for the
    # generated kernels (quadjax.native.generate has no gather at a run-time index)
    q = qs[..., 3, :]
    for i in (2, 1, 0):
        q = jnp.where((k == i)[..., None], qs[..., i, :], q)
    return jnp.where(q[..., :1] < 0, -q, q)


def quat_from_rotation_vector(delta):
    """Unit quaternion of the rotation vector ``delta`` (3,) [rad] (the exponential map): (cos(θ/2), sin(θ/2)·δ/θ),
    θ = ‖δ‖; exact, with a finite gradient, at δ = 0 (where it is (1, δ/2))."""
    theta2 = jnp.sum(delta * delta)
    nonzero = theta2 > 0
    theta = jnp.sqrt(jnp.where(nonzero, theta2, 1.0))  # the double-where keeps grad finite at 0
    half_sinc = jnp.where(nonzero, jnp.sin(0.5 * theta) / theta, 0.5)  # sin(θ/2)/θ
    return jnp.concatenate([jnp.where(nonzero, jnp.cos(0.5 * theta), 1.0)[None], half_sinc * delta])


def quat_to_rotation_vector(q):
    """The rotation vector (3,) [rad] of a unit quaternion (the logarithmic map, inverse of
    :func:`quat_from_rotation_vector`): θ·u for the rotation by θ ∈ [0, π] about u; the sign
    of q is ignored. Finite gradient at the identity."""
    q = jnp.where(q[0] < 0, -q, q)
    v = q[1:]
    s2 = jnp.sum(v * v)
    nonzero = s2 > 0
    s = jnp.sqrt(jnp.where(nonzero, s2, 1.0))  # the double-where keeps grad finite at 0
    scale = jnp.where(nonzero, 2.0 * jnp.arctan2(s, q[0]) / s, 2.0 / q[0])
    return scale * v
