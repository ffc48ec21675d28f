"""Traces from what quadjax produces: an engine Trajectory, a sweep, a monitor repro file, a flight
log, and a system-identification validation (predicted against measured)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from quadjax import presets
from quadjax import status as codes
from quadjax.engine import Hook, Trajectory, vehicle_axes
from quadjax.params import QuadParams
from quadjax.player.page import Event, Trace, Track
from quadjax.quadrotor import effective_rotor_speeds, rotor_thrusts
from quadjax.state import QuadState


@dataclasses.dataclass(frozen=True)
class MixerReport(Hook):
    """An engine hook whose per-tick output is the controller's mixer saturation report (4,)
    (roll, pitch, yaw, collective ∈ {−1, 0, +1}; zeros for a controller that keeps none).
    Pass ``hooks=(MixerReport(),)`` to :func:`quadjax.simulate` and the Trajectory's
    ``outputs[i]`` to :func:`trajectory_trace` as ``saturation=``."""

    def update(self, carry, tick):
        report = getattr(tick.ctrl_state, "saturation", None)
        report = jnp.zeros(4, jnp.int32) if report is None else jnp.asarray(report).astype(jnp.int32)
        return carry, jnp.zeros((), jnp.int32), report


def _single_ndims() -> dict:
    p = presets.rp1()
    return {f.name: np.ndim(getattr(p, f.name)) for f in dataclasses.fields(p)}


def _vehicle_params(params: QuadParams, i: int, batch: tuple) -> QuadParams:
    """Vehicle ``i`` (flat index over ``batch``) of params that are per vehicle where a leaf
    has the batch axes, shared where not."""
    base = _single_ndims()
    out = {}
    for f in dataclasses.fields(params):
        x = np.asarray(getattr(params, f.name))
        if x.ndim > base[f.name]:
            x = x.reshape((-1,) + x.shape[x.ndim - base[f.name]:])[i]
        out[f.name] = x
    return params.replace(**out)


@jax.jit
def _thrusts(params: QuadParams, rotor_speeds, energy, commands):
    speeds = rotor_speeds if commands is None else effective_rotor_speeds(params, rotor_speeds, commands)
    return rotor_thrusts(params, speeds, energy)


def _thrust(params: QuadParams, rotor_speeds, energy, commands=None) -> np.ndarray:
    """Tᵢ [N] of each sample by the model's own functions (battery sag included); jitted, so that
    a trace of many samples is one call, not one per operation."""
    return np.asarray(jax.jit(_thrusts)(params, np.asarray(rotor_speeds), np.asarray(energy),
                                        None if commands is None else np.asarray(commands)))


def _hover_thrust(params: QuadParams) -> float:
    from quadjax.model import hover_thrusts

    return float(np.mean(np.asarray(jax.jit(hover_thrusts)(params))))  # one compile, not one per op


def _ground_events(on_ground, times, track: int | None) -> list[Event]:
    """touch-down / lift-off where the ground flag changes between two samples."""
    g = np.asarray(on_ground) > 0.5
    out = []
    for k in np.flatnonzero(g[1:] != g[:-1]) + 1:
        out.append(Event(float(times[k]), "touch-down" if g[k] else "lift-off", track))
    return out


def _flat(x, batch):
    x = np.asarray(x)
    return x.reshape((int(np.prod(batch, dtype=np.int64)),) + x.shape[len(batch):])


def trajectory_trace(run: Trajectory, params: QuadParams, dt: float, *, state0=None, saturation=None,
                     reference=None, events: Sequence[Event] = (), names: Sequence[str] | None = None,
                     title: str = "quadjax simulation", description: Sequence[str] = ()) -> Trace:
    """The trace of an engine run (one vehicle, or a batch: one track per vehicle).

    ``dt``: the tick given to :func:`quadjax.simulate` [s]; the saved states sit after ticks
    ``save_every − 1, 2·save_every − 1, …``, so sample j is at (j + 1)·save_every·dt.
    ``state0`` (optional, the start state, shared or per vehicle) is prepended at t = 0.
    ``saturation``: the :class:`MixerReport` hook's output. ``reference`` (T, 3): a path drawn
    beside the flight. Events: where the monitor stopped a vehicle (its description), where
    any other status code stopped it, touch-downs and lift-offs, and the caller's ``events``.
    The 3-D view draws every vehicle with vehicle 0's rotor layout; the thrusts are each
    vehicle's own (``params`` per vehicle where a leaf has the batch axes).
    """
    if not isinstance(run, Trajectory):
        raise ValueError(f"trajectory_trace: expected a quadjax Trajectory, got {type(run).__name__}")
    if run.states is None:
        raise ValueError("trajectory_trace: the Trajectory has no saved quadrotor states; simulate with "
                         "SimConfig(save_every >= 1) and 'state' in SimConfig.save")
    if not isinstance(run.states, QuadState):
        raise ValueError(f"trajectory_trace: this run's states are {type(run.states).__name__}, not QuadState "
                         "(another quadjax.Vehicle); build a quadjax.player.Trace of Tracks from them")
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"trajectory_trace: dt={dt!r}, expected the tick length [s] > 0")
    batch = np.shape(run.status)
    n = int(np.prod(batch, dtype=np.int64))
    every = run.config.save_every
    states = jax.tree_util.tree_map(lambda x: _flat(x, batch), run.states)
    commands = None if run.commands is None else _flat(run.commands, batch)
    sat = None if saturation is None else _flat(saturation, batch).astype(np.int32)
    T = states.position.shape[1]
    step = every * float(dt)
    times = step * np.arange(1, T + 1)
    if state0 is not None:
        s0 = jax.tree_util.tree_map(lambda x, ref: np.broadcast_to(np.asarray(x), (n,) + ref.shape[2:]),
                                    state0, states)
        states = jax.tree_util.tree_map(lambda a, b: np.concatenate([a[:, None], b], axis=1), s0, states)
        if commands is not None:
            commands = np.concatenate([commands[:, :1], commands], axis=1)
        if sat is not None:
            sat = np.concatenate([np.zeros_like(sat[:, :1]), sat], axis=1)
        times = np.concatenate([[0.0], times])
    if names is not None and len(names) != n:
        raise ValueError(f"trajectory_trace: {len(names)} names for {n} vehicles")
    status, status_tick = _flat(run.status, batch), _flat(run.status_tick, batch)
    found = [] if run.report is None else _monitor_lines(run, params, batch)
    tracks, evs = [], list(events)
    for i in range(n):
        p = _vehicle_params(params, i, batch)
        s = jax.tree_util.tree_map(lambda x: x[i], states)
        thrust = _thrust(p, s.rotor_speeds, s.energy, None if commands is None else commands[i])
        name = names[i] if names is not None else ("vehicle" if n == 1 else f"vehicle {i}")
        tracks.append(Track(name=name, position=s.position, attitude=s.attitude, body_rates=s.body_rates,
                            rotor_speeds=s.rotor_speeds, commands=None if commands is None else commands[i],
                            thrust=thrust, saturation=None if sat is None else sat[i]))
        track = None if n == 1 else i
        evs += _ground_events(s.on_ground, times, track)
        if int(status[i]):
            k = int(status_tick[i])
            label = found[i] if found and found[i] else f"stopped: {codes.describe_code(int(status[i]))} in tick {k}"
            evs.append(Event(float(k) * float(dt), label, track))
    ref = None if reference is None else np.asarray(reference, np.float64)
    if ref is not None and state0 is not None and ref.shape[0] == T:
        ref = np.concatenate([ref[:1], ref])
    shared = _vehicle_params(params, 0, batch)
    return Trace(tracks=tracks, dt=step, t0=float(times[0]), title=title, kind="trajectory",
                 description=list(description), events=evs, reference=ref, ground_z=float(np.min(params.ground_z)),
                 rotor_positions=np.asarray(shared.rotor_positions), rotor_spins=np.asarray(shared.rotor_spins),
                 hover_thrust=_hover_thrust(shared))


def _monitor_lines(run: Trajectory, params: QuadParams, batch) -> list[str]:
    """Per vehicle, "monitor: I5 below_ground before step 800: …" where the monitor stopped it."""
    from quadjax.monitor import describe

    code = _flat(run.report.code, batch)
    lines = []
    for i in range(len(code)):
        if not int(code[i]):
            lines.append("")
            continue
        report = jax.tree_util.tree_map(lambda x: _flat(x, batch)[i], run.report)
        lines.append("monitor: " + describe(report, _vehicle_params(params, i, batch)))
    return lines


# --------------------------------------------------------------------------- sweeps


def _load_sweep(source):
    """(config, trajectories dict, vehicles dict) of a SweepResult or a sweep's results folder."""
    from quadjax.sweep.config import from_dict

    if hasattr(source, "trajectories") and hasattr(source, "vehicles"):
        return source.config, source.trajectories, source.vehicles
    root = Path(source)
    files = [root / "manifest.json", root / "trajectories.npz", root / "vehicles.npz"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{root}: not a finished sweep's folder (missing {', '.join(missing)})")
    manifest = json.loads(files[0].read_text())
    from quadjax.sweep.store import FORMAT

    if manifest.get("format") != FORMAT:
        raise ValueError(f"{root}: a sweep of format {manifest.get('format')!r}; this quadjax reads {FORMAT!r} "
                         "(run the sweep again)")
    with np.load(files[1]) as z:
        trajectories = {k: z[k] for k in z.files}
    with np.load(files[2]) as z:
        vehicles = {k: z[k] for k in z.files}
    return from_dict(manifest["config"]), trajectories, vehicles


def sweep_trace(source, *, title: str | None = None) -> Trace:
    """The trace of a sweep's kept vehicles (a :class:`quadjax.sweep.SweepResult` or its results
    folder): every kept vehicle at once over the reference, its crash marked."""
    config, tr, vehicles = _load_sweep(source)
    index = np.asarray(tr["index"])
    if index.size == 0:
        raise ValueError("sweep_trace: the sweep kept no trajectories (keep_trajectories = 0)")
    if "attitude" not in tr:
        raise ValueError("sweep_trace: these kept trajectories hold positions only (an older sweep); run it again")
    nominal = presets.get(config.preset)
    order = {int(v): k for k, v in enumerate(np.asarray(vehicles["vehicle_index"]))}
    rows = np.array([order[int(v)] for v in index])
    time = np.asarray(tr["time"], np.float64)
    # every kept vehicle's thrusts in one call, each with its own drawn parameters
    varied = config.random.varied_fields
    drawn = nominal.replace(**{f: jnp.asarray(vehicles["param_" + f][rows]) for f in varied})
    each = jax.jit(jax.vmap(_thrusts, in_axes=(vehicle_axes(drawn, *varied), 0, 0, None)))  # one compile, not one per op
    thrusts = np.asarray(each(drawn, jnp.asarray(tr["rotor_speeds"]), jnp.asarray(tr["energy"]), None))
    tracks, events = [], []
    for j, (v, row) in enumerate(zip(index, rows)):
        tracks.append(Track(name=f"vehicle {int(v)}", position=tr["position"][j], attitude=tr["attitude"][j],
                            body_rates=tr["body_rates"][j], rotor_speeds=tr["rotor_speeds"][j], thrust=thrusts[j],
                            saturation=tr["saturation"][j], error=tr["error"][j]))
        code, ticks = int(vehicles["crash_code"][row]), int(vehicles["crash_tick"][row])
        if code:
            # the crash is seen at the end of tick crash_tick − 1; invalid params never fly (t = 0)
            events.append(Event(ticks * config.control_dt, f"vehicle {int(v)}: {codes.describe_code(code)}"
                                + (" (never flew)" if code == codes.PARAMS_INVALID else ""), j))
    crashed = len(events)
    desc = [f"{config.vehicles} × {config.preset} on {config.trajectory.get('kind', 'a reference')}, "
            f"{config.duration:g} s, {config.controller} at {1 / config.control_dt:g} Hz; "
            f"{len(index)} kept vehicles shown, {crashed} of them crashed."]
    return Trace(tracks=tracks, dt=config.control_dt, t0=float(time[0]), kind="sweep",
                 title=title or f"sweep: {len(index)} of {config.vehicles} vehicles", description=desc,
                 events=events, reference=np.asarray(tr["reference"], np.float64), ground_z=float(nominal.ground_z),
                 rotor_positions=np.asarray(nominal.rotor_positions), rotor_spins=np.asarray(nominal.rotor_spins),
                 hover_thrust=_hover_thrust(nominal))


# --------------------------------------------------------------------------- repro files


def repro_trace(path, *, title: str | None = None) -> Trace:
    """The trace of a monitor repro file (:func:`quadjax.monitor.write_repro`): the flight that
    led to the violation where the file holds it (``history=True``), else the one recorded step
    (the state going in and what it produced), with the violation marked."""
    from quadjax.monitor import load_history, load_repro

    meta, params, state, command, dt, _, _, after = load_repro(path)
    history = load_history(path)
    h = float(dt)
    k = int(meta["tick"])
    if history is not None:  # the saved states, then the state the step was about to take at k·h
        states, step = history
        if abs(states.position.shape[0] * step - k * h) <= 1e-9 * max(1.0, k * h):
            # the last sample, the state after tick k − 1, is replaced by what the step was about to
            # take (after the caller's edit); a violation after the step adds what it produced
            states = jax.tree_util.tree_map(lambda x, s: np.concatenate([x[:-1], np.asarray(s)[None]]), states, state)
            if meta["phase"] == "after" and step == h:
                states = jax.tree_util.tree_map(lambda x, a: np.concatenate([x, np.asarray(a)[None]]), states, after)
        times = step * np.arange(1, states.position.shape[0] + 1)
    else:  # the state going into tick k, and what the step made of it
        states = jax.tree_util.tree_map(lambda a, b: np.stack([np.asarray(a), np.asarray(b)]), state, after)
        step, times = h, np.array([k * h, (k + 1) * h])
    thrust = _thrust(params, states.rotor_speeds, states.energy)
    track = Track(name=f"vehicle {meta['vehicle']}" if meta.get("vehicle") is not None else "vehicle",
                  position=states.position, attitude=states.attitude, body_rates=states.body_rates,
                  rotor_speeds=states.rotor_speeds, thrust=thrust)
    events = _ground_events(states.on_ground, times, None)
    events.append(Event((k if meta["phase"] == "before" else k + 1) * h, "monitor: " + meta["description"], None))
    desc = [f"repro file {Path(path).name}: {meta['description']}",
            f"recorded on the {meta['backend']} backend, {meta['step']} × {meta['substeps']}, {meta['dtype']}; "
            "replay it with quadjax.monitor.replay."]
    return Trace(tracks=[track], dt=step, t0=float(times[0]), kind="repro", title=title or f"repro: {meta['invariant']}",
                 description=desc, events=events, ground_z=float(params.ground_z),
                 rotor_positions=np.asarray(params.rotor_positions), rotor_spins=np.asarray(params.rotor_spins),
                 hover_thrust=_hover_thrust(params))


# --------------------------------------------------------------------------- flight logs and sysid


def _log_track(log, name, params):
    thrust = None
    if params is not None and log.rotor_speeds is not None:
        thrust = _thrust(params, log.rotor_speeds, np.zeros(len(log)))
    return Track(name=name, position=log.position, attitude=log.attitude, body_rates=log.body_rates,
                 rotor_speeds=log.rotor_speeds, thrust=thrust, role="measured")


def _layout(params):
    if params is None:
        return {}
    return {"rotor_positions": np.asarray(params.rotor_positions), "rotor_spins": np.asarray(params.rotor_spins),
            "hover_thrust": _hover_thrust(params), "ground_z": float(params.ground_z)}


def log_trace(log, params: QuadParams | None = None, *, title: str | None = None) -> Trace:
    """The trace of a flight log (:class:`quadjax.logs.FlightLog`); ``params`` (optional) give the
    rotor layout and the thrust arrows (k_f ω², full battery: a log has no energy state)."""
    from quadjax.logs import FlightLog

    if not isinstance(log, FlightLog):
        raise ValueError(f"log_trace: expected a quadjax.logs.FlightLog, got {type(log).__name__}")
    desc = [f"flight log {log.name}: {len(log)} samples at {1 / log.dt:g} Hz ({len(log) * log.dt:.1f} s)"]
    if log.stale is not None and np.any(log.stale):
        desc.append(f"{int(np.sum(log.stale))} stale rows (a dropped packet filled by resampling).")
    return Trace(tracks=[_log_track(log, log.name, params)], dt=log.dt, t0=float(log.t[0]), kind="log",
                 title=title or f"log: {log.name}", description=desc, **_layout(params))


def validation_trace(log, params: QuadParams, *, motor_map=None, inputs: str = "rotor_speeds", horizon: int = 50,
                     title: str | None = None) -> Trace:
    """Predicted against measured: the model ``params`` flown open loop from the measured state
    every ``horizon`` samples (the protocol of :mod:`quadjax.sysid.validation`, one start per
    window), on the log's measured inputs. The prediction's error is the tracking error panel."""
    from quadjax.sysid.motor import MotorMap
    from quadjax.sysid.objective import predict
    from quadjax.sysid.windows import make_windows

    dtype = np.asarray(params.mass).dtype
    windows = make_windows(log, horizon, stride=horizon, inputs=inputs, mask_stale=False, dtype=dtype)
    mm = motor_map if motor_map is not None else MotorMap.identity(params.num_rotors, dtype=dtype)
    pred = jax.jit(jax.vmap(lambda w: predict(params, mm, w.state0, w.inputs, log.dt, mode=inputs,
                                              rotor0_known=w.rotor0_known)))(windows)
    W, H = windows.num_windows, windows.horizon
    T = len(log)
    rows = (np.arange(W)[:, None] * horizon + np.arange(1, H + 1)[None, :]).ravel()

    def placed(x, start):  # predicted rows on the log's grid; each window starts at the measurement
        out = np.full((T,) + np.shape(x)[2:], np.nan)
        out[rows] = np.asarray(x).reshape((W * H,) + np.shape(x)[2:])
        out[np.arange(W) * horizon] = np.asarray(start)
        return out

    s = jax.tree_util.tree_map(placed, pred, windows.state0)
    track_p = Track(name=f"{log.name} (predicted)", position=s.position, attitude=s.attitude, body_rates=s.body_rates,
                    rotor_speeds=s.rotor_speeds, thrust=_thrust(params, s.rotor_speeds, s.energy),
                    error=np.linalg.norm(s.position - log.position, axis=1), role="predicted", of=0)
    measured = _log_track(log, log.name, params)
    covered = W * horizon
    desc = [f"{log.name}: the model predicts {horizon} samples ({horizon * log.dt:g} s) open loop from the measured "
            f"state at every {horizon}-th sample ({W} windows), on the measured {inputs.replace('_', ' ')}.",
            "Dashed: predicted; solid: measured. Tracking error: ‖p̂ − p‖ [m]."
            + (f" Samples after {covered} are not predicted." if covered < T - 1 else "")]
    return Trace(tracks=[measured, track_p], dt=log.dt, t0=float(log.t[0]), kind="validation",
                 title=title or f"validation: {log.name}", description=desc, **_layout(params))
