"""Controllers (#5): step response, large-tilt recovery, gains gradient (the hover hold and anti-windup are quadjax verify's scenarios, tests/test_verify.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import control as C
from quadjax.verify.scenarios import step_metrics

F64 = jnp.float64
DT = 2e-3


def a(x):
    return jnp.asarray(x, F64)


@functools.partial(jax.jit, static_argnums=(2, 5))
def closed_loop(plant, s0, law, ctrl, cs0, n):
    """``n`` ticks of DT under ``law``: (final state, final controller state, states (n, ...))."""
    traj = qj.simulate(plant, s0, DT, controller=law, ctrl_params=ctrl, ctrl_state=cs0, num_ticks=n)
    return traj.final, traj.ctrl_state, traj.states


@functools.cache
def pid_law(rates):
    """One law object per CascadeRates: the law is a static argument of ``closed_loop``, and a
    fresh ``functools.partial`` (hashed by identity) would compile it again on every call."""
    return functools.partial(C.pid_control, rates=rates)


#: ticks per ``closed_loop`` call in :func:`chained`: 0.5 s (every flight length there is a multiple)
CHUNK = 250


def chained(plant, s0, law, ctrl, cs0, n):
    """``closed_loop`` for ``n`` ticks as n / CHUNK calls of CHUNK ticks, state and controller
    state carried from one to the next: one compiled program for every flight length. Only for
    references that do not depend on time (``Hover``): each call starts its clock at t = 0."""
    assert n % CHUNK == 0 and isinstance(ctrl.reference, C.Hover), n
    s, cs, pieces = s0, cs0, []
    for _ in range(n // CHUNK):
        s, cs, states = closed_loop(plant, s, law, ctrl, cs, CHUNK)
        pieces.append(states)
    return s, cs, jax.tree_util.tree_map(lambda *x: jnp.concatenate(x), *pieces)


def fly(params, ref, state0, seconds, *, kind="pid", gains=None, rates=None, plant=None):
    """Closed-loop flight; returns (states (T, ...), final controller state)."""
    if kind == "pid":
        ctrl = C.PIDController.create(params, ref, gains)
        cs = C.pid_init(ctrl, state0)
        law = pid_law(rates or C.CascadeRates(dt=DT))
    else:
        ctrl = C.GeometricController.create(params, ref, gains)
        cs = C.geometric_init(ctrl, state0)
        law = C.geometric_control
    n = int(round(seconds / DT))
    run = chained if isinstance(ref, C.Hover) else closed_loop
    _, cs, states = run(plant or params, state0, law, ctrl, cs, n)
    return states, cs


# the hover hold and the anti-windup recovery are quadjax verify's scenarios hover_hold and
# saturation_recovery (tests/test_verify.py runs them and plants defects they must catch)


@pytest.mark.parametrize("kind,settle_s,overshoot", [("pid", 2.0, 0.05), ("geometric", 2.0, 0.02)])
@pytest.mark.parametrize("preset", ["rp1", "iris", "crazyflie21"])
def test_one_metre_step_settles_in_documented_time(kind, settle_s, overshoot, preset):
    """Documented in PIDGains.default / GeometricGains.default: 2 % band within 2 s."""
    p = qj.presets.get(preset, dtype=F64)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    ref = C.Step(start=a([0.0, 0.0, 1.0]), end=a([1.0, 0.0, 1.0]), t_step=a(0.5), yaw=a(0.0))
    states, _ = fly(p, ref, s0, 4.0, kind=kind)
    # the same measure as quadjax verify's step_pid / step_geometric (rp1 there; every preset here)
    settled_at, over, altitude = step_metrics(np.asarray(states.position[:, 0]), np.asarray(states.position[:, 2]),
                                             DT, 0.5)
    assert settled_at < settle_s
    assert over < overshoot
    assert altitude < 0.05  # altitude held through the step


def test_geometric_controller_recovers_from_150_degree_tilt():
    p = qj.presets.rp1(dtype=F64)
    q = qj.quaternion.quat_from_axis_angle(a([1.0, 0.0, 0.0]), np.radians(150.0))
    s0 = qj.hover_state(p, (0.0, 0.0, 30.0)).replace(attitude=q)
    states, _ = fly(p, C.Hover(position=a([0.0, 0.0, 30.0]), yaw=a(0.0)), s0, 5.0, kind="geometric")
    q_end = states.attitude[-1]
    tilt = np.degrees(np.arccos(1 - 2 * float(q_end[1] ** 2 + q_end[2] ** 2)))
    assert tilt < 2.0
    assert float(jnp.linalg.norm(states.position[-1] - a([0.0, 0.0, 30.0]))) < 0.1
    assert not np.isnan(np.asarray(states.position)).any()


def _tracking_loss(gains, ctrl, s0, n):
    """Mean squared position error of a closed-loop flight of ``n`` ticks on ``ctrl.reference``."""
    ctrl = ctrl.replace(gains=gains)
    ref = ctrl.reference
    p = PLANT
    law = functools.partial(C.pid_control, rates=C.CascadeRates(dt=DT))
    states = qj.simulate(p, s0, DT, controller=law, ctrl_params=ctrl, ctrl_state=C.pid_init(ctrl, s0),
                         num_ticks=n).states
    t = DT * jnp.arange(1, n + 1)
    target = jax.vmap(ref)(t).position
    return jnp.mean(jnp.sum((states.position - target) ** 2, axis=-1))


VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_tracking_loss), static_argnums=(3,))
loss_value = jax.jit(_tracking_loss, static_argnums=(3,))  # one compilation for both tests below (n = 200)
PLANT = qj.presets.rp1(dtype=F64)
FIG8 = C.Figure8(center=a([0.0, 0.0, 2.0]), a=a(1.0), b=a(0.5), omega=a(0.8), yaw=a(0.0))


def test_gains_gradient_matches_finite_differences():
    ctrl = C.PIDController.create(PLANT, FIG8)
    s0 = qj.hover_state(PLANT, (0.0, 0.0, 2.0))
    gains = ctrl.gains
    n = 200
    _, g = VALUE_AND_GRAD(gains, ctrl, s0, n)
    for field in ("pos_p", "vel_p", "vel_i", "att_p", "rate_p", "rate_i"):
        value = getattr(gains, field)
        d = value * jnp.asarray([1.0, -0.5, 0.7])
        h = 1e-6
        fd = (loss_value(gains.replace(**{field: value + h * d}), ctrl, s0, n)
              - loss_value(gains.replace(**{field: value - h * d}), ctrl, s0, n)) / (2 * h)
        ad = jnp.sum(getattr(g, field) * d)
        assert np.isfinite(float(ad))
        assert float(ad) == pytest.approx(float(fd), rel=1e-4, abs=1e-9), field


def test_vmap_over_vehicles_with_per_vehicle_gains_matches_a_loop():
    ctrl = C.PIDController.create(PLANT, FIG8)
    s0 = qj.hover_state(PLANT, (0.0, 0.0, 2.0))
    base = ctrl.gains
    scales = jnp.asarray([0.7, 1.0, 1.3])
    batch = base.replace(pos_p=scales[:, None] * base.pos_p)
    axes = jax.tree_util.tree_map(lambda _: None, base).replace(pos_p=0)
    batched = jax.jit(jax.vmap(lambda g: _tracking_loss(g, ctrl, s0, 200), in_axes=(axes,)))(batch)
    loop = [loss_value(base.replace(pos_p=k * base.pos_p), ctrl, s0, 200) for k in scales]
    np.testing.assert_allclose(batched, loop, rtol=1e-10)
    assert float(jnp.std(batched)) > 0


def test_optax_tuning_lowers_the_tracking_error():
    """A few Adam steps on log-gains lower the figure-8 error (the full study: benchmarks/tune_pid_gains.py)."""
    import optax

    ctrl = C.PIDController.create(PLANT, FIG8)
    s0 = qj.hover_state(PLANT, (0.0, 0.0, 2.0))
    log_gains = jax.tree_util.tree_map(jnp.log, ctrl.gains)
    opt = optax.adam(0.05)
    opt_state = opt.init(log_gains)
    losses = []
    for _ in range(4):
        gains = jax.tree_util.tree_map(jnp.exp, log_gains)
        value, g = VALUE_AND_GRAD(gains, ctrl, s0, 200)
        g_log = jax.tree_util.tree_map(lambda gi, x: gi * x, g, gains)  # chain rule through exp
        updates, opt_state = opt.update(g_log, opt_state)
        log_gains = optax.apply_updates(log_gains, updates)
        losses.append(float(value))
    assert losses[-1] < 0.9 * losses[0], losses
