"""Conventions (GUIDE §2) and the edge conversions in quadjax.frames."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import quadjax as qj
from quadjax import frames
from quadjax.quaternion import quat_from_axis_angle, quat_multiply, quat_rotate, quat_to_matrix


def test_yaw_plus_90_maps_body_x_to_world_y():
    q = quat_from_axis_angle(jnp.array([0.0, 0.0, 1.0]), jnp.pi / 2)
    np.testing.assert_allclose(quat_rotate(q, jnp.array([1.0, 0.0, 0.0])), [0.0, 1.0, 0.0], atol=1e-15)
    # the same rotation as the 3-2-1 Euler angles (0, 0, +90°)
    np.testing.assert_allclose(frames.euler321_to_quat(jnp.array([0.0, 0.0, jnp.pi / 2])), q, atol=1e-15)


def test_positive_roll_lowers_the_right_side():
    q = quat_from_axis_angle(jnp.array([1.0, 0.0, 0.0]), 0.3)
    right = quat_rotate(q, jnp.array([0.0, -1.0, 0.0]))  # body -y is the right side in FLU
    assert right[2] < 0


def test_faster_ccw_pair_turns_clockwise_and_left_rotors_roll_right_side_down():
    p = qj.presets.rp1(dtype=jnp.float64).replace(motor_tau=jnp.asarray(0.0))
    s = qj.hover_state(p, (0.0, 0.0, 1.0))
    w = qj.hover_rotor_speed(p)
    d = qj.derivative(p, s, w * jnp.array([1.1, 1.1, 0.9, 0.9]))  # rotors 0, 1 are CCW
    assert d.body_rates[2] < 0, "CCW pair faster must yaw clockwise seen from above (−z)"
    np.testing.assert_allclose(d.body_rates[:2], 0.0, atol=1e-12)
    d = qj.derivative(p, s, w * jnp.array([0.9, 1.1, 1.1, 0.9]))  # rotors 1, 2 are on the left (+y)
    assert d.body_rates[0] > 0
    d = qj.derivative(p, s, w * jnp.array([1.1, 0.9, 1.1, 0.9]))  # rotors 0, 2 are in front: nose up is −pitch in FLU
    assert d.body_rates[1] < 0


def test_quaternion_matrix_agree_and_compose():
    rng = np.random.default_rng(1)
    a, b = (jnp.asarray(x / np.linalg.norm(x)) for x in rng.normal(size=(2, 4)))
    v = jnp.asarray(rng.normal(size=3))
    np.testing.assert_allclose(quat_to_matrix(a) @ v, quat_rotate(a, v), atol=1e-14)
    np.testing.assert_allclose(quat_to_matrix(quat_multiply(a, b)), quat_to_matrix(a) @ quat_to_matrix(b), atol=1e-14)


unit_quats = st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda x: np.linalg.norm(x) > 0.1)


@settings(max_examples=200)
@given(unit_quats)
def test_euler321_round_trip(q):
    q = jnp.asarray(np.asarray(q) / np.linalg.norm(q))
    e = frames.quat_to_euler321(q)
    if abs(float(e[1])) > 1.5:  # gimbal lock: angles not unique
        return
    q2 = frames.euler321_to_quat(e)
    assert min(float(jnp.max(jnp.abs(q2 - q))), float(jnp.max(jnp.abs(q2 + q)))) < 1e-9


@settings(max_examples=200)
@given(unit_quats, st.lists(st.floats(-10, 10), min_size=3, max_size=3))
def test_ned_conversion_rotates_consistently(q, v):
    """A body vector mapped to the world must agree in both conventions."""
    q = jnp.asarray(np.asarray(q) / np.linalg.norm(q))
    v = jnp.asarray(v)
    world_enu = quat_rotate(q, v)
    q_ned = frames.quat_enu_flu_to_ned_frd(q)
    np.testing.assert_allclose(quat_rotate(q_ned, frames.flu_to_frd(v)), frames.enu_to_ned(world_enu), atol=1e-12)
    back = frames.quat_ned_frd_to_enu_flu(q_ned)
    assert float(qj.quaternion.quat_angle_between(back, q)) < 1e-6  # q and −q are one attitude


def test_level_vehicle_facing_east_is_yaw_90_in_ned():
    """ENU yaw 0 faces east; in NED east is yaw +90°."""
    q_ned = frames.quat_enu_flu_to_ned_frd(jnp.array([1.0, 0.0, 0.0, 0.0]))
    np.testing.assert_allclose(frames.quat_to_euler321(q_ned), [0.0, 0.0, jnp.pi / 2], atol=1e-12)


def test_state_conversion_round_trip():
    from tests.helpers import busy_params, busy_state

    s = busy_state(busy_params())
    back = frames.state_ned_to_enu(frames.state_enu_to_ned(s))
    np.testing.assert_allclose(back.position, s.position)
    assert float(qj.quaternion.quat_angle_between(back.attitude, s.attitude)) < 1e-7
    np.testing.assert_allclose(back.body_rates, s.body_rates)


@pytest.mark.parametrize("order", ["px4", "ardupilot", "betaflight", "crazyflie"])
def test_rotor_orders_name_the_same_corners(order):
    corners = {"FR": (1, -1), "RL": (-1, 1), "FL": (1, 1), "RR": (-1, -1)}
    labels = np.array(frames.ROTOR_ORDERS[order])
    px4 = frames.reorder_rotors(np.arange(4), order, "px4")
    assert [corners[labels[i]] for i in np.asarray(px4)] == [corners[c] for c in frames.ROTOR_ORDERS["px4"]]
    np.testing.assert_array_equal(frames.reorder_rotors(px4, "px4", order), np.arange(4))


def test_crazyflie_order_matches_the_data_card():
    # data card: M1 FR CCW, M2 RR CW, M3 RL CCW, M4 FL CW → PX4 (FR, RL, FL, RR) = (M1, M3, M4, M2)
    np.testing.assert_array_equal(frames.rotor_permutation("crazyflie", "px4"), [0, 2, 3, 1])
    with pytest.raises(ValueError, match="unknown rotor order"):
        frames.rotor_permutation("dji")


def test_units_and_throttle_curve():
    np.testing.assert_allclose(frames.rpm_to_rad_s(60.0), 2 * np.pi)
    np.testing.assert_allclose(frames.rad_s_to_rpm(frames.rpm_to_rad_s(12345.0)), 12345.0)
    a, wmax = 0.65, 1000.0
    x = jnp.linspace(0, 1, 11)
    w = frames.throttle_to_rotor_speed(x, wmax, a)
    np.testing.assert_allclose((w / wmax) ** 2, a * x**2 + (1 - a) * x, atol=1e-12)  # thrust fraction
    assert float(w[-1]) == pytest.approx(wmax)
    import jax

    g = jax.grad(lambda x: frames.throttle_to_rotor_speed(x, wmax, a))(0.0)
    assert np.isfinite(g)
