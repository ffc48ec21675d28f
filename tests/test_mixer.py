"""The mixer (issue #3, seed 002): allocation, saturation priority, report, jit/vmap/grad.

References that do not share code with quadjax.mixer: the allocation matrix B written
from the body-moment definitions in numpy (checked against the seed's table), its
numpy pseudo-inverse, a lexicographic linear program solved by scipy (HiGHS), and the
seed's throttle sweep with transitions derived by hand from the seed's three steps.
"""

import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from quadjax import presets
from quadjax.mixer import (
    GENERIC,
    MixerLayout,
    MixerParams,
    allocate,
    mix,
    mixer_params_from,
    mixer_params_valid,
    saturation_from,
    to_rotor_command,
    wrench,
)
from quadjax.quadrotor import rotor_thrusts
from quadjax.verify.scenarios import SEED_REPORTS, SEED_TRANSITIONS, SWEEP_F, SWEEP_TORQUE, sweep_transitions



# --- vehicles -------------------------------------------------------------------------------------


def hexacopter(dtype=jnp.float64):
    """Six rotors on a 0.25 m circle, spins alternating (a layout with no closed form)."""
    ang = np.deg2rad(30.0 + 60.0 * np.arange(6))
    pos = np.stack([0.25 * np.cos(ang), 0.25 * np.sin(ang), np.zeros(6)], axis=-1)
    return MixerParams.create(
        rotor_positions=pos, rotor_spins=(1.0, -1.0, 1.0, -1.0, 1.0, -1.0),
        k_m=0.016, k_f=8.5e-6, t_max=10.0, dtype=dtype,
    )


def lopsided(dtype=jnp.float64):
    """Four rotors of unequal arms about a centre of mass off the frame's middle, with T_min > 0:
    the pseudo-inverse's collective column differs per rotor and T_min/u does too, so a rotor
    pair's two rows (i, j) and (j, i) carry different bounds (iris and the hexacopter have equal
    columns and T_min = 0, where an exchange of the two goes unseen)."""
    return MixerParams.create(
        rotor_positions=((0.10, -0.18, 0.0), (-0.16, 0.20, 0.0), (0.12, 0.22, 0.0), (-0.14, -0.17, 0.0)),
        rotor_spins=(1.0, 1.0, -1.0, -1.0), k_m=0.016, k_f=8.5e-6, t_min=0.4, t_max=8.0, dtype=dtype,
    )


def rectangle(dtype=jnp.float64):
    """An H-like frame: PX4 order at (±0.13, ±0.20) (opposed pairs, not a square)."""
    return MixerParams.create(
        rotor_positions=((0.13, -0.2, 0.0), (-0.13, 0.2, 0.0), (0.13, 0.2, 0.0), (-0.13, -0.2, 0.0)),
        rotor_spins=(1.0, 1.0, -1.0, -1.0), k_m=0.02, k_f=6e-6, t_min=0.3, t_max=8.0, dtype=dtype,
    )


@functools.cache
def vehicle(name, dtype=jnp.float64):
    """A mixer by name; "<name>/generic" forces the pseudo-inverse path on that geometry."""
    if name.endswith("/generic"):
        return vehicle(name.split("/")[0], dtype).replace(layout=GENERIC)
    if name in BUILT:
        return BUILT[name](dtype)
    return mixer_params_from(presets.get(name, dtype=dtype))


BUILT = {"hexacopter": hexacopter, "rectangle": rectangle, "lopsided": lopsided}  # test frames, not presets
LAYOUTS = {"rp1": "quad_x", "cmu_plus": "plus", "iris": "generic", "hexacopter": "generic",
           "rectangle": "opposed_pairs", "lopsided": "generic"}
PROPERTY_VEHICLES = ("rp1", "cmu_plus", "iris", "hexacopter", "lopsided")
DTYPES = (jnp.float32, jnp.float64)


def numpy_allocation(mp):
    """B (4, R) in float64 from the definitions F = ΣT, τ = Σ r × (0, 0, T) − k_m Σ spin T e_z."""
    pos = np.asarray(mp.rotor_positions, np.float64)
    spins = np.asarray(mp.rotor_spins, np.float64)
    return np.stack([np.ones(len(spins)), pos[:, 1], -pos[:, 0], -float(mp.k_m) * spins])


@functools.cache
def constants(name, dtype=jnp.float64):
    """Float64 references of a vehicle: B, its pseudo-inverse P, T_min, T_max, row scales Σ|B|·T_max."""
    mp = vehicle(name, dtype)
    B = numpy_allocation(mp)
    return types.SimpleNamespace(
        B=B, P=np.linalg.pinv(B), lo=float(mp.t_min), hi=float(mp.t_max),
        rows=np.abs(B).sum(axis=1) * float(mp.t_max), R=B.shape[1],
    )


def assert_within(actual, expected, atol):
    """|actual − expected| ≤ atol elementwise (atol may be an array broadcasting against them)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    err = np.abs(actual - expected)
    assert np.all(err <= atol), _excess(actual, expected, err, atol)


def _excess(actual, expected, err, atol):
    """Where assert_within fails worst: the row of the largest excess (NaN counts as largest)."""
    shape = np.broadcast_shapes(err.shape, np.shape(atol))
    excess = np.broadcast_to(np.where(np.isnan(err), np.inf, err - atol), shape)
    if excess.ndim < 2:
        return f"max excess {np.max(excess):.3g}: {actual} vs {expected} (atol {atol})"
    row = np.unravel_index(np.argmax(excess), excess.shape)[:-1]
    atol_row = np.broadcast_to(atol, excess.shape)[row]
    return (f"max excess {np.max(excess):.3g} at row {row}: {np.broadcast_to(actual, excess.shape)[row]} vs "
            f"{np.broadcast_to(expected, excess.shape)[row]} (atol {atol_row})")


def eps_of(dtype):
    return float(jnp.finfo(dtype).eps)


# --- one jitted probe, one batch shape: every test reuses the compiled mixer ---------------------

BATCH = 256  # rows per call: a property test's whole batch is one call


def _probe(mp, w):
    """mix, allocate, wrench(allocate) and the report for a batch of demands (leading axes broadcast)."""
    out = mix(mp, w)
    thrusts = allocate(mp, w)
    return out, thrusts, wrench(mp, thrusts), saturation_from(w, out)


#: vectorised by mix's own leading-axis batching (test_jit_vmap_and_dtype: the same as jax.vmap)
probe = jax.jit(_probe)


def run(name, w, dtype=jnp.float64):
    """(out, allocate, wrench(allocate), report) as numpy for demands w (n, 4): one jitted call
    per BATCH rows (compiled once per vehicle and dtype)."""
    mp = vehicle(name, dtype)
    w = np.atleast_2d(np.asarray(w, dtype=np.dtype(dtype)))
    n = len(w)
    padded = np.zeros((-(-n // BATCH) * BATCH, 4), w.dtype)
    padded[:n] = w
    parts = [probe(mp, padded[k : k + BATCH]) for k in range(0, len(padded), BATCH)]
    joined = jax.tree_util.tree_map(lambda *x: np.concatenate([np.asarray(v) for v in x])[:n], *parts)
    return joined


# --- demand strategies ------------------------------------------------------------------------------


def component(limit):
    """A float32-representable value in [−limit, limit]: plain floats, or log-uniform in magnitude."""
    return st.one_of(
        st.floats(-limit, limit, allow_nan=False, width=32),
        st.builds(
            lambda e, sign: float(np.float32(sign * 10.0**e)),
            st.floats(-6.0, math.log10(limit)),
            st.sampled_from([-1.0, 1.0]),
        ),
    )


LIMITS = (1e3, 1e6, 1e6, 1e6)  # |F| [N], |τ| [N·m] of a drawn demand
demands = st.tuples(*[component(limit) for limit in LIMITS])


# --- property tests: whole batches per example, one jitted call each --------------------------------
#
# Each hypothesis example is a batch of ROWS cases checked in ONE vectorised, jitted mixer call:
# the first DRAWN rows drawn by hypothesis (its edge values, and shrinking), the rest from a
# seeded numpy generator of the same distribution. Each test runs on every (vehicle, dtype), so a few examples
# cover more cases than the thousands of one-case examples these tests had before.

ROWS = BATCH
DRAWN = 32
BATCH_SETTINGS = settings(max_examples=4, derandomize=True, deadline=None)
every_vehicle_and_dtype = pytest.mark.parametrize(
    "name, dtype", [(n, d) for n in PROPERTY_VEHICLES for d in DTYPES],
    ids=[f"{n}-{jnp.dtype(d).name}" for n in PROPERTY_VEHICLES for d in DTYPES],
)


def bulk_components(rng, limit, n):
    """``component(limit)``'s distribution in numpy: half plain uniform, half log-uniform magnitude."""
    plain = rng.uniform(-limit, limit, n)
    log = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-6.0, math.log10(limit), n)
    return np.where(rng.random(n) < 0.5, plain, log).astype(np.float32).astype(np.float64)


@st.composite
def demand_batches(draw, rows=ROWS, drawn=DRAWN):
    """(rows, 4) demands: ``drawn`` rows from ``demands``, the rest seeded numpy of the same law."""
    head = np.asarray(draw(st.lists(demands, min_size=drawn, max_size=drawn)), np.float64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bulk = np.stack([bulk_components(rng, limit, rows - drawn) for limit in LIMITS], axis=-1)
    return np.concatenate([head, bulk])


@st.composite
def fraction_batches(draw, rows=ROWS, drawn=DRAWN):
    """(rows, 6) fractions in [0, 1]: ``drawn`` rows by hypothesis, the rest uniform."""
    head = np.asarray(draw(st.lists(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
                                    min_size=drawn, max_size=drawn)), np.float64)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return np.concatenate([head, rng.uniform(0.0, 1.0, (rows - drawn, 6))])


STEP_SIZES = (1e-3, 1e-1, 1.0, 30.0)


@st.composite
def demand_step_batches(draw, pairs=ROWS // 2, drawn=DRAWN // 2):
    """(w (pairs, 4), step (pairs, 4) in [−1, 1], size (pairs,) from STEP_SIZES)."""
    head = draw(st.lists(st.tuples(demands, st.tuples(*[st.floats(-1.0, 1.0)] * 4), st.sampled_from(STEP_SIZES)),
                         min_size=drawn, max_size=drawn))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = pairs - drawn
    w = np.concatenate([np.asarray([h[0] for h in head], np.float64),
                        np.stack([bulk_components(rng, limit, n) for limit in LIMITS], axis=-1)])
    step = np.concatenate([np.asarray([h[1] for h in head], np.float64), rng.uniform(-1.0, 1.0, (n, 4))])
    size = np.concatenate([np.asarray([h[2] for h in head], np.float64), rng.choice(STEP_SIZES, n)])
    return w, step, size


def all_rows(ok, *shown):
    """Assert ``ok`` (rows,) holds for every row; on failure show the first bad rows of ``shown``."""
    ok = np.asarray(ok)
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, f"{bad.size} rows fail, first {bad[:3]}: " + "; ".join(str(x[bad[:3]]) for x in shown)


@every_vehicle_and_dtype
@BATCH_SETTINGS
@given(w=demand_batches())
def test_mix_contract_for_any_finite_demand(name, dtype, w):
    """Seed 002's post-condition of mix(): thrusts within limits, achieved = B·thrusts,
    achieved torque (στx, στy, sτz) with σ ∈ (0, 1], s ∈ [0, 1], roll/pitch direction kept."""
    out, _, _, report = run(name, w, dtype)
    k = constants(name, dtype)
    T = out.thrusts
    assert T.dtype == np.dtype(dtype)
    all_rows(np.all(np.isfinite(T), axis=1), w, T)
    all_rows(np.all((T >= k.lo) & (T <= k.hi), axis=1), w, T)
    tol = 64 * eps_of(dtype) * k.rows
    assert_within(out.achieved, T.astype(np.float64) @ k.B.T, tol)
    sigma, s = out.rp_scale.astype(np.float64), out.yaw_scale.astype(np.float64)
    all_rows(out.valid & (0.0 < sigma) & (sigma <= 1.0) & (0.0 <= s) & (s <= 1.0), w, sigma, s)
    w64 = np.asarray(w, np.dtype(dtype)).astype(np.float64)
    expected = np.stack([sigma * w64[:, 1], sigma * w64[:, 2], s * w64[:, 3]], axis=-1)
    assert_within(out.achieved[:, 1:], expected, tol[1:] + 64 * eps_of(dtype) * np.abs(expected))
    # direction kept: achieved (τx, τy) is a non-negative multiple of the demand
    all_rows(np.all(out.achieved[:, 1:3] * w64[:, 1:3] >= -tol[1:3] * np.abs(w64[:, 1:3]), axis=1),
             w, out.achieved)
    assert set(np.unique(report)) <= {-1, 0, 1}


@every_vehicle_and_dtype
@BATCH_SETTINGS
@given(fractions=fraction_batches())
def test_demand_within_limits_comes_back_unchanged(name, dtype, fractions):
    """w = B·T for T inside the limits: mix returns T, σ = s = 1, collective unmoved, report 0.
    (Hexacopter: T is first projected to the pseudo-inverse allocation P·B·T and kept only
    where that lies inside the limits.)"""
    k = constants(name, dtype)
    margin = 1e-3 * (k.hi - k.lo)
    T = k.lo + margin + (k.hi - k.lo - 2 * margin) * fractions[:, : k.R]
    T = (T @ k.B.T) @ k.P.T  # P·(B·T) per row
    inside = np.all((T >= k.lo + margin) & (T <= k.hi - margin), axis=1)  # the others' allocation is not
    out, _, _, report = run(name, T @ k.B.T, dtype)
    assert_within(out.thrusts[inside], T[inside], 256 * eps_of(dtype) * k.hi)
    all_rows(((out.rp_scale == 1.0) & (out.yaw_scale == 1.0) & ~out.collective_moved) | ~inside, T,
             out.rp_scale, out.yaw_scale)
    assert np.all(report[inside] == 0)


@every_vehicle_and_dtype
@BATCH_SETTINGS
@given(batch=demand_step_batches())
def test_mix_is_continuous_in_the_demand(name, dtype, batch):
    """|ΔT|∞ ≤ K |Δw|∞ with K = 16 ‖P‖∞ (P the allocation): bounded change for bounded input change."""
    w, step, size = batch
    w = np.asarray(w, np.dtype(dtype))
    w2 = (w.astype(np.float64) + size[:, None] * step).astype(w.dtype)
    out, _, _, _ = run(name, np.concatenate([w, w2]), dtype)
    k = constants(name, dtype)
    dw = np.abs(w2.astype(np.float64) - w.astype(np.float64)).max(axis=1)
    K = 16 * np.abs(k.P).sum(axis=1).max()
    T = out.thrusts.astype(np.float64)
    change = np.abs(T[len(w):] - T[: len(w)]).max(axis=1)
    all_rows(change <= K * dw + 1e3 * eps_of(dtype) * k.hi, w, w2, change, dw)


@every_vehicle_and_dtype
@BATCH_SETTINGS
@given(w=demand_batches())
def test_allocate_inverts_wrench(name, dtype, w):
    """allocate(w) = the numpy pseudo-inverse P·w and wrench(allocate(w)) = w, to rounding."""
    _, T, back, _ = run(name, w, dtype)
    k = constants(name, dtype)
    w64 = np.asarray(w, np.dtype(dtype)).astype(np.float64)
    size = np.abs(w64) @ np.abs(k.P).T  # (rows, R)
    assert_within(T, w64 @ k.P.T, 64 * eps_of(dtype) * size.max(axis=1, keepdims=True))  # P's rounding is normwise
    assert_within(back, w64, 128 * eps_of(dtype) * (np.abs(T) @ np.abs(k.B).T)
                  + 1e-12 * np.abs(w64).max(axis=1, keepdims=True))


# --- the priority against a lexicographic linear program --------------------------------------


def lexicographic_reference(name, w):
    """(σ, c, s) of seed 002's priority by three LPs over T = c·P₀ + σ·(P₁τx + P₂τy) + s·P₃τz."""
    k = constants(name)
    u, r, y = k.P[:, 0], k.P[:, 1:3] @ w[1:3], k.P[:, 3] * w[3]
    A = np.concatenate([np.stack([u, r, y], 1), -np.stack([u, r, y], 1)])
    b = np.concatenate([np.full_like(u, k.hi), np.full_like(u, -k.lo)])

    def solve(cost, bounds):
        res = linprog(cost, A_ub=A, b_ub=b, bounds=bounds, method="highs")
        assert res.status == 0, res.message
        return res.x

    sigma = solve([0, -1, 0], [(None, None), (0, 1), (0, 1)])[1]
    fix = (sigma - 1e-10, sigma)
    c_lo = solve([1, 0, 0], [(None, None), fix, (0, 1)])[0]
    c_hi = solve([-1, 0, 0], [(None, None), fix, (0, 1)])[0]
    c = min(max(w[0], c_lo), c_hi)
    s = solve([0, 0, -1], [(c - 1e-10, c + 1e-10), fix, (0, 1)])[2]
    return sigma, c, s


def saturating_demands(name, n, seed):
    """Demands that saturate every way: F from −20 % to 120 % of the range, torques up to 3× reach."""
    k = constants(name)
    rng = np.random.default_rng(seed)
    F = rng.uniform(-0.2, 1.2, n) * k.rows[0]
    tau = rng.normal(size=(n, 3)) * k.rows[1:] * rng.choice([0.05, 0.3, 1.0, 3.0], size=(n, 1))
    tau[::7, 2] = 0.0
    return np.concatenate([F[:, None], tau], axis=1)


@pytest.mark.parametrize("name", ["rp1", "cmu_plus", "rectangle", "iris", "hexacopter", "lopsided"])
def test_priority_matches_lexicographic_lp(name):
    """σ maximal, then the collective closest to F, then s maximal — checked by an LP solver,
    on demands that saturate every way (closed form and pseudo-inverse paths alike)."""
    w = saturating_demands(name, 64, seed=7)
    out, _, _, _ = run(name, w)
    scale = constants(name).rows[0]
    for k in range(len(w)):
        sigma, c, s = lexicographic_reference(name, w[k])
        assert out.rp_scale[k] == pytest.approx(sigma, abs=1e-7)
        assert out.achieved[k, 0] == pytest.approx(c, abs=1e-7 * scale)
        if w[k, 3] != 0:
            assert out.yaw_scale[k] == pytest.approx(s, abs=1e-6)


def test_closed_form_equals_pseudo_inverse_path():
    """Two derivations, one answer: the closed form (opposed pairs) and the generic
    pseudo-inverse path agree on the Quad X geometry."""
    w = saturating_demands("rp1", 1024, seed=11)
    closed, _, _, _ = run("rp1", w)
    generic, _, _, _ = run("rp1/generic", w)
    assert_within(closed.thrusts, generic.thrusts, 1e-9 * constants("rp1").hi)
    assert_within(closed.rp_scale, generic.rp_scale, 1e-9)
    assert_within(closed.yaw_scale, generic.yaw_scale, 1e-7)


# --- the seed's throttle sweep on RP-1 -------------------------------------------------------------


def sweep(name, torque, F):
    w = np.concatenate([F[:, None], np.broadcast_to(torque, (len(F), 3))], axis=1)
    out, _, _, report = run(name, w)
    return out, report


def pair_transitions(d_a, d_b, Y, lo, hi):
    """The four sweep transitions [N] from the seed's steps, for |d_a| > |d_b|, Y > 0, σ = 1:
    collective raised below 4 L_a (no room for yaw), yaw whole from 4 (L_a + Y), cut again
    from 4 (H_b − Y), collective held from 2 (H_a + H_b); L, H the pair-mean limits."""
    L_a, H_a, H_b = lo + abs(d_a), hi - abs(d_a), hi - abs(d_b)
    return np.array([4 * L_a, 4 * (L_a + Y), 4 * (H_b - Y), 2 * (H_a + H_b)])


def test_rp1_preset_reproduces_the_seed_geometry():
    """GUIDE §1: a = 0.7/9 m, k_m = 0.1/6.4 m, T_max ≈ 12 N; B is the seed's table."""
    mp = vehicle("rp1")
    a, k_m = 0.7 / 9.0, 0.1 / 6.4
    table = np.array([[1, 1, 1, 1], [-a, a, a, -a], [-a, a, -a, a], [-k_m, -k_m, k_m, k_m]])
    np.testing.assert_allclose(numpy_allocation(mp), table, rtol=1e-12)
    assert float(mp.t_max) == pytest.approx(12.0, rel=1e-9) and float(mp.t_min) == 0.0
    assert mp.layout == MixerLayout("quad_x", (0, 1, 2, 3))




@functools.cache
def rp1_sweep():
    return sweep("rp1", SWEEP_TORQUE, SWEEP_F)


def test_throttle_sweep_transitions_where_the_seeds_steps_put_them():
    """Seed 002's sweep against the seed (±0.3 N, the report, roll and pitch never cut) is
    quadjax verify's mixer_throttle_sweep (tests/test_verify.py); here, through this file's own
    batched probe, the transitions sit where the seed's three steps put them exactly for rp1's
    geometry (a = 0.7/9, k_m = 0.1/6.4, T_max = 12) and the report on each stretch is the seed's."""
    out, report = rp1_sweep()
    where, reports = sweep_transitions(SWEEP_F, report)
    assert reports == list(SEED_REPORTS)
    assert_within(where, SEED_TRANSITIONS, 0.3)
    a = 0.7 / 9.0
    d_a, d_b, Y = -(0.5 + 0.2) / (4 * a), (0.5 - 0.2) / (4 * a), 0.1 / (4 * 0.1 / 6.4)
    assert_within(where, pair_transitions(d_a, d_b, Y, 0.0, 12.0), 0.006)


@pytest.mark.parametrize(
    "F, collective, yaw_whole",
    [(0.0, "raised", False), (9.0, "as demanded", False), (15.4, "as demanded", True),
     (38.0, "as demanded", False), (41.6, "held below", False)],
)
def test_throttle_sweep_listed_points(F, collective, yaw_whole):
    """The five points the seed lists, judged to rounding (9.0 and 15.4 sit on transitions)."""
    out, _ = sweep("rp1", SWEEP_TORQUE, np.array([F]))
    achieved, s, tol = out.achieved[0, 0], out.yaw_scale[0], 1e-9
    if collective == "raised":
        assert achieved > F + 1.0
    elif collective == "held below":
        assert achieved < F - 1e-3
    else:
        assert achieved == pytest.approx(F, abs=tol)
    assert s == pytest.approx(1.0, abs=tol) if yaw_whole else s < 0.99


def test_bb_t1_rotor_thrust_step_per_collective_step():
    """BB-T1: max over the sweep of max_i |ΔT_i| / ΔF ≤ 1; the seed reports 0.5, which is where
    yaw is being restored (c = F/4, t = c − L_a: pair b's mean 2c − L_a moves ΔF/2)."""
    out, _ = rp1_sweep()
    step = np.max(np.abs(np.diff(out.thrusts, axis=0)), axis=1) / np.diff(SWEEP_F)
    assert step.max() <= 1.0
    assert step.max() == pytest.approx(0.5, abs=1e-6)


def test_plus_layout_keeps_the_same_priority():
    """Seed-003 "+" (cmu_plus): pair a = front/rear (CCW) carries pitch, pair b = left/right
    (CW) roll. A sweep with pitch the wider spread shows the four transitions where the
    seed's steps put them, with the same report sequence as the Quad X."""
    mp = vehicle("cmu_plus")
    assert mp.layout == MixerLayout("plus", (0, 2, 1, 3))
    d, k_m, hi = 0.1103, 0.017, float(mp.t_max)
    torque = (0.05, 0.15, 0.02)
    # pair a: T_front/rear = f − Y ∓ τy/(2d); pair b: T_left/right = f + Y ± τx/(2d)
    expected = pair_transitions(torque[1] / (2 * d), torque[0] / (2 * d), torque[2] / (4 * k_m), 0.0, hi)
    F = np.arange(0.0, 13.0, 0.002)
    _, report = sweep("cmu_plus", torque, F)
    where, reports = sweep_transitions(F, report)
    assert_within(where, expected, 0.002)
    assert reports == [(0, 0, 1, -1), (0, 0, 1, 0), (0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 1, 1)]
    # roll beyond reach: σ < 1 cuts roll and pitch alike, direction kept; the roll pair is
    # then pinned at mid-range and, with no yaw to offset it, so is the collective: 2 T_max
    w = np.array([6.0, 0.6, -0.2, 0.0])
    out, _, _, report = run("cmu_plus", [w])
    sigma = out.rp_scale[0]
    assert sigma < 1.0
    assert_within(out.achieved[0, 1:3], sigma * w[1:3], 1e-12)
    assert out.achieved[0, 0] == pytest.approx(2 * hi, rel=1e-12)
    np.testing.assert_array_equal(report[0], [1, -1, 0, -1])


# --- the pseudo-inverse fallback on a hexacopter ----------------------------------------------


def test_hexacopter_uses_the_pseudo_inverse_fallback():
    """Generic layout: allocate is the minimum-norm inverse (numpy pinv); mix keeps the limits
    and the priority within that allocation, so a demand whose pinv allocation saturates is
    cut, as documented, even where a null-space redistribution could have met it."""
    mp, k = vehicle("hexacopter"), constants("hexacopter")
    assert mp.layout == GENERIC and bool(mixer_params_valid(mp))
    w = np.array([[30.0, 0.8, -0.5, 0.1], [33.39, 0.2, 2.33, 0.23]])
    out, T, _, report = run("hexacopter", w)
    assert_within(T[0], k.P @ w[0], 1e-12)
    # demand 1 is reachable by some T in [0, 10]^6 (LP), but its pinv allocation leaves the box
    reach = linprog(np.zeros(6), A_eq=k.B, b_eq=w[1], bounds=[(0.0, 10.0)] * 6, method="highs")
    assert reach.status == 0 and np.any(k.P @ w[1] > 10.0)
    assert out.yaw_scale[1] < 1.0 and out.rp_scale[1] == 1.0
    assert out.achieved[1, 0] == pytest.approx(33.39, abs=1e-9)  # the collective ranks above yaw
    np.testing.assert_array_equal(report[1], [0, 0, 1, 0])


# --- non-finite and extreme demands ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["rp1", "iris"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_demand_gives_t_min_and_a_flag(name, dtype):
    k = constants(name, dtype)
    bad = [np.nan, np.inf, -np.inf]
    w = [[20.0, 0.1, 0.0, 0.0]] + [[bad[j % 3] if i == j % 4 else 1.0 for i in range(4)] for j in range(12)]
    out, _, _, report = run(name, w, dtype)
    assert out.valid[0] and not np.any(out.valid[1:])
    np.testing.assert_array_equal(out.thrusts[1:], k.lo)
    assert np.all(out.rp_scale[1:] == 0) and np.all(out.yaw_scale[1:] == 0)
    np.testing.assert_array_equal(report[1:], 0)
    # the good demand in the same batch is untouched
    alone, _, _, _ = run(name, w[:1], dtype)
    np.testing.assert_array_equal(out.thrusts[0], alone.thrusts[0])


@pytest.mark.parametrize("name", PROPERTY_VEHICLES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_finite_demands_give_no_nan(name, dtype):
    """Zero, negative collective, 1e6 N·m torques and the largest finite values."""
    k = constants(name, dtype)
    big = float(jnp.finfo(dtype).max)
    w = [[0, 0, 0, 0], [-50, 0, 0, 0], [10, 1e6, -1e6, 1e6], [0, 0, 0, -1e6], [big, big, -big, big],
         [-big, -big, big, -big], [big, 0, 0, 0], [1e-30, 1e-30, -1e-30, 1e-30]]
    out, _, _, _ = run(name, w, dtype)
    T = out.thrusts
    assert np.all(np.isfinite(T)) and np.all(T >= k.lo) and np.all(T <= k.hi)
    assert np.all(np.isfinite(out.achieved)) and np.all(out.valid)
    # no demand, or a negative collective: idle, the least collective along P₀ (no torque) that keeps
    # every rotor at T_min or above: all at T_min where P₀ is uniform, one of them on a lopsided frame
    idle = k.lo * k.P[:, 0] / k.P[:, 0].min()
    assert_within(T[:2], idle, 16 * eps_of(dtype) * k.hi)
    assert out.rp_scale[2] > 0


# --- jit, vmap, dtypes ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, dtype", [("rp1", jnp.float32), ("rp1", jnp.float64), ("iris", jnp.float32)])
def test_jit_vmap_and_dtype(name, dtype):
    """Leading axes broadcast, vmap and jit agree; every field keeps the caller's dtype."""
    mp = vehicle(name, dtype)
    w = saturating_demands(name, BATCH, seed=5).astype(np.dtype(dtype))
    jitted, alloc, _, _ = probe(mp, w)  # (BATCH, 4) handled by broadcasting, under jit
    vmapped = jax.jit(jax.vmap(mix, in_axes=(None, 0)))(mp, w)
    tol = 64 * eps_of(dtype) * constants(name, dtype).rows.max()
    for x, y in zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(vmapped), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert_within(x, y, tol)
    assert [leaf.dtype for leaf in jax.tree_util.tree_leaves(jitted)] == [dtype] * 4 + [jnp.bool_] * 2
    assert alloc.dtype == dtype and to_rotor_command(mp, jitted.thrusts).dtype == dtype
    if name == "rp1" and dtype == jnp.float64:  # op by op: jit == no jit, (2, 3, 4) leading axes
        eager = mix(mp, w[:6].reshape(2, 3, 4))
        assert_within(eager.thrusts.reshape(6, 4), jitted.thrusts[:6], tol)
        assert eager.thrusts.dtype == dtype


def test_vmap_over_mixer_params_matches_a_loop():
    """A batch of vehicles (T_max, k_m and geometry varied) under vmap, both paths."""
    w = np.array([[3.0, 0.4, -0.2, 0.1], [30.0, 1.0, 0.5, -0.3], [45.0, 0.0, 0.1, 0.05]])
    for name in ("rp1", "iris"):
        base = vehicle(name)
        params = [
            base.replace(t_max=base.t_max * f, k_m=base.k_m * g, rotor_positions=base.rotor_positions * h)
            for f, g, h in [(0.5, 1.0, 1.0), (1.0, 1.7, 1.0), (1.3, 0.6, 1.4)]
        ]
        batch = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *params)
        assert np.all(np.asarray(jax.jit(mixer_params_valid)(batch)))
        batched = jax.jit(jax.vmap(mix))(batch, w)
        with pytest.raises(ValueError, match="one vehicle"):
            mix(batch, w)
        for k, p in enumerate(params):
            assert_within(batched.thrusts[k], probe(p, np.tile(w[k], (BATCH, 1)))[0].thrusts[0], 1e-12)


def test_second_call_does_not_recompile():
    f = jax.jit(lambda mp, w: mix(mp, w))
    mp = vehicle("rp1", jnp.float32)
    f(mp, np.ones(4, np.float32))
    f(mp.replace(t_max=mp.t_max * 0.9), np.full(4, 2.0, np.float32))
    assert f._cache_size() == 1


# --- gradients --------------------------------------------------------------------------------------


def _objective(mp, w):
    out = mix(mp, w)
    weights = jnp.linspace(0.5, 1.5, out.thrusts.shape[-1], dtype=out.thrusts.dtype)
    return jnp.sum(weights * out.thrusts) + out.rp_scale + out.yaw_scale + jnp.sum(out.achieved)


grad_objective = jax.jit(jax.vmap(jax.grad(_objective, argnums=(0, 1)), in_axes=(None, 0)))
GRAD_POINTS = [
    [0, 0, 0, 0], [9.0, 0.5, 0.2, 0.1], [15.4, 0.5, 0.2, 0.1], [41.6, 0.5, 0.2, 0.1], [-5, 0, 0, 0],
    [10, 1e6, -1e6, 1e6], [10, 0.3, 0.0, 0.0], [20.0, 0.1, -0.05, 0.02], [3.0, 0.5, 0.2, 0.1],
    [45.0, 0.5, 0.2, 0.1], [20.0, 3.0, 1.0, 0.05], ["max"] * 4, [np.nan, 0, 0, 0], [np.inf, 1, 1, 1],
]


def grad_points(dtype):
    big = float(jnp.finfo(dtype).max)
    return np.array([[big if v == "max" else v for v in p] for p in GRAD_POINTS], dtype=np.dtype(dtype))


@pytest.mark.parametrize(
    "name, dtype",
    [("rp1", jnp.float64), ("cmu_plus", jnp.float32), ("iris", jnp.float64)],
)
def test_gradients_finite_everywhere(name, dtype):
    """Finite gradients w.r.t. the demand and every parameter leaf, at kinks and extremes."""
    g_mp, g_w = grad_objective(vehicle(name, dtype), grad_points(dtype))
    for leaf in jax.tree_util.tree_leaves((g_mp, g_w)):
        assert np.all(np.isfinite(np.asarray(leaf)))


@pytest.mark.parametrize("name", ["rp1", "iris"])
def test_gradient_matches_finite_differences(name):
    """Where the mapping is smooth (inside one saturation regime), grad = central differences."""
    mp = vehicle(name)
    smooth = slice(7, 11)  # points on no kink
    points = grad_points(jnp.float64)[smooth]
    g = grad_objective(mp, grad_points(jnp.float64))[1][smooth]
    h = 1e-6
    shifted = np.concatenate([points[:, None, :] + h * np.eye(4), points[:, None, :] - h * np.eye(4)], axis=1)
    out, _, _, _ = run(name, shifted.reshape(-1, 4))
    weights = np.linspace(0.5, 1.5, constants(name).R)
    value = out.thrusts @ weights + out.rp_scale + out.yaw_scale + out.achieved.sum(axis=1)
    value = value.reshape(len(points), 8)
    fd = (value[:, :4] - value[:, 4:]) / (2 * h)
    assert_within(g, fd, 1e-6 * (1 + np.abs(fd)))


# --- rotor command, parameters, layouts -----------------------------------------------------------


def test_to_rotor_command_inverts_the_thrust_law():
    qp = presets.rp1()
    mp = mixer_params_from(qp)
    T = jnp.asarray([0.0, 1.0, 6.0, 12.0])
    omega = to_rotor_command(mp, T)
    np.testing.assert_allclose(rotor_thrusts(qp, omega, 0.0), T, rtol=1e-12)
    assert float(omega[3]) == pytest.approx(float(qp.omega_max), rel=1e-12)
    np.testing.assert_array_equal(to_rotor_command(mp, jnp.asarray([-1.0, np.nan, np.inf, 0.0])), 0.0)
    g = jax.grad(lambda t: jnp.sum(to_rotor_command(mp, t)))(jnp.asarray([0.0, 1.0, 2.0, 3.0]))
    assert np.all(np.isfinite(np.asarray(g)))


def test_mixer_params_from_sets_limits_and_layouts():
    for name, kind in LAYOUTS.items():
        if name in BUILT:
            continue
        qp = presets.get(name)
        mp = mixer_params_from(qp)
        assert mp.layout.kind == kind and bool(mixer_params_valid(mp))
        assert float(mp.t_min) == 0.0
        assert float(mp.t_max) == pytest.approx(float(qp.k_f * qp.omega_max**2), rel=1e-12)
    assert vehicle("rectangle").layout == MixerLayout("opposed_pairs", (0, 1, 2, 3))
    # traced params need an explicit layout
    with pytest.raises(ValueError, match="layout"):
        jax.jit(lambda q: mixer_params_from(q).t_max)(presets.rp1())
    layout = vehicle("rp1").layout
    t_max = jax.jit(lambda q: mixer_params_from(q, layout=layout).t_max)(presets.rp1())
    assert float(t_max) == pytest.approx(12.0, rel=1e-9)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(k_m=-0.01), "k_m"),
        (dict(k_f=0.0), "k_f"),
        (dict(t_min=-1.0), "t_min"),
        (dict(t_min=5.0, t_max=5.0), "t_max"),
        (dict(t_max=np.inf), "t_max"),
        (dict(rotor_spins=(1.0, 1.0, -1.0, 0.5)), "rotor_spins"),
        (dict(rotor_positions=((0.1, 0.1, 0), (0.1, 0.1, 0), (0.1, 0.1, 0), (0.1, 0.1, 0))), "rotor_positions"),
        (dict(rotor_positions=((np.nan, 0.1, 0), (-0.1, 0.1, 0), (0.1, 0.1, 0), (-0.1, -0.1, 0))), "rotor_positions"),
        (dict(rotor_positions=((0.1, -0.1, 0), (-0.1, 0.1, 0))), "rotor_positions"),
        (dict(layout=MixerLayout("plus", (0, 2, 1, 3))), "rotor_positions"),  # a Quad X is no "+"
        (dict(layout="closed"), "layout"),
    ],
)
def test_bad_parameters_raise_naming_the_field(change, field):
    kw = dict(
        rotor_positions=presets.quad_x_positions(0.1), rotor_spins=(1.0, 1.0, -1.0, -1.0),
        k_m=0.016, k_f=1e-6, t_max=10.0,
    )
    kw.update(change)
    with pytest.raises(ValueError, match=f"MixerParams.{field}"):
        MixerParams.create(**kw)


def test_mixer_params_valid_per_vehicle_under_jit():
    good = vehicle("rp1")
    bad = good.replace(t_max=jnp.asarray(-1.0))
    twisted = good.replace(rotor_positions=good.rotor_positions.at[1, :2].set(jnp.asarray([-0.09, 0.07])))
    batch = jax.tree_util.tree_map(lambda *x: jnp.stack(x), good, bad, twisted)
    np.testing.assert_array_equal(jax.jit(mixer_params_valid)(batch), [True, False, False])
    assert bool(mixer_params_valid(twisted.replace(layout=GENERIC)))  # fine for the generic path


def test_quad_x_constructor_matches_the_preset():
    mp = MixerParams.quad_x(arm=0.7 / 9.0 * math.sqrt(2.0), k_m=0.1 / 6.4, k_f=8.9e-7, t_max=12.0)
    ref = vehicle("rp1")
    assert mp.layout == ref.layout
    np.testing.assert_allclose(mp.rotor_positions, ref.rotor_positions, rtol=1e-12)
