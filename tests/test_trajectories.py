"""Reference trajectories: analytic derivatives, waypoints, the c4dynamics mission."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from quadjax import control as C

F64 = jnp.float64


def a(x):
    return jnp.asarray(x, F64)


def test_figure8_derivatives_are_exact():
    ref = C.Figure8(center=a([1.0, 2.0, 3.0]), a=a(4.0), b=a(2.0), omega=a(0.3), yaw=a(0.5))
    t = 1.7
    r = ref(t)
    w = 0.3
    np.testing.assert_allclose(r.position, [1 + 4 * np.sin(w * t), 2 + 2 * np.sin(2 * w * t), 3.0])
    np.testing.assert_allclose(r.velocity, [4 * w * np.cos(w * t), 4 * w * np.cos(2 * w * t), 0.0])
    np.testing.assert_allclose(r.acceleration, [-4 * w**2 * np.sin(w * t), -8 * w**2 * np.sin(2 * w * t), 0.0])
    np.testing.assert_allclose(r.jerk, [-4 * w**3 * np.cos(w * t), -16 * w**3 * np.cos(2 * w * t), 0.0])
    assert float(r.yaw) == 0.5 and float(r.yaw_rate) == 0.0


def test_circle_speed_and_centripetal_acceleration():
    ref = C.Circle(center=a([0.0, 0.0, 2.0]), radius=a(5.0), omega=a(8.0 / 5.0), yaw=a(0.0))
    r = jax.vmap(ref)(jnp.linspace(0.0, 5.0, 7, dtype=F64))
    np.testing.assert_allclose(jnp.linalg.norm(r.velocity, axis=-1), 8.0, rtol=1e-12)
    np.testing.assert_allclose(jnp.linalg.norm(r.acceleration, axis=-1), 8.0**2 / 5.0, rtol=1e-12)


def test_c4dynamics_mission_matches_its_reference():
    qp = pytest.importorskip("c4dynamics.controllers.quad_pid")
    ref = C.C4dFigure8(a=a(4.0), b=a(2.0), omega=a(0.1), z_ref=a(2.0), t_takeoff=a(8.0), t_land=a(8.0), t_end=a(90.0))
    for t in (0.0, 3.0, 8.0, 20.0, 55.5, 81.0, 85.0, 90.0):
        np.testing.assert_allclose(ref(t).position, qp.position_reference(t, 4.0, 2.0, 0.1, 2.0, t_sim=90.0), atol=1e-12)
    vx, vy = qp.velocity_reference(30.0, 4.0, 2.0, 0.1, t_sim=90.0)
    np.testing.assert_allclose(ref(30.0).velocity[:2], [vx, vy], atol=1e-12)


def test_minimum_snap_passes_waypoints_at_rest_and_is_smooth():
    W = np.array([[0.0, 0.0, 1.0], [2.0, 1.0, 1.5], [3.0, -1.0, 2.0], [0.0, 0.0, 1.0]])
    T = np.array([2.0, 1.5, 2.5])
    ref = C.minimum_snap(W, T, dtype=F64)
    knots = np.concatenate([[0.0], np.cumsum(T)])
    for k, w in zip(knots, W):
        np.testing.assert_allclose(ref(k).position, w, atol=1e-9)
    for end in (0.0, knots[-1]):
        r = ref(end)
        for d in (r.velocity, r.acceleration, r.jerk):
            np.testing.assert_allclose(d, 0.0, atol=1e-8)
    for k in knots[1:-1]:  # continuous through the interior knots
        lo, hi = ref(k - 1e-7), ref(k + 1e-7)
        for f in ("velocity", "acceleration", "jerk"):
            np.testing.assert_allclose(getattr(lo, f), getattr(hi, f), atol=1e-4)


def test_minimum_snap_has_less_snap_than_another_interpolant():
    """The optimum's ∫‖snap‖² is below a perturbed path through the same waypoints."""
    W = np.array([[0.0, 0.0, 1.0], [2.0, 1.0, 1.5], [3.0, -1.0, 2.0]])
    T = np.array([2.0, 1.5])
    ref = C.minimum_snap(W, T, dtype=F64)
    ts = jnp.linspace(0.0, 3.5, 2001, dtype=F64)

    def snap_cost(r):
        snap = jax.vmap(lambda t: jax.jacfwd(lambda s: r(s).jerk)(t))(ts)
        return float(jnp.mean(jnp.sum(snap**2, axis=-1)))

    bump = ref.replace(coeffs=ref.coeffs.at[0, 7, 0].add(1e-3).at[1, 7, 0].add(-1e-3))
    assert snap_cost(ref) < snap_cost(bump)


def test_bad_waypoints_are_rejected():
    with pytest.raises(ValueError, match="durations"):
        C.minimum_snap(np.zeros((3, 3)), [1.0, -1.0])
    with pytest.raises(ValueError, match="waypoints"):
        C.minimum_snap(np.zeros((3, 2)), [1.0, 1.0])
