"""C generated from the JAX model (quadjax.native.generate) against the model itself.

The generated step is compiled with the system C compiler (no FMA contraction) and called
through ctypes, one vehicle at a time; the reference is the XLA ``rk4_step``. Every leaf of
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


def _fleet(R, n, dtype, seed):
    """n vehicles with every QuadParams leaf drawn per vehicle (valid ranges), airborne or
    grounded states, commands around hover, dt per vehicle."""
    rng = np.random.default_rng(seed)
    vehicles = []
    for i in range(n):
        mass = rng.uniform(0.03, 3.0)
        size = rng.uniform(0.02, 0.06) ** 2 * mass
        xx, yy = size * rng.uniform(0.8, 1.0, 2)
        J = np.diag([xx, yy, (xx + yy) * rng.uniform(0.8, 0.98)])  # principal moments: zz <= xx + yy
        J[0, 1] = J[1, 0] = 0.05 * size * rng.uniform(-1, 1)
        J[0, 2] = J[2, 0] = 0.03 * size * rng.uniform(-1, 1)
        J[1, 2] = J[2, 1] = 0.03 * size * rng.uniform(-1, 1)
        angle = 2 * np.pi * (np.arange(R) + 0.5) / R + rng.uniform(-0.1, 0.1, R)
        arm = rng.uniform(0.05, 0.4) * rng.uniform(0.9, 1.1, R)
        spins = rng.permutation(np.where(np.arange(R) % 2 == 0, 1.0, -1.0))  # any balanced CW/CCW order
        omega_max = rng.uniform(500, 3000)
        p = qj.QuadParams.create(
            mass=mass, inertia=J, rotor_positions=np.stack([arm * np.cos(angle), arm * np.sin(angle),
                                                            rng.uniform(-0.02, 0.02, R)], -1),
            rotor_spins=spins, k_f=2.5 * mass * 9.81 / R / omega_max ** 2, k_m=rng.uniform(0.005, 0.03),
            motor_tau=0.0 if i % 4 == 0 else rng.uniform(0.005, 0.08), omega_min=rng.uniform(0, 50),
            omega_max=omega_max, drag_linear=rng.uniform(0, 0.3, 3) * mass,
            drag_quadratic=rng.uniform(0, 0.05, 3) * mass, drag_rotational=rng.uniform(0, 20, 3) * size,
            rotor_inertia=rng.uniform(0, 1e-3) * size, k_p=rng.uniform(0, 1e-8), battery_capacity=rng.uniform(1e3, 1e5),
            battery_sag=rng.uniform(0, 0.3), ground_z=rng.uniform(-1, 1), gravity=rng.uniform(1.6, 11),
            wind=rng.uniform(-3, 3, 3), dtype=dtype)
        hover = np.sqrt(float(p.mass) * float(p.gravity) / R / float(p.k_f))  # the mean hover speed (an
        # uneven layout's per-rotor trim may need negative thrust, and hover_rotor_speed is NaN there)
        q = rng.normal(size=4)
        grounded = i % 5 == 1
        s = qj.QuadState.create(
            position=(rng.uniform(-2, 2), rng.uniform(-2, 2), float(p.ground_z) + (0.0 if grounded else rng.uniform(0.01, 3))),
            velocity=(0, 0, 0) if grounded else rng.uniform(-3, 3, 3), attitude=q / np.linalg.norm(q),
            body_rates=(0, 0, 0) if grounded else rng.uniform(-2, 2, 3),
            rotor_speeds=hover * rng.uniform(0.8, 1.2, R),
            energy=rng.uniform(0, 1.2) * float(p.battery_capacity), on_ground=float(grounded), dtype=dtype)
        u = jnp.asarray(hover * rng.uniform(0.7, 1.3, R), dtype)
        vehicles.append((p, s, u, jnp.asarray(rng.uniform(2e-4, 4e-3), dtype)))
    return vehicles


@needs_cc
@pytest.mark.parametrize("R", [4, 6, 8])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_generated_step_equals_the_model_with_every_leaf_varied(tmp_path, R, dtype):
    fleet = _fleet(R, 12, dtype, seed=R)
    source, layout_in, layout_out = generate(qj.rk4_step, fleet[0], "step")
    step = _compile(source, tmp_path)
    reference = jax.jit(qj.rk4_step)
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
    (args,) = _fleet(4, 1, "float64", seed=7)
    # fresh lambdas: make_jaxpr and jit cache traces by function, the model's module globals are read when tracing
    source, _, layout_out = generate(lambda *a: qj.rk4_step(*a), args, "base")
    base_c = _call(_compile(source, tmp_path, "base"), args, layout_out.size, "float64")
    base_xla = _flat(jax.jit(lambda *a: qj.rk4_step(*a))(*args))

    def quadratic_rate_drag(params, body_rates):
        return tuple(-a * w * jnp.abs(w) * 50.0 for a, w in zip(params.drag_rotational, body_rates))

    monkeypatch.setattr(quadjax.quadrotor, "rotational_drag_moment_c", quadratic_rate_drag)
    source, _, _ = generate(lambda *a: qj.rk4_step(*a), args, "variant")
    variant_c = _call(_compile(source, tmp_path, "variant"), args, layout_out.size, "float64")
    variant_xla = _flat(jax.jit(lambda *a: qj.rk4_step(*a))(*args))
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
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_generated_lane_rollout_equals_the_engine_per_vehicle(tmp_path, dtype):
    """The lane form (W vehicles per call, parameter-only work hoisted out of the time loop):
    each lane, with its own params, state, commands and dt, equals the engine's XLA rollout."""
    from quadjax.native.generate import generate_rollout

    W, T = 4, 30
    fleet = _fleet(4, W, dtype, seed=11)
    p0, s0, u0, dt0 = fleet[0]
    source, layout_p, layout_s = generate_rollout(lambda *a: qj.rk4_step(*a), p0, s0, u0, dt0, "roll", lanes=W)
    roll = _compile(source, tmp_path, "roll", opt="-O1")  # -O2 takes 15 s on the unrolled lanes; same bits
    rng = np.random.default_rng(5)
    commands = [np.asarray(u)[None] * rng.uniform(0.95, 1.05, (T, 4)) for _, _, u, _ in fleet]
    P = np.stack([_flat((p, dt)) for p, _, _, dt in fleet], -1).astype(dtype)  # (NP, W): lane fastest
    S = np.stack([_flat(s) for _, s, _, _ in fleet], -1).astype(dtype)
    U = np.ascontiguousarray(np.stack(commands, -1).astype(dtype))  # (T, R, W)
    assert P.shape[0] == layout_p.size and S.shape[0] == layout_s.size
    roll.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long]
    P, S = np.ascontiguousarray(P), np.ascontiguousarray(S)
    roll(P.ctypes.data, S.ctypes.data, U.ctypes.data, T)
    xla = qj.SimConfig(backend="xla", save_every=0)
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *[(p, s, dt) for p, s, _, dt in fleet])
    run = jax.jit(jax.vmap(lambda p, s, dt, u: qj.simulate(p, s, dt, commands=u, config=xla).final))
    final = run(*stacked, jnp.asarray(np.moveaxis(U, -1, 0)))
    for lane in range(W):
        want = _flat(jax.tree_util.tree_map(lambda x: x[lane], final))
        np.testing.assert_allclose(S[:, lane], want, **TOL[dtype])
