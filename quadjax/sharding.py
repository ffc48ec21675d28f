"""The vehicle axis spread over devices with ``jax.sharding``: identical results per vehicle.

Vehicles are independent, so each device runs the ordinary vmapped rollout on its
share of them (``jax.shard_map`` over a one-axis mesh named ``"vehicles"``) and
nothing is communicated during the rollout. N need not divide the device count:
the batch is padded with copies of its last vehicle and the padding dropped.

On a multi-core CPU with ``backend="xla"``, one XLA CPU device per core
(``XLA_FLAGS=--xla_force_host_platform_device_count=<cores>``, set before JAX starts) and
:func:`rollout_sharded` ran 1.2–1.4× faster than XLA's own multi-threading of each fused
kernel on the 2-core test machine (benchmarks/RESULTS.md, "levers"); the native CPU kernel
(the default there) already spreads vehicles over the cores.

Single host, several devices (GPUs, or CPU devices forced)::

    # XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax starts)
    mesh = vehicle_mesh()                       # all local devices
    run = jax.jit(lambda s: rollout_sharded(p, s, commands, dt, mesh=mesh, save_every=0))
    final, _ = run(states0)                     # (N, ...) spread over the devices

Multi-host (``jax.distributed``): start one process per host with the same program and
call ``jax.distributed.initialize()`` first (coordinator address, number of
processes and process id come from the cluster environment or its arguments).
``jax.devices()`` then lists every device of every host and :func:`vehicle_mesh`
builds the global mesh. Each process builds its own slice of the vehicles (for
example vehicles ``process_index * n_local ...``) and turns it into one global array
with ``jax.make_array_from_process_local_data(NamedSharding(mesh, P("vehicles")), local)``
(N a multiple of the global device count: no padding across hosts); shared
arguments are passed as ordinary replicated values. The jitted rollout is called
identically on every process; each host computes only its own vehicles, and its
part of the result is in ``out.addressable_shards`` (or gathered with
``jax.experimental.multihost_utils.process_allgather``). Reductions carried in the
scan (``reduce=``) keep what crosses hosts small.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from quadjax.rollout import _expand_axes, map_vehicles, rollout, rollout_closed_loop

VEHICLES = "vehicles"


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
    full = _expand_axes(axes, tree)
    return jax.tree_util.tree_map(
        lambda a, x: jax.device_put(x, NamedSharding(mesh, P() if a is None else P(VEHICLES))),
        full, tree, is_leaf=lambda a: a is None,
    )


def map_vehicles_sharded(fn, args: tuple, in_axes: tuple, *, mesh: Mesh | None = None, block: int | None = None):
    """:func:`quadjax.rollout.map_vehicles` with the vehicles split across ``mesh``'s devices.

    Outputs are batch-first (N, ...), sharded along N. Call it inside ``jax.jit``.
    """
    mesh = vehicle_mesh() if mesh is None else mesh
    devices = mesh.devices.size
    axes = _expand_axes(tuple(in_axes), tuple(args))
    leaves, treedef = jax.tree_util.tree_flatten(tuple(args))
    flat_axes = treedef.flatten_up_to(axes)
    if any(a not in (0, None) for a in flat_axes):
        raise ValueError("map_vehicles_sharded: in_axes entries must be 0 or None")
    sizes = {jnp.shape(x)[0] for x, a in zip(leaves, flat_axes) if a == 0}
    if len(sizes) != 1:
        raise ValueError(f"map_vehicles_sharded: mapped arguments disagree on the number of vehicles {sorted(sizes)}")
    n = sizes.pop()
    pad = (-n) % devices

    def padded(x):
        return jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x

    leaves = [padded(jnp.asarray(x)) if a == 0 else x for x, a in zip(leaves, flat_axes)]
    specs = [P(VEHICLES) if a == 0 else P() for a in flat_axes]

    def local(*flat):
        return map_vehicles(fn, tuple(jax.tree_util.tree_unflatten(treedef, list(flat))), tuple(in_axes), block=block)

    out = jax.shard_map(local, mesh=mesh, in_specs=tuple(specs), out_specs=P(VEHICLES), check_vma=False)(*leaves)
    return jax.tree_util.tree_map(lambda x: x[:n], out) if pad else out


def rollout_sharded(
    params,
    state0,
    commands,
    dt,
    *,
    params_axes=None,
    state_axes=0,
    commands_axes=0,
    mesh: Mesh | None = None,
    block: int | None = None,
    **options,
):
    """:func:`quadjax.rollout.rollout_batch` with the vehicles spread over ``mesh`` (default: all devices)."""
    def one(p, s, u):
        return rollout(p, s, u, dt, **options)

    return map_vehicles_sharded(
        one, (params, state0, commands), (params_axes, state_axes, commands_axes), mesh=mesh, block=block
    )


def rollout_closed_loop_sharded(
    params,
    state0,
    controller,
    ctrl_params,
    ctrl_state0,
    num_ticks: int,
    dt,
    *,
    params_axes=None,
    state_axes=0,
    ctrl_params_axes=None,
    ctrl_state_axes=0,
    mesh: Mesh | None = None,
    block: int | None = None,
    **options,
):
    """:func:`quadjax.rollout.rollout_closed_loop_batch` with the vehicles spread over ``mesh``."""
    def one(p, s, cp, cs):
        return rollout_closed_loop(p, s, controller, cp, cs, num_ticks, dt, **options)

    return map_vehicles_sharded(
        one, (params, state0, ctrl_params, ctrl_state0),
        (params_axes, state_axes, ctrl_params_axes, ctrl_state_axes), mesh=mesh, block=block,
    )
