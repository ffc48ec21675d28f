"""The GPU backend (quadjax.gpu): Pallas kernels from the model's one step, run here in Pallas'
interpreter on the CPU and held to the XLA path (issue 15: f32 to 1e-5 relative, f64 to 1e-12).

* the straight-line form of the step (quadjax.native.generate.straight_line) equals the model for
  every QuadParams leaf varied per vehicle, 4, 6 and 8 rotors, both dtypes, and names a primitive it
  cannot scalarise;
* the open-loop kernel equals rollout_p on XLA: per-vehicle and shared params, commands, wind and
  wrench series, substeps, save strides;
* the closed-loop kernel (PID, geometric) with a fold equals vmap(simulate) with a Reduce hook;
* on a GPU the engine's open loop lowers to the Pallas kernel (cross-lowered for CUDA here: the
  Triton lowering itself runs on this CPU), as does the closed loop;
* benchmarks/gpu.py runs end to end in its --interpret dry run.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from quadjax import gpu, native
from quadjax.control import CascadeRates, Hover, PIDController, pid_control, pid_init
from quadjax.native.generate import UnsupportedPrimitive, straight_line
from tests.helpers import closed_loop_case, varied_fleet, worst_relative

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the issue's bar, relative to 1 + |x| (positions near 0 have no relative scale)
TOL = {jnp.float32: 1e-5, jnp.float64: 1e-12}




def _stack(trees):
    return jax.tree_util.tree_map(lambda *x: jnp.stack(x), *trees)


# --------------------------------------------------------------------------- the straight-line step


@pytest.mark.parametrize("R,dtype", [(4, jnp.float32), (4, jnp.float64), (6, jnp.float64), (8, jnp.float32)])
def test_straight_line_step_equals_the_model(R, dtype):
    """Every leaf varied per vehicle (varied_fleet): the straight-line step of kernel_step, evaluated
    on (N,) arrays, equals vmap(kernel_step) on XLA; wind and wrench inputs included."""
    fleet = varied_fleet(R, 12, dtype, seed=R)
    ps, ss, us, dts = (_stack(x) if i < 2 else jnp.stack(x) for i, x in enumerate(zip(*fleet)))
    rng = np.random.default_rng(R)
    wind = jnp.asarray(rng.uniform(-3, 3, (12, 3)), dtype)
    wrench = jnp.asarray(rng.uniform(-0.1, 0.1, (12, 6)), dtype)
    step = straight_line(native.kernel_step, native.step_example(R, np.dtype(dtype)), invariant=("P",))
    assert step.operations > 500 and len(step.prologue_ops) > 10  # the params' work is hoisted

    def rows(x):  # (N, ...) → the flat elements, each (N,)
        return list(jnp.reshape(x, (x.shape[0], -1)).T)

    P = [r for leaf in jax.tree_util.tree_leaves((ps, dts)) for r in rows(leaf)]
    S = [r for leaf in jax.tree_util.tree_leaves(ss) for r in rows(leaf)]
    out = jax.jit(lambda P, S, U, W, E: step(P=P, S=S, U=U, Wd=W, E=E))(P, S, rows(us), rows(wind), rows(wrench))
    ref = jax.vmap(native.kernel_step)((ps, dts), ss, us, wind, wrench)
    got = native.unpack_state(jnp.stack(out, -1), R)
    assert worst_relative(got, ref) <= TOL[dtype] / 10


def test_straight_line_names_what_it_cannot_scalarise():
    def looping(x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]

    with pytest.raises(UnsupportedPrimitive, match="'while'"):
        straight_line(looping, {"x": jax.ShapeDtypeStruct((), jnp.float32)})


# --------------------------------------------------------------------------- the open loop


def _open_loop_case(dtype, N=6, T=12, per_vehicle_params=True):
    """Packed rows for rollout_p: N vehicles of varied_fleet (or one vehicle's params shared),
    per-vehicle commands, wind and wrench series."""
    fleet = varied_fleet(4, N, dtype, seed=3)
    rng = np.random.default_rng(4)
    h = jnp.asarray(1e-3, dtype)
    params = [p for p, *_ in fleet] if per_vehicle_params else [fleet[0][0]]
    P = jnp.stack([native.pack_params(p, h) for p in params])
    X = jnp.stack([native.pack_state(s) for _, s, _, _ in fleet])
    U = jnp.stack([u * jnp.asarray(rng.uniform(0.9, 1.1, (T, 4)), dtype) for _, _, u, _ in fleet])
    Wd = jnp.asarray(rng.uniform(-2, 2, (N, T, 3)), dtype)
    E = jnp.asarray(rng.uniform(-0.05, 0.05, (1, 1, 6)), dtype)  # one held wrench for all
    return P, X, U, Wd, E


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_open_loop_kernel_equals_xla(dtype):
    """Per-vehicle params (every leaf varied), commands and a wind series, one held wrench, 2
    substeps, states saved every 4th tick; N = 6 in blocks of 4 (one padded block)."""
    args = _open_loop_case(dtype)
    kw = dict(substeps=2, save_every=4, rotors=4)
    final, saved = gpu.rollout_rows(*args, block=4, interpret=True, **kw)
    ref_final, ref_saved = native._xla(*args, **kw)
    assert final.dtype == dtype and final.shape == ref_final.shape and saved.shape == ref_saved.shape == (6, 3, 19)
    assert worst_relative(final, ref_final) <= TOL[dtype]
    assert worst_relative(saved, ref_saved) <= TOL[dtype]


def test_open_loop_kernel_shared_params_final_only():
    """Params shared by every vehicle travel once (not per vehicle): the same numbers as XLA."""
    args = _open_loop_case(jnp.float64, N=5, per_vehicle_params=False)
    final, saved = gpu.rollout_rows(*args, substeps=1, save_every=0, rotors=4, block=8, interpret=True)
    ref, _ = native._xla(*args, substeps=1, save_every=0, rotors=4)
    assert saved.shape == (5, 0, 19)
    assert worst_relative(final, ref) <= TOL[jnp.float64]


# --------------------------------------------------------------------------- the closed loop


# PID in float32 against the engine: benchmarks/gpu.py's dry run (test_gpu_benchmark_dry_run)
@pytest.mark.parametrize("name,dtype", [("pid", jnp.float64), ("geometric", jnp.float64)])
def test_closed_loop_kernel_equals_the_engine(name, dtype):
    """N = 5 vehicles of different mass and inertia from scattered velocities, 30 ticks of 2 ms, 2
    substeps, the worst distance to the target folded: final state, controller state and fold
    equal vmap(simulate(controller=..., hooks=(Reduce(...),))) on XLA."""
    case = closed_loop_case(name, dtype)
    out = gpu.closed_loop(**case["args"], block=4, interpret=True)
    final, cs, acc = case["reference"]
    assert float(jnp.min(acc)) > 0.07  # the fold saw the flight (the start is 0.077 m off the target)
    assert worst_relative(out.final, final) <= TOL[dtype]
    assert worst_relative(out.ctrl_state, cs) <= TOL[dtype] * 10  # integrators and filters: rounding amplified by 1/h
    assert worst_relative(out.fold, acc) <= TOL[dtype]
    assert out.final.position.dtype == dtype


def test_closed_loop_refuses_bad_arguments():
    p = qj.presets.rp1(jnp.float32)
    law, init = functools.partial(pid_control, rates=CascadeRates(dt=0.002)), pid_init
    ctrl = PIDController.create(p, Hover(position=jnp.zeros(3, jnp.float32), yaw=jnp.zeros((), jnp.float32)))
    s0 = qj.hover_state(p)
    two = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), s0)
    three = jax.tree_util.tree_map(lambda x: jnp.stack([x, x, x]), p)
    with pytest.raises(ValueError, match="agree on N"):
        gpu.closed_loop(three, two, law, ctrl, init(ctrl, s0), dt=0.002, num_ticks=3, in_axes=(0, 0, None, None, None),
                        interpret=True)
    with pytest.raises(ValueError, match="num_ticks"):
        gpu.closed_loop(p, two, law, ctrl, init(ctrl, s0), dt=0.002, num_ticks=0, in_axes=(None, 0, None, None, None))
    with pytest.raises(ValueError, match="in_axes"):
        gpu.closed_loop(p, two, law, ctrl, init(ctrl, s0), dt=0.002, num_ticks=3, in_axes=(1, 0, None, None, None))


# --------------------------------------------------------------------------- on a GPU


def _cuda_text(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_on_a_gpu_the_engine_runs_the_pallas_kernel(monkeypatch):
    """With a GPU as JAX's backend (faked: the lowering for CUDA runs on this CPU), backend="auto"
    picks the kernel, and vmap(simulate) lowers to ONE Triton kernel for the whole horizon; its
    gradient lowers too (XLA's derivatives of the same rollout); the closed-loop kernel lowers."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    p = qj.presets.rp1(jnp.float32)
    s0 = qj.hover_state(p)
    U = jnp.broadcast_to(qj.hover_rotor_speed(p), (40, 4))
    masses = p.mass * jnp.linspace(0.9, 1.1, 256)

    def fly(m):
        return qj.simulate(p.replace(mass=m), s0, 1e-3, commands=U, config=qj.SimConfig(save_every=10))

    assert jax.eval_shape(fly, masses[0]).backend == "native"
    text = _cuda_text(lambda m: jax.vmap(lambda x: fly(x).states.position)(m), masses)
    assert text.count("xla.gpu.triton") == 1 and "stablehlo.while" not in text
    grad = _cuda_text(jax.grad(lambda m: jnp.sum(jax.vmap(lambda x: fly(x).final.position[2])(m))), masses)
    assert "stablehlo.while" in grad
    law, init = functools.partial(pid_control, rates=CascadeRates(dt=0.002)), pid_init
    ctrl = PIDController.create(p, Hover(position=jnp.zeros(3, jnp.float32), yaw=jnp.zeros((), jnp.float32)))
    ps = jax.vmap(lambda m: p.replace(mass=m))(masses)
    closed = _cuda_text(lambda ps: gpu.closed_loop(ps, s0, law, ctrl, init(ctrl, s0), dt=0.002, num_ticks=50,
                                                   in_axes=(0, None, None, None, None)).final.position, ps)
    assert closed.count("xla.gpu.triton") == 1


def test_on_a_gpu_derivatives_are_xlas_on_the_callers_pytrees(monkeypatch):
    """On a GPU (faked: the engine takes its GPU branch, the kernel lowers to the C one here) the
    open loop flies the kernel and differentiates the XLA open loop on the caller's own pytrees,
    where vmap batches only the leaves that vary; grad, jvp, a second derivative (H·w) and
    vmap(grad) equal backend="xla" to 1e-10 and central differences, and no derivative touches
    the kernel's packed rows (an H200 measured the packed-row route 3.4x slower than XLA's grad)."""
    if not native.available(jnp.float64, 4):  # built and registered before the fake: a GPU skips this
        pytest.skip(f"no native kernel: {native.unavailable_reason(jnp.float64, 4)}")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    p = qj.presets.rp1(jnp.float64)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    t = jnp.arange(30, dtype=jnp.float64)[:, None] * 1e-3
    U = qj.hover_rotor_speed(p) * (1 + 0.05 * jnp.sin(40.0 * t + jnp.arange(4.0)[None]))
    masses = p.mass * jnp.asarray([0.9, 1.0, 1.1])
    weights = jnp.asarray([1.0, -2.0, 3.0])

    def fly(backend, m):
        cfg = qj.SimConfig(save_every=0, backend=backend)
        return qj.simulate(p.replace(mass=m), s0, 2e-3, commands=U, config=cfg)

    def loss(backend):
        return lambda m: jnp.sum(weights * jax.vmap(lambda x: fly(backend, x).final.position)(m)[:, 2])

    assert jax.eval_shape(functools.partial(fly, "auto"), masses[0]).backend == "native"
    kernel, xla = loss("native"), loss("xla")

    @jax.jit  # one program per backend, not op by op
    def derivatives(m):
        f = {"native": kernel, "xla": xla}
        return {k: (f[k](m), jax.grad(f[k])(m), jax.jvp(f[k], (m,), (weights,))[1],
                    jax.jvp(jax.grad(f[k]), (m,), (weights,))[1],  # a second derivative: H·w
                    jax.vmap(jax.grad(lambda x: fly(k, x).final.velocity[2]))(m)) for k in f}

    def packed_rows(*args, **kwargs):  # rollout_p's own derivative rule: must not be reached
        raise AssertionError("a derivative went through the kernel's packed rows (native._xla)")

    monkeypatch.setattr(native, "_xla", packed_rows)
    got = derivatives(masses)
    assert abs(float(got["native"][0] - got["xla"][0])) <= 1e-12 * abs(float(got["xla"][0]))
    for a, b in zip(got["native"][1:], got["xla"][1:]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    e = jnp.eye(3) * 1e-6
    central = jax.jit(jax.vmap(lambda d: (kernel(masses + d) - kernel(masses - d)) / 2e-6))(e)
    np.testing.assert_allclose(got["native"][1], central, rtol=1e-6)


def test_gpu_benchmark_dry_run(tmp_path):
    """benchmarks/gpu.py end to end on the CPU (--interpret): every section written, the kernel
    equal to XLA in each correctness row."""
    # the script builds each program afresh per section (a new closure each time, as a timing run
    # must); a compilation cache of its own loads the repeats instead of compiling them again
    # (97 -> 62 s here), and no number of a dry run means anything
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    run = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu.py"), "--interpret", "--repeats", "1",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "GPU_RESULTS.json").read_text())
    assert set(results["sections"]) == {"correctness", "throughput", "closed_loop", "gradient"}
    assert all(row["max_rel"] <= 1e-5 for row in results["sections"]["correctness"]["rows"])
    assert "## Open loop" in (tmp_path / "GPU_RESULTS.md").read_text()


def _gpu_benchmark_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bench", os.path.join(REPO, "benchmarks", "gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_benchmark_merges_an_earlier_lease(tmp_path):
    """A lease rarely fits every section: --merge keeps an earlier run's sections that this one does
    not measure, with its notes and the skips this run does not redo, but only from the same device
    and jax (else the ratios would mix machines)."""
    mod = _gpu_benchmark_module()
    earlier = {"device": "NVIDIA H200", "jax": "0.11.2", "interpret": False, "notes": ["run 1"],
               "sections": {"correctness": {"rows": [1]}, "closed_loop": {"rows": [2]}},
               "skipped": ["closed loop kernel N=1e6", "throughput xla N=1e7"]}
    path = tmp_path / "GPU_RESULTS.json"
    path.write_text(json.dumps(earlier))
    now = {"device": "NVIDIA H200", "jax": "0.11.2", "interpret": False, "sections": {}, "skipped": []}
    mod.merge_earlier(now, path, ["closed_loop", "gradient"])
    assert now["sections"] == {"correctness": {"rows": [1]}} and now["notes"] == ["run 1"]
    assert now["skipped"] == ["throughput xla N=1e7"]
    other = {"device": "NVIDIA H100", "jax": "0.11.2", "interpret": False, "sections": {}, "skipped": []}
    mod.merge_earlier(other, path, ["gradient"])
    assert other["sections"] == {} and "notes" not in other


def test_gpu_benchmark_records_a_failing_point_and_goes_on():
    """Device time is scarce: a point that fails (say a lowering the dry run cannot see) is recorded
    with its message and reported in the markdown, the next point still runs, and the exit status
    says so."""
    mod = _gpu_benchmark_module()
    bench = mod.Bench(mod.argparse.Namespace(interpret=True, budget=60.0, repeats=1, out="unused"))

    def broken():
        raise RuntimeError("planted: no Triton lowering for foo_p")

    assert bench.attempt("throughput kernel N=1e7", broken) is None
    assert bench.attempt("throughput xla N=1e7", lambda: 42) == 42
    assert bench.results["errors"] == [{"where": "throughput kernel N=1e7",
                                        "error": "RuntimeError: planted: no Triton lowering for foo_p"}]
    text = mod.markdown(bench.results)
    assert "## Errors" in text and "planted: no Triton lowering for foo_p" in text
