"""The vehicle axis spread over devices with ``jax.sharding``: identical results per vehicle.

Vehicles are independent, so each device runs the ordinary vmapped engine on its share of
them and nothing is communicated during the flight: :func:`quadjax.map_vehicles` with
``mesh=vehicle_mesh()`` (``jax.shard_map`` over a one-axis mesh named ``"vehicles"``), inside
``jax.jit``. N need not divide the device count: the batch is padded with copies of its last
vehicle and the padding dropped.

On a multi-core CPU with ``backend="xla"``, one XLA CPU device per core
(``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>``, set before JAX starts) ran
1.2–1.4× faster than XLA's own multi-threading of each fused kernel on the 2-core test
machine (benchmarks/RESULTS.md, "levers"); the native CPU kernel (the default there) already
spreads vehicles over the cores.

Single host, several devices (GPUs, or CPU devices forced)::

    mesh = vehicle_mesh()                       # all local devices
    fly = lambda s: simulate(p, s, dt, commands=u, config=SimConfig(save_every=0)).final
    final = jax.jit(lambda s: map_vehicles(fly, (s,), (0,), mesh=mesh))(states0)

Multi-host (``jax.distributed``): start one process per host with the same program and
call ``jax.distributed.initialize()`` first; ``jax.devices()`` then lists every device of
every host and :func:`vehicle_mesh` builds the global mesh. Each process builds its own slice
of the vehicles and turns it into one global array with
``jax.make_array_from_process_local_data(NamedSharding(mesh, P("vehicles")), local)``
(N a multiple of the global device count: no padding across hosts). Each host computes only
its own vehicles; its part of the result is in ``out.addressable_shards``.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from quadjax.engine import VEHICLE_AXIS, expand_axes

VEHICLES = VEHICLE_AXIS


def vehicle_mesh(devices=None) -> Mesh:
    """A one-axis mesh named ``"vehicles"`` over ``devices`` (default: ``jax.devices()``)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (VEHICLES,))


def shard_vehicles(tree, mesh: Mesh | None = None, axes=0):
    """Place a batch-first pytree on ``mesh``, split along its leading (vehicle) axis.

    ``axes``: an in_axes prefix (0 split, None replicated). The leading size must be
    a multiple of the number of devices.
    """
    mesh = vehicle_mesh() if mesh is None else mesh
    full = expand_axes(axes, tree)
    return jax.tree_util.tree_map(
        lambda a, x: jax.device_put(x, NamedSharding(mesh, P() if a is None else P(VEHICLES))),
        full, tree, is_leaf=lambda a: a is None,
    )
