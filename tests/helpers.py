"""Small shared helpers for the tests (not part of the library)."""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.native

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


#: ``pytest.mark.parametrize("backend", BACKENDS)``: a physics test on the native kernel (skipped
#: where it is unavailable) and on XLA, pinned through ``SimConfig(backend=...)``
BACKENDS = [
    pytest.param("native", marks=pytest.mark.skipif(
        not quadjax.native.available(), reason=f"native kernel: {quadjax.native.unavailable_reason()}")),
    "xla",
]


@functools.cache
def simulate_open_loop(backend, **config):
    """``jit``-ed ``(params, state0, commands, dt) -> Trajectory`` on ``backend`` (other
    SimConfig fields from ``config``)."""
    config = qj.SimConfig(backend=backend, **config)
    return jax.jit(lambda p, s, u, dt: qj.simulate(p, s, dt, commands=u, config=config))


def leaves_close(a, b, rtol=1e-12, atol=0.0):
    """Assert two pytrees agree leaf by leaf."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def leaves_equal(a, b):
    """Assert two pytrees are equal bit for bit (and of the same dtype)."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def busy_state(params, dtype=jnp.float64):
    """An airborne state with every term of the model active."""
    w = qj.hover_rotor_speed(params)
    q = np.array([0.95, 0.1, -0.2, 0.2])
    return qj.QuadState.create(
        position=(0.3, -0.2, 5.0),
        velocity=(1.0, -0.5, 0.3),
        attitude=q / np.linalg.norm(q),
        body_rates=(0.4, -0.3, 0.2),
        rotor_speeds=np.asarray(w) * np.array([1.02, 0.97, 1.01, 0.99]),
        energy=100.0,
        dtype=dtype,
    )


def busy_params(dtype=jnp.float64):
    """RP-1 with wind, rotor inertia, rotational and quadratic drag, sag and energy all on."""
    p = qj.presets.rp1(dtype=jnp.float64)
    p = p.replace(
        wind=jnp.asarray([1.5, -0.7, 0.2]),
        rotor_inertia=jnp.asarray(3e-5),
        drag_rotational=jnp.asarray([0.01, 0.012, 0.02]),
        inertia=jnp.asarray([[0.012, 0.0004, -0.0002], [0.0004, 0.013, 0.0003], [-0.0002, 0.0003, 0.022]]),
    )
    return p.astype(dtype)


def command_for(params, factors=(1.05, 0.97, 1.02, 0.99)):
    """Rotor commands near hover [rad/s]."""
    return qj.hover_rotor_speed(params) * jnp.asarray(factors, params.mass.dtype)


def run_notebook(name, cwd):
    """Execute ``notebooks/<name>`` top to bottom with ``cwd`` as its working folder.

    Returns (code-cell outputs, their printed text joined). The caller skips first where
    nbformat, nbclient or ipykernel is missing (``pytest.importorskip``).
    """
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    return outputs, "".join(o.get("text", "") for o in outputs)


def spread_fleet(dtype, n=8, t=20):
    """n vehicles hovering at 1 m, vehicle i at x = 10 i m (planted edits tell them apart by x),
    each with its own noisy near-hover commands (n, t, 4)."""
    p = qj.presets.rp1(dtype)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    states = jax.tree_util.tree_map(lambda x: jnp.stack([x] * n), s0)
    states = states.replace(position=states.position.at[:, 0].set(10.0 * jnp.arange(n, dtype=dtype)))
    rng = np.random.default_rng(0)
    u = qj.hover_rotor_speed(p) * jnp.asarray(1 + 0.03 * rng.standard_normal((n, t, 4)), dtype)
    return p, states, u


def below_ground_edit(vehicle, tick, dz=-0.02):
    """Caller code that, in one vehicle of :func:`spread_fleet` (told by its x) before one tick,
    moves it below the ground."""
    def edit(state, k):
        hit = (jnp.abs(state.position[0] - 10.0 * vehicle) < 1.0) & (k == tick)
        return state.replace(position=state.position.at[2].set(jnp.where(hit, dz, state.position[2])))
    return edit


def varied_fleet(R, n, dtype, seed):
    """n vehicles with every QuadParams leaf drawn per vehicle (valid ranges), airborne or
    grounded states, commands around hover, dt per vehicle. The small-vehicle effects are off in
    every third vehicle and each is off in about a third of the others, so that a block of lanes
    mixes vehicles with an effect on and off (the kernel computes an effect for a block with one)."""
    rng = np.random.default_rng(seed)
    off_rng = np.random.default_rng(seed + 7919)  # apart, so that the other draws stay as they were
    effects_off = {"motor_tau_down_ratio": 1.0, "rotor_reaction_inertia": 0.0, "rotor_drag": 0.0,
                   "blade_flapping": 0.0, "k_inflow": 0.0, "rotor_radius": 0.0}
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
            wind=rng.uniform(-3, 3, 3), motor_tau_down_ratio=rng.uniform(0.4, 3.0),
            rotor_reaction_inertia=rng.uniform(0, 1e-3) * size, rotor_drag=rng.uniform(0, 0.2) * mass / R / omega_max,
            blade_flapping=rng.uniform(0, 0.2) * mass * arm.mean() / R / omega_max,
            k_inflow=rng.uniform(0, 0.05) * 2.5 * mass * 9.81 / R / omega_max, rotor_radius=rng.uniform(0, 0.8) * arm.mean(),
            dtype=dtype)
        off = [f for f in effects_off if i % 3 == 2 or off_rng.uniform() < 0.3]
        p = p.replace(**{f: jnp.full_like(getattr(p, f), effects_off[f]) for f in off})
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


#: a small sweep with every mechanism on (gusts, sensor noise, initial errors, 5 perturbations,
#: among them the arm positions ±1 %): the tests' sweeps that differ from it only in numbers
#: share its compilation (through the run's XLA cache, across files too)
SMALL_SWEEP = {
    "vehicles": 48, "chunk_size": 48, "block_size": 16, "keep_trajectories": 48,
    "mission": {"duration": 1.0},
    "sensor_noise": {"enabled": True},
    "randomise": {"rotor_positions": {"dist": "relative", "spread": 0.01}},
}


def small_sweep(**settings):
    """:data:`SMALL_SWEEP` with ``settings`` (dotted names) applied, as a checked SweepConfig."""
    from quadjax.sweep import config as cfg

    return cfg.from_dict(cfg.merge(SMALL_SWEEP, cfg.overrides_to_dict(settings)))


#: a closed-loop target near the start: far ones saturate the mixer, and a rotor commanded to ~0
#: thrust has ω = √(T/k_f) amplify last-bit differences in T without bound (XLA's jitted and eager
#: runs of the same controller then differ by 1e-5 rad/s, as the kernels do)
CLOSED_LOOP_TARGET = (0.05, -0.03, 0.05)


def closed_loop_case(name, dtype, n=5, ticks=30, dt=0.002, substeps=2, reference=True):
    """N vehicles of different mass and inertia from scattered velocities under ``name`` ("pid" or
    "geometric"), the worst distance to the target folded: the kernels' arguments (a dict for
    ``closed_loop(**case["args"], ...)``) and, unless ``reference`` is False (a test that flies its
    own XLA comparison: this one costs a compile of seconds), the engine's answer on XLA (final,
    ctrl state, fold) from ``jax.vmap(simulate(controller=..., hooks=(Reduce(...),)))``."""
    import functools

    from quadjax.control import (CascadeRates, GeometricController, Hover, PIDController, geometric_control,
                                 geometric_init, pid_control, pid_init)
    from quadjax.engine import Reduce

    p = qj.presets.rp1(dtype)
    target = jnp.asarray(CLOSED_LOOP_TARGET, dtype)
    hover = Hover(position=target, yaw=jnp.asarray(0.05, dtype))
    law, ctrl, init = {"pid": (functools.partial(pid_control, rates=CascadeRates(dt=dt)), PIDController.create(p, hover),
                               pid_init),
                       "geometric": (geometric_control, GeometricController.create(p, hover), geometric_init)}[name]
    scale = jnp.linspace(0.85, 1.15, n).astype(dtype)
    ps = jax.vmap(lambda a: p.replace(mass=p.mass * a, inertia=p.inertia * a))(scale)
    rng = np.random.default_rng(0)
    s0 = jax.vmap(lambda v: qj.hover_state(p).replace(velocity=v))(jnp.asarray(rng.uniform(-0.05, 0.05, (n, 3)), dtype))
    cs0 = jax.vmap(lambda s: init(ctrl, s))(s0)

    def worst(acc, state):
        return jnp.maximum(acc, jnp.linalg.norm(state.position - target))

    zero = jnp.zeros((), dtype)

    def one(p1, s, cs):
        tr = qj.simulate(p1, s, dt, controller=law, ctrl_params=ctrl, ctrl_state=cs, num_ticks=ticks,
                         hooks=(Reduce(worst, zero),),
                         config=qj.SimConfig(backend="xla", substeps=substeps, save_every=0))
        return tr.final, tr.ctrl_state, tr.hooks[0]

    args = dict(params=ps, state0=s0, controller=law, ctrl_params=ctrl, ctrl_state=cs0, dt=dt, num_ticks=ticks,
                substeps=substeps, fold=worst, fold_init=zero)
    return {"args": args, "reference": jax.jit(jax.vmap(one))(ps, s0, cs0) if reference else None, "init": init}


def worst_relative(a, b) -> float:
    """Largest |a − b| / (1 + |b|) over the leaves of two trees."""
    return max(float(jnp.max(jnp.abs(jnp.asarray(x, float) - jnp.asarray(y, float)) / (1 + jnp.abs(jnp.asarray(y, float)))))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
