"""Reference trajectories: pure functions of time t [s] → :class:`Reference`.

Each trajectory is a pytree (its numbers are leaves, so a batch of vehicles can fly
a batch of trajectories under vmap) whose ``__call__(t)`` evaluates the position and
yaw; velocity, acceleration and jerk are their exact time derivatives, taken by
forward-mode autodiff (:func:`reference_from`), so no derivative is written by hand.
World frame ENU, SI units.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass


@pytree_dataclass
class Reference:
    """A flat-output reference at one time: position (3,) m, velocity (3,) m/s,
    acceleration (3,) m/s², jerk (3,) m/s³ (world ENU), yaw () rad and yaw_rate () rad/s."""

    position: jax.Array
    velocity: jax.Array
    acceleration: jax.Array
    jerk: jax.Array
    yaw: jax.Array
    yaw_rate: jax.Array


def reference_from(position_fn, yaw_fn, t) -> Reference:
    """Build a :class:`Reference` from p(t) (3,) and ψ(t) by nested forward-mode derivatives."""
    t = jnp.asarray(t)
    one = jnp.ones_like(t)

    def d(f):
        return lambda s: jax.jvp(f, (s,), (one,))[1]

    p, v = jax.jvp(position_fn, (t,), (one,))
    a = d(d(position_fn))(t)
    j = d(d(d(position_fn)))(t)
    yaw, yaw_rate = jax.jvp(yaw_fn, (t,), (one,))
    return Reference(position=p, velocity=v, acceleration=a, jerk=j, yaw=yaw, yaw_rate=yaw_rate)


def _smoothstep(x):
    """3x² − 2x³ on [0, 1], clamped outside (zero slope at both ends)."""
    x = jnp.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


@pytree_dataclass
class Hover:
    """Hold ``position`` (3,) m with ``yaw`` rad."""

    position: jax.Array
    yaw: jax.Array

    def __call__(self, t) -> Reference:
        return reference_from(lambda s: self.position + 0.0 * s, lambda s: self.yaw + 0.0 * s, t)


@pytree_dataclass
class Step:
    """``start`` (3,) until ``t_step`` [s], then ``end`` (3,): a position step (velocity 0)."""

    start: jax.Array
    end: jax.Array
    t_step: jax.Array
    yaw: jax.Array

    def __call__(self, t) -> Reference:
        # jnp.where keeps the derivatives zero on both sides of the jump
        return reference_from(lambda s: jnp.where(s < self.t_step, self.start, self.end),
                              lambda s: self.yaw + 0.0 * s, t)


@pytree_dataclass
class Circle:
    """p = center + radius (cos ωt, sin ωt, 0), counter-clockwise seen from above; yaw fixed."""

    center: jax.Array
    radius: jax.Array
    omega: jax.Array
    yaw: jax.Array

    def __call__(self, t) -> Reference:
        def pos(s):
            z = jnp.zeros_like(s)
            return self.center + self.radius * jnp.stack([jnp.cos(self.omega * s), jnp.sin(self.omega * s), z])

        return reference_from(pos, lambda s: self.yaw + 0.0 * s, t)


@pytree_dataclass
class Figure8:
    """Lemniscate p = center + (A sin ωt, B sin 2ωt, 0); yaw fixed."""

    center: jax.Array
    a: jax.Array
    b: jax.Array
    omega: jax.Array
    yaw: jax.Array

    def __call__(self, t) -> Reference:
        def pos(s):
            w = self.omega * s
            return self.center + jnp.stack([self.a * jnp.sin(w), self.b * jnp.sin(2.0 * w), jnp.zeros_like(s)])

        return reference_from(pos, lambda s: self.yaw + 0.0 * s, t)


@pytree_dataclass
class C4dFigure8:
    """c4dynamics' cascade-PID mission (``quad_pid.position_reference``): take-off, figure-8, landing.

    Take-off: z rises to ``z_ref`` along 3f² − 2f³ over ``t_takeoff``; then x = A sin ωτ,
    y = B sin 2ωτ (τ = t − t_takeoff) at ``z_ref``; the last ``t_land`` seconds before
    ``t_end`` bring x, y, z back to 0 along the same S-curve.
    """

    a: jax.Array
    b: jax.Array
    omega: jax.Array
    z_ref: jax.Array
    t_takeoff: jax.Array
    t_land: jax.Array
    t_end: jax.Array

    def __call__(self, t) -> Reference:
        def pos(s):
            t_land_start = self.t_end - self.t_land
            tau = jnp.clip(s, self.t_takeoff, t_land_start) - self.t_takeoff
            xy = jnp.stack([self.a * jnp.sin(self.omega * tau), self.b * jnp.sin(2.0 * self.omega * tau)])
            up = _smoothstep(s / self.t_takeoff)
            down = 1.0 - _smoothstep((s - t_land_start) / self.t_land)
            return jnp.concatenate([xy * down, (self.z_ref * up * down)[None]])

        return reference_from(pos, lambda s: 0.0 * s, t)


@pytree_dataclass
class PiecewisePolynomial:
    """Position as polynomials per segment: ``coeffs`` (S, K, 3) (power basis in the local
    time, lowest degree first) on segments starting at ``knots`` (S + 1,) [s]; yaw fixed."""

    coeffs: jax.Array
    knots: jax.Array
    yaw: jax.Array

    def __call__(self, t) -> Reference:
        def pos(s):
            seg = jnp.clip(jnp.searchsorted(self.knots, s, side="right") - 1, 0, self.coeffs.shape[0] - 1)
            local = jnp.clip(s, self.knots[0], self.knots[-1]) - self.knots[seg]
            c = self.coeffs[seg]
            out = jnp.zeros_like(c[0])
            for k in range(c.shape[0] - 1, -1, -1):  # Horner
                out = out * local + c[k]
            return out

        return reference_from(pos, lambda s: self.yaw + 0.0 * s, t)


def minimum_snap(waypoints, durations, yaw=0.0, dtype=None) -> PiecewisePolynomial:
    """The minimum-snap path through ``waypoints`` (K, 3) [m] with segment ``durations`` (K−1,) [s].

    Degree-7 polynomials per segment and axis minimising ∫‖p⁽⁴⁾‖² dt, at rest (zero
    velocity, acceleration and jerk) at both ends, passing every waypoint, with
    derivatives 1..6 continuous at interior waypoints (Mellinger & Kumar 2011). Solved
    once, in numpy float64, as the KKT system of the equality-constrained QP.
    """
    W = np.asarray(waypoints, np.float64)
    T = np.asarray(durations, np.float64)
    if W.ndim != 2 or W.shape[1] != 3 or W.shape[0] < 2:
        raise ValueError(f"minimum_snap: waypoints must be (K >= 2, 3), got {W.shape}")
    if T.shape != (W.shape[0] - 1,) or not np.all(np.isfinite(T)) or np.any(T <= 0):
        raise ValueError(f"minimum_snap: durations must be {W.shape[0] - 1} positive numbers, got {T.tolist()}")
    S, n = len(T), 8

    def basis(tau, d):
        """Row of d-th derivative of [1, τ, …, τ⁷]."""
        row = np.zeros(n)
        for k in range(d, n):
            row[k] = np.prod(np.arange(k - d + 1, k + 1)) * tau ** (k - d)
        return row

    def snap_cost(Ts):
        Q = np.zeros((n, n))
        for i in range(4, n):
            for j in range(4, n):
                ci = np.prod(np.arange(i - 3, i + 1))
                cj = np.prod(np.arange(j - 3, j + 1))
                Q[i, j] = ci * cj * Ts ** (i + j - 7) / (i + j - 7)
        return Q

    H = np.zeros((S * n, S * n))
    for s in range(S):
        H[s * n:(s + 1) * n, s * n:(s + 1) * n] = snap_cost(T[s])
    rows, rhs = [], []

    def constrain(seg, tau, d, value, seg2=None, tau2=None):
        row = np.zeros(S * n)
        row[seg * n:(seg + 1) * n] = basis(tau, d)
        if seg2 is not None:
            row[seg2 * n:(seg2 + 1) * n] -= basis(tau2, d)
        rows.append(row)
        rhs.append(value)

    coeffs = np.zeros((S, n, 3))
    for axis in range(3):
        rows.clear()
        rhs.clear()
        for d in range(4):  # rest at both ends
            constrain(0, 0.0, d, W[0, axis] if d == 0 else 0.0)
            constrain(S - 1, T[-1], d, W[-1, axis] if d == 0 else 0.0)
        for s in range(S - 1):
            constrain(s, T[s], 0, W[s + 1, axis])
            for d in range(0, 7):
                constrain(s, T[s], d, 0.0, seg2=s + 1, tau2=0.0)
        A, b = np.array(rows), np.array(rhs)
        m = A.shape[0]
        kkt = np.block([[H, A.T], [A, np.zeros((m, m))]])
        sol = np.linalg.lstsq(kkt, np.concatenate([np.zeros(S * n), b]), rcond=None)[0]
        coeffs[:, :, axis] = sol[: S * n].reshape(S, n)
    knots = np.concatenate([[0.0], np.cumsum(T)])
    dtype = dtype or jnp.zeros(()).dtype
    return PiecewisePolynomial(coeffs=jnp.asarray(coeffs, dtype), knots=jnp.asarray(knots, dtype),
                               yaw=jnp.asarray(yaw, dtype))
