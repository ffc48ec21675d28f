"""Invariants I2–I5 of seed 000: kept by every step from any valid state, reported with their id."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import quadjax as qj
from quadjax.invariants import INVARIANT_FIELDS

PARAMS = {dt: qj.presets.rp1(dtype=dt).replace(ground_z=jnp.asarray(-0.5, dt)) for dt in (jnp.float32, jnp.float64)}

vec = lambda lo, hi, n: st.lists(st.floats(lo, hi), min_size=n, max_size=n)  # noqa: E731

# --- the property: whole batches per example, one jitted call each ---------------------------------
#
# Each hypothesis example is a batch of ROWS cases (vehicle motor lag, state, command, dt) stepped
# and checked in ONE vmapped, jitted call: the first DRAWN rows drawn by hypothesis (its edge
# values, and shrinking), the rest from a seeded numpy generator of the same distribution.

ROWS = 2048
DRAWN = 16
DTS = (1e-4, 1e-3, 5e-3, 0.02, 0.1)
TAUS = (0.0, 0.005, 0.03)


@st.composite
def drawn_case(draw, wmax):
    """One case's raw numbers (float64): the distribution the batch's numpy rows follow too."""
    on_ground = draw(st.booleans())
    return dict(
        q=draw(vec(-1, 1, 4)),
        on_ground=float(on_ground),
        position=(draw(st.floats(-50, 50)), draw(st.floats(-50, 50)),
                  -0.5 if on_ground else draw(st.floats(-0.5, 20.0))),
        velocity=draw(vec(-15, 15, 3)),
        body_rates=draw(vec(-20, 20, 3)),
        rotor_speeds=draw(vec(0, wmax, 4)),
        energy=draw(st.floats(0, 5e5)),
        command=draw(vec(-500, 2 * wmax, 4)),
        dt=draw(st.sampled_from(DTS)),
        tau=draw(st.sampled_from(TAUS)),
    )


def bulk_cases(rng, wmax, n):
    """``n`` cases of drawn_case's law from a numpy generator (field: (n, ...) float64)."""
    on_ground = rng.random(n) < 0.5
    position = np.stack([rng.uniform(-50, 50, n), rng.uniform(-50, 50, n),
                         np.where(on_ground, -0.5, rng.uniform(-0.5, 20.0, n))], axis=-1)
    return dict(
        q=rng.uniform(-1, 1, (n, 4)), on_ground=on_ground.astype(np.float64), position=position,
        velocity=rng.uniform(-15, 15, (n, 3)), body_rates=rng.uniform(-20, 20, (n, 3)),
        rotor_speeds=rng.uniform(0, wmax, (n, 4)), energy=rng.uniform(0, 5e5, n),
        command=rng.uniform(-500, 2 * wmax, (n, 4)), dt=rng.choice(DTS, n), tau=rng.choice(TAUS, n),
    )


@st.composite
def valid_case_batches(draw, dtype, rows=ROWS, drawn=DRAWN):
    """(motor_tau (rows,), state (rows, ...), command (rows, 4), dt (rows,)) in ``dtype``."""
    wmax = float(PARAMS[dtype].omega_max)
    head = draw(st.lists(drawn_case(wmax), min_size=drawn, max_size=drawn))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bulk = bulk_cases(rng, wmax, rows - drawn)
    c = {k: np.concatenate([np.asarray([h[k] for h in head], np.float64), bulk[k]]) for k in bulk}
    q = c["q"]
    q = np.where(np.linalg.norm(q, axis=-1, keepdims=True) < 0.1, [1.0, 0.0, 0.0, 0.0], q)
    state = qj.QuadState.create(
        position=c["position"], velocity=c["velocity"], attitude=q / np.linalg.norm(q, axis=-1, keepdims=True),
        body_rates=c["body_rates"], rotor_speeds=c["rotor_speeds"], energy=c["energy"], on_ground=c["on_ground"],
        dtype=dtype,
    )
    state = state.replace(attitude=qj.quaternion.quat_normalize(state.attitude))
    return jnp.asarray(c["tau"], dtype), state, jnp.asarray(c["command"], dtype), jnp.asarray(c["dt"], dtype)


@jax.jit
@functools.partial(jax.vmap, in_axes=(None, 0, 0, 0, 0))
def step_and_check(p, tau, s, u, dt):
    """One case: (code of the state, code after one RK4 step), under the case's motor lag."""
    p = p.replace(motor_tau=tau)
    return qj.state_violation(p, s), qj.state_violation(p, qj.rk4_step(p, s, u, dt))


def _first_failure(codes, case):
    bad = int(np.flatnonzero(codes)[0])
    return f"case {bad}: {qj.invariant_id(int(codes[bad]))}; " + str(jax.tree_util.tree_map(lambda x: x[bad], case))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["float32", "float64"])
@settings(max_examples=3, derandomize=True, deadline=None)
@given(data=st.data())
def test_step_keeps_invariants_from_any_valid_state(dtype, data):
    tau, s, u, dt = data.draw(valid_case_batches(dtype))
    before, after = (np.asarray(c) for c in step_and_check(PARAMS[dtype], tau, s, u, dt))
    assert np.all(before == 0), "generator produced an invalid state: " + _first_failure(before, (s,))
    assert np.all(after == 0), _first_failure(after, (tau, s, u, dt))


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
