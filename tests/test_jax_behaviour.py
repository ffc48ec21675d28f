"""jit, vmap, dtypes and recompilation."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
from tests.helpers import busy_params, busy_state, command_for, leaves_close

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_jit_matches_no_jit(dtype):
    """Within a few ulps here: XLA's CPU backend contracts a·b + c into FMA inside fused
    kernels, which op-by-op execution cannot (openxla/xla#41579). Bit for bit below."""
    p = busy_params(dtype)
    s = busy_state(p, dtype)
    u = command_for(p)
    eager = qj.rk4_step(p, s, u, 1e-3)
    jitted = jax.jit(qj.rk4_step)(p, s, u, 1e-3)
    leaves_close(eager, jitted, rtol=16 * float(jnp.finfo(dtype).eps), atol=1e-30)


def test_jit_matches_no_jit_bit_for_bit_without_fma(tmp_path):
    """With FMA contraction off (an ISA without FMA), jit and op-by-op agree exactly."""
    code = textwrap.dedent(
        """
        import sys, jax, jax.numpy as jnp, numpy as np
        jax.config.update("jax_enable_x64", True)
        # op by op, rk4_step's stage loop (a lax.scan) is compiled anew on every call (its closure
        # is a new jaxpr), each time to the same executable: a process-private persistent cache
        # that keeps any compile over 0.1 s loads it instead (keyed by the program, flags, devices)
        jax.config.update("jax_compilation_cache_dir", sys.argv[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        import quadjax as qj
        from quadjax.integrators import rk4_step_xla  # the XLA form (qj.rk4_step runs the kernel on the CPU)
        from tests.helpers import busy_params, busy_state, command_for, leaves_equal
        for dtype in (jnp.float32, jnp.float64):
            p = busy_params(dtype); s = busy_state(p, dtype); u = command_for(p)
            leaves_equal(qj.rk4_step(p, s, u, 1e-3), jax.jit(qj.rk4_step)(p, s, u, 1e-3))
            leaves_equal(rk4_step_xla(p, s, u, 1e-3), jax.jit(rk4_step_xla)(p, s, u, 1e-3))
            leaves_equal(qj.derivative(p, s, u), jax.jit(qj.derivative)(p, s, u))
            eager = s
            for _ in range(5):  # op by op is slow; 5 steps already exercise the scan's carry
                eager = rk4_step_xla(p, eager, u, 1e-3)
            xla = qj.SimConfig(backend="xla")
            run = jax.jit(lambda p, s, u: qj.simulate(p, s, 1e-3, commands=u, config=xla).final)
            leaves_equal(eager, run(p, s, jnp.tile(u, (5, 1))))
        print("BITWISE-OK")
        """
    )
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_max_isa=AVX", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "xla_cache")], env=env, capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert "BITWISE-OK" in out.stdout, out.stderr[-3000:]


def _stack(items):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *items)


def test_vmap_over_states_matches_a_loop():
    p = busy_params()
    rng = np.random.default_rng(3)
    states = [busy_state(p).replace(velocity=jnp.asarray(rng.normal(size=3))) for _ in range(5)]
    cmds = [command_for(p, tuple(rng.uniform(0.9, 1.1, 4))) for _ in range(5)]
    step = jax.jit(qj.rk4_step)
    loop = _stack([step(p, s, u, 1e-3) for s, u in zip(states, cmds)])
    batched = jax.jit(jax.vmap(qj.rk4_step, in_axes=(None, 0, 0, None)))(p, _stack(states), jnp.stack(cmds), 1e-3)
    leaves_close(loop, batched, rtol=1e-14, atol=1e-300)


def test_vmap_over_params_with_in_axes_pytree_matches_a_loop():
    p = busy_params()
    masses = jnp.asarray([1.2, 1.5, 1.9])
    winds = jnp.asarray([[0.0, 0.0, 0.0], [3.0, 0.0, 0.0], [0.0, -2.0, 1.0]])
    batched_p = p.replace(mass=masses, wind=winds)
    axes = jax.tree_util.tree_map(lambda _: None, p).replace(mass=0, wind=0)
    s, u = busy_state(p), command_for(p)
    f = jax.jit(jax.vmap(lambda pp: qj.simulate(pp, s, 1e-3, commands=jnp.tile(u, (30, 1))).final, in_axes=(axes,)))
    batched = f(batched_p)
    roll = jax.jit(lambda p, s, u, dt: qj.simulate(p, s, dt, commands=u).final)
    loop = _stack([roll(p.replace(mass=m, wind=w), s, jnp.tile(u, (30, 1)), 1e-3) for m, w in zip(masses, winds)])
    leaves_close(loop, batched, rtol=1e-13, atol=1e-300)
    assert float(jnp.std(batched.position[:, 2])) > 0  # the batch genuinely differs


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_dtype_is_kept(dtype):
    p = busy_params(dtype)
    s = busy_state(p, dtype)
    traj = jax.jit(lambda p, s, u, dt: qj.simulate(p, s, dt, commands=u))(p, s, jnp.tile(command_for(p), (3, 1)), 1e-3)
    out = (traj.final, traj.states, traj.commands)
    assert traj.states is not None and traj.commands is not None
    for leaf in jax.tree_util.tree_leaves(out):
        assert leaf.dtype == dtype
    for leaf in jax.tree_util.tree_leaves(qj.derivative(p, s, command_for(p))):
        assert leaf.dtype == dtype
    assert qj.hover_rotor_speed(p).dtype == dtype


def test_second_call_with_new_values_does_not_recompile():
    traces = []

    def step(p, s, u, dt):
        traces.append(1)
        return qj.rk4_step(p, s, u, dt)

    f = jax.jit(step)
    p = busy_params()
    s = busy_state(p)
    f(p, s, command_for(p), 1e-3)
    f64 = jnp.float64
    f(p.replace(mass=jnp.asarray(2.0, f64), wind=jnp.asarray([5.0, 0, 0], f64)), s.replace(energy=jnp.asarray(7.0, f64)),
      command_for(p, (1, 1, 1, 1)), 2e-3)
    assert len(traces) == 1


@pytest.mark.parametrize("effects", [{}, {"k_inflow": 0.02, "rotor_radius": 0.12, "rotor_reaction_inertia": 2e-6,
                                          "rotor_drag": 1e-7, "blade_flapping": 1e-6}], ids=["off", "on"])
def test_un_jitted_model_calls_compile_nothing_once_warm_and_equal_the_jitted_program(effects):
    """Op by op, the effect gates (quadjax._components.gated) branch in Python on a known gate and
    RK4's stage loop runs in Python: a lax.cond or lax.scan of fresh closures compiled anew on
    every call (before: two compiles per qj.derivative, 98 of its 137 ms; one per XLA-form step,
    547 of its 690 ms). The values are the jitted program's, which keeps its cond and scan, with
    every gated effect off and on."""
    from quadjax.integrators import rk4_step_xla

    p = busy_params().replace(**{k: jnp.asarray(v, jnp.float64) for k, v in effects.items()})
    s = busy_state(p).replace(position=jnp.asarray([0.1, -0.2, 0.3]))  # low: the ground effect acts
    us = [command_for(p) * (1 + 0.01 * k) for k in range(3)]
    calls = {"derivative": lambda u: qj.derivative(p, s, u), "rk4_step_xla": lambda u: rk4_step_xla(p, s, u, 2e-3)}
    compiles = []

    def count(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    for f in calls.values():  # warm: each primitive's own executable
        f(us[0])
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        eager = {name: [f(u) for u in us] for name, f in calls.items()}
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert compiles == []
    jaxpr = str(jax.make_jaxpr(lambda p, s, u: (qj.derivative(p, s, u), rk4_step_xla(p, s, u, 2e-3)))(p, s, us[0]))
    assert "cond[" in jaxpr and "scan[" in jaxpr  # the jitted program keeps its gates and its stage loop
    jitted = {"derivative": jax.jit(qj.derivative), "rk4_step_xla": jax.jit(lambda p, s, u: rk4_step_xla(p, s, u, 2e-3))}
    for name, values in eager.items():
        for u, e in zip(us, values):
            leaves_close(e, jitted[name](p, s, u), rtol=16 * float(jnp.finfo(jnp.float64).eps), atol=1e-30)
