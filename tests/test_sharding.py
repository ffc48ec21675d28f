"""Sharding the vehicle axis over devices (#4): identical to the unsharded run.

Runs in a subprocess with four CPU devices forced (the flag must be set before JAX starts).
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])

CODE = r"""
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import quadjax as qj
from quadjax.sharding import shard_vehicles, vehicle_mesh

assert len(jax.devices()) == 4, jax.devices()
mesh = vehicle_mesh()

def bitwise(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb) and la
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
        assert x.tobytes() == y.tobytes(), np.max(np.abs(x - y))

def fleet(dtype, N, T=16):
    p = qj.presets.rp1(dtype)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    rng = np.random.default_rng(N)
    u = qj.hover_rotor_speed(p) * jnp.asarray(1 + 0.05 * rng.standard_normal((N, T, 4)), dtype)
    ps = p.replace(mass=p.mass * jnp.asarray(np.linspace(0.9, 1.1, N), dtype))
    return p, s0, u, ps, (qj.vehicle_axes(ps, "mass"), 0)

def open_loop(s0, config=qj.SimConfig(), hooks=()):
    return lambda q, u: qj.simulate(q, s0, 1e-3, commands=u, hooks=hooks, config=config)

# float32, N = 10: padded to 12 across the 4 devices, every state saved; both backends
p, s0, u, ps, axes = fleet(jnp.float32, 10)
for backend in ("auto", "xla"):
    fly = open_loop(s0, qj.SimConfig(backend=backend))
    a = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes))(ps, u)
    b = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes, mesh=mesh))(ps, u)
    bitwise(a, b)
    assert b.states.position.shape == (10, 16, 3) and b.status.shape == (10,)
    assert a.backend == b.backend == ("native" if backend == "auto" and qj.native.available() else "xla")

# past the size at which the old kernel deadlocked (N ~ 100, T >= 128: each device's call waited
# on XLA's intra-op pool from inside a pool task): N = 1000 (250 per device), T = 1000, both
# backends; the kernel never waits for a helper that has not started
p, s0, u, ps, axes = fleet(jnp.float32, 1000, T=1000)
for backend in ("auto", "xla"):
    fly = open_loop(s0, qj.SimConfig(save_every=0, backend=backend))
    a = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes))(ps, u)
    b = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes, mesh=mesh))(ps, u)
    bitwise(a, b)
    assert b.backend == a.backend and np.all(np.asarray(b.status) == 0)

# float64, N = 12, 3 per device, a reduction carried in the scan: the result stays spread over the devices
p, s0, u, ps, axes = fleet(jnp.float64, 12)
fly = open_loop(s0, qj.SimConfig(save_every=0),
                (qj.Reduce(lambda c, s: jnp.maximum(c, s.position[2]), jnp.asarray(-jnp.inf)),))
a = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes))(ps, u)
b = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes, mesh=mesh))(ps, u)
bitwise(a, b)
assert b.states is None and b.hooks[0].shape == (12,) and len(b.hooks[0].sharding.device_set) == 4
assert np.all(np.asarray(b.hooks[0]) > 0.9)

# closed loop, one gain per vehicle; the sharded run takes its gains already placed on the mesh
p = qj.presets.rp1(jnp.float32)
s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
hover = qj.hover_rotor_speed(p)
def law(gain, cs, obs, t):
    return hover * (1.0 + gain * (1.2 - obs.position[2])), cs
gains = jnp.asarray(np.linspace(0.05, 0.4, 8), jnp.float32)
def closed(g):
    return qj.simulate(p, s0, 0.01, controller=law, ctrl_params=g, num_ticks=12)
a = jax.jit(lambda g: qj.map_vehicles(closed, (g,), (0,)))(gains)
b = jax.jit(lambda g: qj.map_vehicles(closed, (g,), (0,), mesh=mesh))(shard_vehicles(gains, mesh))
bitwise(a, b)

# a checked run: the monitor's report and the stopped vehicle are the same sharded
p, s0, u, ps, axes = fleet(jnp.float64, 8)
u = u.at[5, 3, 1].set(jnp.nan)
fly = open_loop(s0, qj.SimConfig(check="monitor"))
a = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes))(ps, u)
b = jax.jit(lambda ps, u: qj.map_vehicles(fly, (ps, u), axes, mesh=mesh))(ps, u)
bitwise(a, b)
assert list(np.flatnonzero(np.asarray(b.status))) == [5] and int(b.status_tick[5]) == 3

# check="raise" names the vehicle by its index in the whole fleet, not in its device's share
from jax.experimental import checkify
loud = open_loop(s0, qj.SimConfig(check="raise"))
err, _ = jax.jit(checkify.checkify(lambda ps, u: qj.map_vehicles(loud, (ps, u), axes, mesh=mesh)))(ps, u)
try:
    err.throw()
    raise AssertionError("no error raised")
except checkify.JaxRuntimeError as e:
    assert "non_finite in vehicle 5 at tick 3" in str(e), str(e)
print("OK")
"""


def test_sharded_runs_equal_unsharded_bit_for_bit_on_four_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-3000:] + out.stderr[-3000:]
