"""The verification scenarios: what each flies, what it measures, and where each threshold comes from.

Every scenario runs in float64 on the backend it is given (``"xla"`` by default: the JAX model,
the one statement of the physics; ``"auto"`` or ``"native"`` fly the generated kernel where it
applies). Each builds its own jitted program when it runs, so a defect planted in the model
(a test monkeypatches a component function) is flown, not a cached program of the intact one.

Thresholds cite their source in the check: ``analytic`` (an exact solution or a conservation
law: the bound is rounding), a seed document (``seed 000`` … ``seed 004``), a paper, or a
documented quadjax specification (the docstring that promises it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from quadjax import control as C
from quadjax import presets
from quadjax.engine import Inputs, SimConfig, simulate
from quadjax.invariants import BELOW_GROUND
from quadjax.mixer import mix, mixer_params_from, saturation_from
from quadjax.model import hover_rotor_speed, hover_state
from quadjax.params import QuadParams
from quadjax.quaternion import quat_rotate
from quadjax.state import QuadState
from quadjax.verify.harness import Check, Outcome, Scenario

F64 = jnp.float64


def _a(x):
    return jnp.asarray(x, F64)


def _no_drag(p: QuadParams) -> QuadParams:
    """The vehicle without aerodynamic drag: what the analytic solutions assume."""
    z3 = jnp.zeros(3, F64)
    return p.replace(drag_linear=z3, drag_quadratic=z3, drag_rotational=z3)


def _open_loop(backend, dt, **config):
    """A jitted open-loop flight ``fly(params, state0, commands (T, R)) -> Trajectory``, built afresh
    (see the module doc); params are arguments, so one program flies every vehicle of a scenario."""
    cfg = SimConfig(backend=backend, **config)
    fly = jax.jit(lambda p, s, u: simulate(p, s, dt, commands=u, config=cfg))
    return lambda p, s, u: fly(p, s, jnp.asarray(u, F64))


def _closed_loop(plant, s0, law, ctrl, cs0, dt, n, backend, inputs=None, **config):
    """(states (n, ...), final controller state) of a closed-loop flight, jitted afresh."""
    cfg = SimConfig(backend=backend, **config)
    fly = jax.jit(lambda pl, s, cs: simulate(pl, s, dt, controller=law, ctrl_params=ctrl, ctrl_state=cs,
                                             num_ticks=n, inputs=inputs, config=cfg))
    traj = fly(plant, s0, cs0)
    return traj.states, traj.ctrl_state


def _pid(params, ref, dt, **rates):
    ctrl = C.PIDController.create(params, ref)
    return ctrl, functools.partial(C.pid_control, rates=C.CascadeRates(dt=dt, **rates))


def _time(n, dt):
    return dt * np.arange(1, n + 1)


# --------------------------------------------------------------------------- hover


def hover_hold(backend: str) -> Outcome:
    """Open loop at the hover command for 1 s, drag off: the battery's sag s = 1 − sag·E/C drains
    thrust linearly (E = P t, P = Σ k_p ω³), so z(t) = z₀ − g·sag·P·t³/(6C) and E(t) = P t. Both
    are polynomials of degree ≤ 4, which RK4 integrates exactly: the bound is rounding. Then the
    PID holds a hover for 10 s with drag and sag on."""
    p = _no_drag(presets.rp1(dtype=F64))
    z0, dt, n = 3.0, 1e-3, 1000
    s0 = hover_state(p, (1.0, -2.0, z0))
    w = hover_rotor_speed(p)
    states = _open_loop(backend, dt)(p, s0, jnp.tile(w, (n, 1))).states
    t = _time(n, dt)
    P = float(jnp.sum(p.k_p * w ** 3))
    g, sag, cap = float(p.gravity), float(p.battery_sag), float(p.battery_capacity)
    z_exact = z0 - g * sag * P * t ** 3 / (6 * cap)
    z = np.asarray(states.position[:, 2])
    pos = np.asarray(states.position)
    metrics = {
        "sag_sink_rel_error": abs(z[-1] - z_exact[-1]) / abs(z_exact[-1] - z0),
        "energy_rel_error": abs(float(states.energy[-1]) - P * t[-1]) / (P * t[-1]),
        "horizontal_drift_m": float(np.max(np.abs(pos[:, :2] - [1.0, -2.0]))),
        "sag_sink_m": z0 - z[-1],
    }
    plant = presets.rp1(dtype=F64)
    target = _a([1.0, -2.0, 3.0])
    ctrl, law = _pid(plant, C.Hover(position=target, yaw=_a(0.0)), 2e-3)
    s1 = hover_state(plant, (1.0, -2.0, 3.0))
    held, _ = _closed_loop(plant, s1, law, ctrl, C.pid_init(ctrl, s1), 2e-3, 5000, backend)
    err = np.linalg.norm(np.asarray(held.position) - np.asarray(target), axis=-1)
    metrics["pid_max_error_m"] = float(err.max())
    plot = {"x": t, "xlabel": "t [s]", "ylabel": "z − z₀ [m]",
            "lines": {"quadjax (RK4, 1 ms)": z - z0, "analytic −g·sag·P·t³/(6C)": z_exact - z0}}
    return Outcome(metrics, plot)


HOVER = Scenario(
    "hover_hold", "hover: the battery-sag sink and the energy exact; the PID holds 10 s to 1 mm",
    (Check("sag_sink_rel_error", "<=", 1e-6, "analytic: z₀ − g·sag·P·t³/(6C), exact under RK4"),
     Check("energy_rel_error", "<=", 1e-9, "analytic: E = Σ k_p ω³ · t"),
     Check("horizontal_drift_m", "<=", 1e-12, "analytic: a level hover has no horizontal force", unit="m"),
     Check("pid_max_error_m", "<=", 1e-3, "quadjax spec: PIDGains.default (a hover held to 1 mm for 10 s)", unit="m")),
    hover_hold)


# --------------------------------------------------------------------------- step responses


def step_metrics(x, z, dt, t_step, target=1.0, band=0.02):
    """(settle time after the step [s] into ±band, overshoot past target [m], altitude deviation [m])."""
    t = _time(len(x), dt)
    outside = np.nonzero(np.abs(x - target) > band)[0]
    settle = (t[outside[-1]] - t_step) if len(outside) else 0.0
    return float(settle), float(x.max() - target), float(np.max(np.abs(z - 1.0)))


def _step(kind: str, backend: str) -> Outcome:
    p = presets.rp1(dtype=F64)
    dt, n, t_step = 2e-3, 2000, 0.5
    s0 = hover_state(p, (0.0, 0.0, 1.0))
    ref = C.Step(start=_a([0.0, 0.0, 1.0]), end=_a([1.0, 0.0, 1.0]), t_step=_a(t_step), yaw=_a(0.0))
    if kind == "pid":
        ctrl, law = _pid(p, ref, dt)
        cs = C.pid_init(ctrl, s0)
    else:
        ctrl, law = C.GeometricController.create(p, ref), C.geometric_control
        cs = C.geometric_init(ctrl, s0)
    states, _ = _closed_loop(p, s0, law, ctrl, cs, dt, n, backend)
    x, z = np.asarray(states.position[:, 0]), np.asarray(states.position[:, 2])
    settle, over, alt = step_metrics(x, z, dt, t_step)
    plot = {"x": _time(n, dt), "xlabel": "t [s]", "ylabel": "position [m]", "lines": {"x": x, "z − 1": z - 1.0}}
    return Outcome({"settle_s": settle, "overshoot_m": over, "altitude_dev_m": alt}, plot)


STEP_PID = Scenario(
    "step_pid", "PID cascade: a 1 m step on rp1 settles to the 2 % band",
    (Check("settle_s", "<=", 2.0, "quadjax spec: PIDGains.default (settles to 2 % in about 1.4 s)", unit="s"),
     Check("overshoot_m", "<=", 0.01, "quadjax spec: PIDGains.default (< 1 % overshoot)", unit="m"),
     Check("altitude_dev_m", "<=", 0.05, "quadjax spec: PIDGains.default (altitude held through a step)", unit="m")),
    functools.partial(_step, "pid"))

STEP_GEOMETRIC = Scenario(
    "step_geometric", "geometric SE(3) control (Lee et al. 2010): a 1 m step on rp1 settles to the 2 % band",
    (Check("settle_s", "<=", 2.0, "quadjax spec: GeometricGains.default", unit="s"),
     Check("overshoot_m", "<=", 0.02, "quadjax spec: GeometricGains.default", unit="m"),
     Check("altitude_dev_m", "<=", 0.05, "quadjax spec: GeometricGains.default", unit="m")),
    functools.partial(_step, "geometric"))


# --------------------------------------------------------------------------- free fall, precession


def free_fall(backend: str) -> Outcome:
    """Rotors stopped, drag off, thrown at v₀: p(t) = p₀ + v₀ t − ½ g t² e_z, a quadratic that RK4
    integrates exactly (the bound is rounding); the attitude does not move."""
    p = _no_drag(presets.rp1(dtype=F64))
    dt, n = 1e-3, 2000
    p0, v0 = np.array([0.0, 0.0, 100.0]), np.array([1.0, -0.5, 2.0])
    s0 = QuadState.create(position=p0, velocity=v0, rotor_speeds=(0.0,) * 4, dtype=F64)
    states = _open_loop(backend, dt)(p, s0, np.zeros((n, 4))).states
    t = _time(n, dt)[:, None]
    exact = p0 + v0 * t - 0.5 * float(p.gravity) * t ** 2 * np.array([0.0, 0.0, 1.0])
    err = np.abs(np.asarray(states.position) - exact)
    metrics = {"position_error_m": float(err.max()),
               "attitude_change": float(np.max(np.abs(np.asarray(states.attitude) - [1.0, 0, 0, 0]))),
               "fell_m": float(p0[2] + v0[2] * t[-1, 0] - states.position[-1, 2])}
    plot = {"x": t[:, 0], "xlabel": "t [s]", "ylabel": "|error| [m]", "log": True,
            "lines": {"|z − z_exact|": np.maximum(err[:, 2], 1e-18)}}
    return Outcome(metrics, plot)


FREE_FALL = Scenario(
    "free_fall", "free fall from a throw: the exact parabola",
    (Check("position_error_m", "<=", 1e-10, "analytic: p₀ + v₀t − ½gt², exact under RK4", unit="m"),
     Check("attitude_change", "<=", 0.0, "analytic: no moment, no rotation"),
     Check("fell_m", ">=", 19.0, "analytic: ½ g t² = 19.6 m in 2 s (the fall happened)", unit="m")),
    free_fall)


def precession_vehicle() -> QuadParams:
    """A gyrostat: rp1 with a full, asymmetric inertia, spinning rotors (I_R of seed 004's
    vehicle), and nothing else that makes a moment (k_m = 0, no drag), far above the ground."""
    p = _no_drag(presets.rp1(dtype=F64))
    J = _a([[0.012, 0.0008, -0.0006], [0.0008, 0.016, 0.0010], [-0.0006, 0.0010, 0.024]])
    return p.replace(inertia=J, k_m=_a(0.0), rotor_inertia=_a(3.357e-5), ground_z=_a(-1e9), battery_sag=_a(0.0))


def torque_free_precession(backend: str) -> Outcome:
    """Torque-free tumbling of a gyrostat (rigid body + rotors at constant speed): with the
    rotor momentum h e_z (h = I_R Σ spinᵢ ωᵢ), the world angular momentum R(q)(Jω + h e_z) and the
    kinetic energy ½ ωᵀJω are constant (Euler's equations; Hughes, Spacecraft Attitude Dynamics,
    ch. 4). The same tumble with I_R = 0 shows the rotor term changes the motion."""
    p = precession_vehicle()
    w = hover_rotor_speed(presets.rp1(dtype=F64)) * _a([1.3, 1.3, 0.7, 0.7])  # CCW pair faster: rotor momentum
    dt, n = 5e-4, 4000
    s0 = QuadState.create(position=(0.0, 0.0, 10.0), body_rates=(3.0, -5.0, 8.0), rotor_speeds=w, dtype=F64)
    commands = jnp.tile(w, (n, 1))
    fly = _open_loop(backend, dt)
    states = fly(p, s0, commands).states
    rigid = fly(p.replace(rotor_inertia=_a(0.0)), s0, commands).states
    J = np.asarray(p.inertia)
    h = float(p.rotor_inertia * jnp.sum(p.rotor_spins * w))
    body = np.asarray(states.body_rates) @ J.T + np.array([0.0, 0.0, h])
    L = np.asarray(jax.vmap(quat_rotate)(states.attitude, jnp.asarray(body)))
    L0 = np.asarray(quat_rotate(s0.attitude, jnp.asarray(J @ np.asarray(s0.body_rates) + [0.0, 0.0, h])))
    w_t = np.asarray(states.body_rates)
    E = 0.5 * np.einsum("ti,ij,tj->t", w_t, J, w_t)
    E0 = 0.5 * np.asarray(s0.body_rates) @ J @ np.asarray(s0.body_rates)
    drift = np.linalg.norm(L - L0, axis=-1) / np.linalg.norm(L0)
    metrics = {
        "momentum_rel_drift": float(drift.max()),
        "energy_rel_drift": float(np.max(np.abs(E - E0)) / E0),
        "rates_change": float(np.max(np.abs(w_t - np.asarray(s0.body_rates)))),
        "rotor_term_effect": float(np.max(np.abs(w_t - np.asarray(rigid.body_rates)))),
    }
    plot = {"x": _time(n, dt), "xlabel": "t [s]", "ylabel": "body rate [rad/s]",
            "lines": {"p": w_t[:, 0], "q": w_t[:, 1], "r": w_t[:, 2]}}
    return Outcome(metrics, plot)


PRECESSION = Scenario(
    "torque_free_precession", "a tumbling gyrostat keeps its angular momentum and energy",
    (Check("momentum_rel_drift", "<=", 1e-9, "analytic: d/dt R(q)(Jω + h e_z) = 0"),
     Check("energy_rel_drift", "<=", 1e-9, "analytic: d/dt ½ωᵀJω = 0"),
     Check("rates_change", ">=", 0.5, "analytic: an asymmetric body precesses (the check is not vacuous)",
           unit="rad/s"),
     Check("rotor_term_effect", ">=", 1e-3, "analytic: the rotor momentum h e_z changes the motion (seed 004)",
           unit="rad/s")),
    torque_free_precession)


# --------------------------------------------------------------------------- ground contact


def touch_down(backend: str) -> Outcome:
    """Seed 000's contact: a falling vehicle stops at ground_z (z = ground_z, v = ω = 0,
    on_ground = 1), at t = √(2h/g) within one step; a grounded vehicle stays put while its
    vertical thrust is at most its weight and lifts off above it."""
    p = _no_drag(presets.rp1(dtype=F64))
    dt, n, h = 1e-3, 1000, 2.0
    s0 = QuadState.create(position=(0.3, -0.2, h), rotor_speeds=(0.0,) * 4, dtype=F64)
    fly = _open_loop(backend, dt)
    fall = fly(p, s0, np.zeros((n, 4))).states
    z = np.asarray(fall.position[:, 2])
    landed = int(np.argmax(np.asarray(fall.on_ground) > 0.5))
    ground = float(p.ground_z)
    grounded = hover_state(p, (0.5, 0.5, ground)).replace(on_ground=_a(1.0))
    w = hover_rotor_speed(p)
    below, above = (fly(p, grounded.replace(rotor_speeds=w * np.sqrt(f)), jnp.tile(w * np.sqrt(f), (n, 1))).states
                    for f in (0.9, 1.1))  # 0.9 and 1.1 × the weight, for 1 s
    metrics = {
        "below_ground_m": ground - float(z.min()),
        "touchdown_error_s": abs((landed + 1) * dt - np.sqrt(2 * h / float(p.gravity))),
        "speed_after_m_s": float(np.max(np.abs(np.asarray(fall.velocity[landed:])))),
        "stays_put_m": float(np.max(np.abs(np.asarray(below.position) - np.asarray(grounded.position)))),
        "lift_off_m": float(above.position[-1, 2]) - ground,
    }
    plot = {"x": _time(n, dt), "xlabel": "t [s]", "ylabel": "z [m]", "lines": {"z": z}}
    return Outcome(metrics, plot)


TOUCH_DOWN = Scenario(
    "touch_down", "touch-down is a stop; a grounded vehicle stays put below its weight, lifts off above",
    (Check("below_ground_m", "<=", 0.0, "seed 000: a falling vehicle stops at ground_z", unit="m"),
     Check("touchdown_error_s", "<=", 1e-3, "analytic: t = √(2h/g), within one step", unit="s"),
     Check("speed_after_m_s", "<=", 0.0, "seed 000: contact is a stop (no bounce)", unit="m/s"),
     Check("stays_put_m", "<=", 0.0, "seed 000: grounded while vertical thrust ≤ weight", unit="m"),
     Check("lift_off_m", ">", 0.0, "seed 000: lifts off above its weight", unit="m")),
    touch_down)


def altimeter_bug(backend: str) -> Outcome:
    """Seed 000's debugging story: hover at 0.3 m, 3 % below hover speed; the caller applies a
    −2 cm altimeter correction every 0.1 s (meant once). The vehicle touches down early; the
    correction at 0.8 s pushes the grounded state 2 cm under the ground, and the monitor reports
    I5 (below_ground) before step 800, with position.z = −0.02 m."""
    p = presets.rp1(dtype=F64)
    dt, n = 1e-3, 1500
    s0 = hover_state(p, (0.0, 0.0, 0.3))
    u = jnp.tile(hover_rotor_speed(p) * 0.97, (n, 1))

    def altimeter_fix(state, k):  # the caller's code under suspicion
        due = (k % 100 == 0) & (k > 0)
        return state.replace(position=state.position.at[2].add(jnp.where(due, -0.02, 0.0)))

    cfg = SimConfig(backend=backend, check="monitor")
    traj = jax.jit(lambda s: simulate(p, s, dt, commands=u, edit=altimeter_fix, config=cfg))(s0)
    report = traj.report
    on = np.asarray(traj.states.on_ground) > 0.5
    touchdown = (int(np.argmax(on)) + 1) * dt if on.any() else float("nan")
    reported = int(report.code) == BELOW_GROUND
    metrics = {
        "reports_I5": float(reported),
        "before_step": float(report.tick) if reported else float("nan"),
        "reported_z_error_m": abs(float(report.state.position[2]) + 0.02) if reported else float("nan"),
        "touchdown_s": touchdown,
    }
    z = np.asarray(traj.states.position[:, 2])
    plot = {"x": _time(n, dt), "xlabel": "t [s]", "ylabel": "z [m]", "lines": {"z (frozen at the report)": z}}
    return Outcome(metrics, plot)


ALTIMETER = Scenario(
    "altimeter_bug", "seed 000's debugging scenario: the caller's altimeter bug is caught as I5 before step 800",
    (Check("reports_I5", "==", 1.0, "seed 000: monitor: I5 (below_ground)"),
     Check("before_step", "==", 800, "seed 000: before step 800"),
     Check("reported_z_error_m", "<=", 1e-12, "seed 000: position.z = −0.02 m", unit="m"),
     Check("touchdown_s", "<", 0.8, "seed 000: touches down at 0.76 s, before the correction at 0.8 s", unit="s")),
    altimeter_bug)


# --------------------------------------------------------------------------- the mixer

#: seed 002's throttle sweep: τ held, F from 0 to 52 N
SWEEP_TORQUE, SWEEP_F = (0.5, 0.2, 0.1), np.arange(0.0, 52.0 + 1e-9, 0.01)
#: its transitions [N] and the report (roll, pitch, yaw, collective) on each stretch
SEED_TRANSITIONS = (9.0, 15.4, 38.0, 41.6)
SEED_REPORTS = ((0, 0, 1, -1), (0, 0, 1, 0), (0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 1, 1))


def throttle_sweep(mp, torque=SWEEP_TORQUE, F=SWEEP_F):
    """(mix output, saturation report (n, 4)) along the sweep, as numpy."""
    w = jnp.asarray(np.concatenate([F[:, None], np.broadcast_to(torque, (len(F), 3))], axis=1), F64)
    out, report = jax.jit(jax.vmap(lambda x: (lambda o: (o, saturation_from(x, o)))(mix(mp, x))))(w)
    return jax.tree_util.tree_map(np.asarray, out), np.asarray(report)


def sweep_transitions(F, report):
    """(the F [N] where the report changes, midway between samples; the report on each stretch)."""
    changed = np.flatnonzero(np.any(report[1:] != report[:-1], axis=1))
    return 0.5 * (F[changed] + F[changed + 1]), [tuple(int(v) for v in report[0])] + [
        tuple(int(v) for v in report[i + 1]) for i in changed]


def mixer_throttle_sweep(backend: str) -> Outcome:
    """Seed 002's throttle sweep on rp1's mixer (the seed's geometry, GUIDE §1)."""
    mp = mixer_params_from(presets.rp1(dtype=F64))
    out, report = throttle_sweep(mp)
    where, reports = sweep_transitions(SWEEP_F, report)
    error = np.max(np.abs(where - SEED_TRANSITIONS)) if len(where) == len(SEED_TRANSITIONS) else float("inf")
    step = np.max(np.abs(np.diff(out.thrusts, axis=0)), axis=1) / np.diff(SWEEP_F)
    metrics = {
        "transition_error_N": float(error),
        "reports_match": float(reports == list(SEED_REPORTS)),
        "rp_cut_points": float(np.sum(out.rp_scale < 1.0)),
        "bb_t1": float(step.max()),
    }
    plot = {"x": SWEEP_F, "xlabel": "collective demand F [N]", "ylabel": "rotor thrust [N]",
            "lines": {f"T{i}": out.thrusts[:, i] for i in range(4)}}
    return Outcome(metrics, plot)


MIXER_SWEEP = Scenario(
    "mixer_throttle_sweep", "seed 002's throttle sweep: the priority's transitions, the report, BB-T1",
    (Check("transition_error_N", "<=", 0.3, "seed 002: 9.0, 15.4, 38.0, 41.6 N (±0.3 N, GUIDE §1)", unit="N"),
     Check("reports_match", "==", 1.0, "seed 002: airmode −1 + yaw cut, yaw cut, zeros, yaw cut, collective +1"),
     Check("rp_cut_points", "==", 0.0, "seed 002: roll and pitch are never cut"),
     Check("bb_t1", "<=", 1.0, "seed 002: BB-T1 (the seed reports 0.5)",
           label="BB-T1 rotor_thrust_step_per_collective_step")),
    mixer_throttle_sweep)


def saturation_recovery(backend: str) -> Outcome:
    """Gravity at 3.6 g for 1.5 s (beyond the thrust limit: the mixer cuts the collective), then
    normal, with and without anti-windup. With it, the vertical integrator stops once the
    mixer reports the cut (seed 002: "so the rate loop can stop integrating on saturated axes"),
    and the vehicle recovers sooner and overshoots less (conditional integration; Åström &
    Hägglund, PID Controllers, 1995, §3.5)."""
    p = presets.rp1(dtype=F64)
    dt, z0 = 2e-3, 30.0
    s0 = hover_state(p, (0.0, 0.0, z0))
    heavy = p.replace(gravity=_a(3.6 * float(p.gravity)))
    runs = {}
    for on in (True, False):
        ctrl, law = _pid(p, C.Hover(position=_a([0.0, 0.0, z0]), yaw=_a(0.0)), dt, anti_windup=on)
        cfg = SimConfig(backend=backend)
        fly = jax.jit(lambda pl, s, cs: (lambda tr: (tr.states, tr.ctrl_state))(
            simulate(pl, s, dt, controller=law, ctrl_params=ctrl, ctrl_state=cs, num_ticks=750, config=cfg)))
        st, cs = fly(heavy, s0, C.pid_init(ctrl, s0))
        integral = abs(float(cs.vel_integral[2]))
        pieces, s = [], jax.tree_util.tree_map(lambda x: x[-1], st)
        for _ in range(4):  # 6 s at normal gravity, in the same compiled 750-tick program
            after, cs = fly(p, s, cs)
            s = jax.tree_util.tree_map(lambda x: x[-1], after)
            pieces.append(np.asarray(after.position[:, 2]))
        z = np.concatenate(pieces)
        outside = np.nonzero(np.abs(z - z0) > 0.05)[0]
        runs[on] = (integral, dt * (outside[-1] + 1) if len(outside) else 0.0, z.max() - z0, float(st.position[-1, 2]), z)
    (i_on, t_on, o_on, sank_on, z_on), (i_off, t_off, o_off, _, z_off) = runs[True], runs[False]
    metrics = {
        "integrator_ratio": i_on / i_off,
        "recovery_ratio": t_on / t_off,
        "overshoot_ratio": o_on / o_off,
        "sank_m": z0 - sank_on,
        "recovery_on_s": t_on, "recovery_off_s": t_off,
    }
    plot = {"x": 1.5 + _time(len(z_on), dt), "xlabel": "t [s]", "ylabel": "z − z₀ [m]",
            "lines": {"anti-windup": z_on - z0, "no anti-windup": z_off - z0}}
    return Outcome(metrics, plot)


SATURATION = Scenario(
    "saturation_recovery", "saturated climb (3.6 g): anti-windup stops the integrator and recovers sooner",
    (Check("sank_m", ">=", 2.0, "analytic: 3.6 g exceeds the thrust limit, the demand is cut", unit="m"),
     Check("integrator_ratio", "<=", 0.1, "seed 002: integrators stop on a reported cut"),
     Check("recovery_ratio", "<", 1.0, "Åström & Hägglund 1995 §3.5: conditional integration recovers sooner"),
     Check("overshoot_ratio", "<", 1.0, "Åström & Hägglund 1995 §3.5: and overshoots less")),
    saturation_recovery)


# --------------------------------------------------------------------------- disturbances, tracking


def gust_series(t, peak=3.0, start=1.0, length=2.0, steady=2.0, steady_from=4.0):
    """Wind (T, 3) [m/s]: a "1 − cosine" discrete gust along +x, (peak/2)(1 − cos(2π(t − start)/length))
    over [start, start + length] (MIL-F-8785C §3.7.4), then a steady wind along +y from ``steady_from``."""
    w = np.zeros((len(t), 3))
    inside = (t >= start) & (t <= start + length)
    w[inside, 0] = 0.5 * peak * (1 - np.cos(2 * np.pi * (t[inside] - start) / length))
    w[t >= steady_from, 1] = steady
    return w


def gust_rejection(backend: str) -> Outcome:
    """The PID holds a hover through a 3 m/s 1 − cos gust along +x and a 2 m/s steady wind along +y.
    (from t = 4 s to 15 s). Drag pushes the vehicle downwind (F = −D ⊙ (v − w)); the integral
    action then drives the steady wind's error toward zero (final-value theorem), slowly: the
    default velocity integrator's time constant is ≈ 8 s, so the check asks for the decay, not
    for zero."""
    p = presets.rp1(dtype=F64)
    dt, n = 2e-3, 7500
    target = _a([0.0, 0.0, 2.0])
    s0 = hover_state(p, (0.0, 0.0, 2.0))
    ctrl, law = _pid(p, C.Hover(position=target, yaw=_a(0.0)), dt)
    t = dt * np.arange(n)  # the wind during tick k
    wind = gust_series(t)
    states, _ = _closed_loop(p, s0, law, ctrl, C.pid_init(ctrl, s0), dt, n, backend, inputs=Inputs(wind=_a(wind)))
    pos = np.asarray(states.position) - np.asarray(target)
    gust, steady = (t >= 1.0) & (t < 4.0), t >= 4.0
    e_steady = np.linalg.norm(pos[steady], axis=-1)
    metrics = {
        "downwind_push_m": float(pos[gust, 0].max()),
        "upwind_excursion_m": float(max(-pos[gust, 0].min(), 0.0)),
        "final_error_m": float(np.linalg.norm(pos[-1])),
        "steady_error_decay": float(e_steady[-1] / e_steady.max()),
        "push_over_excursion": float(pos[gust, 0].max() / max(-pos[gust, 0].min(), 1e-12)),
        "peak_deviation_m": float(np.linalg.norm(pos, axis=-1).max()),
    }
    plot = {"x": _time(n, dt), "xlabel": "t [s]", "ylabel": "position error [m]",
            "lines": {"x": pos[:, 0], "y": pos[:, 1], "z": pos[:, 2]}}
    return Outcome(metrics, plot)


GUSTS = Scenario(
    "gust_rejection", "a 1 − cos gust and a steady wind: pushed downwind, then the integrator removes the error",
    (Check("downwind_push_m", ">=", 1e-3, "analytic: drag −D⊙(v − w) pushes the vehicle downwind", unit="m"),
     Check("push_over_excursion", ">=", 2.0, "analytic: pushed downwind first; the recovery's overshoot is "
           "smaller (a damped loop)"),
     Check("steady_error_decay", "<=", 0.5, "analytic: integral action drives a constant disturbance's error to "
           "zero (final-value theorem); a proportional loop would hold it (≈ 1)")),
    gust_rejection)


def figure8_tracking(backend: str) -> Outcome:
    """The main job's mission, one nominal vehicle without gusts: rp1 on the figure-8 (a 2 m, b 1 m,
    10 s period) for 20 s under the PID at 125 Hz (position loop at 25 Hz), RK4 2 × 4 ms."""
    p = presets.rp1(dtype=F64)
    dt, n = 1.0 / 125, 2500
    ref = C.Figure8(center=_a([0.0, 0.0, 2.0]), a=_a(2.0), b=_a(1.0), omega=_a(2 * np.pi / 10.0), yaw=_a(0.0))
    s0 = hover_state(p, (0.0, 0.0, 2.0)).replace(velocity=ref(_a(0.0)).velocity)  # on the reference, as the sweep
    ctrl, law = _pid(p, ref, dt, position_every=5, attitude_every=1)
    states, _ = _closed_loop(p, s0, law, ctrl, C.pid_init(ctrl, s0), dt, n, backend, substeps=2)
    target = np.asarray(jax.vmap(ref)(jnp.asarray(_time(n, dt))).position)
    err = np.linalg.norm(np.asarray(states.position) - target, axis=-1)
    metrics = {"rms_error_m": float(np.sqrt(np.mean(err ** 2))), "max_error_m": float(err.max())}
    plot = {"x": _time(n, dt), "xlabel": "t [s]", "ylabel": "tracking error [m]", "lines": {"|p − p_ref|": err}}
    return Outcome(metrics, plot)


FIGURE8 = Scenario(
    "figure8_tracking", "the main job's figure-8, one nominal vehicle, no gusts",
    (Check("rms_error_m", "<=", 0.0445, "quadjax spec: ≤ the sweep's median RMS error with gusts and ±10 % "
           "vehicles (README: p50 0.0445 m)", unit="m"),
     Check("max_error_m", "<=", 0.100, "quadjax spec: ≤ the sweep's median max error (README: p50 0.100 m)",
           unit="m")),
    figure8_tracking)


# --------------------------------------------------------------------------- identification, reference


def sysid_recovery(backend: str) -> Outcome:
    """Noise-free synthetic flights of a known vehicle (Crazyflie 2.1 Brushless with drag and
    motor lag), 9 parameters started 20–100 % off: an identifiable model on exact data is
    recovered (to the optimiser's tolerance)."""
    from quadjax.sysid import LossWeights, ParamSpec, excitation, fit, random_state, simulate_log

    names, dt = "k_f,k_m,inertia,motor_tau,drag_linear", 0.01
    truth = presets.crazyflie21_brushless(dtype=F64)
    truth = truth.replace(drag_linear=_a([0.010, 0.012, 0.020]), motor_tau=_a(0.045))
    start = truth.replace(k_f=truth.k_f * 1.2, k_m=truth.k_m * 0.7, inertia=truth.inertia * _a([1.3, 0.8, 1.25]),
                          motor_tau=truth.motor_tau * 1.4, drag_linear=truth.drag_linear * _a([2.0, 0.5, 1.5]))
    rng = np.random.default_rng(0)
    logs = [simulate_log(truth, random_state(truth, rng), excitation(truth, 40, dt, seed=i), dt, name=f"synthetic{i}")
            for i in range(16)]
    result = fit(logs, names, start, weights=LossWeights(rotor_speeds=5.0), inputs="commands", horizon=20,
                 adam_steps=50, lbfgs_steps=300)
    true = np.asarray(ParamSpec.create(names, truth).values(jnp.zeros(9)))
    rel = np.abs(result.values / true - 1)
    metrics = {"max_rel_error": float(rel.max()), "start_min_rel_offset": float(np.min(np.abs(result.start / true - 1))),
               "rank": float(result.uncertainty.rank),
               "loss_reduction": float(result.loss_history[-1] / result.loss_history[0])}
    plot = {"x": np.arange(len(result.loss_history)), "xlabel": "optimiser step", "ylabel": "loss", "log": True,
            "lines": {"loss": np.asarray(result.loss_history)}}
    return Outcome(metrics, plot)


SYSID = Scenario(
    "sysid_recovery", "system identification recovers 9 parameters of a known vehicle from synthetic flights",
    (Check("max_rel_error", "<=", 5e-3, "analytic: exact data, an identifiable model (rank 9): the truth is the "
           "minimum"),
     Check("start_min_rel_offset", ">=", 0.19, "the start is 20–100 % off (the check is not vacuous)"),
     Check("rank", "==", 9, "analytic: every parameter excited (Fisher information of rank 9)")),
    sysid_recovery, fast=False)


def random_c4dynamics_case(rng, c4d):
    """A random vehicle, as a c4dynamics struct and as QuadParams (the subset c4dynamics models:
    diagonal inertia, linear drag, one rotational drag coefficient, rotor speeds as the input,
    wind and rotor inertia on), a random airborne state x13 and rotor speeds."""
    m, l_arm = rng.uniform(0.3, 3.0), rng.uniform(0.1, 0.4)
    inertia = rng.uniform(2e-3, 5e-2, 3)
    inertia[2] = rng.uniform(max(inertia[0], inertia[1]) * 1.05, inertia[0] + inertia[1])  # physical moments
    kT, kQ = rng.uniform(1e-6, 1e-5), rng.uniform(0.01, 0.05)
    A = rng.uniform(0.0, 0.5, 3)
    Ar, IR = rng.uniform(0.0, 0.3), rng.uniform(1e-5, 1e-4)
    wind = rng.uniform(-5, 5, 3)
    quad = c4d.struct(m=m, g=9.81, l=l_arm, kT=kT, kQ=kQ * kT, Ixx=inertia[0], Iyy=inertia[1], Izz=inertia[2],
                      Ax=A[0], Ay=A[1], Az=A[2], Ar=Ar, IR=IR, wind=wind)
    params = QuadParams.create(
        mass=m, inertia=inertia, rotor_positions=presets.quad_x_positions(l_arm),
        rotor_spins=(1.0, 1.0, -1.0, -1.0), k_f=kT, k_m=kQ, omega_max=1e4,
        drag_linear=A, drag_rotational=Ar, rotor_inertia=IR, gravity=9.81, wind=wind,
        ground_z=-1e6, dtype=F64,
    )
    q = rng.normal(size=4)
    x13 = np.concatenate([rng.uniform(-10, 10, 3), rng.uniform(-8, 8, 3), q / np.linalg.norm(q), rng.uniform(-6, 6, 3)])
    omega = rng.uniform(0.0, 2.0, 4) * np.sqrt(m * 9.81 / 4 / kT)
    return quad, params, x13, omega


def c4dynamics_crosscheck(backend: str) -> Outcome:
    """quadjax's derivative against c4dynamics 2.6 (an independent implementation of seed 004's
    model) on 50 random vehicles and states, ENU; then c4dynamics' documented example."""
    import c4dynamics as c4d
    from c4dynamics.eqm.quadcopter import quadeqm

    from quadjax import frames
    from quadjax.model import derivative
    from quadjax.quadrotor import body_wrench

    rng = np.random.default_rng(2026)
    deriv = jax.jit(lambda *a: derivative(*a))  # a fresh function: jit caches by function (module doc)
    worst = 0.0
    for _ in range(50):
        quad, params, x13, omega = random_c4dynamics_case(rng, c4d)
        s = QuadState.create(position=x13[0:3], velocity=x13[3:6], attitude=x13[6:10], body_rates=x13[10:13],
                             rotor_speeds=omega, dtype=F64)
        d = deriv(params, s, jnp.asarray(omega))
        ours = np.concatenate([d.position, d.velocity, d.attitude, d.body_rates])
        ref = quadeqm(0.0, x13, quad, omega, "ENU")
        scale = np.maximum(np.abs(ref), np.max(np.abs(ref)) * 1e-3)
        worst = max(worst, float(np.max(np.abs(ours - ref) / scale)))
    p = presets.c4dynamics_reference(dtype=F64)
    w = hover_rotor_speed(p) * _a([1.1, 1.1, 0.9, 0.9])
    s0 = QuadState.create(rotor_speeds=w, dtype=F64)
    F_b, M_b = body_wrench(p, s0.position, s0.attitude, s0.velocity, s0.body_rates, w, s0.energy)
    final = _open_loop(backend, 0.01, save_every=0)(p, s0, jnp.tile(w, (200, 1))).final
    psi = float(np.degrees(frames.quat_to_euler321(final.attitude)[2]))
    metrics = {"derivative_max_rel_error": worst, "example_thrust_error_N": abs(float(F_b[2]) - 4.637),
               "example_yaw_moment_error_Nm": abs(float(M_b[2]) + 0.03508), "example_yaw_error_deg": abs(psi + 19.65)}
    return Outcome(metrics)


C4DYNAMICS = Scenario(
    "c4dynamics_crosscheck", "the derivative against c4dynamics 2.6 (independent), and its worked example",
    (Check("derivative_max_rel_error", "<=", 1e-9, "c4dynamics 2.6.0 quadeqm, float64 rounding"),
     Check("example_thrust_error_N", "<=", 5e-4, "c4dynamics docs / GUIDE §1: F_b = (0, 0, 4.637) N", unit="N"),
     Check("example_yaw_moment_error_Nm", "<=", 5e-5, "c4dynamics docs / GUIDE §1: M_b,z = −0.03508 N·m",
           unit="N·m"),
     Check("example_yaw_error_deg", "<=", 0.05, "c4dynamics docs / GUIDE §1: ψ = −19.65° after 2 s", unit="deg")),
    c4dynamics_crosscheck, needs="c4dynamics")


#: every scenario, in the order they are reported
SCENARIOS = (HOVER, STEP_PID, STEP_GEOMETRIC, FREE_FALL, PRECESSION, TOUCH_DOWN, ALTIMETER, MIXER_SWEEP,
             SATURATION, GUSTS, FIGURE8, SYSID, C4DYNAMICS)


def select(names=None, all_=False) -> tuple:
    """The scenarios named (any order given), or the fast subset, or all of them."""
    by_name = {s.name: s for s in SCENARIOS}
    if names:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"unknown scenario(s) {unknown}: choose from {sorted(by_name)}")
        return tuple(by_name[n] for n in names)
    return tuple(s for s in SCENARIOS if all_ or s.fast)
