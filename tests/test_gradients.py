"""Differentiability: grad of a simulation against central finite differences, finite grads at edge states."""

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from tests.helpers import busy_params, busy_state, command_for

T, DT = 100, 2e-3


def _loss(params, state0, commands):
    traj = qj.simulate(params, state0, DT, commands=commands)
    return _objective(traj.final, traj.states)


def _objective(final, traj):
    return (
        jnp.sum(final.position**2)
        + jnp.sum(traj.velocity[::10] ** 2)
        + 10.0 * jnp.sum(final.attitude * jnp.asarray([0.3, 1.0, -2.0, 1.5]))
        + jnp.sum(final.body_rates**2)
        + jnp.sum((final.rotor_speeds / 1e3) ** 2)
        + 1e-3 * final.energy
    )


@pytest.fixture(scope="module")
def setup():
    p = busy_params().replace(battery_capacity=jnp.asarray(2000.0), battery_sag=jnp.asarray(0.3),
                              omega_min=jnp.asarray(50.0))
    s = busy_state(p)
    rng = np.random.default_rng(7)
    commands = command_for(p) * jnp.asarray(rng.uniform(0.93, 1.07, (T, 4)))
    loss = jax.jit(_loss)
    # the gradients with respect to the parameters and to the initial state: one compiled program
    grad, grad_state = jax.jit(jax.grad(_loss, argnums=(0, 1)))(p, s, commands)
    return p, s, commands, loss, grad, grad_state


FIELDS = [f.name for f in dataclasses.fields(qj.QuadParams)]


@pytest.mark.parametrize("field", FIELDS)
def test_simulation_gradient_matches_finite_differences(setup, field):
    p, s, commands, loss, grad, _ = setup
    value = getattr(p, field)
    rng = np.random.default_rng(zlib.crc32(field.encode()))  # stable across runs (hash() is salted)
    direction = jnp.asarray(rng.normal(size=value.shape)) * (jnp.abs(value) + 1e-3 * (jnp.abs(value) == 0))
    if field == "ground_z":
        direction = jnp.asarray(1.0)
    g_dir = float(jnp.sum(getattr(grad, field) * direction))
    h = 1e-6
    plus = loss(p.replace(**{field: value + h * direction}), s, commands)
    minus = loss(p.replace(**{field: value - h * direction}), s, commands)
    fd = float(plus - minus) / (2 * h)
    assert np.isfinite(g_dir)
    assert g_dir == pytest.approx(fd, rel=1e-5, abs=1e-7 * float(jnp.abs(loss(p, s, commands)))), (g_dir, fd)


def test_gradient_wrt_initial_state_matches_finite_differences(setup):
    p, s, commands, loss, _, g = setup
    d = jax.tree_util.tree_map(lambda x: jnp.asarray(np.random.default_rng(1).normal(size=x.shape)), s)
    d = d.replace(on_ground=jnp.asarray(0.0), attitude=d.attitude * 0.01, rotor_speeds=d.rotor_speeds * 10)
    g_dir = sum(float(jnp.sum(a * b)) for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(d)))
    h = 1e-6
    shift = lambda k: jax.tree_util.tree_map(lambda x, dx: x + k * h * dx, s, d)  # noqa: E731
    fd = float(loss(p, shift(1), commands) - loss(p, shift(-1), commands)) / (2 * h)
    assert g_dir == pytest.approx(fd, rel=1e-5)


def _edge_cases(dtype):
    """(params, state, command) at the points where a careless model has NaN gradients."""
    p = qj.presets.rp1(dtype=dtype)
    hover = qj.hover_state(p, (0.0, 0.0, 1.0))
    zero = jnp.zeros(4, dtype)
    states = [
        hover,
        hover.replace(rotor_speeds=zero),
        qj.QuadState.create(position=(0.0, 0.0, 2.0), dtype=dtype),  # identity attitude, at rest
        hover.replace(position=jnp.zeros(3, dtype), on_ground=jnp.asarray(1.0, dtype)),
    ]
    cases = []
    for tau in (0.0, 0.03):
        for s in states:
            for u in (qj.hover_rotor_speed(p), zero):
                cases.append((p.replace(motor_tau=jnp.asarray(tau, dtype)), s, u))
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *cases)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gradients_are_finite_at_edge_states(dtype):
    """Hover, rotors stopped, identity attitude, on the ground; with and without lag; hover and zero command."""

    def loss(params, state, command):
        final = qj.simulate(params, state, 1e-3, commands=jnp.tile(command, (5, 1))).final
        return sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(final))

    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(*_edge_cases(dtype))
    for leaf in jax.tree_util.tree_leaves(grads):
        assert bool(jnp.all(jnp.isfinite(leaf)))
