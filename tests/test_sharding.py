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
from quadjax.rollout import rollout_batch, rollout_closed_loop_batch, vehicle_axes
from quadjax.sharding import rollout_closed_loop_sharded, rollout_sharded, shard_vehicles, vehicle_mesh

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
    return p, s0, u, ps, dict(params_axes=vehicle_axes(ps, "mass"), state_axes=None)

# float32, N = 10: padded to 12 across the 4 devices, every state saved
p, s0, u, ps, kw = fleet(jnp.float32, 10)
a = jax.jit(lambda ps, u: rollout_batch(ps, s0, u, 1e-3, **kw))(ps, u)
b = jax.jit(lambda ps, u: rollout_sharded(ps, s0, u, 1e-3, mesh=mesh, **kw))(ps, u)
bitwise(a, b)
assert b[1].position.shape == (10, 16, 3)

# float64, N = 12, 3 per device, a reduction carried in the scan: the result stays spread over the devices
p, s0, u, ps, kw = fleet(jnp.float64, 12)
red = dict(reduce=lambda c, s: jnp.maximum(c, s.position[2]), reduce_init=jnp.asarray(-jnp.inf))
a = jax.jit(lambda ps, u: rollout_batch(ps, s0, u, 1e-3, **kw, **red))(ps, u)
b = jax.jit(lambda ps, u: rollout_sharded(ps, s0, u, 1e-3, mesh=mesh, **kw, **red))(ps, u)
bitwise(a, b)
assert b[1].shape == (12,) and len(b[1].sharding.device_set) == 4

# closed loop, one gain per vehicle; the sharded run takes its gains already placed on the mesh
p = qj.presets.rp1(jnp.float32)
s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
hover = qj.hover_rotor_speed(p)
def law(gain, cs, obs, t):
    return hover * (1.0 + gain * (1.2 - obs.position[2])), cs
gains = jnp.asarray(np.linspace(0.05, 0.4, 8), jnp.float32)
ckw = dict(state_axes=None, ctrl_params_axes=0, ctrl_state_axes=None)
a = jax.jit(lambda g: rollout_closed_loop_batch(p, s0, law, g, None, 12, 0.01, **ckw))(gains)
b = jax.jit(lambda g: rollout_closed_loop_sharded(p, s0, law, g, None, 12, 0.01, mesh=mesh, **ckw))(
    shard_vehicles(gains, mesh))
bitwise(a, b)
print("OK")
"""


def test_sharded_rollouts_equal_unsharded_bit_for_bit_on_four_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-3000:] + out.stderr[-3000:]
