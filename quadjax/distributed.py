"""Several processes, one job: JAX's multi-controller runtime (``jax.distributed``).

One process per host (or per device) runs the same program. :func:`initialize` connects
them to the coordinator (process 0's address); from then on ``jax.devices()`` lists every
device of every process and ``jax.local_devices()`` this process's own. quadjax uses the
runtime for what needs agreement and leaves the flying local, because vehicles never
exchange anything:

* :func:`share` splits a list of work items (a sweep's chunks) between the processes;
* :func:`agree` checks that every process holds the same text (a sweep's identity: its
  config, package versions, backend), so that a mismatched host is refused before it flies;
* :func:`broadcast` hands process 0's small integer array to everyone (the chunks still to
  fly, read from the shared results folder by process 0 alone);
* :func:`gather` collects one small array from every process (timings);
* :func:`failed` gathers every process's ok flag: one process's error becomes a clear
  error everywhere instead of a hang.

These run over all devices (``jax.experimental.multihost_utils``: a tiny computation on the
global mesh, over Gloo between CPU processes). A process that dies stops the whole job:
the runtime notices its missing heartbeats after ``heartbeat_timeout_s`` and terminates the
others, so a job never hangs on a dead process; what was written atomically stays, and the
same command resumes it (:mod:`quadjax.sweep.store`).

The settings come from arguments, else from the environment as JAX reads it
(``JAX_COORDINATOR_ADDRESS``), plus ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, else from a
cluster JAX detects (SLURM, Open MPI, Kubernetes, Cloud TPU). A coordinator on a loopback
address is bound to that address only, so a job on one machine opens no port to the network.

A rollout of the user's own over the global mesh (rather than a sweep) is
:func:`quadjax.sharding.global_vehicles`: each process supplies its slice of the vehicles.
"""

from __future__ import annotations

import ipaddress
import os
import socket

import jax
import numpy as np

#: the environment variables read when the argument is not given (the first is JAX's own)
ENV = {"coordinator": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}
#: bytes per process that :func:`agree` compares
AGREE_BYTES = 4096


def requested(coordinator=None, num_processes=None, process_id=None) -> bool:
    """Whether a multi-process run is asked for, by these arguments or the environment."""
    given = (coordinator, num_processes, process_id)
    return any(v is not None for v in given) or any(os.environ.get(name) for name in ENV.values())


def _int_setting(value, name: str) -> int | None:
    if value is None:
        value = os.environ.get(ENV[name])
        if not value:
            return None
        where = f"{ENV[name]}={value!r}"
    else:
        where = f"{name}={value!r}"
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected an integer") from None


def _check_address(address: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` (IPv6 hosts in brackets), or a ValueError saying what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"coordinator {address!r}: expected HOST:PORT, e.g. 127.0.0.1:12345")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise ValueError(f"coordinator {address!r}: the port must be an integer in 1…65535")
    return host.strip("[]"), number


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
               *, heartbeat_timeout_s: int | None = None, timeout_s: int = 300) -> tuple[int, int]:
    """Join the job (see the module docstring); returns (this process's index, the process count).

    coordinator: ``host:port`` of process 0 (it listens there). num_processes, process_id:
    this job's size and this process's place in it. Each falls back to the environment, then
    to cluster detection. heartbeat_timeout_s: how long a silent process may go before the
    job is stopped (JAX's default, 100 s, when None). timeout_s: how long to wait for every
    process to join. Calling it again in a process already joined returns the same figures
    if they match and raises if not.
    """
    num = _int_setting(num_processes, "num_processes")
    pid = _int_setting(process_id, "process_id")
    address = coordinator or os.environ.get(ENV["coordinator"]) or None
    if num is not None and num < 1:
        raise ValueError(f"num_processes = {num}: needs at least 1")
    if num is not None and pid is not None and not 0 <= pid < num:
        raise ValueError(f"process_id = {pid}: must be in 0…{num - 1} for {num} processes")
    kwargs = {}
    if address is not None:
        host, port = _check_address(address)
        if _is_loopback(host) and not os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
            # JAX binds [::]:port by default: every interface. A job on one machine needs none.
            kwargs["coordinator_bind_address"] = f"{socket.gethostbyname(host)}:{port}"
    if heartbeat_timeout_s is not None:
        if heartbeat_timeout_s < 1:
            raise ValueError(f"heartbeat_timeout_s = {heartbeat_timeout_s}: needs at least 1 s")
        kwargs["heartbeat_timeout_seconds"] = int(heartbeat_timeout_s)
    if jax.distributed.is_initialized():
        here = (jax.process_index(), jax.process_count())
        if (pid is not None and pid != here[0]) or (num is not None and num != here[1]):
            raise ValueError(f"this process already joined a job as process {here[0]} of {here[1]}")
        return here
    try:
        jax.distributed.initialize(address, num, pid, initialization_timeout=int(timeout_s), **kwargs)
    except ValueError as err:  # JAX names its own argument; say where the setting comes from
        unset = [f"--{name.replace('_', '-')} / ${ENV[name]}" for name, value in
                 (("coordinator", address), ("num_processes", num), ("process_id", pid)) if value is None]
        raise ValueError(f"cannot join the job: {err} (no cluster detected; set {', '.join(unset)})") from None
    return jax.process_index(), jax.process_count()


def share(items, index: int | None = None, count: int | None = None) -> list:
    """This process's items of ``items``: every ``count``-th from its ``index`` (round robin,
    so that a resume, whose remaining items are scattered, still splits them evenly)."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    return list(items)[index::count]


def gather(array: np.ndarray) -> np.ndarray:
    """(processes, …) every process's ``array`` (same shape and dtype everywhere)."""
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return np.asarray(array)[None]
    return np.asarray(multihost_utils.process_allgather(np.asarray(array)))


def agree(text: str, what: str) -> None:
    """Raise the same ValueError on every process unless every process passed the same ``text``
    (at most :data:`AGREE_BYTES` bytes of UTF-8); the message names the processes that differ
    from process 0 and shows both texts."""
    data = text.encode()
    if len(data) > AGREE_BYTES:
        raise ValueError(f"agree: {what} is {len(data)} bytes, more than {AGREE_BYTES}")
    buffer = np.zeros(AGREE_BYTES + 4, np.uint8)
    buffer[:4] = np.frombuffer(np.uint32(len(data)).tobytes(), np.uint8)
    buffer[4:4 + len(data)] = np.frombuffer(data, np.uint8)
    texts = []
    for row in gather(buffer):
        n = int(np.frombuffer(row[:4].tobytes(), np.uint32)[0])
        texts.append(row[4:4 + n].tobytes().decode(errors="replace"))
    differ = [i for i, t in enumerate(texts) if t != texts[0]]
    if differ:
        shown = ", ".join(str(i) for i in differ)
        raise ValueError(f"the processes of this job disagree on {what}: process(es) {shown} differ from "
                         f"process 0 (process 0: {texts[0]}; process {differ[0]}: {texts[differ[0]]}); "
                         f"run the same program, settings and package versions on every host")


def broadcast(array) -> np.ndarray:
    """Process 0's integer ``array`` on every process (the others pass one of the same shape)."""
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return np.asarray(array)
    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(array)))


def failed(ok: bool) -> list[int]:
    """The indices of the processes that passed ``ok = False`` (every process calls it)."""
    flags = gather(np.asarray([1 if ok else 0], np.int32))
    return [i for i, f in enumerate(flags[:, 0]) if not f]
