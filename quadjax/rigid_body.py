"""The vehicle-independent 6-DoF rigid body: Newton–Euler with a quaternion attitude.

A vehicle supplies a body-frame force and moment; everything here holds for any
vehicle (GUIDE §4: a new vehicle is a new force model, not a fork of this).
Functions work on one body or on leading batch axes.
"""

import jax.numpy as jnp

from quadjax.quaternion import quat_kinematics, quat_rotate


def solve_inertia(J, b):
    """x = J⁻¹ b for a 3×3 inertia J (..., 3, 3) and b (..., 3), by the adjugate.

    Closed form, written out: cheaper than a batched LU for 3×3 and smooth for grad.
    """
    a, bb, c = J[..., 0, 0], J[..., 0, 1], J[..., 0, 2]
    d, e, f = J[..., 1, 0], J[..., 1, 1], J[..., 1, 2]
    g, h, i = J[..., 2, 0], J[..., 2, 1], J[..., 2, 2]
    A, B, C = e * i - f * h, f * g - d * i, d * h - e * g
    det = a * A + bb * B + c * C
    x0, x1, x2 = b[..., 0], b[..., 1], b[..., 2]
    r0 = A * x0 + (c * h - bb * i) * x1 + (bb * f - c * e) * x2
    r1 = B * x0 + (a * i - c * g) * x1 + (c * d - a * f) * x2
    r2 = C * x0 + (bb * g - a * h) * x1 + (a * e - bb * d) * x2
    return jnp.stack([r0, r1, r2], axis=-1) / det[..., None]


def inertia_times(J, w):
    """J w for J (..., 3, 3), w (..., 3), written out."""
    return jnp.sum(J * w[..., None, :], axis=-1)


def angular_acceleration(J, body_rates, moment):
    """Euler's equation ω̇ = J⁻¹ (M − ω × J ω) [rad/s²]; J in kg·m², M in N·m, body frame."""
    gyro = jnp.cross(body_rates, inertia_times(J, body_rates))
    return solve_inertia(J, moment - gyro)


def linear_acceleration(mass, gravity, attitude, body_force):
    """Newton's law in the world frame: v̇ = R(q) F_b / m − g e_z [m/s²].

    mass [kg], gravity [m/s²], body_force [N] in the body frame (everything but weight).
    """
    a = quat_rotate(attitude, body_force) / mass[..., None]
    return a - jnp.stack([jnp.zeros_like(gravity), jnp.zeros_like(gravity), gravity], axis=-1)


def rigid_body_derivative(mass, inertia, gravity, attitude, velocity, body_rates, body_force, moment):
    """(ṗ, v̇, q̇, ω̇) of a rigid body under a body-frame force [N] and moment [N·m].

    ṗ = v;  v̇ = R(q) F_b / m − g e_z;  q̇ = ½ q ⊗ (0, ω);  ω̇ = J⁻¹ (M − ω × J ω).
    """
    return (
        velocity,
        linear_acceleration(mass, gravity, attitude, body_force),
        quat_kinematics(attitude, body_rates),
        angular_acceleration(inertia, body_rates, moment),
    )
