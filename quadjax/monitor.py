"""Invariant monitor (seed 000's planned BB-D2): checked rollouts, repro files, replay.

A checked rollout tests every vehicle's state against the invariants
(:func:`quadjax.state_violation`, I2–I5; I1 :func:`quadjax.params_valid` once at
the start) around every step:

* before the step, on the state the step is about to take — after the caller's
  ``edit`` (the code that touches the state between steps, the usual culprit:
  seed 000's altimeter correction applied every 0.1 s) — phase ``BEFORE_STEP``;
* after the step, on what the step produced from a valid state (a bad command, bad
  parameters, a model bug) — phase ``AFTER_STEP``.

The first violation of each vehicle is recorded in a :class:`MonitorReport` (the
command index, the code, the phase, the state going into the step, its command and
inputs, what the step produced) and that vehicle is frozen at its last valid state:
it is not stepped again and its invalid values never reach the saved states. Other
vehicles are untouched (everything is per vehicle under ``vmap``). Nothing stops:
inspect the report after the run, :func:`describe` a violation in words, write a
:func:`write_repro` file, and :func:`replay` it later, which re-runs that one step
bit for bit.

Example (the seed-000 scenario)::

    def altimeter_fix(state, k):                     # caller code under suspicion
        due = (k % 100 == 0) & (k > 0)
        return state.replace(position=state.position.at[2].add(jnp.where(due, -0.02, 0.0)))

    final, states, report = jax.jit(lambda s: rollout_checked(p, s, u, 1e-3, edit=altimeter_fix))(s0)
    print(describe(report, p))     # I5 below_ground before step 800: position.z = -0.02 m < ground_z = 0 m
    write_repro("bug.npz", report, p, 1e-3)
    assert replay("bug.npz").reproduced
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._components import join, join_state, split, split_state
from quadjax._pytree import pytree_dataclass
from quadjax.integrators import STEPPERS, rk4_step
from quadjax.invariants import INVARIANT_IDS, state_violation
from quadjax.params import QuadParams, params_valid
from quadjax.rollout import (
    _check_options,
    _drive,
    _hold,
    _series,
    _setup,
    _split_series,
    _stepper,
    _with_inputs,
    map_vehicles,
)
from quadjax.state import QuadState

#: violation codes of the monitor: the state invariants' codes, then I1
PARAMS_INVALID = len(INVARIANT_IDS)
MONITOR_IDS = INVARIANT_IDS + ("params_invalid",)
#: the seed's invariant number of each code
INVARIANT_NUMBERS = ("", "I4", "I2", "I3", "I3", "I5", "I1")
#: phase of a violation: found on the state going into a step, or on the step's output
BEFORE_STEP, AFTER_STEP = 0, 1
_PHASES = ("before", "after")


@pytree_dataclass
class MonitorReport:
    """First violation per vehicle (leading batch axes when batched).

    Fields:
        tick: () int32, index of the command (open loop) or controller tick at which it
            was found; −1 where none.
        code: () int32, :data:`MONITOR_IDS` code; 0 where none.
        phase: () int32, :data:`BEFORE_STEP` or :data:`AFTER_STEP`; −1 where none.
        state: QuadState, the state going into that step (after the caller's edit).
        command: (R,) the command of that step [rad/s].
        after: QuadState, what the step produced (equal to ``state`` for BEFORE_STEP).
        wind: (3,) the wind of that step [m/s] (world), or None if not an input.
        wrench: (6,) the external body wrench of that step, or None if not an input.
        constant: (F + 1,) bool, which params fields (in field order) and dt were
            compile-time constants of the run (closed over, not traced): replay
            compiles them the same way, for the same bits.
    """

    tick: jax.Array
    code: jax.Array
    phase: jax.Array
    state: QuadState
    command: jax.Array
    after: QuadState
    wind: jax.Array | None
    wrench: jax.Array | None
    constant: jax.Array

    def broken(self) -> np.ndarray:
        """Indices (into the flattened batch) of the vehicles with a violation."""
        return np.flatnonzero(np.asarray(self.code).reshape(-1) != 0)


def _first(report: MonitorReport, new: MonitorReport, take):
    """Fields of ``new`` where ``take`` (per vehicle, bool), else of ``report``."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(_expand(take, a), b, a), report, new)


def _expand(flag, x):
    return jnp.reshape(flag, jnp.shape(flag) + (1,) * (jnp.ndim(x) - jnp.ndim(flag)))


def _checked(
    params, state0, num_ticks, dt, command_fn, ctrl0, *, substeps, step, edit, save_every,
    wind, wrench, inputs=None,
):
    """Shared engine of the checked rollouts: ``command_fn(ctrl, state, k, inputs_k) -> (command, ctrl)``."""
    constant = jnp.asarray([not isinstance(x, jax.core.Tracer) for x in _const_probe(params, dt)])
    P, S, dt, dtype = _setup(params, state0, dt)
    params = params.astype(dtype)
    _check_options(substeps, save_every, num_ticks, None)
    step_c = _stepper(step)
    R = len(S.rotor_speeds)
    xs = (
        jnp.arange(num_ticks),
        _split_series(_series("wind", wind, num_ticks, 3, dtype)),
        _split_series(_series("wrench", wrench, num_ticks, 6, dtype)),
        inputs,
    )
    h = dt / substeps
    s0 = join_state(S)
    ok_params = params_valid(params)
    report0 = MonitorReport(
        tick=jnp.where(ok_params, -1, 0).astype(jnp.int32),
        code=jnp.where(ok_params, 0, PARAMS_INVALID).astype(jnp.int32),
        phase=jnp.where(ok_params, -1, BEFORE_STEP).astype(jnp.int32),
        state=s0,
        command=jnp.zeros((R,), dtype),
        after=s0,
        wind=None if wind is None else jnp.zeros((3,), dtype),
        wrench=None if wrench is None else jnp.zeros((6,), dtype),
        constant=constant,
    )

    def tick(carry, x):
        S, ctrl, report = carry
        k, wind_t, wrench_t, inputs_k = x
        valid = join_state(S)
        s_in = valid if edit is None else edit(valid, k)
        command, ctrl = command_fn(ctrl, s_in, k, inputs_k)
        command = jnp.asarray(command, dtype)
        P_t, external = _with_inputs(P, wind_t, wrench_t)
        s_out = join_state(_hold(step_c, P_t, split_state(s_in), split(command), h, substeps, external))
        pre = state_violation(params, s_in)
        post = state_violation(params, s_out)
        fresh = report.code == 0
        broke_pre = fresh & (pre != 0)
        broke_post = fresh & (pre == 0) & (post != 0)
        found = MonitorReport(
            tick=k.astype(jnp.int32),
            code=jnp.where(broke_pre, pre, post),
            phase=jnp.where(broke_pre, BEFORE_STEP, AFTER_STEP).astype(jnp.int32),
            state=s_in,
            command=command,
            after=jax.tree_util.tree_map(lambda a, b: jnp.where(_expand(broke_pre, a), a, b), s_in, s_out),
            wind=None if wind_t is None else join(wind_t),
            wrench=None if wrench_t is None else join(wrench_t),
            constant=report.constant,
        )
        report = _first(report, found, broke_pre | broke_post)
        # frozen at the last valid state: before the caller's edit if the edit broke it,
        # the step's valid input if the step broke it
        keep_valid = ~fresh | broke_pre
        nxt = jax.tree_util.tree_map(
            lambda v, i, o: jnp.where(_expand(keep_valid, v), v, jnp.where(_expand(broke_post, i), i, o)),
            valid, s_in, s_out,
        )
        return (split_state(nxt), ctrl, report), (nxt, command)

    (S, ctrl, report), out = _drive(
        tick, (S, ctrl0, report0), xs, num_ticks, save_every=save_every, reduce=None, reduce_init=None,
        checkpoint=False, unroll=1,
    )
    return join_state(S), ctrl, out, report


def _const_probe(params, dt):
    return [getattr(params, f.name) for f in dataclasses.fields(params)] + [dt]


def rollout_checked(
    params: QuadParams,
    state0: QuadState,
    commands,
    dt,
    *,
    substeps: int = 1,
    step=rk4_step,
    edit: Callable | None = None,
    save_every: int | None = 1,
    wind=None,
    wrench=None,
):
    """:func:`quadjax.rollout` with the invariant monitor. One vehicle (vmap to batch).

    ``edit(state, k) -> state``: the caller's code run on the state before command k
    (array form), the place a violation usually comes from. Returns
    ``(final_state, states, report)``; ``states`` as in :func:`quadjax.rollout`
    (frozen vehicles repeat their last valid state), ``report`` a
    :class:`MonitorReport`.
    """
    commands = jnp.asarray(commands, jnp.result_type(state0.position))
    R = params.rotor_spins.shape[-1]
    if commands.ndim != 2 or commands.shape[1] != R:
        raise ValueError(f"commands: shape {commands.shape}, expected (T, {R}) rotor-speed commands")

    def command_fn(ctrl, state, k, u):
        return join(u), ctrl

    final, _, out, report = _checked(
        params, state0, commands.shape[0], dt, command_fn, None, substeps=substeps, step=step, edit=edit,
        save_every=save_every, wind=wind, wrench=wrench, inputs=split(commands),
    )
    return final, None if out is None else out[0], report


def rollout_closed_loop_checked(
    params: QuadParams,
    state0: QuadState,
    controller,
    ctrl_params,
    ctrl_state0,
    num_ticks: int,
    dt,
    *,
    substeps: int = 1,
    step=rk4_step,
    edit: Callable | None = None,
    observe: Callable | None = None,
    save_every: int | None = 1,
    wind=None,
    wrench=None,
):
    """:func:`quadjax.rollout_closed_loop` with the invariant monitor.

    Returns ``(final_state, final_ctrl_state, states, commands, report)``. The
    controller sees the state after ``edit``.
    """
    if not isinstance(num_ticks, int) or num_ticks < 1:
        raise ValueError(f"num_ticks={num_ticks!r}: expected an int >= 1 (static under jit)")
    dtype = jnp.result_type(state0.position)

    def command_fn(cs, state, k, _):
        t = k * jnp.asarray(dt, dtype)
        obs = state if observe is None else observe(params, state, t)
        return controller(ctrl_params, cs, obs, t)

    final, cs, out, report = _checked(
        params, state0, num_ticks, dt, command_fn, ctrl_state0, substeps=substeps, step=step, edit=edit,
        save_every=save_every, wind=wind, wrench=wrench,
    )
    states, commands = (None, None) if out is None else out
    return final, cs, states, commands, report


def rollout_checked_batch(
    params: QuadParams,
    state0: QuadState,
    commands,
    dt,
    *,
    params_axes=None,
    state_axes=0,
    commands_axes=0,
    block: int | None = None,
    **options,
):
    """:func:`rollout_checked` over N vehicles (axes as :func:`quadjax.rollout.rollout_batch`)."""
    def one(p, s, u):
        return rollout_checked(p, s, u, dt, **options)

    return map_vehicles(one, (params, state0, commands), (params_axes, state_axes, commands_axes), block=block)


# --------------------------------------------------------------------------- reading a report


def _vehicle(tree, index, axes=0):
    """The ``index``-th vehicle's slice of a batched pytree (axes as in_axes; None = shared)."""
    if index is None:
        return tree
    from quadjax.rollout import _expand_axes

    full = _expand_axes(axes, tree)

    def pick(a, x):
        if x is None:
            return None
        x = np.asarray(x)
        return x if a is None else x.reshape((-1,) + x.shape[1:])[index]

    return jax.tree_util.tree_map(pick, full, tree, is_leaf=lambda a: a is None)


def _detail(code, state: QuadState, params: QuadParams) -> str:
    """Which field broke and by how much (host side, numpy)."""
    name = MONITOR_IDS[code]
    if name == "params_invalid":
        fields = {f.name: np.asarray(getattr(params, f.name), np.float64) for f in dataclasses.fields(params)}
        try:
            QuadParams.create(**fields)
        except ValueError as err:
            return str(err)
        return "params_valid() is false"
    if name == "non_finite":
        for f in dataclasses.fields(state):
            x = np.atleast_1d(np.asarray(getattr(state, f.name)))
            bad = np.flatnonzero(~np.isfinite(x))
            if bad.size:
                return f"{_component(f.name, bad[0], x.size)} = {x[bad[0]]}"
        return "a value is not finite"
    if name == "attitude_not_unit":
        q = np.asarray(state.attitude)
        eps = np.finfo(q.dtype).eps
        return f"|‖attitude‖² − 1| = {abs(float(np.sum(q * q)) - 1):.3g} > 8ε = {8 * eps:.3g}"
    if name == "rotor_speed":
        w = np.asarray(state.rotor_speeds)
        wmax = float(np.asarray(params.omega_max))
        i = int(np.flatnonzero((w < 0) | (w > wmax))[0])
        bound = "< 0" if w[i] < 0 else f"> omega_max = {wmax:g} rad/s"
        return f"rotor_speeds[{i}] = {w[i]:g} rad/s {bound}"
    if name == "energy":
        return f"energy = {float(np.asarray(state.energy)):g} J < 0"
    if name == "below_ground":
        z = float(np.asarray(state.position)[2])
        return f"position.z = {z:g} m < ground_z = {float(np.asarray(params.ground_z)):g} m"
    return ""


def _component(field, i, size):
    names = {3: "xyz", 4: "wxyz"}.get(size)
    if size == 1:
        return field
    return f"{field}.{names[i]}" if names else f"{field}[{i}]"


def describe(report: MonitorReport, params: QuadParams, vehicle: int | None = None, *, params_axes=None) -> str:
    """One line per violation, in the seed's words: ``I5 below_ground before step 800: position.z = ...``.

    ``vehicle``: the index of one vehicle of a batched report (all broken vehicles if
    None); ``params_axes`` as passed to the batched run (None: one shared set).
    """
    code = np.asarray(report.code)
    batched = code.ndim > 0
    vehicles = ([vehicle] if vehicle is not None else list(report.broken())) if batched else [None]
    lines = []
    for v in vehicles:
        r = _vehicle(report, v)
        c = int(np.asarray(r.code))
        if c == 0:
            lines.append(("" if v is None else f"vehicle {v}: ") + "no violation")
            continue
        p = _vehicle(params, v, params_axes) if batched else params
        which = r.state if int(r.phase) == BEFORE_STEP else r.after
        where = "before" if int(r.phase) == BEFORE_STEP else "after"
        head = "" if v is None else f"vehicle {v}: "
        lines.append(
            f"{head}{INVARIANT_NUMBERS[c]} {MONITOR_IDS[c]} {where} step {int(r.tick)}: {_detail(c, which, p)}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- repro files


def _step_name(step) -> str:
    if isinstance(step, str) and step in STEPPERS:
        return step
    for name, fn in STEPPERS.items():
        if fn is step:
            return name
    raise ValueError("write_repro: replay needs one of the library's steppers " f"{sorted(STEPPERS)}, got {step!r}")


def write_repro(
    path,
    report: MonitorReport,
    params: QuadParams,
    dt,
    *,
    vehicle: int | None = None,
    params_axes=None,
    substeps: int = 1,
    step="rk4",
) -> str:
    """Write one violation as a self-contained ``.npz`` repro file; returns the path.

    It holds the vehicle's params, the state going into the step, the command, the
    step's inputs, ``dt``, ``substeps`` and the integrator, the indices (vehicle,
    step), the code and phase, and what the step produced, all in their exact dtype.
    ``vehicle``: which vehicle of a batched report (default: the first broken one).
    ``params_axes``: as passed to the batched run. ``dt``, ``substeps`` and ``step``
    must be those of the run.
    """
    code = np.asarray(report.code)
    if code.ndim > 0 and vehicle is None:
        broken = report.broken()
        if broken.size == 0:
            raise ValueError("write_repro: the report has no violation")
        vehicle = int(broken[0])
    r = _vehicle(report, vehicle if code.ndim > 0 else None)
    if int(np.asarray(r.code)) == 0:
        raise ValueError(f"write_repro: vehicle {vehicle} has no violation")
    p = _vehicle(params, vehicle, params_axes) if code.ndim > 0 else params
    dtype = np.asarray(r.state.position).dtype
    arrays = {}
    for f in dataclasses.fields(p):
        arrays[f"params.{f.name}"] = np.asarray(getattr(p, f.name), dtype)
    for prefix, s in (("state", r.state), ("after", r.after)):
        for f in dataclasses.fields(s):
            arrays[f"{prefix}.{f.name}"] = np.asarray(getattr(s, f.name))
    arrays["constant"] = np.asarray(r.constant, bool)
    arrays["command"] = np.asarray(r.command)
    arrays["dt"] = np.asarray(dt, dtype)
    if r.wind is not None:
        arrays["wind"] = np.asarray(r.wind)
    if r.wrench is not None:
        arrays["wrench"] = np.asarray(r.wrench)
    c = int(np.asarray(r.code))
    meta = dict(
        vehicle=vehicle, tick=int(np.asarray(r.tick)), code=c, invariant=MONITOR_IDS[c],
        phase=_PHASES[int(np.asarray(r.phase))], substeps=int(substeps), step=_step_name(step),
        dtype=str(dtype), description=describe(r, p),
    )
    arrays["meta"] = np.asarray(json.dumps(meta))
    path = str(path)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


class Replay(NamedTuple):
    """What :func:`replay` found.

    ``reproduced``: the same violation (code, phase). ``bitwise``: the step's output
    equal to the recorded one in every bit (always True for a violation found before
    the step, where nothing is computed). ``code`` and ``after`` are the re-run's.
    """

    meta: dict
    code: int
    after: QuadState
    reproduced: bool
    bitwise: bool


def load_repro(path):
    """Read a repro file: ``(meta, params, state, command, dt, wind, wrench, after)``, exact dtypes.

    ``wind``/``wrench`` are None where the run had none; ``after`` is the recorded output.
    """
    with np.load(path, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    meta = json.loads(str(data.pop("meta")))
    params = QuadParams(**{f.name: jnp.asarray(data[f"params.{f.name}"]) for f in dataclasses.fields(QuadParams)})
    state = QuadState(**{f.name: jnp.asarray(data[f"state.{f.name}"]) for f in dataclasses.fields(QuadState)})
    after = QuadState(**{f.name: np.asarray(data[f"after.{f.name}"]) for f in dataclasses.fields(QuadState)})
    meta["constant"] = [bool(c) for c in data["constant"]]
    command, dt = jnp.asarray(data["command"]), jnp.asarray(data["dt"])
    return meta, params, state, command, dt, data.get("wind"), data.get("wrench"), after


def _replay_step(params, state, command, dt, wind, wrench, *, substeps, step):
    """The checked tick of one vehicle for one command, exactly as in the rollout."""
    P, _, dt, dtype = _setup(params, state, dt)
    params = params.astype(dtype)
    P_t, external = _with_inputs(P, None if wind is None else split(wind), None if wrench is None else split(wrench))
    out = join_state(_hold(_stepper(step), P_t, split_state(state), split(command), dt / substeps, substeps, external))
    return state_violation(params, state), state_violation(params, out), out


#: replay runs the recorded vehicle in a batch of copies: XLA compiles scalar and
#: vectorised code differently (last-bit differences), and the rollout was vectorised
_REPLAY_BATCH = 8


def replay(path) -> Replay:
    """Re-run the step recorded in a repro file and compare with the recording, bit for bit.

    The step is compiled as in the run: jitted, vmapped over copies of the vehicle,
    with the parameters and dt that were compile-time constants there as constants
    (recorded in the file). XLA's CPU backend contracts a·b + c into FMA per fused
    kernel; with the same program structure it does so identically. A run that traced
    per-vehicle parameters through ``vmap`` may still differ in the last bit; its
    violation is reproduced all the same (``reproduced`` vs ``bitwise``).
    """
    meta, params, state, command, dt, wind, wrench, recorded = load_repro(path)
    names = [f.name for f in dataclasses.fields(params)]
    fixed = dict(zip(names + ["dt"], meta["constant"]))
    traced = {k: v for k, v in zip(names + ["dt"], _const_probe(params, dt)) if not fixed[k]}

    def one(tr, s, u, w, x):
        p = params.replace(**{k: v for k, v in tr.items() if k != "dt"})
        return _replay_step(p, s, u, tr.get("dt", dt), w, x, substeps=meta["substeps"], step=meta["step"])

    copies = jax.tree_util.tree_map(
        lambda x: None if x is None else jnp.broadcast_to(jnp.asarray(x), (_REPLAY_BATCH,) + jnp.shape(x)),
        (state, command, wind, wrench), is_leaf=lambda x: x is None,
    )
    pre, post, out = jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0, 0)))(traced, *copies)
    pre, post, out = int(pre[0]), int(post[0]), jax.tree_util.tree_map(lambda x: x[0], out)
    if meta["phase"] == "before":
        code, after, bitwise = pre, state, True
    else:
        code, after = post, out
        bitwise = all(
            np.asarray(a).dtype == np.asarray(b).dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
            for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(recorded))
        )
    phase = BEFORE_STEP if pre != 0 else AFTER_STEP
    same = code == meta["code"] and _PHASES[phase] == meta["phase"]
    return Replay(meta=meta, code=code, after=after, reproduced=same, bitwise=same and bitwise)
