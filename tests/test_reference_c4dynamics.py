"""The model against c4dynamics 2.6 (seed 004), an independent implementation.

c4dynamics has diagonal inertia, linear drag, one rotational drag coefficient, rotor
speeds as the input (no lag, no battery): the comparison uses that subset, with wind,
rotor inertia and rotational drag on, in ENU and NED, quaternion and Euler forms.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import frames
from quadjax.quaternion import quat_multiply
from quadjax.verify.scenarios import random_c4dynamics_case
from tests.helpers import BACKENDS, simulate_open_loop

c4d = pytest.importorskip("c4dynamics")
from c4dynamics.eqm.quadcopter import quadeqm  # noqa: E402

N_STATES = 200


def _state(x13, omega):
    return qj.QuadState.create(position=x13[0:3], velocity=x13[3:6], attitude=x13[6:10], body_rates=x13[10:13],
                               rotor_speeds=omega, dtype=jnp.float64)


def _flat(d: qj.QuadState):
    return np.concatenate([d.position, d.velocity, d.attitude, d.body_rates])


def _assert_rel(ours, ref, rtol=1e-9):
    scale = np.maximum(np.abs(ref), np.max(np.abs(ref)) * 1e-3)
    np.testing.assert_array_less(np.abs(np.asarray(ours) - ref), rtol * scale + 1e-300)


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(2026)
    return [random_c4dynamics_case(rng, c4d) for _ in range(N_STATES)]


@pytest.fixture(scope="module")
def model():
    return jax.jit(qj.derivative), jax.jit(frames.euler12_derivative)


def test_quaternion_enu(cases, model):
    deriv, _ = model
    for quad, params, x13, omega in cases:
        quad.wind = np.asarray(params.wind)
        ours = _flat(deriv(params, _state(x13, omega), jnp.asarray(omega)))
        _assert_rel(ours, quadeqm(0.0, x13, quad, omega, "ENU"))


def test_quaternion_ned(cases, model):
    deriv, _ = model
    qm = jnp.array([0.0, np.sqrt(0.5), np.sqrt(0.5), 0.0])
    qf_conj = jnp.array([0.0, -1.0, 0.0, 0.0])
    to_ned_q = lambda q: quat_multiply(quat_multiply(qm, q), qf_conj)  # linear in q, so also maps q̇  # noqa: E731
    for quad, params, x13, omega in cases:
        d = deriv(params, _state(x13, omega), jnp.asarray(omega))
        x_ned = np.concatenate([frames.enu_to_ned(x13[0:3]), frames.enu_to_ned(x13[3:6]),
                                to_ned_q(jnp.asarray(x13[6:10])), frames.flu_to_frd(x13[10:13])])
        quad.wind = np.asarray(frames.enu_to_ned(params.wind))
        ref = quadeqm(0.0, x_ned, quad, omega, "NED")
        ours = np.concatenate([frames.enu_to_ned(d.position), frames.enu_to_ned(d.velocity),
                               to_ned_q(d.attitude), frames.flu_to_frd(d.body_rates)])
        _assert_rel(ours, ref)


def _euler_state(x13):
    euler = np.asarray(frames.quat_to_euler321(jnp.asarray(x13[6:10])))
    return np.concatenate([x13[0:6], euler, x13[10:13]])


def test_euler_enu(cases, model):
    _, deriv12 = model
    for quad, params, x13, omega in cases:
        x12 = _euler_state(x13)
        if abs(x12[7]) > 1.4:  # the Euler path is singular near θ = ±90°
            continue
        quad.wind = np.asarray(params.wind)
        _assert_rel(deriv12(params, jnp.asarray(x12), jnp.asarray(omega)), quadeqm(0.0, x12, quad, omega, "ENU"))


def test_euler_ned(cases, model):
    _, deriv12 = model
    for quad, params, x13, omega in cases:
        q_ned = frames.quat_enu_flu_to_ned_frd(jnp.asarray(x13[6:10]))
        x12_ned = np.concatenate([frames.enu_to_ned(x13[0:3]), frames.enu_to_ned(x13[3:6]),
                                  frames.quat_to_euler321(q_ned), frames.flu_to_frd(x13[10:13])])
        if abs(x12_ned[7]) > 1.4:
            continue
        quad.wind = np.asarray(frames.enu_to_ned(params.wind))
        ref = quadeqm(0.0, x12_ned, quad, omega, "NED")
        d = deriv12(params, jnp.asarray(_euler_state(x13)), jnp.asarray(omega))
        # translational and rate parts convert as vectors; the NED Euler rates follow from the FRD rates
        ours = np.concatenate([frames.enu_to_ned(d[0:3]), frames.enu_to_ned(d[3:6]),
                               frames.euler_rates(jnp.asarray(x12_ned[6:9]), frames.flu_to_frd(x13[10:13])),
                               frames.flu_to_frd(d[9:12])])
        _assert_rel(ours, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_004_worked_example(backend):
    """c4dynamics' doc example: CCW pair +10 %, CW pair −10 %, 2 s with dt = 0.01."""
    p = qj.presets.c4dynamics_reference(dtype=jnp.float64)
    w = qj.hover_rotor_speed(p) * jnp.array([1.1, 1.1, 0.9, 0.9])
    s0 = qj.QuadState.create(rotor_speeds=w, dtype=jnp.float64)
    from quadjax.quadrotor import body_wrench

    F_b, M_b = body_wrench(p, s0.position, s0.attitude, s0.velocity, s0.body_rates, w, s0.energy)
    np.testing.assert_allclose(F_b, [0.0, 0.0, 4.637], atol=5e-4)
    np.testing.assert_allclose(M_b, [0.0, 0.0, -0.0351], atol=5e-5)
    final = simulate_open_loop(backend, save_every=0)(p, s0, jnp.tile(w, (200, 1)), 0.01).final
    psi = np.degrees(float(frames.quat_to_euler321(final.attitude)[2]))
    assert psi == pytest.approx(-19.65, abs=0.05)
    assert float(final.position[2]) > 0  # thrust slightly above the weight: it climbs
