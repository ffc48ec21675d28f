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
``c++``; ``-O3 -march=native``) against jaxlib's FFI headers and cached in
``$QUADJAX_CACHE_DIR`` (default ``~/.cache/quadjax``, else the temp dir) under a hash of the source,
the compiler, the flags and the jaxlib version. Without a compiler, or with
``QUADJAX_NATIVE=0``, :func:`available` is False and everything runs on XLA.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

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


def _cache_dirs() -> list[Path]:
    """Where the built kernel may live: $QUADJAX_CACHE_DIR or ~/.cache/quadjax, then the temp dir."""
    first = Path(os.environ.get("QUADJAX_CACHE_DIR") or Path.home() / ".cache" / "quadjax")
    return [first, Path(tempfile.gettempdir()) / "quadjax"]


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")


def _build() -> Path:
    """Compile rollout.cc (once per source, compiler, flags and jaxlib) and return the library."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++, clang++)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(
        SOURCE.read_bytes() + version.encode() + " ".join(FLAGS).encode()
        + jax.__version__.encode() + platform.machine().encode() + platform.node().encode()
    ).hexdigest()[:16]
    name = f"quadjax_native_{key}.so"
    for folder in _cache_dirs():
        if (folder / name).exists():
            return folder / name
    errors = []
    for folder in _cache_dirs():  # a read-only home falls back to the temp dir
        try:
            return _compile(cxx, folder / name)
        except OSError as e:
            errors.append(f"{folder}: {e}")
    raise RuntimeError("cannot write the kernel: " + "; ".join(errors))


def _compile(cxx: str, lib: Path) -> Path:
    lib.parent.mkdir(parents=True, exist_ok=True)
    # build beside the target and rename: concurrent processes (pytest -n) never see half a file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    try:
        cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", tmp, str(SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


@functools.lru_cache(maxsize=1)
def _load() -> str | None:
    """Build, load and register the kernels; the reason they are unavailable, or None."""
    if os.environ.get("QUADJAX_NATIVE", "1") == "0":
        return "disabled by QUADJAX_NATIVE=0"
    try:
        lib = ctypes.CDLL(str(_build()))
        for name in _target_names():
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    except Exception as e:  # noqa: BLE001 — any failure means: use XLA, and say why once
        warnings.warn(f"quadjax: native CPU kernel unavailable, using XLA ({e})", RuntimeWarning, stacklevel=3)
        return str(e)
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
