"""Several processes, one job (#22): jax.distributed on 127.0.0.1, CPU devices.

Every test starts its processes with the library's own command or a short script, bounds
each wait, and stops whatever is still running by its pid. The coordinator listens on a
loopback port only (quadjax.distributed binds a loopback coordinator to that address).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from quadjax import distributed, sweep
from quadjax.sweep import config as cfg

REPO = Path(__file__).resolve().parents[1]

#: 8 chunks of 32 vehicles (two calls of a 16-vehicle block each: a chunk takes long enough to
#: freeze a process between two of its chunks), every mechanism of the sweep on (gusts, sensor
#: noise, initial errors)
SETTINGS = {
    "vehicles": 256, "chunk_size": 32, "block_size": 16, "keep_trajectories": 20,
    "mission": {"duration": 2.0},
    "sensor_noise": {"enabled": True},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path, **extra):
    """One CPU device per process unless ``extra`` says otherwise (tests/test_sweep.py flies a
    sweep on two devices and compares it with one)."""
    extra.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    return dict(os.environ, PYTHONPATH=str(REPO), JAX_ENABLE_X64="1",
                JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", **extra)


class Job:
    """Processes started together, their output in files (a full pipe would block them);
    :meth:`stop` kills by pid whatever is still running."""

    def __init__(self, tmp_path, name):
        self.folder = tmp_path / name
        self.folder.mkdir()
        self.procs, self.logs = [], []

    def start(self, argv, env):
        i = len(self.procs)
        out, err = open(self.folder / f"{i}.out", "w"), open(self.folder / f"{i}.err", "w")  # noqa: SIM115
        self.logs.append((out, err))
        self.procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True, cwd=REPO))
        return self.procs[-1]

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                pytest.fail(f"a process still ran after {timeout} s:\n{self.text()}")
        return [p.returncode for p in self.procs]

    def output(self, i, which="err"):
        return (self.folder / f"{i}.{which}").read_text()

    def text(self):
        return "\n".join(f"--- process {i}\n{self.output(i, 'out')[-2000:]}\n{self.output(i)[-4000:]}"
                         for i in range(len(self.procs)))

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        for out, err in self.logs:
            out.close()
            err.close()


def _sweep_pair(job, toml, out, port, env, extra=((), ())):
    for i in range(2):
        job.start([sys.executable, "-m", "quadjax.cli", "sweep", "--config", str(toml), "--out", str(out),
                   "--no-plots", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                   "--process-id", str(i), "--heartbeat-timeout", "5", *extra[i]], env)


def _assert_folder_equals(out: Path, reference):
    for name, arrays in (("vehicles.npz", reference.vehicles), ("trajectories.npz", reference.trajectories)):
        with np.load(out / name) as z:
            assert sorted(z.files) == sorted(arrays)
            for k in z.files:
                assert z[k].dtype == arrays[k].dtype and z[k].tobytes() == np.asarray(arrays[k]).tobytes(), (name, k)
    summary = json.loads((out / "summary.json").read_text())
    strip = lambda s: {k: v for k, v in s.items() if k != "timings_s"}  # noqa: E731
    assert strip(summary) == json.loads(json.dumps(strip(reference.summary)))
    chunks = sorted(p.name for p in (out / "chunks").iterdir())
    assert chunks == [f"chunk_{i:06d}.npz" for i in range(8)]  # each chunk once, no temporaries left


def test_two_processes_equal_one_and_a_killed_process_resumes(tmp_path):
    toml = tmp_path / "sweep.toml"
    toml.write_text(cfg.to_toml(cfg.merge(cfg.DEFAULTS, SETTINGS)))
    reference = sweep.run_sweep(cfg.from_dict(SETTINGS))
    assert np.array_equal(reference.vehicles["vehicle_index"], np.arange(256))
    env = _env(tmp_path)

    # two processes, one CPU device each, against the one-process sweep: bit for bit
    job = Job(tmp_path, "whole")
    try:
        _sweep_pair(job, toml, tmp_path / "whole_out", _free_port(), env)
        assert job.wait(300) == [0, 0], job.text()
    finally:
        job.stop()
    _assert_folder_equals(tmp_path / "whole_out", reference)
    manifest = json.loads((tmp_path / "whole_out" / "manifest.json").read_text())
    shares = manifest["timings_s"]["processes"]
    assert manifest["processes"] == 2 and [s["chunks"] for s in shares] == [4, 4]
    assert "[process 1/2] flew 4 chunk(s), 128 vehicles" in job.output(1, "out")

    # process 1 is frozen as soon as its first chunk is on disk (it flies the odd chunks) and
    # killed; process 0 flies its own share, then the runtime stops it for want of process 1
    out = tmp_path / "killed_out"
    job = Job(tmp_path, "killed")
    try:
        _sweep_pair(job, toml, out, _free_port(), env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.procs[1].poll() is None:
            if any(int(p.stem[-6:]) % 2 for p in (out / "chunks").glob("chunk_*.npz")):
                break
            time.sleep(0.001)
        os.kill(job.procs[1].pid, signal.SIGSTOP)
        odd = [p for p in (out / "chunks").glob("chunk_*.npz") if int(p.stem[-6:]) % 2]
        assert 1 <= len(odd) < 4, (len(odd), job.text())
        os.kill(job.procs[1].pid, signal.SIGKILL)
        job.procs[1].wait()
        t0 = time.monotonic()
        job.procs[0].wait(120)
        assert job.procs[0].returncode != 0 and time.monotonic() - t0 < 60, job.text()
    finally:
        job.stop()
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    assert not (out / "summary.json").exists()
    written = len(list((out / "chunks").glob("chunk_*.npz")))
    assert written < 8

    job = Job(tmp_path, "resumed")
    try:
        _sweep_pair(job, toml, out, _free_port(), env)
        assert job.wait(300) == [0, 0], job.text()
    finally:
        job.stop()
    assert f"resuming with {32 * written} done" in job.output(0) + job.output(1), job.text()
    _assert_folder_equals(out, reference)
    shares = json.loads((out / "manifest.json").read_text())["timings_s"]["processes"]
    assert sum(s["chunks"] for s in shares) == 8 - written  # only what was missing was flown


def test_processes_that_disagree_or_do_not_share_the_folder_all_stop_with_the_reason(tmp_path):
    toml = tmp_path / "sweep.toml"
    toml.write_text(cfg.to_toml(cfg.merge(cfg.DEFAULTS, SETTINGS)))
    env = _env(tmp_path)
    # another seed on process 1: refused on both before anything is written or compiled
    job = Job(tmp_path, "seed")
    try:
        _sweep_pair(job, toml, tmp_path / "a", _free_port(), env, extra=((), ("--seed", "1")))
        assert job.wait(120) == [2, 2], job.text()
    finally:
        job.stop()
    for i in range(2):
        assert "disagree on the sweep" in job.output(i) and "process(es) 1 differ from process 0" in job.output(i)
    assert not (tmp_path / "a").exists()
    # process 1 pointed at another folder (as on a host without the shared file system)
    job = Job(tmp_path, "folder")
    try:
        _sweep_pair(job, toml, tmp_path / "b", _free_port(), env, extra=((), ("--out", str(tmp_path / "c"))))
        assert job.wait(120) == [2, 2], job.text()
    finally:
        job.stop()
    assert "every process needs the same results folder" in job.output(1)
    assert "process(es) 1 could not join the results folder" in job.output(0)
    # a process id outside the job: refused at the command line, before any connection
    bad = subprocess.run([sys.executable, "-m", "quadjax.cli", "sweep", "--num-processes", "2", "--process-id", "2",
                          "--coordinator", "127.0.0.1:1"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "process_id = 2: must be in 0…1" in bad.stderr


def test_settings_are_checked_before_connecting():
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        distributed.initialize("no-port", 2, 0)
    with pytest.raises(ValueError, match="port must be an integer"):
        distributed.initialize("127.0.0.1:99999", 2, 0)
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two': expected an integer"):
        os.environ["JAX_NUM_PROCESSES"] = "two"
        try:
            distributed.initialize("127.0.0.1:1234")
        finally:
            del os.environ["JAX_NUM_PROCESSES"]
    assert distributed.share(range(7), 1, 3) == [1, 4]
    assert distributed.failed(False) == [0] and distributed.failed(True) == []


GLOBAL_MESH = r"""
import os, numpy as np, jax, jax.numpy as jnp
import quadjax as qj
from quadjax import distributed as qd
from quadjax.sharding import global_vehicles, local_vehicles, vehicle_mesh

# nothing but SLURM's variables and the coordinator's address: the rest is detected
index, count = qd.initialize(heartbeat_timeout_s=10)
assert (index, count) == (int(os.environ["SLURM_PROCID"]), 2), (index, count)
assert len(jax.devices()) == 4 and len(jax.local_devices()) == 2
mesh = vehicle_mesh()

N, T = 1000, 1000  # the sizes that caught the old kernel's deadlock under several devices
p = qj.presets.rp1(jnp.float32)
s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
rng = np.random.default_rng(7)  # the whole fleet, the same on both processes; each flies its half
u_all = np.asarray(qj.hover_rotor_speed(p)) * (1 + 0.05 * rng.standard_normal((N, T, 4))).astype(np.float32)
mass_all = np.asarray(p.mass) * np.linspace(0.9, 1.1, N).astype(np.float32)
mine = slice(index * N // 2, (index + 1) * N // 2)
ps = p.replace(mass=jnp.asarray(mass_all[mine]))
axes = (qj.vehicle_axes(ps, "mass"), 0)
for backend in ("auto", "xla"):
    fly = lambda q, u: qj.simulate(q, s0, 1e-3, commands=u, config=qj.SimConfig(backend=backend, save_every=0))
    local = jax.jit(lambda q, u: qj.map_vehicles(fly, (q, u), axes))(ps, jnp.asarray(u_all[mine]))
    spread = jax.jit(lambda q, u: qj.map_vehicles(fly, (q, u), axes, mesh=mesh))(
        *global_vehicles((ps, u_all[mine]), mesh, axes))
    assert spread.final.position.shape == (N, 3)
    got, want = local_vehicles(spread.final), local
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), backend
    assert np.all(local_vehicles(spread.status) == 0) and local.backend == spread.backend
    assert spread.backend == ("native" if backend == "auto" else "xla")
print("OK", index, flush=True)
"""


def test_global_mesh_rollouts_across_two_processes_from_slurm_settings(tmp_path):
    port = _free_port()
    job = Job(tmp_path, "slurm")
    try:
        for i in range(2):
            env = _env(tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=2",
                       JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", SLURM_JOB_ID="4242", SLURM_NTASKS="2",
                       SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_STEP_NODELIST="127.0.0.1")
            job.start([sys.executable, "-c", GLOBAL_MESH], env)
        assert job.wait(300) == [0, 0], job.text()
    finally:
        job.stop()
    for i in range(2):
        assert f"OK {i}" in job.output(i, "out")
