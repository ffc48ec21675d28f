"""The sweep runner: randomised vehicles fly a mission in closed loop, chunk by chunk.

Every vehicle flies through the engine (:func:`quadjax.simulate`), the same call a user
makes: its controller is the flight stack (:func:`_flight_stack`: the sensors, then the
control law), its wind input is the gust (an OU process that does not depend on the flight,
drawn before the flight), and :class:`CrashRules` is the engine hook that judges each tick:

* crash checks, first hit wins (codes in :mod:`quadjax.status`): a state invariant
  (:func:`quadjax.state_violation`), ground contact while the reference is more than
  ``ground_clearance`` above the ground, tilt beyond ``max_tilt_deg``, tracking error beyond
  ``max_error`` (or not finite). Parameters that break I1 stop the vehicle at t = 0. The
  engine freezes a crashed vehicle at its last good state, so a diverging vehicle is
  reported as a crash and never spreads a NaN into the statistics or the batch;
* streaming statistics per vehicle, over the ticks it is still flying: sum of squared
  tracking error, max error, min cos(tilt), ticks saturated; energy is the state's own;
* the fleet-wide tracking-error histogram (:class:`~quadjax.sweep.stats.ErrorHistogram`):
  each tick's error while the vehicle flies is a per-tick output of the hook, binned and counted
  over the block after the flight (integer counts, exact; a scatter-add inside the tick would
  keep the tick out of the native loop);
* full trajectories only for the first ``keep_trajectories`` vehicles of the sweep.

The compiled unit is a *block* of ``block_size`` vehicles per device, ``vmap``-ed over the
block (:func:`quadjax.map_vehicles`). Vehicle i draws everything from
``fold_in(key(seed), i)``: its parameters, initial state and gust each from a key of their own,
the sensors' per-tick noise from ``fold_in(·, tick)``. XLA's CPU code
for an element-wise program is not bit-identical across batch shapes, nor across the lanes
of one batch (vector loops and their tails differ, e.g. in FMA contraction: measured 1-ulp
differences in the energy), so every block is the same compiled program on the same shape,
and vehicle i always sits in lane i mod block_size (chunks hold whole blocks). The results
are then bit-for-bit identical for any chunk size, any resume point and (every device runs
the same per-block program) any number of devices, for a given ``block_size``
(which is therefore part of the sweep's identity).

Each call runs one block on one local device; every device has its own copy of the program
and its own thread, so the devices fly side by side (:func:`_lanes`; on a CPU, forced host
devices, one per core, are the way to use every core: ``quadjax sweep --cpu-devices N`` makes
them, and does so by default for long sweeps). A chunk
of ``chunk_size`` vehicles is as many calls as it needs and goes to disk as one file when it
finishes (:mod:`quadjax.sweep.store`); a rerun resumes.

In a job of several processes (:func:`quadjax.distributed.initialize` first; every process
calls :func:`run_sweep` with the same config and folder), the processes agree on the sweep's
identity, process 0 opens the folder and says which chunks are done, the rest are dealt round
robin (:func:`quadjax.distributed.share`) and each process flies its share on its own devices.
A vehicle's numbers do not depend on where it flew, so the result equals the one-process
sweep's bit for bit; every process aggregates the same chunk files and process 0 writes the
outputs. Each step where one process can fail ends in a collective check, so one process's
error stops all of them with the reason instead of leaving them waiting.

On the CPU (the engine's ``backend="auto"``) the whole flight of a block's vehicles, tick after
tick (flight stack, RK4 substeps, crash rules, statistics), runs in one generated native call
(:mod:`quadjax.native.loop`), whose results do not depend on lanes at all; the gust series streams
in, the histogram's samples and the kept trajectories stream out. The draws and the figures stay
in XLA (and the whole flight does with sensor noise or the estimator, whose per-tick PRNG draws
the generator cannot compile), so the lane rule above still matters.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import queue
import secrets
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from quadjax import control as C
from quadjax import distributed, presets
from quadjax import status as codes
from quadjax._pytree import pytree_dataclass
from quadjax.estimation import EKFObserver, summary as estimation_summary
from quadjax.engine import Hook, Inputs, SimConfig, map_vehicles, simulate, why_not_native
from quadjax.invariants import state_violation
from quadjax.mixer import mixer_params_from
from quadjax.sweep import stats as S
from quadjax.sweep.config import SweepConfig
from quadjax.sweep.gusts import Gusts, gust_init, gust_step
from quadjax.sweep.randomise import (
    InitialSpread, RandomSpec, SensorNoise, initial_state, observe, raw_draws, sample_params, sample_valid_params,
    standard_normal,
)
from quadjax.sweep.sensing import initial_sigma, sensor_suite
from quadjax.sweep.store import SweepStore, identity_hash, write_npz

@dataclasses.dataclass(frozen=True)
class Static:
    """What the compiled block depends on structurally (hashable); the numbers are traced."""

    num_ticks: int
    substeps: int
    stepper: str
    controller: str
    rates: C.CascadeRates | None
    random: RandomSpec
    gusts: bool
    gust_every: int
    noise: bool
    keep: int
    histogram: S.ErrorHistogram
    ground_crash: bool
    knows_vehicle: bool
    estimator: bool = False


def make_reference(trajectory: dict, duration: float, dtype):
    """The reference trajectory pytree of a config's ``[trajectory]`` table."""
    a = functools.partial(jnp.asarray, dtype=dtype)
    t = trajectory
    kind = t["kind"]
    if kind == "figure8":
        return C.Figure8(center=a(t["center"]), a=a(t["a"]), b=a(t["b"]), omega=a(2 * math.pi / t["period"]),
                         yaw=a(t["yaw"]))
    if kind == "circle":
        return C.Circle(center=a(t["center"]), radius=a(t["radius"]), omega=a(2 * math.pi / t["period"]),
                        yaw=a(t["yaw"]))
    if kind == "hover":
        return C.Hover(position=a(t["position"]), yaw=a(t["yaw"]))
    if kind == "c4d_figure8":
        return C.C4dFigure8(a=a(t["a"]), b=a(t["b"]), omega=a(2 * math.pi / t["period"]), z_ref=a(t["altitude"]),
                            t_takeoff=a(t["t_takeoff"]), t_land=a(t["t_land"]), t_end=a(duration))
    if kind == "minimum_snap":
        return C.minimum_snap(t["waypoints"], t["durations"], yaw=t["yaw"], dtype=dtype)
    raise ValueError(f"config: trajectory.kind = {kind!r}: unknown")


def prepare(config: SweepConfig):
    """(static, values): the compiled structure and the traced numbers of a sweep."""
    dtype = jnp.dtype(config.dtype)
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:
        raise ValueError("config: dtype = \"float64\" needs 64-bit JAX: set JAX_ENABLE_X64=1 in the environment")
    nominal = presets.get(config.preset, dtype=dtype)
    reference = make_reference(config.trajectory, config.duration, dtype)
    if config.controller == "pid":
        ctrl = C.PIDController.create(nominal, reference)
        rates = C.CascadeRates(dt=config.control_dt, position_every=config.position_every,
                               attitude_every=config.attitude_every)
    else:
        ctrl = C.GeometricController.create(nominal, reference)
        rates = None
    a = functools.partial(jnp.asarray, dtype=dtype)
    gusts = Gusts.create(config.gusts["sigma"], config.gusts["tau"], dtype=dtype) if config.gusts else None
    noise = SensorNoise.create(**config.sensor_noise, dtype=dtype) if config.sensor_noise else None
    static = Static(
        num_ticks=config.num_ticks, substeps=config.substeps, stepper=config.stepper, controller=config.controller,
        rates=rates, random=config.random.skeleton(), gusts=gusts is not None,
        gust_every=config.gusts["update_every"] if config.gusts else 1, noise=noise is not None,
        keep=config.keep_trajectories, histogram=config.histogram, ground_crash=config.crash["ground"],
        knows_vehicle=config.knows_vehicle, estimator=config.estimator is not None,
    )
    values = {
        "nominal": nominal,
        "ctrl": ctrl,
        "random": config.random.values(dtype),
        "initial": InitialSpread.create(**config.initial, dtype=dtype),
        "gusts": gusts,
        "noise": noise,
        "max_error": a(config.crash["max_error"]),
        "cos_max_tilt": a(math.cos(math.radians(config.crash["max_tilt_deg"]))),
        "clearance": a(config.crash["ground_clearance"]),
        "dt": a(config.control_dt),
        "key": jax.random.PRNGKey(config.seed),
    }
    if config.estimator is not None:
        values["sensors"] = sensor_suite(config.estimator, config.control_dt, dtype)
        values["sigma0"] = initial_sigma(config.estimator, dtype)
    return static, values


def _law(static: Static):
    if static.controller == "pid":
        return functools.partial(C.pid_control, rates=static.rates), C.pid_init
    return C.geometric_control, C.geometric_init


def _controller_for(static: Static, ctrl, params):
    """The nominal controller, or (``knows_vehicle``) one built on this vehicle's parameters."""
    if not static.knows_vehicle:
        return ctrl
    return ctrl.replace(model=C.ControllerModel.from_params(params),
                        mixer=mixer_params_from(params, layout=ctrl.mixer.layout))


def _saturated(params, command, ctrl_state):
    """Any rotor command at the plant's clamp (ω_min, ω_max, to 10⁻⁴ ω_max), or the
    controller's own mixer report (where it keeps one) cutting any axis."""
    tol = 1e-4 * params.omega_max
    sat = jnp.any((command >= params.omega_max - tol) | (command <= params.omega_min + tol))
    report = _mixer_report(ctrl_state)
    return sat if report is None else sat | jnp.any(report != 0)


def _mixer_report(ctrl_state):
    """The controller's last mixer saturation report (4,), or None for a controller that keeps none."""
    return getattr(ctrl_state, "saturation", None)


def _draws(key, k, n, dtype):
    """Tick k's ``n`` standard-normal draws of one vehicle (the sensors' noise)."""
    return standard_normal(raw_draws(jax.random.fold_in(key, k), n, dtype))


def _flight_stack(static: Static, cp: dict, cs, state, t):
    """The controller the engine flies: the sensors (noise drawn per tick from the vehicle's
    key), then the control law. Its state carries the tick count for the draws."""
    inner, k = cs
    dtype = state.position.dtype
    obs = state
    if static.noise:
        z = _draws(cp["key"], k, 12, dtype)
        obs = observe(state, cp["noise"], z.reshape(4, 3))
    command, inner = _law(static)[0](cp["ctrl"], inner, obs, t)
    return command, (inner, k + 1)


def _gust_series(static: Static, v: dict, xi0, key, dtype):
    """The gust during each tick (T, 3) [m/s]: an OU process stepped every ``gust_every`` ticks
    at the last of them, held in between; it does not depend on the flight, so it travels into
    the engine as the wind input. The draws of every step come from one PRNG call on the
    vehicle's gust key (a key per step, as before, cost 4x as much: 40 ms of a default block's
    194), then the OU recursion runs over the steps alone (not a scan over every tick)."""
    every, T = static.gust_every, static.num_ticks
    steps = -(-T // every)  # gust values held during the mission: the start and steps − 1 updates
    xi = jax.random.normal(key, (steps - 1, 3), dtype)

    def step(g, z):
        g = gust_step(v["gusts"], g, z, every * v["dt"])
        return g, g

    g0 = gust_init(v["gusts"], xi0)
    held = jnp.concatenate([g0[None], jax.lax.scan(step, g0, xi)[1]])
    return jnp.repeat(held, every, axis=0, total_repeat_length=steps * every)[:T]


@pytree_dataclass
class CrashRules(Hook):
    """The sweep's judge, an engine hook: after each tick, the first hit of (a state invariant,
    ground contact while the reference is more than ``clearance`` above the ground, tilt
    beyond ``cos_max_tilt``, tracking error beyond ``max_error`` or not finite) stops the
    vehicle with its :mod:`quadjax.status` code; while it flies, it folds the streaming
    statistics. Its per-tick output is (the error while it flies, −1 once it stopped: the fleet
    histogram's sample; the kept trajectory or None): the trajectory (:data:`KEPT`) is the
    state after the tick (frozen at the state before it once the vehicle stopped), the
    controller's mixer saturation report, the error and whether it flies."""

    reference: Any
    dt: jax.Array
    clearance: jax.Array
    cos_max_tilt: jax.Array
    max_error: jax.Array
    histogram: S.ErrorHistogram = dataclasses.field(metadata=dict(static=True))
    ground_crash: bool = dataclasses.field(metadata=dict(static=True))
    keep: bool = dataclasses.field(metadata=dict(static=True))

    def init(self, params, state0, dt):
        zero = jnp.zeros((), dt.dtype)
        return {"err_sq": zero, "err_max": zero, "cos_tilt_min": zero + 1.0, "samples": jnp.zeros((), jnp.int32),
                "sat_ticks": jnp.zeros((), jnp.int32)}

    def update(self, c, tick):
        params, s1 = tick.params, tick.after
        ref1 = self.reference((tick.k + 1).astype(self.dt.dtype) * self.dt)
        d = [s1.position[i] - ref1.position[i] for i in range(3)]
        error = jnp.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
        qx, qy = s1.attitude[1], s1.attitude[2]
        cos_tilt = 1.0 - 2.0 * (qx * qx + qy * qy)
        ground = (s1.on_ground > 0.5) & (ref1.position[2] - params.ground_z > self.clearance)
        violation = state_violation(params, s1)
        cause = jnp.select(
            [violation != 0, ground & self.ground_crash, ~(cos_tilt >= self.cos_max_tilt), ~(error <= self.max_error)],
            [violation, codes.GROUND, codes.TILT, codes.LOST], 0,
        ).astype(jnp.int32)
        alive = tick.flying & (cause == 0)
        c = {
            "err_sq": jnp.where(alive, c["err_sq"] + error * error, c["err_sq"]),
            "err_max": jnp.where(alive, jnp.maximum(c["err_max"], error), c["err_max"]),
            "cos_tilt_min": jnp.where(alive, jnp.minimum(c["cos_tilt_min"], cos_tilt), c["cos_tilt_min"]),
            "samples": c["samples"] + alive.astype(jnp.int32),
            "sat_ticks": c["sat_ticks"] + (alive & _saturated(params, tick.command, tick.ctrl_state[0])).astype(jnp.int32),
        }
        sample = jnp.where(alive, error, -1.0)  # error >= 0 or NaN: −1 marks "not flying"
        if not self.keep:
            return c, cause, (sample, None)
        shown = jax.tree_util.tree_map(lambda a, b: jnp.where(alive, a, b), s1, tick.before)
        report = _mixer_report(tick.ctrl_state[0])
        report = jnp.zeros(4, jnp.int8) if report is None else jnp.asarray(report).astype(jnp.int8)
        return c, cause, (sample, (shown.position, shown.attitude, shown.body_rates, shown.rotor_speeds,
                                   shown.energy, report, error, alive))


def _draw(static: Static, v: dict, index):
    """Vehicle ``index``'s draws: (its varied parameter fields, made safe and as drawn; its
    initial state; its wind series or None; its tick and sensor keys)."""
    key = jax.random.fold_in(v["key"], index)
    k_params, k_init, k_ticks, k_sense, k_gust = (jax.random.fold_in(key, j) for j in range(5))
    nominal, varied = v["nominal"], static.random.varied_fields
    safe, _ = sample_valid_params(nominal, static.random, v["random"], k_params)
    drawn = sample_params(nominal, static.random, v["random"], k_params)
    safe, drawn = ({f: getattr(p, f) for f in varied} for p in (safe, drawn))
    params = nominal.replace(**safe)
    dtype = params.mass.dtype
    z = standard_normal(raw_draws(k_init, 15, dtype))
    state = initial_state(params, v["ctrl"].reference, v["initial"], z[:12].reshape(4, 3))
    wind = params.wind + _gust_series(static, v, z[12:], k_gust, dtype) if static.gusts else None
    return safe, drawn, state, wind, k_ticks, k_sense


def _flight(static: Static, v: dict, draws):
    """Fly one drawn vehicle through the engine: (what its figures need, its histogram samples
    (T,), its kept trajectory or None). Invalid parameter draws (I1) go to the engine as drawn,
    which stops them at t = 0 (status 6); everything else about them is computed from the
    nominal vehicle."""
    safe, drawn, state0, wind, k_ticks, k_sense = draws
    # only the varied fields are per vehicle: the shared ones stay unbatched constants (the
    # kernel then loads them once per block, and XLA keeps them out of the vector loops)
    params, drawn = v["nominal"].replace(**safe), v["nominal"].replace(**drawn)
    cp = {"ctrl": _controller_for(static, v["ctrl"], params), "noise": v["noise"], "key": k_ticks,
          "sense_key": k_sense}
    rules = CrashRules(reference=v["ctrl"].reference, dt=v["dt"], clearance=v["clearance"],
                       cos_max_tilt=v["cos_max_tilt"], max_error=v["max_error"], histogram=static.histogram,
                       ground_crash=static.ground_crash, keep=static.keep > 0)
    config = SimConfig(integrator=static.stepper, substeps=static.substeps, save_every=1, save=())
    run = simulate(
        drawn, state0, v["dt"], controller=functools.partial(_flight_stack, static), ctrl_params=cp,
        ctrl_state=(_law(static)[1](cp["ctrl"], state0), jnp.zeros((), jnp.int32)),
        num_ticks=static.num_ticks, inputs=Inputs(wind=wind), hooks=(rules,), config=config,
        observe=EKFObserver.create(v["sensors"], cp["sense_key"], v["sigma0"], gravity=params.gravity)
        if static.estimator else None,
    )
    flown = {"stats": run.hooks[0], "final": run.final, "status": run.status, "status_tick": run.status_tick,
             "estimation": estimation_summary(run.observer) if static.estimator else None}
    samples, kept = run.outputs[0]
    return flown, samples, kept


def _figures(static: Static, v: dict, draws, flown) -> dict:
    """One vehicle's outputs from its draws and its flight."""
    params, state0 = v["nominal"].replace(**draws[0]), draws[2]
    dtype = params.mass.dtype
    stats, s, status = flown["stats"], flown["final"], flown["status"]
    end = v["ctrl"].reference(jnp.asarray(static.num_ticks, dtype) * v["dt"]).position
    d = s.position - end
    out = {
        "crash_code": status,
        # ticks flown before the crash (the crash is seen at the end of its tick); 0 for params
        "crash_tick": jnp.where(status == codes.PARAMS_INVALID, 0,
                                jnp.where(flown["status_tick"] >= 0, flown["status_tick"] + 1, -1)).astype(jnp.int32),
        "rms_error": jnp.sqrt(stats["err_sq"] / jnp.maximum(stats["samples"], 1).astype(dtype)),
        "max_error": stats["err_max"],
        "max_tilt": jnp.arccos(jnp.clip(stats["cos_tilt_min"], -1.0, 1.0)),
        "energy": s.energy - state0.energy,
        "saturation_time": stats["sat_ticks"].astype(dtype) * v["dt"],
        "final_error": jnp.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]),
        "samples": stats["samples"],
        "params_ok": status != codes.PARAMS_INVALID,
    }
    if static.estimator:  # beside the tracking error: how well the vehicle knew where it was
        est = flown["estimation"]
        out.update(est_rms_position=est["rms_position"], est_rms_attitude=est["rms_attitude"], est_nees=est["nees"])
    for name in static.random.varied_fields:
        out["param_" + name] = getattr(params, name)
    return out


def fly_vehicle(static: Static, v: dict, index):
    """Vehicle ``index`` of the sweep, drawn and flown through the engine: (its outputs, its
    histogram samples (T,): the tracking error each tick it flies, −1 after; its kept trajectory
    (:data:`KEPT`) or None)."""
    draws = _draw(static, v, index)
    flown, samples, kept = _flight(static, v, draws)
    return _figures(static, v, draws, flown), samples, kept


#: what a kept trajectory holds per tick: (name, trailing shape, dtype; None: the sweep's float
#: dtype, R: the rotor count); the order of :class:`CrashRules`' per-tick output
KEPT = (("position", (3,), None), ("attitude", (4,), None), ("body_rates", (3,), None),
        ("rotor_speeds", ("R",), None), ("energy", (), None), ("saturation", (4,), "int8"),
        ("error", (), None), ("alive", (), "bool"))


def _kept_item_bytes(item: int, rotors: int) -> int:
    """Bytes of one vehicle-tick of a kept trajectory."""
    size = {None: item, "int8": 1, "bool": 1}
    return sum(int(np.prod([rotors if d == "R" else d for d in shape], dtype=np.int64)) * size[dt]
               for _, shape, dt in KEPT)


def run_chunk(static: Static, v: dict, index, valid):
    """Fly the vehicles ``index`` (B,) int32 (``valid`` (B,) bool marks padding) for the whole
    mission. Returns (per-vehicle outputs, histogram counts, kept trajectories (T, K, …))."""
    K = min(static.keep, index.shape[0])
    draws = map_vehicles(functools.partial(_draw, static, v), (index,), (0,))
    # the block's first K lanes keep their trajectories, the rest only their figures: saving
    # every tick of every lane would cost more than their flight (a lane's numbers do not
    # depend on which part of the block it is in, as every block is this same program)
    parts = [map_vehicles(functools.partial(_flight, s, v), (jax.tree_util.tree_map(lambda x: x[lanes], draws),), (0,))
             for s, lanes in ((static, slice(0, K)), (dataclasses.replace(static, keep=0), slice(K, None)))
             if len(range(index.shape[0])[lanes])]
    flown, samples = (jax.tree_util.tree_map(lambda *x: jnp.concatenate(x), *[p[j] for p in parts]) for j in (0, 1))
    kept = parts[0][2] if K else None
    out = map_vehicles(functools.partial(_figures, static, v), (draws, flown), (0, 0))
    bins = jnp.where(valid[:, None] & ~(samples < 0), static.histogram.index(samples), static.histogram.num_bins)
    counts = jnp.zeros(static.histogram.num_bins, jnp.int32).at[bins.ravel()].add(1, mode="drop")
    if kept is None:
        R = v["nominal"].num_rotors
        kept = tuple(jnp.zeros((static.num_ticks, 0) + tuple(R if d == "R" else d for d in shape), dt or v["dt"].dtype)
                     for _, shape, dt in KEPT)
    else:
        kept = tuple(jnp.swapaxes(x[:K], 0, 1) for x in kept)
    return out, counts, kept


_COMPILED: dict = {}


def _compiled(static, values, index, valid, device):
    """The compiled call of one block on ``device`` (its inputs are placed there), compiled once
    per process and device."""
    leaves, tree = jax.tree_util.tree_flatten((values, index, valid))
    key = (static, tree, tuple((x.shape, str(x.dtype)) for x in leaves), device)
    if key not in _COMPILED:
        _COMPILED[key] = jax.jit(functools.partial(run_chunk, static)).lower(values, index, valid).compile()
    return _COMPILED[key]


@dataclasses.dataclass
class SweepResult:
    """A finished sweep: ``summary`` (the figures, JSON-able), ``vehicles`` (per-vehicle arrays
    in index order), ``counts`` (error histogram), ``trajectories`` (kept vehicles: index (K,),
    time (T,) [s], reference (T, 3), and per :data:`KEPT` (K, T, …): position [m], attitude,
    body_rates [rad/s], rotor_speeds [rad/s], energy [J], saturation (the mixer's report),
    error [m], alive),
    ``timings`` [s] and the results folder (None for an in-memory sweep)."""

    config: SweepConfig
    summary: dict
    vehicles: dict
    counts: np.ndarray
    trajectories: dict
    timings: dict
    out_dir: Path | None


def physics_backend(config: SweepConfig, rotors: int) -> tuple[str, str | None]:
    """("native" or "xla", why not native): where the engine (``backend="auto"``) will run this
    sweep's physics, by the rules of :func:`quadjax.simulate` (the tests check the two agree).
    The two backends agree to rounding, not bit for bit: a sweep is one or the other."""
    why = why_not_native(SimConfig(integrator=config.stepper), rotors, config.dtype)
    return ("xla", why) if why else ("native", None)


def sweep_identity(config: SweepConfig, nominal) -> tuple[dict, dict]:
    """(versions, reasons): what a sweep's numbers depend on beyond its config (package
    versions, physics backend, platform, dtype), and why the backend is what it is (for
    the message when a resume would mix backends)."""
    import quadjax

    backend, why = physics_backend(config, nominal.rotor_positions.shape[0])
    versions = {"quadjax": quadjax.__version__, "jax": jax.__version__, "jaxlib": _jaxlib_version(),
                "backend": backend, "platform": jax.default_backend(), "dtype": config.dtype}
    return versions, ({"backend": why} if why else {})


def _jaxlib_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxlib")
    except PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- size budget

#: refused past these unless forced (``run_sweep(force=True)``, ``quadjax sweep --force``):
#: 2e10 vehicle-ticks is about 2 h of flight on a 2-core machine (≈ 330 ns per vehicle-tick)
MAX_VEHICLE_TICKS = 2e10
#: kept trajectories plus per-vehicle arrays, one copy (the chunks and the final files are two on disk)
MAX_RESULTS_BYTES = 2e9
#: per-vehicle outputs of :func:`fly_vehicle` besides the parameters, plus vehicle_index
_PER_VEHICLE_OUTPUTS = 11


def estimate(config: SweepConfig, nominal=None) -> dict:
    """What the sweep will cost, computed before anything is compiled: ``vehicle_ticks``;
    ``results_bytes`` (kept trajectories and per-vehicle arrays, one copy); ``disk_bytes``
    (chunks plus final files); ``memory_bytes`` (the larger of one compiled call, which
    holds every tick of its block's kept outputs and gusts, and the aggregation, which
    holds the results twice)."""
    if nominal is None:
        nominal = presets.get(config.preset)
    item = np.dtype(config.dtype).itemsize
    ticks, vehicles = config.num_ticks, config.vehicles
    per_tick = _kept_item_bytes(item, nominal.num_rotors)  # one vehicle-tick of a kept trajectory
    kept = min(config.keep_trajectories, vehicles) * ticks * per_tick
    params = sum(int(np.size(getattr(nominal, f))) for f in config.random.varied_fields)
    per_vehicle = vehicles * (_PER_VEHICLE_OUTPUTS + 3 * (config.estimator is not None) + params) * 8
    block, devices = min(config.block_size, vehicles), len(jax.local_devices())
    # per device: the kept lanes' outputs; per lane and tick: the histogram's sample and bin, the gust
    in_call = devices * ticks * (min(config.keep_trajectories, block) * per_tick
                                 + block * (item + 4 + (3 * item if config.gusts else 0)))
    results = kept + per_vehicle
    return {"vehicle_ticks": vehicles * ticks, "results_bytes": results, "disk_bytes": 2 * results,
            "memory_bytes": max(in_call, 2 * results)}


def _available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def check_size(config: SweepConfig, nominal=None) -> dict:
    """:func:`estimate`, or a one-line ValueError with the estimate if the sweep is past the
    budget (an absurd size is far more often a typo than a plan)."""
    e = estimate(config, nominal)
    free = _available_memory()
    over = []
    if e["vehicle_ticks"] > MAX_VEHICLE_TICKS:
        over.append(f"{e['vehicle_ticks']:.3g} vehicle-ticks (budget {MAX_VEHICLE_TICKS:.0e})")
    if e["results_bytes"] > MAX_RESULTS_BYTES:
        over.append(f"{_gb(e['results_bytes'])} of results, {_gb(e['disk_bytes'])} on disk "
                    f"(budget {_gb(MAX_RESULTS_BYTES)}; fewer vehicles, a shorter mission or a smaller --keep)")
    if free is not None and e["memory_bytes"] > free:
        over.append(f"{_gb(e['memory_bytes'])} of memory at the peak, {_gb(free)} available "
                    f"(fewer vehicles, a shorter mission, a smaller --block-size or --keep)")
    if over:
        size = f"{config.vehicles} × {config.num_ticks} ticks = {e['vehicle_ticks']:.3g} vehicle-ticks"
        raise ValueError(f"sweep too large ({size}): {'; '.join(over)}; pass --force "
                         f"(run_sweep(force=True)) to run it anyway")
    return e


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


# --------------------------------------------------------------------------- the sweep


def run_sweep(config: SweepConfig, out_dir=None, *, overwrite: bool = False, progress=None,
              plots: bool = True, force: bool = False) -> SweepResult:
    """Run (or resume) the sweep ``config`` describes.

    out_dir: results folder (see :mod:`quadjax.sweep.store`), locked for the run; None keeps
        everything in memory (no resume). progress: optional ``callback(dict)`` after
        compilation, after each chunk (keys: phase, chunk, chunks, chunks_done,
        vehicles_done, vehicles, elapsed_s) and for each damaged chunk found on resume
        (phase "repair", with its reason; without a callback, a RuntimeWarning). force: run
        even past the size budget (:func:`check_size`).
    """
    t_start = time.perf_counter()
    static, values = prepare(config)
    if not force:
        check_size(config, values["nominal"])
    block = min(config.block_size, config.vehicles)
    # a vehicle must sit in the same lane of its block however the sweep is chunked: XLA's
    # CPU code differs between vector-loop lanes and tails, so chunks hold whole blocks
    chunk = -(-min(config.chunk_size, config.vehicles) // block) * block
    if out_dir is None:
        if jax.process_count() > 1:
            raise ValueError("a sweep over several processes needs a results folder every process shares "
                             "(out_dir, --out DIR)")
        return _fly(config, static, values, None, block, chunk, progress, plots, t_start)
    versions, reasons = sweep_identity(config, values["nominal"])
    distributed.agree(json.dumps({"config": config.hash(), **versions}, sort_keys=True),
                      "the sweep (its config hash, package versions, physics backend, platform, dtype)")
    with _open_store(out_dir, config, chunk, overwrite, versions, reasons) as store:
        return _fly(config, static, values, store, block, store.chunk_size, progress, plots, t_start)


def _open_store(out_dir, config, chunk, overwrite, versions, reasons) -> SweepStore:
    """Process 0 opens (or resumes) the results folder and stamps it with this run; then the
    other processes join it. Every step that can fail on one process ends in a collective
    check, so that all of them raise instead of waiting for the one that did."""
    store, error = None, None
    token = np.zeros(_RUN_BYTES, np.int32)
    if jax.process_index() == 0:
        try:
            store = SweepStore.open(out_dir, config=config.resolved, config_hash=config.hash(),
                                    vehicles=config.vehicles, chunk_size=chunk, overwrite=overwrite,
                                    versions=versions, reasons=reasons)
            token = np.frombuffer(secrets.token_bytes(_RUN_BYTES), np.uint8).astype(np.int32)
            store.begin_run(_run_name(token), jax.process_count())
        except (ValueError, OSError) as err:
            if store is not None:
                store.close()
            store, error = None, err
    header = distributed.broadcast(np.concatenate([[error is None and jax.process_index() == 0], token]).astype(np.int32))
    if not header[0]:
        if error is not None:
            raise error
        raise ValueError(f"{out_dir}: process 0 could not open the results folder (its output says why)")
    if store is None:
        try:
            store = SweepStore.join(out_dir, identity=identity_hash(config.hash(), versions), run=_run_name(header[1:]))
        except ValueError as err:
            error = err
    _raise_if_failed(error, "could not join the results folder")
    return store


#: bytes of the random name that tells this run's manifest from any copy of it
_RUN_BYTES = 8


def _run_name(token) -> str:
    return bytes(np.asarray(token, np.uint8)).hex()


def _raise_if_failed(error: BaseException | None, doing: str) -> None:
    """Every process learns whether any failed at this point: the one that did raises its own
    error, the others a ValueError naming it."""
    bad = distributed.failed(error is None)
    if error is not None:
        raise error
    if bad:
        raise ValueError(f"process(es) {', '.join(map(str, bad))} {doing} (their output says why); "
                         f"rerun the same command on every process to resume")


def _report_damaged(store: SweepStore, report, progress) -> None:
    for i, why in store.damaged:
        note = f"{store.chunk_path(i)}: damaged ({why}); flying it again"
        if progress is None:
            warnings.warn(f"quadjax sweep: {note}", RuntimeWarning, stacklevel=3)
        report({"phase": "repair", "chunk": i + 1, "chunks": store.num_chunks, "reason": why, "note": note})


def _chunks_done(store, num_chunks: int, report, progress) -> set:
    """The chunks already on disk: process 0 verifies the folder (removing damaged chunks) and
    tells the others, which must not read it while it does."""
    mask = np.zeros(num_chunks, np.int32)
    if store is not None and store.primary:
        mask[store.completed()] = 1
        _report_damaged(store, report, progress)
    return set(np.flatnonzero(distributed.broadcast(mask)).tolist()) if store is not None else set()


def _fly(config, static, values, store, block, chunk, progress, plots, t_start) -> SweepResult:
    """Fly this process's share of the chunks not yet done (all of them, in memory, when there
    is no store), then aggregate and write."""
    num_chunks = -(-config.vehicles // chunk)
    count = jax.process_count()
    report = progress or (lambda event: None)
    done = _chunks_done(store, num_chunks, report, progress)
    todo = distributed.share([i for i in range(num_chunks) if i not in done])
    memory: dict = {}
    devices = jax.local_devices()
    timings = {"compile_s": 0.0, "flight_s": 0.0}
    error = None
    try:
        _fly_chunks(config, static, values, store, memory, block, chunk, todo, done, devices, timings, report, t_start)
    except Exception as err:  # the others must hear of it rather than wait for this process
        error = err
    _raise_if_failed(error, "failed while flying their chunks")
    if count > 1:
        _gather_timings(timings, len(todo), _vehicles_in(todo, chunk, config.vehicles))
    missing = np.zeros(1, np.int32)
    if store is not None and store.primary:
        missing[0] = sum(not store.chunk_path(i).exists() for i in range(num_chunks))
    missing = int(distributed.broadcast(missing)[0])
    if missing:
        raise ValueError(f"{store.root}: {missing} chunk files missing after every "
                         f"process finished: every process needs the same results folder (a shared file system)")
    chunks = (store.read_chunk(i) if store else memory[i] for i in range(num_chunks))
    result = _aggregate(config, chunks, timings)
    timings["total_s"] = time.perf_counter() - t_start
    result.summary["timings_s"] = dict(timings)
    if store:
        result.out_dir = store.root
        if store.primary:
            _write_outputs(store, result, plots, {"timings_s": timings, "devices": len(devices), "processes": count})
    return result


def _fly_chunks(config, static, values, store, memory, block, chunk, todo, done, devices, timings, report, t_start):
    """Fly the chunks ``todo`` on this process's devices: one block per call, each device
    driven by its own thread (:func:`_lanes`), the chunks written in order."""
    num_chunks = -(-config.vehicles // chunk)
    base = {"chunks": num_chunks, "vehicles": config.vehicles, "process": jax.process_index(),
            "processes": jax.process_count()}
    if not todo:
        return
    t0 = time.perf_counter()
    lanes = _lanes(static, values, block, devices)
    timings["compile_s"] = time.perf_counter() - t0
    report({**base, "phase": "compiled", "chunk": 0, "chunks_done": len(done),
            "vehicles_done": _vehicles_in(done, chunk, config.vehicles), "share": len(todo),
            "elapsed_s": time.perf_counter() - t_start, "compile_s": timings["compile_s"], "devices": len(devices)})
    bounds = {i: (i * chunk, min((i + 1) * chunk, config.vehicles)) for i in todo}
    calls = [(start, bounds[i][1]) for i in todo for start in range(bounds[i][0], bounds[i][1], block)]
    free = queue.SimpleQueue()
    for lane in lanes:
        free.put(lane)

    def fly(start, end):
        lane = free.get()  # whichever device is idle
        try:
            return lane.fly(start, end, block)
        finally:
            free.put(lane)

    done = set(done)
    t0, writing = time.perf_counter(), 0.0
    pool = ThreadPoolExecutor(len(lanes), thread_name_prefix="quadjax-sweep")
    try:
        results = _in_order(pool, fly, calls, window=2 * len(lanes))
        for flown, i in enumerate(todo, 1):
            first, end = bounds[i]
            arrays = _chunk_arrays(first, end, config, [next(results) for _ in range(first, end, block)])
            t_write = time.perf_counter()
            if store:
                store.write_chunk(i, arrays)
            else:
                memory[i] = arrays
            writing += time.perf_counter() - t_write
            done.add(i)
            report({**base, "phase": "chunk", "chunk": i + 1, "chunks_done": len(done), "flown": flown,
                    "share": len(todo), "vehicles_done": _vehicles_in(done, chunk, config.vehicles),
                    "elapsed_s": time.perf_counter() - t_start})
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # an interrupted sweep waits only for the calls running
    timings["flight_s"] = time.perf_counter() - t0 - writing


@dataclasses.dataclass
class _Lane:
    """One local device: the sweep's values placed on it and the block program compiled for it."""

    values: Any
    device: Any
    compiled: Any

    def fly(self, start: int, end: int, block: int):
        """Vehicles start … start + block − 1 (those ≥ end are padding), as numpy."""
        return jax.device_get(self.compiled(self.values, *_call_inputs(start, end, block, self.device)))


def _lanes(static, values, block: int, devices) -> list[_Lane]:
    """A lane per device. One program over all the devices would run their blocks one after
    another on the CPU (measured: two forced devices flew the default sweep no faster than one);
    a program per device, each called from its own thread, runs them side by side, and every
    device runs the same per-block program, so a vehicle's bits do not depend on which one
    flew it. The programs compile in parallel (XLA compiles on the calling thread)."""

    def build(device):
        placed = jax.device_put(values, device)
        return _Lane(placed, device, _compiled(static, placed, *_call_inputs(0, 1, block, device), device))

    with ThreadPoolExecutor(len(devices), thread_name_prefix="quadjax-compile") as pool:
        return list(pool.map(build, devices))


def _in_order(pool, fn, items, window: int):
    """``fn(*item)`` for each item on ``pool``, at most ``window`` in flight, yielded in order."""
    pending: collections.deque = collections.deque()
    for item in items:
        pending.append(pool.submit(fn, *item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _gather_timings(timings: dict, chunks: int, vehicles: int) -> None:
    """Every process's compile and flight time, chunks and vehicles: the job's flight time is
    the slowest process's."""
    rows = distributed.gather(np.asarray([timings["compile_s"], timings["flight_s"], chunks, vehicles], np.float64))
    timings["processes"] = [{"process": i, "compile_s": float(r[0]), "flight_s": float(r[1]), "chunks": int(r[2]),
                             "vehicles": int(r[3])} for i, r in enumerate(rows)]
    timings["compile_s"] = float(rows[:, 0].max())
    timings["flight_s"] = float(rows[:, 1].max())


def _vehicles_in(done, chunk, vehicles) -> int:
    return sum(min(chunk, vehicles - i * chunk) for i in done)


def _write_outputs(store: SweepStore, result: SweepResult, plots: bool, extra: dict) -> None:
    """The final files; the manifest lists the plots, so that --overwrite removes only those."""
    write_npz(store.root / "vehicles.npz", result.vehicles)
    write_npz(store.root / "trajectories.npz", result.trajectories)
    written = set(store.manifest.get("plots") or [])  # an earlier run's plots are still the sweep's
    if plots:
        from quadjax.sweep.plots import save_plots

        from quadjax.player import sweep_trace, write_page

        pages = save_plots(result, store.root / "plots")
        if len(result.trajectories["index"]):
            pages.append(write_page(sweep_trace(result), store.root / "plots" / "player.html"))
        written |= {Path(p).relative_to(store.root).as_posix() for p in pages}
    store.finish(result.summary, {**extra, "plots": sorted(written)})


def _call_inputs(start, end, size, device):
    """Vehicle indices start … start + size − 1 of one call, on ``device``; ``valid`` masks those
    ≥ end (they are computed, as real vehicles of the next chunk would be, and dropped)."""
    index = np.arange(start, start + size, dtype=np.int32)
    return jax.device_put(index, device), jax.device_put(index < end, device)


def _chunk_arrays(first, end, config, calls):
    """What a chunk file holds: its vehicles' outputs, histogram counts and kept trajectories."""
    n = end - first
    outs = [c[0] for c in calls]
    arrays = {"vehicle_index": np.arange(first, end, dtype=np.int64),
              "counts": np.sum([np.asarray(c[1], np.int64) for c in calls], axis=0)}
    arrays.update({k: np.concatenate([np.asarray(o[k]) for o in outs])[:n] for k in outs[0]})
    # kept rows: per call, the first K of its block (T, K, …); keep those with index < K
    kept = {"index": [], **{name: [] for name, _, _ in KEPT}}
    block = len(np.asarray(outs[0]["crash_code"]))
    for j, (_, _, series) in enumerate(calls):
        start = first + j * block
        rows = max(0, min(config.keep_trajectories - start, end - start, series[0].shape[1]))
        kept["index"].append(np.arange(start, start + rows, dtype=np.int64))
        for (name, _, _), x in zip(KEPT, series):
            kept[name].append(np.swapaxes(np.asarray(x)[:, :rows], 0, 1))
    arrays.update({"kept_" + k: np.concatenate(v) for k, v in kept.items()})
    return arrays


def _aggregate(config: SweepConfig, chunks, timings) -> SweepResult:
    """Concatenate the chunks in index order and compute the summary."""
    per_vehicle: dict = {}
    kept: dict = {"index": [], **{name: [] for name, _, _ in KEPT}}
    counts = np.zeros(config.histogram.num_bins, np.int64)
    for arrays in chunks:
        counts += arrays["counts"].astype(np.int64)
        for k, x in arrays.items():
            if k == "counts":
                continue
            if k.startswith("kept_"):
                kept[k[5:]].append(x)
            else:
                per_vehicle.setdefault(k, []).append(x)
    vehicles = {k: np.concatenate(v) for k, v in per_vehicle.items()}
    dtype = np.dtype(config.dtype)
    # as in the scan: (k + 1) converted to the dtype, times dt in the dtype
    time_s = np.arange(1, config.num_ticks + 1).astype(dtype) * dtype.type(config.control_dt)
    reference = make_reference(config.trajectory, config.duration, dtype)
    ref_pos = np.asarray(jax.jit(jax.vmap(reference))(jnp.asarray(time_s)).position)  # one compile, not one per op
    trajectories = {"index": np.concatenate(kept["index"]), "time": time_s, "reference": ref_pos,
                    **{name: np.concatenate(kept[name]) for name, _, _ in KEPT}}
    summary = S.summarise(vehicles, counts, config.histogram, config.control_dt, config.num_ticks)
    return SweepResult(config=config, summary=summary, vehicles=vehicles, counts=counts,
                       trajectories=trajectories, timings=timings, out_dir=None)
