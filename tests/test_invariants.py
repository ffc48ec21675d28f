"""Invariants I2–I5 of seed 000: kept by every step from any valid state, reported with their id."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import quadjax as qj
from quadjax.invariants import INVARIANT_FIELDS

PARAMS = {dt: qj.presets.rp1(dtype=dt).replace(ground_z=jnp.asarray(-0.5, dt)) for dt in (jnp.float32, jnp.float64)}
STEP = jax.jit(qj.rk4_step)
VALID = jax.jit(qj.state_violation)

vec = lambda lo, hi, n: st.lists(st.floats(lo, hi), min_size=n, max_size=n)  # noqa: E731


@st.composite
def valid_cases(draw):
    dtype = draw(st.sampled_from([jnp.float32, jnp.float64]))
    p = PARAMS[dtype]
    wmax = float(p.omega_max)
    q = np.asarray(draw(vec(-1, 1, 4)))
    if np.linalg.norm(q) < 0.1:
        q = np.array([1.0, 0.0, 0.0, 0.0])
    on_ground = draw(st.booleans())
    z = -0.5 if on_ground else draw(st.floats(-0.5, 20.0))
    state = qj.QuadState.create(
        position=(draw(st.floats(-50, 50)), draw(st.floats(-50, 50)), z),
        velocity=draw(vec(-15, 15, 3)),
        attitude=q / np.linalg.norm(q),
        body_rates=draw(vec(-20, 20, 3)),
        rotor_speeds=draw(vec(0, wmax, 4)),
        energy=draw(st.floats(0, 5e5)),
        on_ground=float(on_ground),
        dtype=dtype,
    )
    state = state.replace(attitude=qj.quaternion.quat_normalize(state.attitude))
    command = jnp.asarray(draw(vec(-500, 2 * wmax, 4)), dtype)
    dt = draw(st.sampled_from([1e-4, 1e-3, 5e-3, 0.02, 0.1]))
    tau = draw(st.sampled_from([0.0, 0.005, 0.03]))
    return p.replace(motor_tau=jnp.asarray(tau, dtype)), state, command, dt


@settings(max_examples=2000)
@given(valid_cases())
def test_step_keeps_invariants_from_any_valid_state(case):
    p, s, u, dt = case
    assert int(VALID(p, s)) == 0, "generator produced an invalid state"
    out = STEP(p, s, u, dt)
    code = int(VALID(p, out))
    assert code == 0, qj.invariant_id(code)


def _valid(dtype=jnp.float64):
    p = PARAMS[dtype]
    return p, qj.hover_state(p, (0.0, 0.0, 1.0))


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("position", (0.0, 0.0, jnp.nan), "non_finite"),
        ("velocity", (jnp.inf, 0.0, 0.0), "non_finite"),
        ("attitude", (1.0, 1e-3, 0.0, 0.0), "attitude_not_unit"),
        ("rotor_speeds", (100.0, -1.0, 100.0, 100.0), "rotor_speed"),
        ("rotor_speeds", (100.0, 1e5, 100.0, 100.0), "rotor_speed"),
        ("energy", -1.0, "energy"),
        ("position", (0.0, 0.0, -0.6), "below_ground"),
    ],
)
def test_each_violation_is_reported_with_its_id(field, value, expected):
    p, s = _valid()
    bad = s.replace(**{field: jnp.asarray(value, jnp.float64)})
    code = int(qj.state_violation(p, bad))
    assert qj.invariant_id(code) == expected
    assert not bool(qj.state_valid(p, bad))
    if expected != "non_finite":
        assert INVARIANT_FIELDS[code] == field


def test_non_finite_is_checked_first_and_batches_are_per_vehicle():
    p, s = _valid()
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x] * 3), s)
    batch = batch.replace(
        position=batch.position.at[1, 2].set(-5.0).at[2, 2].set(-5.0),
        energy=batch.energy.at[2].set(jnp.nan),
    )
    codes = jax.jit(qj.state_violation)(p, batch)
    assert [qj.invariant_id(c) for c in codes] == ["none", "below_ground", "non_finite"]


def test_attitude_tolerance_scales_with_dtype():
    for dtype in (jnp.float32, jnp.float64):
        p, s = _valid(dtype)
        eps = float(jnp.finfo(dtype).eps)
        w = np.sqrt(1 + 4 * eps)  # |‖q‖² − 1| = 4 ε: inside the 8 ε band
        assert int(qj.state_violation(p, s.replace(attitude=jnp.asarray([w, 0, 0, 0], dtype)))) == 0
        w = np.sqrt(1 + 64 * eps)
        assert qj.invariant_id(qj.state_violation(p, s.replace(attitude=jnp.asarray([w, 0, 0, 0], dtype)))) == "attitude_not_unit"
