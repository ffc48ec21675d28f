"""Native CPU kernel for the open-loop RK4 rollout, behind ``jax.ffi``.

The engine (:func:`quadjax.simulate`) uses it on the CPU backend (``backend="auto"``) for the
library's RK4 stepper with 4, 6 or 8 rotors, float32 or float64, and no ``reduce``;
everything else, every other backend and every derivative (``jax.grad``, ``jvp``)
take the XLA path, whose numbers it matches to rounding (tests/test_native.py).

Why a second implementation: XLA's CPU backend compiles one RK4 step into ~150
single-output loop fusions that each recompute the shared subexpressions they need,
~9× the machine's limit (GUIDE §3, benchmarks/README.md). The kernel
(``rollout.cc``) keeps one vehicle's whole step in vector registers, vehicles in SIMD
lanes, runs the whole horizon in one call and spreads vehicles over XLA's intra-op
thread pool.

The kernel is compiled on first use with the system C++ compiler (``$CXX``, else
``c++``; ``-O3 -march=native``) against jaxlib's FFI headers and cached per user in
:func:`cache_dir` (``$QUADJAX_CACHE_DIR``, default ``~/.cache/quadjax``) under a hash of the
source, the compiler, the flags and the jaxlib version, with its sha256 beside it. Loading a
library runs its code, so a cached one is loaded only if :func:`trust_problem` finds nothing
wrong (private folder and file, digest equal); otherwise it is rebuilt once. A cache folder
that is not private or not writable is not used: the kernel is built in a fresh private
temporary folder instead, with a warning. Without a compiler, or with ``QUADJAX_NATIVE=0``,
:func:`available` is False and everything runs on XLA (a warning, once).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.files import write_atomic
from quadjax.params import QuadParams
from quadjax.state import QuadState

SOURCE = Path(__file__).with_name("rollout.cc")
ROTOR_COUNTS = (4, 6, 8)
DTYPES = ("float32", "float64")
# -ffp-contract=off: no FMA contraction, so SIMD and scalar lanes compute the same bits and a
# vehicle's result never depends on its batch, block or shard (tested); FMA gave no measurable speed
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fopenmp-simd",
         "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-w")

# scalar parameter fields in the kernel's order (rollout.cc, enum Param); vectors flattened
_FIXED = ("mass", "inertia", "k_f", "k_m", "motor_tau", "omega_min", "omega_max", "drag_linear",
          "drag_quadratic", "drag_rotational", "rotor_inertia", "k_p", "battery_capacity",
          "battery_sag", "ground_z", "gravity", "wind")


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")


def kernel_filename(cxx: str | None = None) -> str:
    """The cached library's file name: a hash of everything its bytes depend on (source,
    compiler and its version, flags, jax, machine)."""
    cxx = cxx or _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++, clang++)")
    done = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{cxx} --version failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    key = hashlib.sha256(
        SOURCE.read_bytes() + done.stdout.encode() + " ".join(FLAGS).encode()
        + jax.__version__.encode() + platform.machine().encode() + platform.node().encode()
    ).hexdigest()[:16]
    return f"quadjax_native_{key}.so"


def cache_dir() -> Path:
    """The per-user kernel cache: ``$QUADJAX_CACHE_DIR``, else ``~/.cache/quadjax``.

    Never a shared folder: a library found there would run its code in this process
    (a predictable name in ``/tmp`` is an invitation to plant one)."""
    return Path(os.environ.get("QUADJAX_CACHE_DIR") or Path.home() / ".cache" / "quadjax")


def _digest_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _private(path: Path, kind: str) -> str | None:
    """Why ``path`` is not ours alone (None when it is): it must be a real ``kind`` ("file"
    or "folder", not a link), owned by this user, and not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"{path}: {err.strerror}"
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        return f"{path}: not a regular {kind}"
    if st.st_uid != os.geteuid():
        return f"{path}: owned by uid {st.st_uid}, not this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trust_problem(lib: Path) -> str | None:
    """Why the cached library ``lib`` must not be loaded (None when it may be).

    Loading runs the library's code, so it must be ours: its folder and it are private
    (:func:`_private`), and its sha256 equals the digest recorded beside it when it was built
    (a truncated or overwritten file fails here, before ``dlopen`` could crash on it)."""
    for path, kind in ((lib.parent, "folder"), (lib, "file"), (_digest_path(lib), "file")):
        why = _private(path, kind)
        if why:
            return why
    recorded = _digest_path(lib).read_text().strip()
    if _sha256(lib) != recorded:
        return f"{lib}: sha256 differs from the digest recorded at build time (damaged or replaced)"
    return None


def _usable_cache() -> tuple[Path, str | None]:
    """The cache folder (created 0700 if absent), or a fresh private temp folder and the
    reason the cache could not be used."""
    folder = cache_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = _private(folder, "folder") or (None if os.access(folder, os.W_OK) else f"{folder}: not writable")
    except OSError as err:
        why = f"{folder}: {err.strerror or err}"
    if why is None:
        return folder, None
    # mkdtemp: a new folder with mode 0700 and an unpredictable name, used by this process only
    private = tempfile.mkdtemp(prefix="quadjax-native-")
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    return Path(private), (f"cache folder not used ({why}); built in the private folder {private} for this "
                           f"process only; set QUADJAX_CACHE_DIR to a folder of your own to keep the kernel")


def _compile(cxx: str, lib: Path) -> Path:
    """Compile into a private temporary folder, then write the library and its digest into the
    cache atomically (:func:`quadjax.files.write_atomic`): a concurrent process (pytest -n) or
    a crash never leaves half a library under ``lib``; the digest goes first, so a library
    without its own digest is never trusted."""
    with tempfile.TemporaryDirectory(prefix="quadjax-build-") as build:
        out = Path(build) / lib.name
        cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", str(out), str(SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        data = out.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    write_atomic(_digest_path(lib), lambda f: f.write((digest + "\n").encode()), mode=0o600)
    return write_atomic(lib, lambda f: f.write(data), mode=0o700)


def _register(lib: Path) -> None:
    handle = ctypes.CDLL(str(lib))
    for name in _target_names():
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handle, name)), platform="cpu")


def _build_and_register(notes: list) -> None:
    """Load the cached kernel if it is trusted, else (re)build it, at most once. What the
    user should hear about the cache (not used, not trusted, rebuilt) goes into ``notes``."""
    cxx = _compiler()
    name = kernel_filename(cxx)
    folder, note = _usable_cache()
    notes += [note] if note else []
    lib = folder / name
    if os.path.lexists(lib):
        why = trust_problem(lib)
        if why is None:
            try:
                return _register(lib)
            except (OSError, AttributeError) as err:  # ours but unloadable (e.g. another libc)
                why = f"{lib} did not load ({err})"
        notes.append(f"not loading the cached kernel: {why}; rebuilding it")
    _register(_compile(cxx, lib))


@functools.lru_cache(maxsize=1)
def _load() -> str | None:
    """Build, load and register the kernels; the reason they are unavailable, or None."""
    if os.environ.get("QUADJAX_NATIVE", "1") == "0":
        return "disabled by QUADJAX_NATIVE=0"
    notes: list = []
    try:
        _build_and_register(notes)
    except Exception as e:  # noqa: BLE001 — any failure means: use XLA, and say why once
        warnings.warn(f"quadjax: native CPU kernel unavailable, using XLA ({'; '.join(notes + [str(e)])})",
                      RuntimeWarning, stacklevel=3)
        return str(e)
    if notes:
        warnings.warn(f"quadjax: native kernel cache: {'; '.join(notes)}", RuntimeWarning, stacklevel=3)
    return None


def _target_names():
    return [_target(np.dtype(d), r) for d in DTYPES for r in ROTOR_COUNTS]


def _target(dtype, rotors: int) -> str:
    return f"quadjax_rollout_{'f32' if dtype == np.float32 else 'f64'}_r{rotors}"


def available() -> bool:
    """True when the native kernel is built and registered (builds it on first call)."""
    return _load() is None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    return _load()


def supports(rotors: int, dtype) -> bool:
    """True when the kernel covers this rotor count and dtype (it may still be unavailable)."""
    return rotors in ROTOR_COUNTS and np.dtype(dtype).name in DTYPES


# --------------------------------------------------------------------------- packing


def pack_params(params: QuadParams, dt) -> jax.Array:
    """(NP,) kernel parameter row: the fields of ``_FIXED`` flattened, rotors (x, y, spin), dt."""
    fixed = [jnp.ravel(getattr(params, f)) for f in _FIXED]
    rotors = jnp.stack([params.rotor_positions[:, 0], params.rotor_positions[:, 1], params.rotor_spins], -1)
    return jnp.concatenate(fixed + [jnp.ravel(rotors), jnp.ravel(dt)])


def pack_state(state: QuadState) -> jax.Array:
    """(..., 15 + R) kernel state rows (leading axes kept)."""
    return jnp.concatenate([state.position, state.velocity, state.attitude, state.body_rates,
                            state.rotor_speeds, state.energy[..., None], state.on_ground[..., None]], axis=-1)


def unpack_state(x: jax.Array, rotors: int) -> QuadState:
    """Inverse of :func:`pack_state` on the last axis."""
    r = 13 + rotors
    return QuadState(position=x[..., 0:3], velocity=x[..., 3:6], attitude=x[..., 6:10],
                     body_rates=x[..., 10:13], rotor_speeds=x[..., 13:r], energy=x[..., r],
                     on_ground=x[..., r + 1])


# --------------------------------------------------------------------------- the call


def rollout(params: QuadParams, x0, commands, dt, wind, wrench, *, substeps: int, save_every: int):
    """One vehicle's RK4 rollout in the kernel on a packed state ``x0`` (:func:`pack_state`);
    batch with ``jax.vmap``.

    Inputs already checked and cast to one dtype by the engine. Returns the packed
    ``(final, saved)`` (``saved`` None for ``save_every=0``). Not differentiable by itself:
    the engine supplies the derivative.
    """
    if _load() is not None:
        raise RuntimeError(f"quadjax native kernel unavailable: {_load()}")
    dtype = commands.dtype
    T, R = commands.shape
    S = 15 + R
    slots = T // save_every if save_every else 0
    call = jax.ffi.ffi_call(
        _target(dtype, R),
        (jax.ShapeDtypeStruct((S,), dtype), jax.ShapeDtypeStruct((slots, S), dtype)),
        vmap_method="expand_dims",
    )
    dummy = jnp.zeros((1,), dtype)
    final, saved = call(
        pack_params(params, dt), x0, commands,
        dummy if wind is None else wind, dummy if wrench is None else wrench,
        substeps=np.int64(substeps), save_every=np.int64(save_every),
        has_wind=wind is not None, has_wrench=wrench is not None,
    )
    return final, (saved if save_every else None)
