"""Reduced precision (seed 000, "Scalar types") and the step's operation count ("Timing").

The characterisation itself is benchmarks/precision.py; here: the rules it relies on, each on a
short horizon. tests/conftest.py enables x64, so float64 references are at hand.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.integrators
import quadjax.quadrotor
from quadjax import native
from quadjax.invariants import unit_quaternion
from quadjax.quaternion import quat_normalize
from quadjax.verify import opcount, precision

DT = 1e-3


def _hover_run(dtype, steps, plain=False):
    """RP-1 hovering at 1 m under its own dtype's hover command for ``steps`` steps (one jit, one scan)."""
    p = qj.presets.rp1(dtype=dtype)
    s = qj.hover_state(p, position=(0.0, 0.0, 1.0))
    if plain:  # a hand-built all-16-bit state: the energy in the dtype itself
        s = s.replace(energy=s.energy.astype(p.mass.dtype))
    u = qj.hover_rotor_speed(p)

    @jax.jit
    def run(s):
        return jax.lax.scan(lambda x, _: (qj.rk4_step(p, x, u, DT), None), s, None, length=steps)[0]

    return p, run(s)


# --------------------------------------------------------------------------- parameters (I1)


def test_float16_rejects_rp1_by_naming_k_f_and_the_smallest_normal():
    smallest = float(np.finfo(np.float16).smallest_normal)
    assert 8.9e-7 < smallest  # why: RP-1's k_f is subnormal in IEEE binary16
    with pytest.raises(ValueError, match=rf"QuadParams\.k_f .*float16.*{smallest:.4g}"):
        qj.presets.rp1(dtype="float16")
    # the same params cast past the constructor: named by check_params, refused by I1 under jit
    cast = qj.presets.rp1(dtype="float64").astype("float16")
    with pytest.raises(ValueError, match=r"QuadParams\.k_f .*subnormal"):
        qj.check_params(cast)
    assert not bool(jax.jit(qj.params_valid)(cast))


def test_params_valid_sees_a_subnormal_under_jit():
    """XLA's CPU backend treats subnormal operands as zero, so a |x| >= tiny test would pass
    one; I1 reads the bits. 1e-310 is subnormal in float64, 1e-300 normal."""
    p = qj.presets.rp1(dtype="float64")
    assert bool(jax.jit(qj.params_valid)(p.replace(k_f=jnp.asarray(1e-300))))
    assert not bool(jax.jit(qj.params_valid)(p.replace(k_f=jnp.asarray(1e-310))))
    assert not bool(qj.params_valid(p.replace(k_f=jnp.asarray(1e-310))))


def test_bfloat16_params_are_accepted_and_a_step_keeps_the_dtypes():
    p = qj.presets.rp1(dtype=jnp.bfloat16)
    qj.check_params(p)
    assert bool(jax.jit(qj.params_valid)(p))
    s = qj.hover_state(p, position=(0.0, 0.0, 1.0))
    assert s.position.dtype == jnp.bfloat16 and s.energy.dtype == jnp.float32  # the accumulator
    u = qj.hover_rotor_speed(p)
    assert u.dtype == jnp.bfloat16
    after = jax.jit(qj.rk4_step)(p, s, u, DT)
    assert jax.tree_util.tree_map(lambda x: x.dtype, after) == jax.tree_util.tree_map(lambda x: x.dtype, s)
    rates = qj.derivative(p, s, u)
    assert {x.dtype for x in jax.tree_util.tree_leaves(rates)} == {jnp.dtype(jnp.bfloat16)}
    assert int(qj.state_violation(p, after)) == 0
    # the state the step made is the dynamics', not a copy: the energy grew by Ė dt to bf16's rounding
    e_dot = float(rates.energy)
    assert abs(float(after.energy) - e_dot * DT) <= 4 * float(jnp.finfo(jnp.bfloat16).eps) * e_dot * DT


# --------------------------------------------------------------------------- energy accumulator


def test_bfloat16_energy_accumulates_to_float64s():
    """2000 hover steps (2 s, ≈ 500 J). The float32 accumulator's own rounding is ~1e-5 here; the
    rest is bfloat16's on the rate Σ k_p ω³ and on the RK4 weights h bᵢ, each ≤ 2⁻⁸ relative
    (bf16 keeps 8 significant bits), so within 2 %. A bf16 energy stalls at ~32 J instead."""
    p64, ref = _hover_run("float64", 2000)
    _, got = _hover_run("bfloat16", 2000)
    assert float(ref.energy) > 400.0  # the vehicle drew what its hover power says: the test has teeth
    assert abs(float(got.energy) - float(ref.energy)) <= 0.02 * float(ref.energy)


def test_a_plain_bfloat16_energy_stalls():
    """Why the accumulator: a hand-built all-bf16 state stops accumulating where Ė h bᵢ falls
    below half an ulp of the sum (a few tens of J), far short of the float64 energy."""
    _, ref = _hover_run("float64", 2000)
    _, plain = _hover_run("bfloat16", 2000, plain=True)
    assert plain.energy.dtype == jnp.bfloat16
    assert float(plain.energy) < 0.5 * float(ref.energy)


# --------------------------------------------------------------------------- invariants and drift


@pytest.fixture(scope="module")
def rows():
    """The characterisation on short horizons: float64 reference, float32, bfloat16, float16."""
    return precision.characterise(steps=(100, 1000), dtypes=("float64", "float32", "bfloat16", "float16"),
                                  plain_energy=())


def test_invariants_hold_at_each_precision(rows):
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["dtype"] for r in ok} == {"float64", "float32", "bfloat16"}
    assert {r["scenario"] for r in ok} == set(precision.SCENARIOS)
    assert all(r["invariant"] == "none" for r in ok), [r for r in ok if r["invariant"] != "none"]
    # the rotation scenarios rotated (at bf16 too): the invariants were checked on moving attitudes
    assert all(r["attitude_error"] > 0 for r in ok if r["dtype"] == "bfloat16" and r["scenario"] != "hover")


def test_float16_rows_are_rejected_with_the_message(rows):
    f16 = [r for r in rows if r["dtype"] == "float16"]
    assert len(f16) == len(precision.SCENARIOS) * 2
    assert all(r["status"].startswith("rejected: QuadParams.k_f") and r["position_error"] is None for r in f16)
    md = precision.format_markdown(rows)
    assert "float16**: rejected: QuadParams.k_f" in md and "| bfloat16 | float32 | 1000 |" in md


def test_float32_hover_drift_is_rounding_sized(rows):
    """1000 hover steps (t = 1 s) at 10 m. Bound: float32 rounds each operation to ε/2; give the
    specific force a relative error of K = 100 ε (the step's ~1700 operations, few of them on the
    force) held for t, so |Δv| ≤ g t K ε and |Δp| ≤ ½ g t² K ε + 10 ulp(z) (the height itself
    rounds to its ulp); the attitude is tilted by a moment error of K ε of the rotors' roll
    moment ΣT·a, |Δθ| ≤ ½ (m g a K ε / J_xx) t². The energy is a running sum: each of RK4's 4
    additions per step rounds it by ≤ ε/2 of itself, so over n steps |ΔE|/E ≤ 2 n ε."""
    r = next(r for r in rows if r["dtype"] == "float32" and r["scenario"] == "hover" and r["steps"] == 1000)
    p = qj.presets.rp1(dtype="float64")
    eps, t, g = float(np.finfo(np.float32).eps), 1000 * DT, float(p.gravity)
    K = 100
    ulp_z = float(np.spacing(np.float32(precision.START_HEIGHT)))
    arm = float(np.abs(p.rotor_positions[0, 0]))
    assert r["velocity_error"] <= g * t * K * eps
    assert r["position_error"] <= 0.5 * g * t**2 * K * eps + 10 * ulp_z
    assert r["attitude_error"] <= 0.5 * float(p.mass) * g * arm * K * eps / float(p.inertia[0, 0]) * t**2
    assert r["energy_error_rel"] <= 2 * r["steps"] * eps


def test_i2_tolerance_fits_each_dtype():
    """I2's 8 ε: wide enough for a quaternion normalised in the dtype (the step's last act on
    it), narrow enough to see a quaternion 16 ε off."""
    rng = np.random.default_rng(0)
    q64 = rng.normal(size=(4000, 4))
    for dtype in (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16):
        q = quat_normalize(jnp.asarray(q64, dtype))
        assert bool(jnp.all(unit_quaternion(q))), dtype
        off = jnp.asarray([1.0 + 8 * float(jnp.finfo(dtype).eps), 0.0, 0.0, 0.0], dtype)  # |q|² ≈ 1 + 16 ε
        assert not bool(unit_quaternion(off)), dtype


# --------------------------------------------------------------------------- the engine


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_engine_refuses_16_bit_and_says_what_to_use(dtype):
    p = qj.presets.rp1(dtype="float64")
    s0 = jax.tree_util.tree_map(lambda x: x.astype(dtype), qj.hover_state(p))
    with pytest.raises(ValueError, match=r"float32 or float64.*model functions"):
        qj.simulate(p, s0, DT, commands=jnp.zeros((3, 4)))


def test_a_16_bit_step_runs_outside_the_native_kernel():
    """The kernel covers float32 and float64; rk4_step takes its XLA form for anything else,
    and agrees with it (one function)."""
    assert not native.supports(4, jnp.bfloat16) and native.supports(4, jnp.float32)
    p = qj.presets.rp1(dtype=jnp.bfloat16)
    s, u = qj.hover_state(p), qj.hover_rotor_speed(p)
    a = jax.jit(qj.rk4_step)(p, s, u * 1.01, DT)
    b = jax.jit(quadjax.integrators.rk4_step_xla)(p, s, u * 1.01, DT)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda x, y: bool(jnp.all(x == y)), a, b))


# --------------------------------------------------------------------------- operation count


@pytest.fixture(scope="module")
def p64():
    return qj.presets.rp1(dtype="float64")


def _cases(p):
    w = qj.hover_rotor_speed(p)
    airborne = (qj.hover_state(p, position=(0.0, 0.0, 1.0)), w)
    grounded = (qj.QuadState.create(on_ground=1.0, dtype="float64"), 0 * w)
    return [airborne, grounded] + opcount.random_states(p, 4)


def test_operation_count_is_the_same_for_every_state(p64, monkeypatch):
    counts = [opcount.operation_count(p64, s, u, DT) for s, u in _cases(p64)]
    assert all(c == counts[0] for c in counts)
    c = counts[0]
    assert c["total"] == sum(v for k, v in c.items() if k not in ("total", "arithmetic"))
    assert 0 < c["arithmetic"] < c["total"]
    assert c["select_n"] > 0 and "while" not in c
    # its only conds are the effects' gates, which the parameters decide, not the state: without
    # them there is none (ground contact is a select: both arms computed)
    assert c["cond"] > 0
    monkeypatch.setattr(quadjax.quadrotor, "gated", lambda on, term, off, *args, **_: term(*args))
    ungated = opcount.operation_count(p64, *_cases(p64)[0], DT)
    assert "cond" not in ungated and ungated["arithmetic"] > c["arithmetic"]


def test_a_planted_multiply_changes_the_count(p64, monkeypatch):
    """One extra multiply per rotor thrust: RK4 evaluates the thrusts once per stage, so the
    count grows by 4 stages × R rotors multiplies, and nothing else."""
    s, u = qj.hover_state(p64), qj.hover_rotor_speed(p64)
    before = opcount.operation_count(p64, s, u, DT)
    original = quadjax.quadrotor.rotor_thrusts_c
    monkeypatch.setattr(quadjax.quadrotor, "rotor_thrusts_c",
                        lambda params, w, e: tuple(1.0 * t for t in original(params, w, e)))
    after = opcount.operation_count(p64, s, u, DT)
    extra = 4 * p64.num_rotors
    assert after["mul"] == before["mul"] + extra
    assert after["total"] == before["total"] + extra and after["arithmetic"] == before["arithmetic"] + extra


def test_a_data_dependent_branch_would_show(p64, monkeypatch):
    """The equality above can fail: with ground contact behind a lax.cond whose grounded arm
    does one more operation, the airborne and grounded counts differ by it."""
    original = quadjax.integrators.ground_contact_c
    gates = opcount.operation_count(p64, *_cases(p64)[0], DT)["cond"]  # the effects' (the test above)

    def branched(params, before, after):
        def grounded(b, a):
            out = original(params, b, a)
            return out.replace(energy=out.energy * 1.0)

        return jax.lax.cond(before.on_ground > 0.5, grounded, lambda b, a: original(params, b, a), before, after)

    monkeypatch.setattr(quadjax.integrators, "ground_contact_c", branched)
    (air, w_air), (ground, w_ground) = _cases(p64)[:2]
    a = opcount.operation_count(p64, air, w_air, DT)
    g = opcount.operation_count(p64, ground, w_ground, DT)
    assert g["mul"] == a["mul"] + 1 and a["cond"] == g["cond"] == gates + 1
