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

Several processes (``jax.distributed``, one per host or per device): each runs the same
program after :func:`quadjax.distributed.initialize`; ``jax.devices()`` then lists every
device of every process and :func:`vehicle_mesh` builds the global mesh. Each process builds
only its own share of the vehicles, :func:`global_vehicles` joins the shares into one global
batch (process 0's share first), the jitted call runs each device's vehicles where they are
(nothing crosses processes), and :func:`local_vehicles` takes this process's rows of the
result back::

    qd.initialize()                             # quadjax.distributed
    mesh = vehicle_mesh()                       # every device of every process
    mine = global_vehicles(my_states0, mesh)    # the same number of vehicles on each process
    final = local_vehicles(jax.jit(lambda s: map_vehicles(fly, (s,), (0,), mesh=mesh))(mine))

Each share must be a multiple of the process's device count (no padding across processes).
The sweep (:mod:`quadjax.sweep.runner`) splits its chunks between processes instead: it
needs the runtime only to agree and to hand out work.
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


def global_vehicles(local, mesh: Mesh | None = None, axes=0):
    """One global batch on ``mesh`` from every process's share ``local`` (batch-first pytree):
    the shares in process order. ``axes``: an in_axes prefix; a leaf with None is replicated
    (every process passes the same value). Each process's share must be a multiple of its
    devices on the mesh."""
    mesh = vehicle_mesh() if mesh is None else mesh
    full = expand_axes(axes, local)
    mine = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)

    def place(a, x):
        x = np.asarray(x)
        if a is not None and x.shape[0] % mine:
            raise ValueError(f"global_vehicles: this process's share of {x.shape[0]} vehicles is not a multiple "
                             f"of its {mine} device(s) on the mesh")
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P() if a is None else P(VEHICLES)), x)

    return jax.tree_util.tree_map(place, full, local, is_leaf=lambda a: a is None)


def local_vehicles(tree):
    """This process's rows of a batch-first result on a mesh (its own devices' shards, in
    order), as numpy arrays; a replicated leaf comes back whole."""

    def part(x):
        shards = {}
        for s in x.addressable_shards:
            start = s.index[0].start if s.index and s.index[0].start is not None else 0
            shards.setdefault(start, s)  # a replicated leaf has one shard per device, all alike
        rows = [np.asarray(shards[k].data) for k in sorted(shards)]
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    return jax.tree_util.tree_map(part, tree)


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
