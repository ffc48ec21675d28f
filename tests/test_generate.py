"""C generated from the JAX model (quadjax.native.generate) against the model itself.

The generated step is compiled with the system C compiler (no FMA contraction) and called
through ctypes, one vehicle at a time; the reference is the XLA form of ``rk4_step`` (on the CPU
``qj.rk4_step`` itself runs the native kernel, generated once per process). Every leaf of
QuadParams varies per vehicle; 4, 6 and 8 rotors; both dtypes. A planted one-line change to
the model reaches the generated code in exactly the same way, which is what "one source"
means.
"""

import ctypes
import dataclasses
import platform
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.quadrotor
from quadjax.native.generate import Layout, UnsupportedPrimitive, generate
from quadjax.integrators import rk4_step_xla as XLA_STEP
from tests.helpers import varied_fleet

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")
TOL = {"float64": dict(rtol=1e-12, atol=1e-12), "float32": dict(rtol=2e-5, atol=2e-5)}


def _compile(source: str, folder, name="step", opt="-O2"):
    c = folder / f"{name}.c"
    c.write_text(source)
    lib = folder / f"{name}.so"
    subprocess.run([CC, opt, "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-o", str(lib), str(c),
                    "-lm"], check=True)
    return getattr(ctypes.CDLL(str(lib)), name)


def _call(fn, args, out_size, dtype):
    flat = np.ascontiguousarray(np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(args)]),
                                dtype=dtype)
    out = np.zeros(out_size, dtype)
    fn(ctypes.c_void_p(flat.ctypes.data), ctypes.c_void_p(out.ctypes.data))
    return out


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


@needs_cc
@pytest.mark.parametrize("R", [4, 6, 8])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_generated_step_equals_the_model_with_every_leaf_varied(tmp_path, R, dtype):
    fleet = varied_fleet(R, 12, dtype, seed=R)
    source, layout_in, layout_out = generate(qj.rk4_step, fleet[0], "step")
    step = _compile(source, tmp_path)
    reference = jax.jit(XLA_STEP)
    names = [f.name for f in dataclasses.fields(qj.QuadParams)]
    varied = {n: len({tuple(np.ravel(np.asarray(getattr(v[0], n)))) for v in fleet}) for n in names}
    assert all(k > 1 for k in varied.values()), varied  # every leaf differs between vehicles
    for args in fleet:
        assert np.all(np.isfinite(_flat(args)))
        got = _call(step, args, layout_out.size, dtype)
        want = _flat(reference(*args))
        np.testing.assert_allclose(got, want, **TOL[dtype])


@needs_cc
def test_a_one_line_physics_change_reaches_the_generated_code_in_the_same_way(tmp_path, monkeypatch):
    """Plant a variant of one effect (rotational drag ∝ ω|ω| instead of ω) in the model: the
    generated code, traced again, moves exactly as the XLA model moves."""
    (args,) = varied_fleet(4, 1, "float64", seed=7)
    # fresh lambdas: make_jaxpr and jit cache traces by function, the model's module globals are read when tracing
    source, _, layout_out = generate(lambda *a: XLA_STEP(*a), args, "base")
    base_c = _call(_compile(source, tmp_path, "base"), args, layout_out.size, "float64")
    base_xla = _flat(jax.jit(lambda *a: XLA_STEP(*a))(*args))

    def quadratic_rate_drag(params, body_rates):
        return tuple(-a * w * jnp.abs(w) * 50.0 for a, w in zip(params.drag_rotational, body_rates))

    monkeypatch.setattr(quadjax.quadrotor, "rotational_drag_moment_c", quadratic_rate_drag)
    source, _, _ = generate(lambda *a: XLA_STEP(*a), args, "variant")
    variant_c = _call(_compile(source, tmp_path, "variant"), args, layout_out.size, "float64")
    variant_xla = _flat(jax.jit(lambda *a: XLA_STEP(*a))(*args))
    change = variant_xla - base_xla
    assert np.abs(change).max() > 1e-6  # the planted change matters
    np.testing.assert_allclose(variant_c - base_c, change, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(variant_c, variant_xla, rtol=1e-12, atol=1e-12)


def test_an_unsupported_primitive_fails_at_generation_naming_it():
    x = jnp.ones(3)
    with pytest.raises(UnsupportedPrimitive, match="cumsum"):
        generate(lambda v: jnp.cumsum(v), (x,), "f")
    with pytest.raises(UnsupportedPrimitive, match="known only at run time"):
        generate(lambda v, i: jax.lax.dynamic_slice(v, (i.astype(jnp.int32),), (1,)), (x, jnp.ones(())), "f")


def test_layouts_are_the_dataclass_fields_in_order():
    p = qj.presets.rp1(dtype="float64")
    s = qj.hover_state(p)
    layout = Layout.of((p, s))
    names = [e[0] for e in layout.entries]
    fields = [f".{f.name}" for f in dataclasses.fields(qj.QuadParams)] + [f".{f.name}" for f in dataclasses.fields(qj.QuadState)]
    assert [n.split("]", 1)[1] for n in names] == fields
    offsets = [e[2] for e in layout.entries]
    sizes = [int(np.prod(e[1])) for e in layout.entries]
    assert offsets == list(np.cumsum([0] + sizes[:-1])) and layout.size == sum(sizes) == len(_flat((p, s)))


@needs_cc
def test_a_division_by_a_choice_of_powers_of_two_is_an_exact_product(tmp_path):
    """JAX's derivative of max / min divides by a choice of 1 and 2 (2 where the operands tie). The
    generator multiplies by the choice of 1 and 1/2 instead, and no division is left: exactly XLA's
    quotient on both sides of a tie and at it (planted: the wrong reciprocal fails at the tie)."""
    def tangents(x, y):
        return jax.jvp(jnp.maximum, (x, y), (jnp.float32(1.25), jnp.float32(3.0)))[1] + jax.jvp(
            jnp.minimum, (x, y), (jnp.float32(0.75), jnp.float32(-2.5)))[1]

    example = (jnp.float32(0.0), jnp.float32(0.0))
    source, _, _ = generate(tangents, example, "tangents")
    assert "/" not in source.split("void tangents")[1]
    fn = _compile(source, tmp_path, "tangents")
    for x, y in ((1.0, 1.0), (2.0, 1.0), (1.0, 2.0), (-0.3, -0.3)):
        args = (jnp.float32(x), jnp.float32(y))
        assert _call(fn, args, 1, "float32")[0] == np.float32(jax.jit(tangents)(*args))


def test_the_kernel_fuses_multiply_adds_itself_the_same_at_every_width(tmp_path):
    """The kernel is built without the compiler's contraction (-ffp-contract=off in
    quadjax.native.FLAGS); the generator writes each fused multiply-add itself, where a product's
    every use is a sum, so the same source rounds the same at every vector width. Here a·b + c with
    a = b = 1 + 2⁻¹², c = −1: fused, 2⁻¹¹ + 2⁻²⁴; rounded twice, 2⁻¹¹. A product that also feeds
    something else (a·d, scaled by p) stays a product, and its sum rounds twice. Every lane, at 16,
    8 and 4 lanes, gets the same bits; d − a·b is fused as well (planted: no fusing gives 2⁻¹¹ and
    fails)."""
    import quadjax.native as native
    from quadjax.native.generate import VECTOR_PRELUDE, generate_kernel

    cxx = native.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    if platform.machine() == "x86_64" and " fma" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("no fused multiply-add in this CPU: the kernel rounds twice (the same at every width)")

    def step(p, s):
        a, b, c, d = s
        return jnp.stack([a * b + c, a * d + c, a * d * p[0], d - a * b])

    example = {"P": jnp.zeros((1,), jnp.float32), "S": jnp.zeros((4,), jnp.float32)}
    one = 1 + 2.0 ** -12
    s = np.array([one, one, -1.0, one], np.float32)
    wide = np.float64(one) * np.float64(one)
    expected = np.array([wide - 1, np.float32(wide) - np.float32(1), np.float32(np.float32(wide) * 3), one - wide],
                        np.float32)
    assert expected[0] != expected[1] and expected[3] != np.float32(one) - np.float32(wide)  # one rounding or two
    for lanes in (16, 8, 4):
        ks = generate_kernel(step, example, carry="S", invariant=("P",), namespace="k", lanes=lanes)
        body = ks.source.split("static inline void step")[1]
        assert body.count("qj_vfma(") == 1 and body.count("qj_vfnma(") == 1  # a·b's two sums; a·d's stays
        cc = tmp_path / f"k{lanes}.cc"
        cc.write_text(VECTOR_PRELUDE + ks.source + f"""
extern "C" void run(const float* p, float* s) {{
  k::V P[1], S[4], H[k::NH];
  for (int l = 0; l < {lanes}; ++l) {{ P[0][l] = p[0]; for (int i = 0; i < 4; ++i) S[i][l] = s[i]; }}
  k::prologue(P, H);
  k::step(H, P, S);
  for (int i = 0; i < 4; ++i) for (int l = 0; l < {lanes}; ++l) s[i * {lanes} + l] = S[i][l];
}}
""")
        lib = tmp_path / f"k{lanes}.so"
        subprocess.run([cxx, *native.FLAGS, "-o", str(lib), str(cc)], check=True)
        run = ctypes.CDLL(str(lib)).run
        buf = np.concatenate([s, np.zeros(4 * lanes - 4, np.float32)])
        run(ctypes.c_void_p(np.array([3.0], np.float32).ctypes.data), ctypes.c_void_p(buf.ctypes.data))
        np.testing.assert_array_equal(buf.reshape(4, lanes), np.repeat(expected[:, None], lanes, 1))
