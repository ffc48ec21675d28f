"""Precision characterisation (seed 000, "Scalar types"): the model in float32, bfloat16 and
float16 against float64, over 1e2–1e5 RK4 steps of the standard scenarios.

How accurate the model is at reduced precision is a characterisation result, not a guarantee
(docs/precision.md). Each dtype runs the library's own pure functions,
:func:`quadjax.rk4_step` on params from :func:`quadjax.presets.get` in that dtype (a dtype in
which some parameter is not 0 or a normal number is rejected there, with the message kept in
the row). The states are built by :func:`quadjax.hover_state` / :meth:`quadjax.QuadState.create`,
so a 16-bit state keeps its energy in float32 (:func:`quadjax.state.energy_dtype`); with
``plain_energy`` the same runs are repeated with the energy in the 16-bit dtype itself, the
hand-built rollout that stalls.

Scenarios (``dt`` = 1 ms, from rest at 10 m unless said; RP-1's battery sag is set to 0 so that
the float64 reference holds its trim and the drift measured is the arithmetic's):

* ``hover``: the hover command of the dtype (:func:`quadjax.hover_rotor_speed`), level and still;
* ``yaw_spin``: open loop, the CCW pair faster and the CW pair slower at the hover's total thrust,
  a constant yaw acceleration of 0.1 rad/s² (10 rad/s after 1e5 steps, the envelope's edge);
* ``precession``: torque free (gravity 0, rotors stopped) from body rates (1, 0, 3) rad/s: an
  axisymmetric body precesses, the rates' transverse part turning at (J_z − J_x)/J_x · r.

Every horizon of a dtype is one run: one ``jax.jit`` of a ``lax.scan`` over blocks of steps,
the three scenarios batched by ``jax.vmap``, I2–I5 checked after every step.
"""

from __future__ import annotations

import io
import math
from functools import reduce

import jax
import jax.numpy as jnp
import numpy as np

from quadjax import presets
from quadjax.invariants import INVARIANT_IDS, state_violation
from quadjax.model import hover_rotor_speed, hover_state
from quadjax.integrators import rk4_step
from quadjax.params import model_dtype
from quadjax.quaternion import quat_angle_between
from quadjax.state import QuadState

SCENARIOS = ("hover", "yaw_spin", "precession")
DT = 1e-3  # s
START_HEIGHT = 10.0  # m
YAW_ACCELERATION = 0.1  # rad/s²
PRECESSION_RATES = (1.0, 0.0, 3.0)  # rad/s
#: the seed's invariant numbers for the codes of :data:`quadjax.invariants.INVARIANT_IDS`
INVARIANT_NUMBERS = ("", "I4", "I2", "I3", "I3", "I5")


def _scenarios(preset: str, dtype):
    """(params, state0, command) of each scenario in ``dtype``, stacked on a leading axis of
    len(:data:`SCENARIOS`). Raises the params' ValueError where ``dtype`` cannot hold them."""
    base = presets.get(preset, dtype=dtype)
    d = base.mass.dtype
    flying = base.replace(battery_sag=jnp.zeros((), d))
    hover = hover_state(flying, position=(0.0, 0.0, START_HEIGHT))
    w = hover_rotor_speed(flying)
    # yaw: τ_z = −k_m Σ spinᵢ Tᵢ; thrusts T (1 − spinᵢ δ) keep ΣT and give τ_z = k_m δ Σ Tᵢ (4 spins of ±1)
    thrust = float(np.sum(np.asarray(flying.k_f, np.float64) * np.asarray(w, np.float64) ** 2))
    delta = YAW_ACCELERATION * float(np.asarray(flying.inertia, np.float64)[2, 2]) / (
        float(np.asarray(flying.k_m, np.float64)) * thrust)
    yaw = (np.asarray(w, np.float64) * np.sqrt(1.0 - np.asarray(flying.rotor_spins, np.float64) * delta)).astype(d)
    free = flying.replace(gravity=jnp.zeros((), d))
    spinning = QuadState.create(position=(0.0, 0.0, START_HEIGHT), body_rates=PRECESSION_RATES,
                                rotor_speeds=np.zeros(base.num_rotors), dtype=d)
    cases = [(flying, hover, w), (flying, hover, jnp.asarray(yaw)), (free, spinning, jnp.zeros_like(w))]
    return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *cases)


def _plain(state: QuadState) -> QuadState:
    """The same state with its energy in the state's own dtype (no wider accumulator)."""
    return state.replace(energy=state.energy.astype(state.position.dtype))


def _runner(block: int, blocks: int):
    """A jitted rollout: ``blocks`` × ``block`` RK4 steps of the vmapped scenarios, returning the
    state after every block (blocks, S, ...) and, per scenario, the first violated invariant and
    the step it was first seen after (0 before the first step)."""

    def one(params, state, command):
        def step(carry, _):
            s, n, code, at = carry
            s = rk4_step(params, s, command, DT)
            now = state_violation(params, s)
            first = (code == 0) & (now != 0)
            return (s, n + 1, jnp.where(first, now, code), jnp.where(first, n + 1, at)), None

        def run_block(carry, _):
            carry, _ = jax.lax.scan(step, carry, None, length=block)
            return carry, carry[0]

        code0 = state_violation(params, state)
        zero = jnp.zeros((), jnp.int32)
        (_, _, code, at), saved = jax.lax.scan(run_block, (state, zero, code0, zero), None, length=blocks)
        return saved, code, at

    return jax.jit(jax.vmap(one))


def _rollout(preset, dtype, steps, plain):
    params, state0, command = _scenarios(preset, dtype)
    if plain:
        state0 = _plain(state0)
    block = reduce(math.gcd, steps)
    saved, code, at = _runner(block, max(steps) // block)(params, state0, command)
    picks = np.asarray([n // block - 1 for n in steps])  # saved: (scenario, block, ...)
    at_horizon = jax.tree_util.tree_map(lambda x: np.asarray(x[:, picks].astype(jnp.float64)), saved)
    return at_horizon, np.asarray(code), np.asarray(at), np.dtype(saved.energy.dtype)


def _x64_available() -> bool:
    return jnp.zeros((), jnp.float64).dtype == np.float64


def characterise(steps=(100, 1000, 10000, 100000), dtypes=("float64", "float32", "bfloat16", "float16"),
                 preset="rp1", plain_energy=("bfloat16", "float16")) -> list[dict]:
    """One row per dtype × scenario × horizon (steps), measured against float64.

    Keys: ``dtype``, ``energy_dtype`` (the accumulator), ``scenario``, ``steps``, ``status``
    ("ok", or "rejected: <message>" where the preset is not representable in the dtype; the
    numbers are then None), ``position_error`` [m] and ``velocity_error`` [m/s] (Euclidean),
    ``attitude_error`` [rad] (geodesic angle), ``energy`` [J] (the dtype's), ``energy_error`` [J]
    and ``energy_error_rel`` (|E − E₆₄| / E₆₄; None where E₆₄ = 0), ``invariant`` (the first of
    I2–I5 violated up to that horizon, e.g. "I2 attitude_not_unit", or "none") and
    ``invariant_step``. ``plain_energy``: 16-bit dtypes that are also run with the energy in the
    dtype itself (``energy_dtype`` equal to ``dtype``). Needs float64: the caller enables x64.
    """
    if not _x64_available():
        raise ValueError("characterise: the float64 reference needs x64; the caller enables it "
                         "(jax.config.update('jax_enable_x64', True)) before the call")
    steps = tuple(sorted(int(n) for n in steps))
    if not steps or steps[0] < 1:
        raise ValueError(f"characterise: steps {steps}: expected horizons >= 1")
    reference = _rollout(preset, "float64", steps, plain=False)[0]
    rows = []
    runs = [(d, False) for d in dtypes] + [(d, True) for d in plain_energy if d in dtypes]
    for name, plain in runs:
        dtype = model_dtype(name, "characterise")
        try:
            states, code, at, accumulator = _rollout(preset, dtype, steps, plain)
        except ValueError as err:
            if plain:
                continue  # already reported for the accumulated run
            rows += [_rejected(dtype, s, n, str(err)) for s in SCENARIOS for n in steps]
            continue
        for k, scenario in enumerate(SCENARIOS):
            for j, n in enumerate(steps):
                rows.append(_row(dtype, accumulator, scenario, n, reference, states, k, j, code[k], at[k]))
    return rows


def _rejected(dtype, scenario, n, message):
    return dict(dtype=str(dtype), energy_dtype=None, scenario=scenario, steps=n, status=f"rejected: {message}",
                position_error=None, velocity_error=None, attitude_error=None, energy=None, energy_error=None,
                energy_error_rel=None, invariant=None, invariant_step=None)


def _row(dtype, accumulator, scenario, n, ref, got, k, j, code, at):
    def at_(tree, field):
        return getattr(tree, field)[k, j]

    e64, e = float(at_(ref, "energy")), float(at_(got, "energy"))
    seen = int(code) != 0 and int(at) <= n  # the first violation, if it came by this horizon
    return dict(
        dtype=str(dtype), energy_dtype=str(accumulator), scenario=scenario, steps=n, status="ok",
        position_error=float(np.linalg.norm(at_(got, "position") - at_(ref, "position"))),
        velocity_error=float(np.linalg.norm(at_(got, "velocity") - at_(ref, "velocity"))),
        attitude_error=_angle(at_(got, "attitude"), at_(ref, "attitude")),
        energy=e, energy_error=abs(e - e64), energy_error_rel=abs(e - e64) / abs(e64) if e64 else None,
        invariant=f"{INVARIANT_NUMBERS[int(code)]} {INVARIANT_IDS[int(code)]}" if seen else "none",
        invariant_step=int(at) if seen else None,
    )


def _angle(q, q_ref) -> float:
    """The rotation angle [rad] from ``q_ref`` to ``q``, in float64 (:func:`quat_angle_between`:
    a 16-bit quaternion is unit only to 8 ε, and arccos of a dot product would clip it)."""
    return float(quat_angle_between(jnp.asarray(q, jnp.float64), jnp.asarray(q_ref, jnp.float64)))


def _label(row) -> str:
    plain = row["energy_dtype"] == row["dtype"] and row["dtype"] in ("bfloat16", "float16")
    return f"{row['dtype']} ({row['dtype']} energy)" if plain else row["dtype"]


def format_markdown(rows) -> str:
    """The rows as one Markdown table per scenario; a rejected dtype as one line."""
    out = io.StringIO()
    rejected = {}
    for r in rows:
        if r["status"] != "ok":
            rejected.setdefault(r["dtype"], r["status"])
    for dtype, status in rejected.items():
        out.write(f"- **{dtype}**: {status}\n")
    if rejected:
        out.write("\n")

    def g(x, fmt="{:.3g}"):
        return "–" if x is None else fmt.format(x)

    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        ok = [r for r in rows if r["scenario"] == scenario and r["status"] == "ok"]
        if not ok:
            continue
        out.write(f"**{scenario}**\n\n| dtype | energy in | steps | position [m] | velocity [m/s] | attitude [rad] "
                  "| energy [J] | energy error [J] | energy error (rel.) | first invariant violated |\n")
        out.write("|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
        for r in ok:
            inv = r["invariant"] + (f" (step {r['invariant_step']})" if r["invariant_step"] is not None else "")
            out.write(f"| {_label(r)} | {r['energy_dtype']} | {r['steps']} | {g(r['position_error'])} "
                      f"| {g(r['velocity_error'])} | {g(r['attitude_error'])} | {g(r['energy'], '{:.4g}')} "
                      f"| {g(r['energy_error'])} | {g(r['energy_error_rel'])} | {inv} |\n")
        out.write("\n")
    return out.getvalue()


def figure(rows):
    """Drift against float64 over the horizon: one column per scenario, one row per quantity
    (log–log; a drift of exactly 0 is drawn at the axis floor)."""
    from matplotlib.figure import Figure

    quantities = (("position_error", "position [m]"), ("velocity_error", "velocity [m/s]"),
                  ("attitude_error", "attitude [rad]"), ("energy_error", "energy [J]"))
    ok = [r for r in rows if r["status"] == "ok" and r["dtype"] != "float64"]
    scenarios = list(dict.fromkeys(r["scenario"] for r in ok))
    fig = Figure(figsize=(4 * max(len(scenarios), 1), 2.6 * len(quantities)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(quantities), max(len(scenarios), 1), squeeze=False))
    for c, scenario in enumerate(scenarios):
        for q, (key, label) in enumerate(quantities):
            ax = axes[q, c]
            for name in dict.fromkeys(_label(r) for r in ok):
                line = [r for r in ok if r["scenario"] == scenario and _label(r) == name]
                if line:
                    x = [r["steps"] for r in line]
                    y = [max(r[key], 1e-18) for r in line]
                    ax.plot(x, y, "o-" if "energy)" not in name else "x--", label=name)
            ax.set(xscale="log", yscale="log", xlabel="steps (dt = 1 ms)", ylabel=f"drift: {label}")
            if q == 0:
                ax.set_title(scenario)
    if scenarios:
        axes[0, 0].legend(fontsize="small")
    return fig


def plot(rows, path):
    """Write :func:`figure` of ``rows`` as a PNG at ``path`` (atomically); returns the path."""
    from quadjax.files import write_atomic

    fig = figure(rows)
    return write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
