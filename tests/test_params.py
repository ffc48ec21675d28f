"""Invariant I1: bad parameters are rejected at the boundary with the field named."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax.presets import PRESETS


def _kwargs():
    p = qj.presets.rp1(dtype=jnp.float64)
    return {f.name: np.asarray(getattr(p, f.name)) for f in dataclasses.fields(p)}


BAD = [
    ("mass", np.nan), ("mass", np.inf), ("mass", -1.0), ("mass", 0.0), ("mass", (1.0, 2.0)),
    ("inertia", np.diag([0.01, np.nan, 0.02])), ("inertia", np.diag([0.01, -0.01, 0.02])),
    ("inertia", [[0.01, 0.005, 0], [0.0, 0.01, 0], [0, 0, 0.02]]),  # not symmetric
    ("inertia", np.diag([0.01, 0.01, 0.05])),  # violates the triangle inequality
    ("inertia", np.eye(2)),
    ("rotor_positions", np.full((4, 3), np.nan)), ("rotor_positions", np.zeros((4, 2))),
    ("rotor_positions", np.zeros((3, 3))),
    ("rotor_spins", (1.0, 1.0, -1.0, 0.5)), ("rotor_spins", (1.0, 1.0, -1.0)),
    ("k_f", -8.9e-7), ("k_f", np.nan), ("k_m", -0.01), ("k_m", np.inf),
    ("motor_tau", -0.01), ("omega_min", -1.0), ("omega_max", 0.0), ("omega_max", np.inf),
    ("drag_linear", (0.1, -0.1, 0.1)), ("drag_quadratic", (np.nan, 0, 0)), ("drag_rotational", (0, 0, 0, 0)),
    ("rotor_inertia", -1e-5), ("k_p", -1.0), ("battery_capacity", 0.0), ("battery_sag", 1.0),
    ("battery_sag", -0.1), ("ground_z", np.nan), ("gravity", -9.81), ("wind", (np.inf, 0, 0)),
]


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_field_is_rejected_by_name_and_invalid(field, value):
    kwargs = _kwargs()
    kwargs[field] = value
    with pytest.raises(ValueError, match=rf"QuadParams\.{field}\b"):
        qj.QuadParams.create(**kwargs)
    # the same values slipped past the constructor are caught by I1, also under jit
    bad = qj.presets.rp1(dtype=jnp.float64).replace(**{field: jnp.asarray(value, jnp.float64)})
    assert not bool(jnp.any(qj.params_valid(bad)))
    if np.shape(value) == np.shape(kwargs[field]) or field == "mass":
        assert not bool(jnp.any(jax.jit(qj.params_valid)(bad)))


def test_non_numeric_is_rejected():
    kwargs = _kwargs()
    kwargs["k_f"] = "fast"
    with pytest.raises(ValueError, match=r"QuadParams\.k_f"):
        qj.QuadParams.create(**kwargs)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_valid(name):
    for dtype in (jnp.float32, jnp.float64):
        p = PRESETS[name][0](dtype=dtype)
        assert bool(qj.params_valid(p))
        assert p.mass.dtype == dtype
        assert float(jnp.max(qj.hover_rotor_speed(p))) < float(p.omega_max)  # can hover


def test_params_valid_is_per_vehicle_in_a_batch():
    p = qj.presets.rp1(dtype=jnp.float64)
    batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, x, x]), p)
    batch = batch.replace(mass=jnp.asarray([1.0, -1.0, 2.0]), k_f=batch.k_f.at[2].set(jnp.nan))
    np.testing.assert_array_equal(jax.jit(qj.params_valid)(batch), [True, False, False])


def test_create_accepts_diagonal_inertia_and_scalar_drag():
    p = qj.QuadParams.create(mass=1.0, inertia=(0.01, 0.01, 0.02), rotor_positions=qj.presets.quad_x_positions(0.1),
                             rotor_spins=(1, 1, -1, -1), k_f=1e-6, k_m=0.01, omega_max=2000.0, drag_linear=0.2)
    default = jnp.zeros(()).dtype  # JAX's default float when none is asked for
    assert p.mass.dtype == default
    np.testing.assert_array_equal(p.inertia, np.diag([0.01, 0.01, 0.02]).astype(default))
    np.testing.assert_array_equal(p.drag_linear, np.full(3, 0.2, default))
    assert p.num_rotors == 4


def test_preset_lookup_names_the_choices():
    with pytest.raises(ValueError, match="rp1"):
        qj.presets.get("nope")
    assert bool(qj.params_valid(qj.presets.get("iris")))
