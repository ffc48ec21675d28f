"""The vehicle-independent 6-DoF rigid body: Newton–Euler with a quaternion attitude.

A vehicle supplies a body-frame force and moment; everything here holds for any
vehicle (GUIDE §4: a new vehicle is a new force model, not a fork of this).
Functions work on one body or on leading batch axes. The ``*_c`` functions are the
component form (:mod:`quadjax._components`) that the steppers use; J is then a tuple of
three rows.
"""

from quadjax._components import cross_c, dot_c, join, split, split_matrix
from quadjax.quaternion import quat_kinematics_c, quat_rotate_c


def solve_inertia_c(J, b):
    """x = J⁻¹ b on components, by the adjugate (closed form: cheap for 3×3, smooth for grad)."""
    (a, bb, c), (d, e, f), (g, h, i) = J
    A, B, C = e * i - f * h, f * g - d * i, d * h - e * g
    det = a * A + bb * B + c * C
    x0, x1, x2 = b
    r0 = A * x0 + (c * h - bb * i) * x1 + (bb * f - c * e) * x2
    r1 = B * x0 + (a * i - c * g) * x1 + (c * d - a * f) * x2
    r2 = C * x0 + (bb * g - a * h) * x1 + (a * e - bb * d) * x2
    inv_det = 1.0 / det  # one reciprocal: XLA may rewrite r / det so, or not, depending on the program
    return (r0 * inv_det, r1 * inv_det, r2 * inv_det)


def inertia_times_c(J, w):
    """J w on components."""
    return tuple(dot_c(row, w) for row in J)


def angular_acceleration_c(J, body_rates, moment):
    """ω̇ = J⁻¹ (M − ω × J ω) on components."""
    gyro = cross_c(body_rates, inertia_times_c(J, body_rates))
    return solve_inertia_c(J, tuple(m - g for m, g in zip(moment, gyro)))


def angular_acceleration(J, body_rates, moment):
    """Euler's equation ω̇ = J⁻¹ (M − ω × J ω) [rad/s²]; J in kg·m², M in N·m, body frame."""
    return join(angular_acceleration_c(split_matrix(J), split(body_rates), split(moment)))


def linear_acceleration_c(mass, gravity, attitude, body_force):
    """v̇ = R(q) F_b / m − g e_z on components."""
    ax, ay, az = quat_rotate_c(attitude, body_force)
    return (ax / mass, ay / mass, az / mass - gravity)


def rigid_body_derivative_c(mass, inertia, gravity, attitude, velocity, body_rates, body_force, moment):
    """(ṗ, v̇, q̇, ω̇) on components; ``inertia`` is a tuple of three rows."""
    return (
        velocity,
        linear_acceleration_c(mass, gravity, attitude, body_force),
        quat_kinematics_c(attitude, body_rates),
        angular_acceleration_c(inertia, body_rates, moment),
    )


def rigid_body_derivative(mass, inertia, gravity, attitude, velocity, body_rates, body_force, moment):
    """(ṗ, v̇, q̇, ω̇) of a rigid body under a body-frame force [N] and moment [N·m].

    ṗ = v;  v̇ = R(q) F_b / m − g e_z;  q̇ = ½ q ⊗ (0, ω);  ω̇ = J⁻¹ (M − ω × J ω).
    """
    out = rigid_body_derivative_c(
        mass, split_matrix(inertia), gravity, split(attitude), split(velocity), split(body_rates),
        split(body_force), split(moment),
    )
    return tuple(join(x) for x in out)
