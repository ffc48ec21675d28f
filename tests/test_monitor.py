"""Invariant monitor (#4, seed 000 BB-D2): planted violations, frozen vehicles, repro files, replay."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax.monitor import AFTER_STEP, BEFORE_STEP, describe, replay, write_repro
from quadjax.status import PARAMS_INVALID, STATUS_IDS
from tests.helpers import below_ground_edit, spread_fleet

N, T = 8, 20
CHECKED = qj.SimConfig(check="monitor")


def _batch(fn, args, in_axes=None):
    """Every argument mapped over vehicles unless told otherwise."""
    return qj.map_vehicles(fn, args, (0,) * len(args) if in_axes is None else in_axes)


@pytest.fixture(scope="module", params=[jnp.float32, jnp.float64], ids=["float32", "float64"])
def planted(request):
    """A checked fleet with two planted violations, and the unchecked run of the same fleet."""
    dtype = request.param
    p, s0, u = spread_fleet(dtype, N, T)
    u = u.at[3, 5, 2].set(jnp.nan)  # vehicle 3: a NaN command at step 5 -> the step breaks I4
    # the monitor runs on the backend that flies the vehicle: here XLA, checked against XLA's
    # fast open loop (tests/test_engine.py does the same on the native kernel)
    cfg = CHECKED.replace(backend="xla")
    checked = jax.jit(lambda s, u: _batch(
        lambda s, u: qj.simulate(p, s, 1e-3, commands=u, edit=below_ground_edit(6, 11, -0.02), config=cfg), (s, u)))(s0, u)
    plain = jax.jit(lambda s, u: _batch(
        lambda s, u: qj.simulate(p, s, 1e-3, commands=u, config=qj.SimConfig(backend="xla")), (s, u)))(s0, u)
    assert checked.backend == plain.backend == "xla"
    return dtype, p, checked, plain


def test_planted_violations_are_found_and_the_other_vehicles_are_untouched(planted):
    dtype, p, checked, plain = planted
    final, states, report = checked.final, checked.states, checked.report
    ref_final, ref_states = plain.final, plain.states
    expect = {3: (5, STATUS_IDS.index("non_finite"), AFTER_STEP),
              6: (11, STATUS_IDS.index("below_ground"), BEFORE_STEP)}
    for v in range(N):
        tick, code, phase = expect.get(v, (-1, 0, -1))
        assert (int(report.tick[v]), int(report.code[v]), int(report.phase[v])) == (tick, code, phase), v
        # the engine's status is the monitor's first violation
        assert (int(checked.status[v]), int(checked.status_tick[v])) == (code, tick), v
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
    dtype, p, checked, _ = planted
    path = write_repro(tmp_path / "r.npz", checked, p, 1e-3, vehicle=6)
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        assert z["state.position"][2] == np.asarray(-0.02, dtype) and z["command"].shape == (4,)
        assert z["dt"] == np.asarray(1e-3, dtype) and z["params.mass"] == np.asarray(p.mass)
    assert meta["phase"] == "before" and meta["invariant"] == "below_ground" and meta["vehicle"] == 6
    assert meta["backend"] == "xla" and meta["step"] == "rk4" and meta["substeps"] == 1
    r = replay(path)
    assert r.reproduced and r.bitwise and r.code == STATUS_IDS.index("below_ground")
    with pytest.raises(ValueError, match="no violation"):
        write_repro(tmp_path / "x.npz", checked, p, 1e-3, vehicle=0)
    with pytest.raises(ValueError, match="no monitor report"):  # an unchecked run has nothing to write
        write_repro(tmp_path / "y.npz", planted[3], p, 1e-3)


def test_seed_000_altimeter_bug_is_reported_before_the_step_that_would_take_it():
    """The seed's debugging story: a −2 cm altimeter correction meant once, applied every 0.1 s."""
    p = qj.presets.rp1(jnp.float64)
    s0 = qj.hover_state(p, (0.0, 0.0, 0.3))
    u = jnp.tile(qj.hover_rotor_speed(p) * 0.97, (1500, 1))  # 3 % below hover: sinks slowly

    def altimeter_fix(state, k):
        due = (k % 100 == 0) & (k > 0)
        return state.replace(position=state.position.at[2].add(jnp.where(due, -0.02, 0.0)))

    traj = jax.jit(lambda s: qj.simulate(p, s, 1e-3, commands=u, edit=altimeter_fix, config=CHECKED))(s0)
    final, states, report = traj.final, traj.states, traj.report
    k = int(report.tick)
    assert int(report.code) == STATUS_IDS.index("below_ground") and int(report.phase) == BEFORE_STEP
    assert int(traj.status) == int(report.code) and int(traj.status_tick) == k
    assert k % 100 == 0  # a correction step, not a model step
    z = np.asarray(states.position[:, 2])
    touchdown = int(np.argmax(np.asarray(states.on_ground) > 0.5))
    assert 0 < touchdown < k  # it had landed; the next correction pushed the grounded state under
    assert float(report.state.position[2]) == pytest.approx(-0.02, abs=1e-12)
    assert np.all(z >= 0) and float(final.on_ground) == 1.0  # frozen on the ground, never below it
    assert describe(report, p).startswith(f"I5 below_ground before step {k}: position.z = -0.02 m")


@pytest.mark.parametrize("backend", [
    pytest.param("native", marks=pytest.mark.skipif(not qj.native.available(), reason="native kernel unavailable")),
    "xla"])
def test_replay_reproduces_a_recorded_violation_bit_for_bit(tmp_path, backend):
    dtype = jnp.float32
    p, s0, u = spread_fleet(dtype, N, T)
    wind = jnp.zeros((N, T, 3), dtype).at[2, 9, 0].set(jnp.nan)  # vehicle 2: a NaN gust at step 9
    cfg = CHECKED.replace(substeps=2, backend=backend)
    run = jax.jit(jax.vmap(lambda s, u, w: qj.simulate(p, s, 1e-3, commands=u, inputs=qj.Inputs(wind=w), config=cfg)))
    traj = run(s0, u, wind)
    report = traj.report
    assert list(report.broken()) == [2] and int(report.tick[2]) == 9 and int(report.phase[2]) == AFTER_STEP
    # substeps, integrator and backend come from the run's config
    path = write_repro(tmp_path / "bug.npz", traj, p, 1e-3)
    r = replay(path)
    assert r.reproduced and r.bitwise and r.code == STATUS_IDS.index("non_finite")
    assert r.meta["vehicle"] == 2 and r.meta["tick"] == 9 and r.meta["dtype"] == jnp.dtype(dtype).name
    assert r.meta["substeps"] == 2 and r.meta["step"] == "rk4" and r.meta["backend"] == backend
    # the rotors and the battery do not see the wind: they are finite numbers, equal in every bit (the
    # attitude and rates do: the rotors' inflow and H-force act on the airspeed, and 0 × NaN is NaN)
    for field in ("rotor_speeds", "energy"):
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
    # a NaN's sign and payload are the operand an instruction took first, which two compilations of
    # one step may order differently: not compared (every NaN of the recorded output, sign flipped). A
    # finite value one ulp off (a rotor speed) is
    def negate_nans(data):
        for k in [k for k in data if k.startswith("after.")]:
            data[k] = np.where(np.isnan(data[k]), -data[k], data[k]).astype(data[k].dtype)  # the sign bit flipped
        assert any(np.isnan(data[k]).any() for k in data if k.startswith("after."))

    def one_ulp(data):
        data["after.rotor_speeds"] = np.nextafter(data["after.rotor_speeds"], np.inf).astype(dtype)

    for edit, same in ((negate_nans, True), (one_ulp, False)):
        data = dict(np.load(path))
        edit(data)
        moved = tmp_path / "moved.npz"
        np.savez(moved, **data)
        assert replay(moved).bitwise == same


def test_invalid_parameters_of_one_vehicle_freeze_only_that_vehicle():
    p, s0, u = spread_fleet(jnp.float64, N, T)
    masses = jnp.full(N, float(p.mass)).at[4].set(-1.0)  # I1: mass must be > 0
    ps = p.replace(mass=masses)
    axes = qj.vehicle_axes(ps, "mass")
    traj = jax.jit(lambda ps, s, u: _batch(
        lambda q, s, u: qj.simulate(q, s, 1e-3, commands=u, config=CHECKED), (ps, s, u), (axes, 0, 0)))(ps, s0, u)
    states, report = traj.states, traj.report
    assert list(report.broken()) == [4]
    assert int(report.code[4]) == PARAMS_INVALID and int(report.tick[4]) == 0
    np.testing.assert_array_equal(traj.status, np.where(np.arange(N) == 4, PARAMS_INVALID, 0))
    np.testing.assert_array_equal(traj.status_tick, np.where(np.arange(N) == 4, 0, -1))
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

    traj = jax.jit(lambda s: qj.simulate(p, s, 0.01, controller=law, ctrl_params=jnp.asarray(0.1), ctrl_state=0,
                                         num_ticks=15, config=CHECKED.replace(substeps=4)))(s0)
    final, cs, states, report = traj.final, traj.ctrl_state, traj.states, traj.report
    assert int(report.tick) == 7 and int(report.phase) == AFTER_STEP
    assert STATUS_IDS[int(report.code)] == "non_finite"
    assert int(traj.status) == int(report.code) and int(traj.status_tick) == 7
    # New semantics: a stopped vehicle is frozen at its state AND its controller state before the
    # tick in which it stopped. The old monitor froze only the state (the controller ran on: cs == 15);
    # now the controller state is that going into tick 7 (7 ticks counted), as the state is.
    assert bool(qj.state_valid(p, final)) and int(cs) == 7
    np.testing.assert_array_equal(states.position[7:], np.broadcast_to(states.position[6], (8, 3)))
    # the commands of the ticks before are the law's, finite; the one of tick 7 is the NaN
    assert np.all(np.isfinite(np.asarray(traj.commands[:7]))) and np.all(np.isnan(np.asarray(traj.commands[7])))
