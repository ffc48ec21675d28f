"""Invariant monitor (#4, seed 000 BB-D2): planted violations, frozen vehicles, repro files, replay."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax.monitor import (
    AFTER_STEP,
    BEFORE_STEP,
    MONITOR_IDS,
    PARAMS_INVALID,
    describe,
    replay,
    rollout_checked,
    rollout_checked_batch,
    rollout_closed_loop_checked,
    write_repro,
)
from quadjax.rollout import rollout_batch, vehicle_axes

N, T = 8, 20


def _fleet(dtype):
    p = qj.presets.rp1(dtype)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    states = jax.tree_util.tree_map(lambda x: jnp.stack([x] * N), s0)
    # vehicle i starts at x = 10 i m: the caller's code below tells them apart by x
    states = states.replace(position=states.position.at[:, 0].set(10.0 * jnp.arange(N, dtype=dtype)))
    rng = np.random.default_rng(0)
    u = qj.hover_rotor_speed(p) * jnp.asarray(1 + 0.03 * rng.standard_normal((N, T, 4)), dtype)
    return p, states, u


def _bad_edit(vehicle, tick, dz):
    """Caller code that, in one vehicle (told by its x) before one command, moves it below the ground."""
    def edit(state, k):
        hit = (jnp.abs(state.position[0] - 10.0 * vehicle) < 1.0) & (k == tick)
        return state.replace(position=state.position.at[2].set(jnp.where(hit, dz, state.position[2])))
    return edit


@pytest.fixture(scope="module", params=[jnp.float32, jnp.float64], ids=["float32", "float64"])
def planted(request):
    """A checked fleet with two planted violations, and the unchecked run of the same fleet."""
    dtype = request.param
    p, s0, u = _fleet(dtype)
    u = u.at[3, 5, 2].set(jnp.nan)  # vehicle 3: a NaN command at step 5 -> the step breaks I4
    checked = jax.jit(lambda s, u: rollout_checked_batch(p, s, u, 1e-3, edit=_bad_edit(6, 11, -0.02)))(s0, u)
    plain = jax.jit(lambda s, u: rollout_batch(p, s, u, 1e-3, backend="xla"))(s0, u)  # the checked engine is XLA
    return dtype, p, checked, plain


def test_planted_violations_are_found_and_the_other_vehicles_are_untouched(planted):
    dtype, p, (final, states, report), (ref_final, ref_states) = planted
    expect = {3: (5, MONITOR_IDS.index("non_finite"), AFTER_STEP),
              6: (11, MONITOR_IDS.index("below_ground"), BEFORE_STEP)}
    for v in range(N):
        tick, code, phase = expect.get(v, (-1, 0, -1))
        assert (int(report.tick[v]), int(report.code[v]), int(report.phase[v])) == (tick, code, phase), v
    assert list(report.broken()) == [3, 6]
    # every other vehicle is bit for bit what the unchecked rollout gives
    ok = np.asarray([v not in expect for v in range(N)])
    for a, b in zip(jax.tree_util.tree_leaves((final, states)), jax.tree_util.tree_leaves((ref_final, ref_states))):
        np.testing.assert_array_equal(np.asarray(a)[ok], np.asarray(b)[ok])
    # the broken ones are frozen at their last valid state: finite, equal to the state before the step
    for v, (tick, _, _) in expect.items():
        frozen = jax.tree_util.tree_map(lambda x: x[v, tick:], states)
        valid = jax.tree_util.tree_map(lambda x: x[v, tick - 1], ref_states)
        for a, b in zip(jax.tree_util.tree_leaves(frozen), jax.tree_util.tree_leaves(valid)):
            np.testing.assert_array_equal(np.asarray(a), np.broadcast_to(np.asarray(b), np.shape(a)))
        assert bool(qj.state_valid(p, jax.tree_util.tree_map(lambda x: x[v], final)))
    # the report holds the repro inputs: the state going into the step and its command
    assert report.state.position[6, 2] == jnp.asarray(-0.02, dtype)
    assert np.isnan(float(report.command[3, 2]))
    text = describe(report, p)
    assert "vehicle 3: I4 non_finite after step 5: position" in text
    assert "vehicle 6: I5 below_ground before step 11: position.z = -0.02 m < ground_z = 0 m" in text


def test_repro_file_is_self_contained_and_replays_a_before_step_violation(planted, tmp_path):
    dtype, p, (_, _, report), _ = planted
    path = write_repro(tmp_path / "r.npz", report, p, 1e-3, vehicle=6)
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        assert z["state.position"][2] == np.asarray(-0.02, dtype) and z["command"].shape == (4,)
        assert z["dt"] == np.asarray(1e-3, dtype) and z["params.mass"] == np.asarray(p.mass)
    assert meta["phase"] == "before" and meta["invariant"] == "below_ground" and meta["vehicle"] == 6
    r = replay(path)
    assert r.reproduced and r.bitwise and r.code == MONITOR_IDS.index("below_ground")
    with pytest.raises(ValueError, match="no violation"):
        write_repro(tmp_path / "x.npz", report, p, 1e-3, vehicle=0)


def test_seed_000_altimeter_bug_is_reported_before_the_step_that_would_take_it():
    """The seed's debugging story: a −2 cm altimeter correction meant once, applied every 0.1 s."""
    p = qj.presets.rp1(jnp.float64)
    s0 = qj.hover_state(p, (0.0, 0.0, 0.3))
    u = jnp.tile(qj.hover_rotor_speed(p) * 0.97, (1500, 1))  # 3 % below hover: sinks slowly

    def altimeter_fix(state, k):
        due = (k % 100 == 0) & (k > 0)
        return state.replace(position=state.position.at[2].add(jnp.where(due, -0.02, 0.0)))

    final, states, report = jax.jit(lambda s: rollout_checked(p, s, u, 1e-3, edit=altimeter_fix))(s0)
    k = int(report.tick)
    assert int(report.code) == MONITOR_IDS.index("below_ground") and int(report.phase) == BEFORE_STEP
    assert k % 100 == 0  # a correction step, not a model step
    z = np.asarray(states.position[:, 2])
    touchdown = int(np.argmax(np.asarray(states.on_ground) > 0.5))
    assert 0 < touchdown < k  # it had landed; the next correction pushed the grounded state under
    assert float(report.state.position[2]) == pytest.approx(-0.02, abs=1e-12)
    assert np.all(z >= 0) and float(final.on_ground) == 1.0  # frozen on the ground, never below it
    assert describe(report, p).startswith(f"I5 below_ground before step {k}: position.z = -0.02 m")


def test_replay_reproduces_a_recorded_violation_bit_for_bit(tmp_path):
    dtype = jnp.float32
    p, s0, u = _fleet(dtype)
    wind = jnp.zeros((N, T, 3), dtype).at[2, 9, 0].set(jnp.nan)  # vehicle 2: a NaN gust at step 9
    run = jax.jit(jax.vmap(lambda s, u, w: rollout_checked(p, s, u, 1e-3, substeps=2, wind=w)))
    _, _, report = run(s0, u, wind)
    assert list(report.broken()) == [2] and int(report.tick[2]) == 9 and int(report.phase[2]) == AFTER_STEP
    path = write_repro(tmp_path / "bug.npz", report, p, 1e-3, substeps=2, step="rk4")
    r = replay(path)
    assert r.reproduced and r.bitwise and r.code == MONITOR_IDS.index("non_finite")
    assert r.meta["vehicle"] == 2 and r.meta["tick"] == 9 and r.meta["dtype"] == jnp.dtype(dtype).name
    # the attitude, rates and rotors do not see the wind: they are finite numbers, equal in every bit
    for field in ("attitude", "body_rates", "rotor_speeds", "energy"):
        a = np.asarray(getattr(r.after, field))
        assert np.all(np.isfinite(a)) and a.dtype == dtype
        assert a.tobytes() == np.asarray(getattr(report.after, field))[2].tobytes()
    # a tampered file is not reproduced
    with np.load(path) as z:
        data = dict(z)
    data["command"] = data["command"] * np.asarray(1.001, dtype)
    tampered = tmp_path / "tampered.npz"
    np.savez(tampered, **data)
    r = replay(tampered)
    assert r.reproduced and not r.bitwise  # the same violation, not the same bits


def test_invalid_parameters_of_one_vehicle_freeze_only_that_vehicle():
    p, s0, u = _fleet(jnp.float64)
    masses = jnp.full(N, float(p.mass)).at[4].set(-1.0)  # I1: mass must be > 0
    ps = p.replace(mass=masses)
    axes = vehicle_axes(ps, "mass")
    final, states, report = jax.jit(
        lambda ps, s, u: rollout_checked_batch(ps, s, u, 1e-3, params_axes=axes))(ps, s0, u)
    assert list(report.broken()) == [4]
    assert int(report.code[4]) == PARAMS_INVALID and int(report.tick[4]) == 0
    np.testing.assert_array_equal(states.position[4], np.broadcast_to(s0.position[4], (T, 3)))
    assert "QuadParams.mass" in describe(report, ps, params_axes=axes)
    assert np.all(np.isfinite(np.asarray(states.position)))


def test_closed_loop_monitor_flags_a_controller_that_emits_nan():
    p = qj.presets.rp1(jnp.float64)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    hover = qj.hover_rotor_speed(p)

    def law(gain, cs, obs, t):
        command = hover * (1.0 + gain * (1.0 - obs.position[2]))
        return jnp.where(cs == 7, jnp.nan, command), cs + 1  # a bug at its 8th tick

    final, cs, states, commands, report = jax.jit(
        lambda s: rollout_closed_loop_checked(p, s, law, jnp.asarray(0.1), 0, 15, 0.01, substeps=4))(s0)
    assert int(report.tick) == 7 and int(report.phase) == AFTER_STEP
    assert MONITOR_IDS[int(report.code)] == "non_finite"
    assert bool(qj.state_valid(p, final)) and int(cs) == 15
    np.testing.assert_array_equal(states.position[7:], np.broadcast_to(states.position[6], (8, 3)))
