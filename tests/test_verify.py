"""quadjax verify: the fast subset passes on the intact model, and every scenario FAILS when a
defect is planted in what it judges (a sign flip, a priority swap, a stepper bug, ...)."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

import quadjax.control
import quadjax.control.pid
import quadjax.integrators
import quadjax.mixer
import quadjax.monitor
import quadjax.quadrotor
import quadjax.rigid_body
import quadjax.sysid
from quadjax.invariants import BELOW_GROUND
from quadjax.verify import harness
from quadjax.verify import scenarios as S
from quadjax.verify.cli import verify_main


@pytest.fixture(scope="module")
def fast():
    return {r.scenario.name: r for r in harness.run(S.select())}


def test_the_fast_subset_passes_and_every_threshold_names_its_source(fast):
    assert set(fast) == {s.name for s in S.SCENARIOS if s.fast}
    for r in fast.values():
        assert r.status == "pass", [v.line() for v in r.verdicts if v.status != "pass"]
    names = [s.name for s in S.SCENARIOS]
    assert len(names) == len(set(names))
    assert all(c.source.strip() for s in S.SCENARIOS for c in s.checks)
    assert {"sysid_recovery"} <= {s.name for s in S.SCENARIOS if not s.fast}


# --- planted defects: (scenario, the check that must fail, (module, attribute, defect)) ----------


def _flipped_battery_sag(params, energy):
    """s = 1 + sag·min(E/C, 1): the sag's sign flipped (thrust grows as the battery drains)."""
    return 1.0 + params.battery_sag * jnp.minimum(energy / params.battery_capacity, 1.0)


def _with_observation(law, change):
    def broken(ctrl, cs, obs, t, **kw):
        return law(ctrl, cs, change(obs), t, **kw)
    return broken


def _forward_euler(f, x, h, *, axpy=None, at_stage=None):
    """x + h f(x): a stepper that claims to be RK4."""
    after = axpy(x, h, f(x))
    return at_stage(after, 0) if at_stage is not None else after


def _flipped_rigid_gyroscopic(J, body_rates, moment):
    """ω̇ = J⁻¹ (M + ω × Jω): the rigid body's gyroscopic term with its sign flipped."""
    from quadjax._components import cross_c
    gyro = cross_c(body_rates, quadjax.rigid_body.inertia_times_c(J, body_rates))
    return quadjax.rigid_body.solve_inertia_c(J, tuple(m + g for m, g in zip(moment, gyro)))


def _flipped_rotor_gyroscopic(params, rotor_speeds, body_rates):
    p, q, r = (-x for x in ORIGINAL["gyroscopic_moment_c"](params, rotor_speeds, body_rates))
    return (p, q, r)


def _no_ground_contact(params, before, after):
    return after


def _no_below_ground_check(params, state):
    code = ORIGINAL["state_violation"](params, state)
    return jnp.where(code == BELOW_GROUND, 0, code)


def _yaw_before_collective(mp, F, tx, ty, tz):
    """A mixer with the priority swapped: yaw is kept whole and the collective gives way (shifted
    to fit the allocation, then clipped), where seed 002 keeps the collective and cuts yaw."""
    w = jnp.stack([F, tx, ty, tz])
    T = quadjax.mixer.allocate(mp, w)
    shift = jnp.clip(0.0, mp.t_min - jnp.min(T), mp.t_max - jnp.max(T))
    return T + shift, jnp.ones_like(F), jnp.ones_like(F), shift != 0


def _never_frozen(error, report, enabled):
    return jnp.zeros_like(error, dtype=bool)


def _wind_sign_flipped(params, attitude, velocity):
    """The airspeed (and with it the drag) on v + w instead of the air-relative v − w."""
    flipped = params.replace(wind=tuple(-w for w in params.wind))
    return ORIGINAL["air_velocity_body_c"](flipped, attitude, velocity)


def _rotor_order_swapped(params, thrusts):
    """The model's rotors 0 and 2 swapped (front-right ↔ front-left): the mixer's PX4 order no
    longer matches the airframe's, a classic wiring bug."""
    t0, t1, t2, t3 = thrusts
    return ORIGINAL["rotor_moment_c"](params, (t2, t1, t0, t3))


def _commands_one_sample_late(*args, **kwargs):
    """A log whose commands are stamped one sample late (a loader's off-by-one)."""
    log = ORIGINAL["simulate_log"](*args, **kwargs)
    late = np.concatenate([log.motor_commands[:1], log.motor_commands[:-1]])
    return dataclasses.replace(log, motor_commands=late)


ORIGINAL = {
    "gyroscopic_moment_c": quadjax.quadrotor.gyroscopic_moment_c,
    "state_violation": quadjax.monitor.state_violation,
    "air_velocity_body_c": quadjax.quadrotor.air_velocity_body_c,
    "rotor_moment_c": quadjax.quadrotor.rotor_moment_c,
    "simulate_log": quadjax.sysid.simulate_log,
}

DEFECTS = {
    "battery sag sign": (S.HOVER, "sag_sink_rel_error", quadjax.quadrotor, "battery_scale", _flipped_battery_sag),
    "PID velocity sign": (S.STEP_PID, "settle_s", quadjax.control, "pid_control",
                          _with_observation(quadjax.control.pid_control, lambda o: o.replace(velocity=-o.velocity))),
    "geometric rate sign": (S.STEP_GEOMETRIC, "settle_s", quadjax.control, "geometric_control",
                            _with_observation(quadjax.control.geometric_control,
                                              lambda o: o.replace(body_rates=-o.body_rates))),
    "Euler for RK4": (S.FREE_FALL, "position_error_m", quadjax.integrators, "runge_kutta4", _forward_euler),
    "rigid-body gyroscopic sign": (S.PRECESSION, "momentum_rel_drift", quadjax.rigid_body, "angular_acceleration_c",
                                   _flipped_rigid_gyroscopic),
    "rotor gyroscopic sign": (S.PRECESSION, "momentum_rel_drift", quadjax.quadrotor, "gyroscopic_moment_c",
                              _flipped_rotor_gyroscopic),
    "no ground contact": (S.TOUCH_DOWN, "below_ground_m", quadjax.integrators, "ground_contact_c", _no_ground_contact),
    "monitor misses I5": (S.ALTIMETER, "reports_I5", quadjax.monitor, "state_violation", _no_below_ground_check),
    "mixer priority swap": (S.MIXER_SWEEP, "reports_match", quadjax.mixer, "_mix_pairs", _yaw_before_collective),
    "anti-windup ignores the report": (S.SATURATION, "integrator_ratio", quadjax.control.pid, "_frozen",
                                       _never_frozen),
    "wind sign": (S.GUSTS, "push_over_excursion", quadjax.quadrotor, "air_velocity_body_c", _wind_sign_flipped),
    "rotor order": (S.FIGURE8, "rms_error_m", quadjax.quadrotor, "rotor_moment_c", _rotor_order_swapped),
    "c4dynamics: rotor gyroscopic sign": (S.C4DYNAMICS, "derivative_max_rel_error", quadjax.quadrotor,
                                          "gyroscopic_moment_c", _flipped_rotor_gyroscopic),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_planted_defect_fails_its_scenario(defect, monkeypatch):
    """Intact, each passes (the test above; not asked for here, so that the two test workers do
    not both fly the whole subset)."""
    scenario, check, module, name, broken = DEFECTS[defect]
    if scenario.needs:
        pytest.importorskip(scenario.needs)
    monkeypatch.setattr(module, name, broken)
    result = harness.run_scenario(scenario)
    failed = {v.check.metric for v in result.verdicts if v.status == "fail"}
    assert result.status == "fail" and check in failed, [v.line() for v in result.verdicts]


def test_every_fast_scenario_has_a_planted_defect():
    assert {s.name for s in S.SCENARIOS if s.fast} <= {d[0].name for d in DEFECTS.values()}


@pytest.mark.slow
def test_sysid_recovery_passes_and_fails_on_late_commands(monkeypatch):
    intact = harness.run_scenario(S.SYSID)
    assert intact.status == "pass", [v.line() for v in intact.verdicts]
    monkeypatch.setattr(quadjax.sysid, "simulate_log", _commands_one_sample_late)
    broken = harness.run_scenario(S.SYSID)
    assert "max_rel_error" in {v.check.metric for v in broken.verdicts if v.status == "fail"}


# --- the harness ---------------------------------------------------------------------------------


def _scenario(run, checks, **kw):
    return harness.Scenario("probe", "a probe", tuple(checks), run, **kw)


def test_a_raising_scenario_fails_every_check_and_the_others_still_run():
    def boom(backend):
        raise RuntimeError("the physics exploded")

    checks = [harness.Check("x", "<=", 1.0, "analytic"), harness.Check("y", ">=", 0.0, "analytic")]
    ok = _scenario(lambda b: harness.Outcome({"x": 0.5, "y": 1.0}), checks)
    results = harness.run([_scenario(boom, checks), ok])
    assert [r.status for r in results] == ["fail", "pass"]
    assert all("RuntimeError: the physics exploded" in v.note for v in results[0].verdicts)


@pytest.mark.parametrize("value,ok", [(0.5, True), (1.0, True), (1.5, False), (float("nan"), False),
                                      (float("inf"), False)])
def test_a_non_finite_metric_never_passes(value, ok):
    assert harness.Check("x", "<=", 1.0, "analytic").judge(value) is ok


def test_a_missing_metric_fails_and_a_missing_dependency_skips():
    missing = harness.run_scenario(_scenario(lambda b: harness.Outcome({}), [harness.Check("x", "<=", 1, "a")]))
    assert missing.status == "fail" and "no metric 'x'" in missing.verdicts[0].note
    skipped = harness.run_scenario(_scenario(lambda b: 1 / 0, [harness.Check("x", "<=", 1, "a")],
                                             needs="a_module_that_is_not_there"))
    assert skipped.status == "skip"
    with pytest.raises(ValueError, match="op"):
        harness.Check("x", "=~", 1.0, "a")


def test_the_command_prints_verdicts_writes_the_report_and_exits_by_the_result(tmp_path, capsys, monkeypatch):
    assert verify_main(["mixer_throttle_sweep", "--out", str(tmp_path / "ok")]) == 0
    out = capsys.readouterr().out
    assert "✓ pass  mixer_throttle_sweep  BB-T1 rotor_thrust_step_per_collective_step = 0.5 (<= 1)" in out
    doc = json.loads((tmp_path / "ok" / "verify.json").read_text())
    assert doc["passed"] and doc["scenarios"][0]["metrics"]["bb_t1"] == pytest.approx(0.5, abs=1e-9)
    assert (tmp_path / "ok" / "plots" / "mixer_throttle_sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| ✓ pass | mixer_throttle_sweep |" in (tmp_path / "ok" / "VERIFY.md").read_text()
    monkeypatch.setattr(quadjax.mixer, "_mix_pairs", _yaw_before_collective)
    assert verify_main(["mixer_throttle_sweep", "--out", str(tmp_path / "bad"), "--no-plots"]) == 1
    assert "✗ FAIL  mixer_throttle_sweep  reports_match = 0" in capsys.readouterr().out
    assert verify_main(["no_such_scenario"]) == 2
    assert "unknown scenario" in capsys.readouterr().err
