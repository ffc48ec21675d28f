"""Reliability and security regressions (issue 23): each case an adversarial probe found.

The native build cache (planted, truncated and garbage libraries), the engine boundary
(params, dt, dtypes, rotor counts, coarse steps), and a property test over generated
(params, state, command, dt) cases. The sweep store's cases are in
tests/test_reliability_sweep.py, the fit/log loaders' in tests/test_reliability_fit.py.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import quadjax as qj
import quadjax.native as native

REPO = Path(__file__).resolve().parents[1]
needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")

# a library whose constructor proves it ran: it writes the file named by $QJ_PLANT_MARK
_PLANT = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *path = getenv("QJ_PLANT_MARK");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) { fputs("planted code ran\n", f); fclose(f); }
}
"""


def _planted_library(folder: Path) -> Path:
    src = folder / "planted.c"
    src.write_text(_PLANT)
    lib = folder / "planted.so"
    subprocess.run([shutil.which("cc") or "c++", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def _child_env(env: dict) -> dict:
    """A child interpreter's environment: this one's, the repo importable, the kernel not disabled, ``env``."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    full.pop("QUADJAX_NATIVE", None)
    return full


def _python(code: str, env: dict, timeout=240) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (the kernel loads once per process)."""
    return subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)], env=_child_env(env),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o700)
    return path


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- native build cache


@needs_compiler
def test_planted_library_never_runs_and_truncated_cache_is_rebuilt(tmp_path):
    """The worst cases at once, in a fresh process: a library whose constructor writes a file,
    planted under the kernel's own name in the shared temp folder (where earlier versions
    looked first); and the user's cache holding a truncated kernel (a bus error on dlopen
    before) next to its genuine digest. The planted code must never run, the truncated file
    must be rebuilt, and the kernel must work."""
    name = native.kernel_filename()
    shared = tmp_path / "shared_tmp"
    (shared / "quadjax").mkdir(parents=True)
    planted = _planted_library(tmp_path)
    shutil.copy(planted, shared / "quadjax" / name)
    cache = _private_dir(tmp_path / "cache")
    genuine = native.cache_dir() / name
    if not native.available() or not genuine.exists() or native.trust_problem(genuine):
        pytest.skip("this process did not build a trusted kernel to truncate")
    shutil.copy(genuine, cache / name)
    shutil.copy(genuine.with_name(name + ".sha256"), cache / (name + ".sha256"))
    with open(cache / name, "r+b") as f:
        f.truncate(genuine.stat().st_size // 2)
    mark = tmp_path / "planted_ran"
    run = _python("""
        import jax.numpy as jnp, quadjax as qj, quadjax.native as n
        assert n.available(), n.unavailable_reason()
        p = qj.presets.rp1()
        s = qj.hover_state(p, (0.0, 0.0, 1.0))
        t = qj.simulate(p, s, 1e-3, commands=jnp.tile(qj.hover_rotor_speed(p), (10, 1)))
        assert t.backend == "native", t.backend
        print("z", float(t.final.position[2]))
    """, {"TMPDIR": str(shared), "QUADJAX_CACHE_DIR": str(cache), "QJ_PLANT_MARK": str(mark)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert not mark.exists(), "a planted library's code ran in the user's process"
    assert "sha256 differs" in run.stderr  # the warning names the cause
    # rebuilt whole: trusted, and the child's flight ran on it (t.backend == "native": the library
    # loaded and registered every FFI target). Not compared byte for byte with the genuine one:
    # one CI run rebuilt it with other bytes, which 20 builds here never did.
    assert native.trust_problem(cache / name) is None
    assert abs(float(run.stdout.split()[-1]) - 1.0) < 1e-3


@needs_compiler
@pytest.mark.parametrize("defect", ["group_writable_folder", "world_writable_file", "no_digest", "zero_bytes",
                                    "garbage", "symlink", "digest_of_another_file"])
def test_cached_library_is_trusted_only_when_private_and_digest_matches(tmp_path, defect):
    """``trust_problem`` (run before any dlopen) refuses each way a cached kernel can be
    planted or damaged, and accepts the same file once it is private and its digest matches."""
    name = native.kernel_filename()
    cache = _private_dir(tmp_path / "cache")
    lib = cache / name
    digest = cache / (name + ".sha256")
    lib.write_bytes(_planted_library(tmp_path).read_bytes())
    lib.chmod(0o700)
    digest.write_text(_sha(lib) + "\n")
    digest.chmod(0o600)
    assert native.trust_problem(lib) is None  # the control: a private file with its digest
    if defect == "group_writable_folder":
        cache.chmod(0o770)
    elif defect == "world_writable_file":
        lib.chmod(0o777)
    elif defect == "no_digest":
        digest.unlink()
    elif defect == "zero_bytes":
        lib.write_bytes(b"")
    elif defect == "garbage":
        lib.write_bytes(os.urandom(4096))
    elif defect == "symlink":
        target = tmp_path / "elsewhere.so"
        lib.rename(target)
        lib.symlink_to(target)
    elif defect == "digest_of_another_file":
        digest.write_text(_sha(digest) + "\n")
    why = native.trust_problem(lib)
    assert why and str(cache) in why, why


def test_failed_build_falls_back_to_xla_with_a_warning_naming_the_cause(tmp_path):
    """A compiler that writes garbage: the kernel is rebuilt once, the load fails, and the
    process runs on XLA with one warning saying why (never a crash, never silence)."""
    fake = tmp_path / "fake-c++"
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo fake 1.0; exit 0; fi\n'
                    'while [ "$1" != "-o" ]; do shift; done; echo not-an-elf > "$2"\n')
    fake.chmod(0o755)
    cache = _private_dir(tmp_path / "cache")
    run = _python("""
        import quadjax.native as n, quadjax as qj, jax.numpy as jnp
        assert not n.available()
        print("reason:", n.unavailable_reason())
        p = qj.presets.rp1()
        t = qj.simulate(p, qj.hover_state(p, (0, 0, 1.0)), 1e-3, commands=jnp.tile(qj.hover_rotor_speed(p), (5, 1)))
        print("backend:", t.backend)
    """, {"CXX": str(fake), "QUADJAX_CACHE_DIR": str(cache)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "backend: xla" in run.stdout
    assert run.stderr.count("native CPU kernel unavailable") == 1
    assert "invalid ELF header" in run.stdout or "file too short" in run.stdout, run.stdout


def test_unusable_cache_folder_is_never_used(tmp_path):
    """A cache folder writable by others is not used, even for building: the kernel goes to a
    fresh private temp folder (mode 0700), and a warning says why and what to set."""
    cache = tmp_path / "shared_cache"
    cache.mkdir()
    cache.chmod(0o777)
    fake = tmp_path / "fake-c++"  # fast: the test is about where, not what, is built
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo fake 1.0; exit 0; fi\n'
                    'while [ "$1" != "-o" ]; do shift; done; echo x > "$2"\n')
    fake.chmod(0o755)
    private_tmp = _private_dir(tmp_path / "tmp")
    run = _python("import os, quadjax.native as n; n.available(); "
                  "print('folders', [f for f in os.listdir(os.environ['TMPDIR']) if f.startswith('quadjax-native-')])",
                  {"CXX": str(fake), "QUADJAX_CACHE_DIR": str(cache), "TMPDIR": str(private_tmp)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "writable by group or others" in run.stderr and "QUADJAX_CACHE_DIR" in run.stderr
    folder = Path(re.search(r"private folder (\S+) for", run.stderr).group(1))
    assert folder.parent == private_tmp and folder.name.startswith("quadjax-native-")
    # one stand-in per process: the kept source and the library both went to it
    assert f"folders ['{folder.name}']" in run.stdout, run.stdout
    assert list(cache.iterdir()) == []
    assert not folder.exists()  # removed when the process ended


@needs_compiler
def test_processes_that_need_one_library_at_once_compile_it_once(tmp_path):
    """Three processes build the same library at the same moment (pytest -n, a sweep's processes on
    one host): the compiler runs once, the others wait on its lock and load what it wrote, and every
    process calls into the library. A compiler that sleeps 2 s makes them overlap."""
    log = tmp_path / "compiles"
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    slow = tmp_path / "slow-c++"
    slow.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then exec {cxx} --version; fi\n'
                    f'echo $$ >> {log}\nsleep 2\nexec {cxx} "$@"\n')
    slow.chmod(0o755)
    cache = _private_dir(tmp_path / "cache")
    code = textwrap.dedent("""
        import ctypes, quadjax.native as n
        text = 'extern "C" int quadjax_lock_probe() { return 42; }'
        notes = []
        n.build_library(text, [], notes)
        lib = n.cache_dir() / n.library_filename(text)
        print("probe", ctypes.CDLL(str(lib)).quadjax_lock_probe(), notes)
    """)
    env = _child_env({"CXX": str(slow), "QUADJAX_CACHE_DIR": str(cache)})
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:  # stopped by their own handles if the wait failed
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "probe 42 []" in out, out
    assert len(log.read_text().split()) == 1  # one compile for the three
    assert len([f for f in cache.iterdir() if f.suffix == ".so"]) == 1


@needs_compiler
def test_a_builder_that_holds_the_lock_too_long_is_built_around(tmp_path, monkeypatch):
    """A process stuck while holding a library's build lock delays the others by at most
    BUILD_WAIT_S: then they build it themselves and say why (never a hang)."""
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(_private_dir(tmp_path / "cache")))
    monkeypatch.setattr(native, "BUILD_WAIT_S", 0.5)
    text = 'extern "C" int quadjax_lock_probe() { return 7; }'
    lib = native.cache_dir() / native.library_filename(text)
    notes = []
    with qj.files.exclusive_lock(lib.with_name(lib.name + ".lock"), 1.0):  # the stuck builder
        native.build_library(text, [], notes)
    assert len(notes) == 1 and "still held by another process after 0.5 s" in notes[0], notes
    assert native.trust_problem(lib) is None


# --------------------------------------------------------------------------- the cache's upkeep

DAY = 86400.0


def _age(path: Path, days: float) -> None:
    t = time.time() - days * DAY
    os.utime(path, (t, t))


@needs_compiler
def test_prune_removes_what_was_not_used_for_a_while_and_a_use_keeps_an_entry(tmp_path, monkeypatch):
    """Every entry 40 days old; then library A is loaded and source k1 read, as a process uses them.
    ``prune_cache(unused_days=30)`` removes library B and source k2 with their digests and locks, a
    digest and a lock whose entry is gone, and a writer's temporary killed two hours ago; it keeps
    A and k1 (trusted still), a temporary being written now, the digest of a library being built
    (its lock held), another tool's file and the SITL's folder. A dry run says the same and touches nothing."""
    cache = _private_dir(tmp_path / "cache")
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(cache))
    texts = {k: f'extern "C" int quadjax_prune_{k}() {{ return 1; }}' for k in "AB"}
    libs = {k: cache / native.library_filename(t) for k, t in texts.items()}
    for t in texts.values():
        native.build_library(t, [], [])
    srcs = {k: cache / f"{native.SOURCE_PREFIX}{k}.cc" for k in ("k1", "k2")}
    for k in srcs:
        assert native.cached_source(k, lambda k=k: f"// {k}\n") == f"// {k}\n"
    (cache / "sitl").mkdir()
    foreign = [cache / "other-tool.bin", cache / "sitl" / "betaflight"]
    leftovers = [cache / f"{native.LIBRARY_PREFIX}0123456789abcdef.so.sha256",
                 cache / f"{native.SOURCE_PREFIX}gone.cc.lock",
                 cache / f".{native.LIBRARY_PREFIX}0123456789abcdef.so.0a1b2c3d.quadjax-tmp"]
    writing = cache / f".{native.SOURCE_PREFIX}k3.cc.4d5e6f70.quadjax-tmp"
    building = cache / f"{native.LIBRARY_PREFIX}fedcba9876543210.so.sha256"  # its library comes next
    for path in foreign + leftovers + [writing, building]:
        path.write_text("x")
    for path in [*cache.iterdir(), *foreign]:
        _age(path, 40)
    _age(leftovers[-1], 2 / 24)
    _age(writing, 10 / DAY)

    notes = []
    native.build_library(texts["A"], [], notes)  # a process loads A ...
    assert notes == []
    assert native.cached_source("k1", lambda: pytest.fail("k1 is kept: read, not generated")) == "// k1\n"  # ... and reads k1

    before = sorted(cache.iterdir())
    would = native.prune_cache(unused_days=30, dry_run=True)
    assert sorted(cache.iterdir()) == before
    with qj.files.exclusive_lock(building.with_suffix(".lock"), 1.0):  # the builder's turn
        gone = native.prune_cache(unused_days=30)
    assert [e.path for e in would] == [e.path for e in gone]
    assert {e.path for e in gone} == {libs["B"], srcs["k2"]}
    assert {e.kind for e in gone} == {"library", "source"}
    assert {e.path for e in native.cache_entries()} == {libs["A"], srcs["k1"]}
    for path in (libs["B"], srcs["k2"]):
        assert not any(cache.glob(path.name + "*")), sorted(cache.iterdir())
    assert not any(path.exists() for path in leftovers)
    assert writing.exists() and building.exists() and all(path.exists() for path in foreign)
    assert native.trust_problem(libs["A"]) is None and native.trust_problem(srcs["k1"]) is None


def test_prune_passes_over_an_entry_in_use_and_fits_the_cache_to_a_size(tmp_path, monkeypatch):
    """Sources of 1, 2, 3 and 4 kB used in that order, the oldest's lock held (a process loading or
    building it). Pruning to 5.5 kB passes over the held one and removes the next least recently used
    (2 kB, then 3 kB) until the rest fit; nothing is old enough for ``unused_days`` alone."""
    cache = _private_dir(tmp_path / "cache")
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(cache))
    paths = []
    for k in range(1, 5):
        native.cached_source(f"s{k}", lambda k=k: "x" * (1000 * k))
        paths.append(cache / f"{native.SOURCE_PREFIX}s{k}.cc")
        _age(paths[-1], 5 - k)
    assert native.prune_cache(unused_days=30) == []
    with qj.files.exclusive_lock(paths[0].with_name(paths[0].name + ".lock"), 1.0):
        gone = native.prune_cache(max_bytes=5500)
    assert [e.path for e in gone] == paths[1:3]
    kept = native.cache_entries()
    assert [e.path for e in kept] == [paths[0], paths[3]]
    assert sum(e.bytes for e in kept) == 5000 + 2 * 65 <= 5500  # the sources and their digests
    assert native.prune_cache(max_bytes=0) and native.cache_entries() == []


@needs_compiler
def test_building_a_library_removes_what_went_unused_for_auto_prune_days(tmp_path, monkeypatch):
    """A new library (what an upgrade or an edit brings) removes the entries unused for
    AUTO_PRUNE_DAYS and keeps the others; loading one from the cache removes nothing."""
    cache = _private_dir(tmp_path / "cache")
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(cache))
    for k, days in (("ancient", native.AUTO_PRUNE_DAYS + 1), ("recent", native.AUTO_PRUNE_DAYS - 1)):
        native.cached_source(k, lambda: "x")
        _age(cache / f"{native.SOURCE_PREFIX}{k}.cc", days)
    text = 'extern "C" int quadjax_auto_prune() { return 1; }'
    native.build_library(text, [], [])
    lib = cache / native.library_filename(text)
    assert {e.path.name for e in native.cache_entries()} == {lib.name, f"{native.SOURCE_PREFIX}recent.cc"}
    native.cached_source("ancient", lambda: "x")
    _age(cache / f"{native.SOURCE_PREFIX}ancient.cc", native.AUTO_PRUNE_DAYS + 1)
    native.build_library(text, [], [])  # from the cache: no build, no pruning
    assert len(native.cache_entries()) == 3


def test_a_kept_source_pruned_while_it_is_read_is_generated_again(tmp_path, monkeypatch):
    """Kept sources are read without their lock, so a prune in another process may remove one between
    the trust checks and the read: the reader generates it again (it had raised, and the kernel fell
    back to XLA)."""
    cache = _private_dir(tmp_path / "cache")
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(cache))
    native.cached_source("raced", lambda: "// first\n")
    path, read = cache / f"{native.SOURCE_PREFIX}raced.cc", Path.read_bytes

    def pruned_meanwhile(self):
        if self == path and path.exists():
            path.unlink()  # what a prune does between the checks and the read
        return read(self)

    with monkeypatch.context() as m:
        m.setattr(Path, "read_bytes", pruned_meanwhile)
        assert native.cached_source("raced", lambda: "// again\n") == "// again\n"
    assert native.cached_source("raced", lambda: pytest.fail("kept again")) == "// again\n"


def test_prune_refuses_a_folder_that_is_not_the_users_own(tmp_path, monkeypatch):
    """A cache folder writable by others is not ours to clean (as it is not ours to load from):
    ValueError, and nothing in it is removed."""
    cache = _private_dir(tmp_path / "cache")
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(cache))
    native.cached_source("s", lambda: "x")
    cache.chmod(0o777)
    with pytest.raises(ValueError, match="writable by group or others"):
        native.prune_cache(unused_days=0)
    assert len(native.cache_entries()) == 1


def test_the_cache_command_shows_and_prunes(tmp_path, monkeypatch, capsys):
    """``quadjax cache`` lists the entries and their size; ``--prune --dry-run`` says what would go
    and removes nothing; ``--prune`` removes it; a pruning option without ``--prune`` is an error."""
    from quadjax.cli import main

    cache = _private_dir(tmp_path / "cache")
    monkeypatch.setenv("QUADJAX_CACHE_DIR", str(cache))
    for k, days in (("old", 45), ("new", 1)):
        native.cached_source(k, lambda: "x" * 250_000)
        _age(cache / f"{native.SOURCE_PREFIX}{k}.cc", days)
    assert main(["cache", "--list"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "0 libraries (0.0 MB), 2 generated sources (0.5 MB): 0.5 MB" in out
    assert out.index(f"{native.SOURCE_PREFIX}old.cc") < out.index(f"{native.SOURCE_PREFIX}new.cc")
    assert main(["cache", "--prune", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove source" in out and "would keep 0 libraries (0.0 MB), 1 generated source" in out
    assert len(native.cache_entries()) == 2
    assert main(["cache", "--prune", "--unused-days", "30"]) == 0
    assert "removed 0 libraries (0.0 MB), 1 generated source (0.3 MB)" in capsys.readouterr().out
    assert [e.path.name for e in native.cache_entries()] == [f"{native.SOURCE_PREFIX}new.cc"]
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "--max-mb", "1"])
    assert exit_.value.code == 2 and "go with --prune" in capsys.readouterr().err


# --------------------------------------------------------------------------- the engine boundary


def _rp1(**changes):
    return qj.presets.rp1(dtype="float64").replace(**{k: jnp.asarray(v, jnp.float64) for k, v in changes.items()})


def _hover_run(params, dt=1e-3, T=20, **kw):
    s0 = qj.hover_state(qj.presets.rp1(dtype="float64"), (0.0, 0.0, 1.0))
    u = jnp.tile(qj.hover_rotor_speed(qj.presets.rp1(dtype="float64")), (T, 1))
    return qj.simulate(params, s0, dt, commands=u, **kw)


@pytest.mark.parametrize("field, value", [("mass", np.nan), ("mass", -1.0), ("k_f", 0.0), ("battery_sag", 1.0),
                                          ("omega_max", -5.0), ("gravity", np.inf)])
def test_replaced_params_are_refused_by_name_or_flagged_per_vehicle(field, value):
    """The README's batching idiom ``p.replace(mass=...)`` bypasses ``create``: concrete bad
    values are refused by name at simulate; traced ones (vmap) get status params_invalid and
    never fly, while the good vehicle beside them flies untouched."""
    bad = _rp1(**{field: value})
    with pytest.raises(ValueError, match=f"invalid params: QuadParams.{field}"):
        _hover_run(bad)
    good = _rp1()
    fleet = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), good, bad)
    run = jax.jit(jax.vmap(lambda p: _hover_run(p, config=qj.SimConfig(check="monitor"))))(fleet)
    assert np.asarray(run.status).tolist() == [0, qj.STATUS_IDS.index("params_invalid")]
    alone = _hover_run(good, config=qj.SimConfig(check="monitor"))
    assert np.array_equal(np.asarray(run.final.position[0]), np.asarray(alone.final.position))


@pytest.mark.parametrize("dt", [0.0, -1e-3, np.nan, np.inf])
def test_bad_dt_is_refused_or_flagged(dt):
    with pytest.raises(ValueError, match="dt = "):
        _hover_run(_rp1(), dt=dt)
    run = jax.jit(lambda d: _hover_run(_rp1(), dt=d, config=qj.SimConfig(check="monitor")))(jnp.asarray(dt))
    assert int(run.status) == qj.STATUS_IDS.index("params_invalid")


def test_a_step_the_params_make_unstable_is_refused_and_a_coarse_one_is_reported():
    """dt = 0.5 s: rotational drag of 41 1/s (c4dynamics_reference) makes RK4 unstable there,
    refused before flying with the step that would work; rp1 has no such fixed rate, and its
    monitored run is stopped with coarse_step as soon as a step turns too far (both backends,
    which agree), instead of returning finite nonsense."""
    c4d = qj.presets.get("c4dynamics_reference", dtype="float64")
    s0 = qj.hover_state(c4d, (0.0, 0.0, 5.0))
    u = jnp.tile(qj.hover_rotor_speed(c4d), (4, 1))
    with pytest.raises(ValueError, match=r"unstable for these params.*dt/substeps <= 0\.0"):
        qj.simulate(c4d, s0, 0.5, commands=u)
    assert qj.simulate(c4d, s0, 0.5, commands=u, config=qj.SimConfig(substeps=64)).final.position.shape == (3,)
    p = _rp1()
    s0 = qj.hover_state(p, (0.0, 0.0, 5.0))
    u = jnp.tile(qj.hover_rotor_speed(p) * jnp.asarray([1.05, 0.95, 1.0, 1.0]), (4, 1))
    codes = set()
    for backend in ("xla",) + (("native",) if native.available() else ()):
        run = qj.simulate(p, s0, 0.5, commands=u, config=qj.SimConfig(check="monitor", backend=backend))
        codes.add(int(run.status))
        assert "coarse_step" in qj.monitor.describe(run.report, p) and "dt/substeps <=" in qj.monitor.describe(run.report, p)
    assert codes == {qj.STATUS_IDS.index("coarse_step")}


def test_rotor_count_of_state_and_params_must_agree():
    p = _rp1()
    hexa = qj.hover_state(qj.presets.get("iris", dtype="float64")).replace(rotor_speeds=jnp.zeros(6))
    with pytest.raises(ValueError, match="rotor_speeds"):
        qj.simulate(p, hexa, 1e-3, commands=jnp.zeros((3, 4)))


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_only_float_dtypes_are_accepted(dtype):
    with pytest.raises(ValueError, match="float32 or float64"):
        qj.presets.rp1(dtype=dtype)
    with pytest.raises(ValueError, match="float32 or float64"):
        qj.QuadState.create(dtype=dtype)
    with pytest.raises(ValueError, match="float32 or float64"):
        _rp1().astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int32", "bool"])
def test_the_engine_runs_in_float32_or_float64_only(dtype):
    """16-bit is for the model functions alone (tests/test_precision.py); the engine refuses it."""
    p = _rp1()
    s0 = jax.tree_util.tree_map(lambda x: x.astype(dtype), qj.hover_state(p))
    with pytest.raises(ValueError, match="float32 or float64"):
        qj.simulate(p, s0, 1e-3, commands=jnp.zeros((3, 4)))


@pytest.mark.parametrize("field, value", [("k_f", 1e-50), ("mass", 1e39), ("battery_capacity", 1e-46)])
def test_create_checks_the_values_after_the_cast(field, value):
    """Representable in float64, not in float32 (0 or inf there): refused in float32 only."""
    spec = dict(mass=1.0, inertia=(0.01, 0.01, 0.02), k_f=1e-5, k_m=0.01, omega_max=1000.0,
                rotor_positions=[[0.1, -0.1, 0], [-0.1, 0.1, 0], [0.1, 0.1, 0], [-0.1, -0.1, 0]],
                rotor_spins=[1, 1, -1, -1])
    spec[field] = value
    if field == "mass":
        spec["inertia"] = (1e37, 1e37, 2e37)
    qj.QuadParams.create(**spec, dtype="float64")
    with pytest.raises(ValueError, match=f"QuadParams.{field} = .* in float32"):
        qj.QuadParams.create(**spec, dtype="float32")


def test_stiff_lag_is_integrated_exactly_not_into_nonsense():
    """motor_tau = 1e-5 s at dt = 1e-3 s (the probe's z = 5e8 m): the lag is solved exactly, so
    the run matches a run resolving τ (dt/1000), and a monitored run flags only the ticks
    where the command jumps (rotor transient), never a steady one."""
    p = _rp1(motor_tau=1e-5)
    s0 = qj.hover_state(p, (0.0, 0.0, 1.0))
    u = jnp.tile(qj.hover_rotor_speed(p) * 1.02, (50, 1))
    coarse = qj.simulate(p, s0, 1e-3, commands=u, config=qj.SimConfig(backend="xla"))
    fine = qj.simulate(p, s0, 1e-3, commands=u, config=qj.SimConfig(backend="xla", substeps=1000, save_every=0))
    assert abs(float(coarse.final.position[2] - fine.final.position[2])) < 1e-4
    assert 1.0 < float(coarse.final.position[2]) < 1.2
    steady = qj.simulate(p, s0.replace(rotor_speeds=u[0]), 1e-3, commands=u, config=qj.SimConfig(check="monitor"))
    assert int(steady.status) == 0
    jump = qj.simulate(p, s0, 1e-3, commands=u, config=qj.SimConfig(check="monitor"))
    assert int(jump.status) == qj.STATUS_IDS.index("coarse_step") and int(jump.status_tick) == 0
    assert "rotor transient" in qj.monitor.describe(jump.report, p)


def test_replay_reproduces_a_params_invalid_report(tmp_path):
    """An I1 report (params traced through vmap, one vehicle bad) replays as reproduced."""
    fleet = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), _rp1(), _rp1(mass=-1.0))
    run = jax.jit(jax.vmap(lambda p: _hover_run(p, config=qj.SimConfig(check="monitor"))))(fleet)
    path = qj.monitor.write_repro(tmp_path / "i1.npz", run, fleet, 1e-3, vehicle=1, params_axes=0)
    again = qj.monitor.replay(path)
    assert again.reproduced and again.code == qj.STATUS_IDS.index("params_invalid")


# --------------------------------------------------------------------------- property: 10⁵ cases


def _cases(n, seed):
    """n (params, state, command, dt) cases over wide valid ranges, with ~5 % invalid params,
    some invalid states (off-unit attitude, rotors past ω_max, energy < 0, below ground)
    and ~1 % invalid dt; every leaf of QuadParams varies per vehicle."""
    rng = np.random.default_rng(seed)

    def logu(lo, hi, size=n):
        return np.exp(rng.uniform(np.log(lo), np.log(hi), size))

    mass = logu(0.02, 5.0)
    scale = mass * logu(0.005, 0.05) ** 2
    d = scale[:, None] * rng.uniform(0.6, 1.0, (n, 3))
    J = np.zeros((n, 3, 3))
    J[:, 0, 0], J[:, 1, 1], J[:, 2, 2] = d[:, 0], d[:, 1], d[:, 0] + d[:, 1]
    J[:, 0, 1] = J[:, 1, 0] = 0.05 * scale * rng.uniform(-1, 1, n)
    arm = logu(0.03, 0.5)
    ang = np.pi / 4 + np.arange(4) * np.pi / 2 + rng.uniform(-0.2, 0.2, (n, 4))
    omega_max = logu(300, 5000)
    p = dict(
        mass=mass, inertia=J, rotor_spins=np.tile([1.0, -1.0, 1.0, -1.0], (n, 1)),
        rotor_positions=np.stack([arm[:, None] * np.cos(ang), arm[:, None] * np.sin(ang),
                                  rng.uniform(-0.02, 0.02, (n, 4))], -1),
        k_f=mass * 9.81 / 2 / omega_max ** 2 * rng.uniform(0.8, 3.0, n), k_m=logu(1e-3, 0.05),
        motor_tau=np.where(rng.random(n) < 0.3, 0.0, logu(1e-5, 0.2)), omega_min=omega_max * rng.uniform(0, 0.1, n),
        omega_max=omega_max, drag_linear=mass[:, None] * logu(1e-3, 20, (n, 3)),
        drag_quadratic=mass[:, None] * logu(1e-4, 2, (n, 3)), drag_rotational=scale[:, None] * logu(1e-3, 200, (n, 3)),
        rotor_inertia=scale * logu(1e-6, 1e-1), k_p=logu(1e-12, 1e-7), battery_capacity=logu(10, 1e6),
        battery_sag=rng.uniform(0, 0.5, n), ground_z=rng.uniform(-1, 1, n), gravity=rng.uniform(0, 20, n),
        wind=rng.uniform(-10, 10, (n, 3)),
        # the small-vehicle effects off: the 3 % bound is characterised without them (see the note on issue 16)
        motor_tau_down_ratio=np.ones(n), rotor_reaction_inertia=np.zeros(n), rotor_drag=np.zeros(n),
        blade_flapping=np.zeros(n), k_inflow=np.zeros(n), rotor_radius=np.zeros(n))
    bad = rng.random(n) < 0.05
    p["mass"] = np.where(bad & (rng.random(n) < 0.5), -p["mass"], p["mass"])
    p["battery_sag"] = np.where(bad & (rng.random(n) < 0.5), 1.5, p["battery_sag"])
    p["k_f"] = np.where(bad & (rng.random(n) < 0.3), np.nan, p["k_f"])
    params = qj.QuadParams(**{k: jnp.asarray(v) for k, v in p.items()})
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q = np.where((rng.random(n) < 0.02)[:, None], q * 1.01, q)
    grounded = rng.random(n) < 0.2
    z = p["ground_z"] + np.where(grounded, 0.0, logu(1e-3, 50))
    z = np.where(rng.random(n) < 0.02, p["ground_z"] - 0.1, z)
    state = qj.QuadState(
        position=jnp.asarray(np.stack([rng.uniform(-5, 5, n), rng.uniform(-5, 5, n), z], -1)),
        velocity=jnp.asarray(rng.uniform(-15, 15, (n, 3)) * (rng.random((n, 1)) < 0.8)),
        attitude=jnp.asarray(q), body_rates=jnp.asarray(rng.uniform(-20, 20, (n, 3)) * (rng.random((n, 1)) < 0.7)),
        rotor_speeds=jnp.asarray(omega_max[:, None] * rng.uniform(0, 1.05, (n, 4))),
        energy=jnp.asarray(p["battery_capacity"] * rng.uniform(-0.02, 1, n)),
        on_ground=jnp.asarray(grounded.astype(float)))
    command = jnp.asarray(omega_max[:, None] * rng.uniform(-0.2, 1.2, (n, 4)))
    dt = logu(1e-4, 0.5)
    dt = np.where(rng.random(n) < 0.01, rng.choice([0.0, -1e-3, np.nan, np.inf], n), dt)
    return params, state, command, jnp.asarray(dt)


def _fly_one_tick(substeps):
    config = qj.SimConfig(check="monitor", substeps=substeps, save_every=0, backend="xla")

    def one(p, s, u, dt):
        run = qj.simulate(p, s, dt, commands=u[None], config=config)
        return run.final, run.status

    return jax.jit(jax.vmap(one))


def _increments(params, state, command, h):
    """What one step of h may change, per block (the scale its error is judged against):
    h·(|v| + ½h·a) for position, h·a for velocity with a = |F|/m + g (thrust and drag, not
    their net: a tilted thrust against gravity nets little but turns much), h·|ω|/2 for the
    attitude, h·(|M| + |ω|² J_max)/J_min for the body rates, h·Σk_p ω³ for the energy."""
    from quadjax.quadrotor import body_wrench

    top = jnp.maximum(state.rotor_speeds, jnp.clip(command, 0, params.omega_max[:, None]))
    F, M = (np.asarray(x) for x in body_wrench(params, state.position, state.attitude, state.velocity,
                                               state.body_rates, top,
                                               state.energy))
    moments = np.linalg.eigvalsh(np.asarray(params.inertia))
    w = np.linalg.norm(np.asarray(state.body_rates), axis=1)
    a = np.linalg.norm(F, axis=1) / np.asarray(params.mass) + np.asarray(params.gravity)
    power = np.sum(np.asarray(params.k_p)[:, None] * np.asarray(top) ** 3, axis=1)
    return dict(position=h * (np.linalg.norm(np.asarray(state.velocity), axis=1) + 0.5 * h * a), velocity=h * a,
                attitude=0.5 * h * w, body_rates=h * (np.linalg.norm(M, axis=1) + w * w * moments[:, 2]) / moments[:, 0],
                energy=h * power)


def test_property_every_step_is_rejected_reported_or_right():
    """10⁵ generated cases, one tick each, monitored. Every case ends one of three ways: its
    inputs are rejected (params_invalid: bad params or dt), it is reported (a state invariant
    I2–I5, or coarse_step), or its result is right: within 3 % of what one step may change
    (:func:`_increments`) of a reference with 16 substeps, and the rotor speeds (exact lag)
    to rounding. A step that lands or starts on the ground is judged on position only, to
    within one step's motion: contact is a stop at the end of the step that crosses the
    ground (seed 000's model), resolved to one step by design."""
    n = 100_000
    params, state, command, dt = _cases(n, seed=23)
    coarse, status = _fly_one_tick(1)(params, state, command, dt)
    fine, fine_status = _fly_one_tick(16)(params, state, command, dt)
    status, fine_status = np.asarray(status), np.asarray(fine_status)
    ids = qj.STATUS_IDS
    counts = {ids[c]: int((status == c).sum()) for c in range(len(ids))}
    # every outcome is exercised, and a fair share of cases is judged on its numbers
    assert counts["none"] > 0.15 * n and counts["params_invalid"] > 0.03 * n and counts["coarse_step"] > 0.2 * n
    assert min(counts[k] for k in ("attitude_not_unit", "rotor_speed", "energy", "below_ground")) > 100
    # what the reference rejects at h/16 the coarse run cannot have judged right at h
    assert not np.any((status == 0) & (fine_status == ids.index("params_invalid")))
    accepted = (status == 0) & (fine_status == 0)
    assert accepted.sum() > 0.95 * (status == 0).sum()
    h = np.asarray(dt)
    grounded = (np.asarray(coarse.on_ground) > 0) | (np.asarray(fine.on_ground) > 0) | (np.asarray(state.on_ground) > 0)
    free, contact = accepted & ~grounded, accepted & grounded
    scale = {k: np.maximum(a, b) for (k, a), b in zip(_increments(params, state, command, h).items(),
                                                      _increments(params, coarse, command, h).values())}
    worst = {}
    for name, s in scale.items():
        a, b = (np.asarray(getattr(x, name)).reshape(n, -1) for x in (coarse, fine))
        rounding = 64 * np.finfo(np.float64).eps * np.abs(b).max(axis=1)  # the reference's 16 steps
        ratio = np.linalg.norm(a - b, axis=1) / (0.03 * s + rounding + 1e-300)
        worst[name] = float(ratio[free].max())
    assert max(worst.values()) <= 1.0, worst
    rotors = np.abs(np.asarray(coarse.rotor_speeds) - np.asarray(fine.rotor_speeds)).max(axis=1)
    assert np.all(rotors[accepted] <= 1e-9 * np.asarray(params.omega_max)[accepted])
    moved = np.linalg.norm(np.asarray(coarse.position) - np.asarray(fine.position), axis=1)
    assert np.all(moved[contact] <= scale["position"][contact] * 1.5 + 1e-9), contact.sum()
