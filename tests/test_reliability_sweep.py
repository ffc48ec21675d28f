"""Sweep store reliability (issue 23, items 3–5 and the sweep's part of 7): the folder lock,
unique temporaries, the sweep identity (backend, versions, 10 == 10.0), chunks verified
whole and re-flown when damaged, folders that are not a sweep's, SIGINT/SIGTERM, one-line
CLI errors and the size budget.

The in-process sweeps share one compilation (blocks of 8 vehicles, 10 ticks, 4 kept
trajectories): they differ only in numbers (seed, vehicle count). The child processes
share a persistent compilation cache with this process (the run's, from tests/conftest.py).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile

import jax
import numpy as np
import pytest

import quadjax as qj
from quadjax import sweep
from quadjax.cli import main as cli_main
from quadjax.sweep import config as cfg
from quadjax.sweep import runner
from quadjax.files import TMP_SUFFIX
from quadjax.sweep.store import LOCK, FolderLock, SweepStore, identity_hash, write_npz

BASE = {"vehicles": 32, "chunk_size": 8, "block_size": 8, "keep_trajectories": 4, "mission": {"duration": 0.08}}


def conf(**settings):
    return cfg.from_dict(cfg.merge(BASE, cfg.overrides_to_dict(settings)))


def strip(summary):
    return {k: v for k, v in summary.items() if k != "timings_s"}


def assert_folder_equals(folder, reference):
    """The files in ``folder`` hold, bit for bit, the in-memory sweep ``reference``."""
    for name, arrays in (("vehicles.npz", reference.vehicles), ("trajectories.npz", reference.trajectories)):
        with np.load(folder / name) as z:
            assert sorted(z.files) == sorted(arrays), name
            for k in z.files:
                assert z[k].dtype == arrays[k].dtype, k
                np.testing.assert_array_equal(z[k], arrays[k], err_msg=f"{name}:{k}")
    summary = json.loads((folder / "summary.json").read_text())
    assert strip(summary) == json.loads(json.dumps(strip(reference.summary)))


@pytest.fixture(scope="module")
def reference():
    """The sweep flown in memory: what every folder below must end up holding."""
    return sweep.run_sweep(conf())


@pytest.fixture(scope="module")
def finished(tmp_path_factory, reference):
    """A complete results folder of the reference sweep (copy it before changing it)."""
    out = tmp_path_factory.mktemp("finished") / "res"
    sweep.run_sweep(conf(), out, plots=False)
    assert_folder_equals(out, reference)
    return out


@pytest.fixture
def copy(finished, tmp_path):
    target = tmp_path / "res"
    shutil.copytree(finished, target)
    return target


@pytest.fixture(scope="module")
def child_env(tmp_path_factory):
    """Environment of the child processes: x64 as in this process, one compilation cache: this
    run's (tests/conftest.py), which the in-process sweeps write too, so a child loads the
    program that ``reference`` compiled (the same sweep) instead of compiling it again."""
    cache = os.environ.get("QUADJAX_TEST_XLA_CACHE") or tmp_path_factory.mktemp("jax_cache")
    return dict(os.environ, JAX_ENABLE_X64="1", JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def _stop(proc):
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# --- 1. the folder lock ------------------------------------------------------------------------


def test_a_second_sweep_on_a_locked_folder_is_refused_naming_the_holders_pid(copy, child_env):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom quadjax.sweep.store import FolderLock\n"
         f"lock = FolderLock({str(copy)!r}).acquire()\nprint('locked', flush=True)\ntime.sleep(120)"],
        env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.name != LOCK}
        for overwrite in (False, True):  # --overwrite does not break a lock either
            started = time.perf_counter()
            with pytest.raises(ValueError) as err:
                sweep.run_sweep(conf(), copy, overwrite=overwrite, plots=False)
            assert f"pid {holder.pid}" in str(err.value) and str(copy) in str(err.value)
            assert time.perf_counter() - started < 5  # at once, not after waiting
        assert {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.name != LOCK} == before
    finally:
        _stop(holder)
    # the holder died without releasing anything: its lock went with it
    assert sweep.run_sweep(conf(), copy, plots=False).out_dir == copy


def test_the_lock_is_released_when_a_sweep_ends_or_is_refused(copy):
    with pytest.raises(ValueError, match="its config differs"):
        sweep.run_sweep(conf(seed=5), copy)
    with FolderLock(copy):  # free again after the refusal …
        pass
    sweep.run_sweep(conf(), copy, plots=False)
    with FolderLock(copy):  # … and after a run
        with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
            SweepStore.open(copy, config={}, config_hash="x", vehicles=8, chunk_size=8)


# --- 2. unique temporaries -----------------------------------------------------------------------


def test_concurrent_atomic_writers_never_crash_and_leave_one_complete_version(tmp_path):
    target = tmp_path / "f.npz"
    versions = [{"x": np.full(250_000, v, np.float32), "tag": np.asarray(v)} for v in (1, 2)]
    errors = []

    def writer(arrays):
        try:
            for _ in range(15):
                write_npz(target, arrays)
        except Exception as e:  # noqa: BLE001 — collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with np.load(target) as z:
        tag = int(z["tag"])
        np.testing.assert_array_equal(z["x"], versions[tag - 1]["x"])
    assert [p.name for p in tmp_path.iterdir()] == ["f.npz"]  # no temporary left behind


def test_resume_removes_only_this_stores_stale_temporaries(copy, reference):
    stale = copy / "chunks" / f".chunk_000001.npz.k2j3{TMP_SUFFIX}"
    stale.write_bytes(b"half a chunk")
    mine = copy / "chunks" / "notes.tmp"
    mine.write_text("the user's")
    sweep.run_sweep(conf(), copy, plots=False)
    assert not stale.exists() and mine.read_text() == "the user's"
    assert_folder_equals(copy, reference)


# --- 3. the sweep identity ---------------------------------------------------------------------


def test_identity_compares_values_not_spelling():
    assert conf(**{"mission.duration": 10}).hash() == conf(**{"mission.duration": 10.0}).hash()
    assert conf(**{"gusts.sigma": 1}).hash() == conf(**{"gusts.sigma": [1.0, 1.0, 1.0]}).hash()
    assert conf(chunk_size=16).hash() == conf().hash()  # results do not depend on it
    assert conf(seed=1).hash() != conf().hash() and conf(block_size=16).hash() != conf().hash()
    assert identity_hash(conf().hash(), {"backend": "native"}) != identity_hash(conf().hash(), {"backend": "xla"})


def test_identity_names_the_backend_the_engine_actually_uses():
    c = conf()
    p = qj.presets.get(c.preset)
    versions, reasons = runner.sweep_identity(c, p)
    assert versions["quadjax"] == qj.__version__ and versions["dtype"] == "float32"
    commands = np.tile(np.asarray(qj.hover_rotor_speed(p)), (2, 1))
    run = jax.eval_shape(lambda: qj.simulate(p, qj.hover_state(p), 0.004, commands=commands, config=qj.SimConfig(
        integrator=c.stepper, substeps=c.substeps)))  # traced, not compiled: the backend is static
    assert versions["backend"] == run.backend
    assert (versions["backend"] == "xla") == ("backend" in reasons)
    assert runner.physics_backend(conf(**{"mission.stepper": "euler"}), 4)[0] == "xla"


def test_resuming_with_another_backend_is_refused_saying_so(copy, child_env):
    stored = json.loads((copy / "manifest.json").read_text())["versions"]["backend"]
    if stored != "native":
        pytest.skip("the native kernel is unavailable here: nothing to switch off")
    (copy.parent / "c.toml").write_text(cfg.to_toml(conf().resolved))
    before = sorted(p.name for p in (copy / "chunks").iterdir())
    done = subprocess.run([sys.executable, "-m", "quadjax.cli", "sweep", "--config", str(copy.parent / "c.toml"),
                           "--out", str(copy), "--no-plots"], env=dict(child_env, QUADJAX_NATIVE="0"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(f"quadjax sweep: error: {copy}: holds a different sweep")
    assert "its backend differs (native there, xla here: disabled by QUADJAX_NATIVE=0)" in line
    assert "config differs" not in line
    assert sorted(p.name for p in (copy / "chunks").iterdir()) == before


# --- 4. chunks verified whole, the damaged ones flown again -------------------------------------


def _member_offset(path, member):
    """Where ``member``'s bytes start in the zip file ``path``."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = np.frombuffer(f.read(4), "<u2")
    return info.header_offset + 30 + int(name_len) + int(extra_len)


def _damage(kind, path, other):
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif kind == "flipped byte":
        data = bytearray(path.read_bytes())
        data[_member_offset(path, "rms_error.npy") + 130] ^= 0x40  # inside the array, past its header
        path.write_bytes(bytes(data))
    elif kind == "another seed":
        shutil.copy(other / "chunks" / path.name, path)
    elif kind == "misplaced":  # this sweep's own chunk 0, under chunk 1's name
        shutil.copy(path.with_name("chunk_000000.npz"), path)


@pytest.fixture(scope="module")
def seed1(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed1") / "res"
    sweep.run_sweep(conf(seed=1), out, plots=False)
    return out


@pytest.mark.parametrize("kind,reason", [
    ("empty", "unreadable"), ("truncated", "unreadable"), ("flipped byte", "rms_error.npy fails its CRC check"),
    ("another seed", "belongs to another sweep"), ("misplaced", "does not hold vehicles 8…15"),
])
def test_a_damaged_chunk_is_flown_again_and_the_result_is_the_clean_one(copy, reference, seed1, kind, reason):
    chunk = copy / "chunks" / "chunk_000001.npz"
    _damage(kind, chunk, seed1)
    events = []
    result = sweep.run_sweep(conf(), copy, plots=False, progress=events.append)
    repairs = [e for e in events if e["phase"] == "repair"]
    assert [e["chunk"] for e in repairs] == [2] and reason in repairs[0]["reason"], repairs
    assert [e["chunk"] for e in events if e["phase"] == "chunk"] == [2]  # that one, and only that one
    assert_folder_equals(copy, reference)
    assert strip(result.summary) == strip(reference.summary)
    assert SweepStore.open(copy, config={}, config_hash=conf().hash(), vehicles=32, chunk_size=8,
                           versions=runner.sweep_identity(conf(), qj.presets.get("rp1"))[0]).completed() == [0, 1, 2, 3]


def test_a_damaged_chunk_without_a_progress_callback_warns(copy, reference):
    (copy / "chunks" / "chunk_000003.npz").write_bytes(b"")
    with pytest.warns(RuntimeWarning, match=r"chunk_000003\.npz: damaged .*flying it again"):
        sweep.run_sweep(conf(), copy, plots=False)
    assert_folder_equals(copy, reference)


# --- 5. folders that are not a sweep's ---------------------------------------------------------


def test_a_folder_that_is_not_a_sweep_is_refused_and_left_as_it_was(tmp_path, capsys, monkeypatch):
    w = tmp_path / "w"
    (w / "plots").mkdir(parents=True)
    (w / "plots" / "fig.png").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["sweep", "--vehicles", "8", "--duration", "0.08", "--no-plots", "--out", "w"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("quadjax sweep: error: w: not empty and not a sweep's results folder (it holds plots); pass "
                   "--out DIR for a new or empty folder, or --overwrite to write the sweep's files there anyway "
                   "(other files are kept)")
    assert sorted(p.relative_to(w).as_posix() for p in w.rglob("*")) == ["plots", "plots/fig.png"]


def test_overwrite_deletes_only_the_sweeps_own_files(tmp_path, reference):
    w = tmp_path / "w"
    (w / "plots").mkdir(parents=True)
    (w / "plots" / "fig.png").write_text("x")
    (w / "notes.txt").write_text("mine")
    sweep.run_sweep(conf(), w, overwrite=True, plots=True)
    assert_folder_equals(w, reference)
    listed = json.loads((w / "manifest.json").read_text())["plots"]
    assert listed and all((w / p).is_file() for p in listed) and "plots/fig.png" not in listed
    sweep.run_sweep(conf(seed=1), w, overwrite=True, plots=False)  # another sweep replaces this one
    assert not any((w / p).exists() for p in listed)
    assert (w / "plots" / "fig.png").read_text() == "x" and (w / "notes.txt").read_text() == "mine"
    assert json.loads((w / "manifest.json").read_text())["config_hash"] == conf(seed=1).hash()


def test_an_empty_or_absent_folder_is_fine_and_an_empty_name_is_refused(tmp_path, reference, monkeypatch):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "absent" / "deeper"):
        sweep.run_sweep(conf(), out, plots=False)
        assert_folder_equals(out, reference)
    monkeypatch.chdir(tmp_path / "empty")
    with pytest.raises(ValueError, match='^"": an empty results folder name'):
        sweep.run_sweep(conf(), "")


# --- 6. SIGINT and SIGTERM ---------------------------------------------------------------------


def _signalled_sweep(tmp_path, env, signum, vehicles):
    """Start ``quadjax sweep`` in a child, signal it after its first chunk; (command, result)."""
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml(conf(vehicles=vehicles).resolved))
    command = [sys.executable, "-m", "quadjax.cli", "sweep", "--config", str(path), "--out", str(tmp_path / "res"),
               "--no-plots"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.lstrip().startswith("chunk "):
                proc.send_signal(signum)
                break
        rest = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        _stop(proc)
    return command, proc.returncode, "".join(lines) + rest


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_sweep_with_one_line_and_a_rerun_resumes(tmp_path, child_env, signum, code):
    vehicles = 2000  # 250 chunks of 8: still flying when the first one is reported
    command, rc, stderr = _signalled_sweep(tmp_path, child_env, signum, vehicles)
    assert rc == code, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    m = re.fullmatch(r"quadjax sweep: stopped after chunk (\d+) of 250; rerun the same command to resume", last)
    assert m, stderr
    assert 1 <= int(m.group(1)) < 250
    assert len(list((tmp_path / "res" / "chunks").glob("chunk_*.npz"))) == int(m.group(1))
    assert not list((tmp_path / "res").rglob(f"*{TMP_SUFFIX}"))
    if signum != signal.SIGINT:
        return
    resumed = subprocess.run(command, env=child_env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming with {8 * int(m.group(1))} done" in resumed.stderr
    assert_folder_equals(tmp_path / "res", sweep.run_sweep(conf(vehicles=vehicles)))


# --- 7. one-line CLI errors ---------------------------------------------------------------------


def _cli_error(capsys, argv):
    assert cli_main(["sweep", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_cli_errors_name_the_path_and_the_reason(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --out "" must not write here
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert _cli_error(capsys, ["--out", str(afile)]) == (
        f"quadjax sweep: error: {afile}: not a folder (a file of that name is in the way)")
    assert _cli_error(capsys, ["--out", str(afile / "sub")]).startswith(
        f"quadjax sweep: error: {afile / 'sub'}: cannot create the results folder")
    assert _cli_error(capsys, ["--config", str(tmp_path)]) == (
        f"quadjax sweep: error: {tmp_path}: a folder, not a TOML config file")
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert _cli_error(capsys, ["--config", str(binary)]).startswith(
        f"quadjax sweep: error: {binary}: not a TOML config file (not UTF-8 text")
    bad = tmp_path / "bad.toml"
    bad.write_text("[mission]\nduration = -1\n")
    assert _cli_error(capsys, ["--config", str(bad)]).startswith(
        f"quadjax sweep: error: {bad}: config: mission.duration = -1")
    assert _cli_error(capsys, ["--out", ""]).startswith('quadjax sweep: error: "": an empty results folder name')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "b.toml", "bad.toml"]  # nothing written


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores file permissions")
def test_cli_error_on_a_read_only_folder(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert _cli_error(capsys, ["--out", str(ro)]).startswith(f"quadjax sweep: error: {ro}: cannot write here")
        assert _cli_error(capsys, ["--out", str(ro / "sub")]).startswith(
            f"quadjax sweep: error: {ro / 'sub'}: cannot create the results folder")
    finally:
        ro.chmod(0o755)


# --- 8. absurd sizes ----------------------------------------------------------------------------


def test_an_absurd_size_is_refused_before_compiling(tmp_path, capsys):
    out = tmp_path / "big"
    err = _cli_error(capsys, ["--vehicles", "1", "--duration", "1e7", "--out", str(out)])
    assert err.startswith("quadjax sweep: error: sweep too large (1 × 1250000000 ticks = 1.25e+09 "
                          "vehicle-ticks): 86.3 GB of results, 173 GB on disk")
    assert "pass --force" in err and not out.exists()
    events = []
    with pytest.raises(ValueError, match="vehicle-ticks \\(budget 2e\\+10\\)"):
        sweep.run_sweep(conf(vehicles=10**7, keep_trajectories=0, **{"mission.duration": 20.0}),
                        progress=events.append)
    assert events == []  # nothing compiled, nothing flown
    e = runner.estimate(conf())
    # a kept vehicle-tick: 16 floats of state and error, the int8 saturation report (4), alive (1)
    assert e["vehicle_ticks"] == 32 * 10 and e["results_bytes"] == 4 * 10 * (16 * 4 + 4 + 1) + 32 * (11 + 12) * 8


def test_force_runs_past_the_budget(monkeypatch, reference):
    monkeypatch.setattr(runner, "MAX_VEHICLE_TICKS", 100)
    with pytest.raises(ValueError, match="sweep too large"):
        sweep.run_sweep(conf())
    assert strip(sweep.run_sweep(conf(), force=True).summary) == strip(reference.summary)
