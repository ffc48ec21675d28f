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
import shutil
import subprocess

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
