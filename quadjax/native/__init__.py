"""Native CPU kernel for the open-loop RK4 rollout, generated from the JAX model, behind ``jax.ffi``.

The engine (:func:`quadjax.simulate`) uses it on the CPU backend (``backend="auto"``) for the
library's RK4 stepper with 4, 6 or 8 rotors, float32 or float64, and no ``reduce``;
everything else, every other backend and every derivative (``jax.grad``, ``jvp``)
take the XLA path, whose numbers it matches to rounding (tests/test_native.py).

Why native code: XLA's CPU backend compiles one RK4 step into ~150 single-output loop fusions
that each recompute the shared subexpressions they need (GUIDE §3, benchmarks/README.md).

One statement of the physics: the kernel's step is *generated* from the same JAX function
the XLA path runs (:func:`kernel_step`, i.e. ``quadjax.integrators.rk4_step_c``) by
:func:`quadjax.native.generate.generate_kernel`, as straight-line C++ over GCC vector types
(one vehicle per SIMD lane, what depends on the parameters alone hoisted out of the time
loop). ``rollout.cc`` is only the harness: batch broadcasting, blocks, command staging,
substeps, saving, threads and the FFI binding. The parameter and state layouts are the
dataclasses' fields in order (:class:`quadjax.native.generate.Layout`); nothing restates them.

The kernel for a dtype is generated and compiled on its first use with the system C++
compiler (``$CXX``, else ``c++``; ``-O3 -march=native``) against jaxlib's FFI headers and cached
per user in :func:`cache_dir` (``$QUADJAX_CACHE_DIR``, default ``~/.cache/quadjax``) under a hash
of the generated source, the compiler, the flags and the jaxlib version, with its sha256 beside
it. Loading a library runs its code, so a cached one is loaded only if :func:`trust_problem`
finds nothing wrong (private folder and file, digest equal); otherwise it is rebuilt once. A
cache folder that is not private or not writable is not used: the kernel is built in a fresh
private temporary folder instead, with a warning. Without a compiler, or with
``QUADJAX_NATIVE=0``, :func:`available` is False and everything runs on XLA (a warning, once).
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

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._components import join_state, split, split_params, split_state
from quadjax.files import write_atomic
from quadjax.integrators import rk4_step_c
from quadjax.native.generate import _VECTOR_PRELUDE, Layout, generate_kernel
from quadjax.params import QuadParams
from quadjax.state import QuadState

HARNESS = Path(__file__).with_name("rollout.cc")
ROTOR_COUNTS = (4, 6, 8)
DTYPES = ("float32", "float64")
VECTOR_BYTES = 32  # one AVX2 register per vector: wider types spill (measured: W = 16 floats is 5x slower)
# -ffp-contract=fast: multiply-adds fused (12 % less CPU time per vehicle-step, measured); the kernel
# then rounds differently from XLA's un-fused operations (agreement to ~1e-13 in float64, tested),
# but every vehicle still runs the same instructions in every lane, block, batch size and shard, so
# its result never depends on them (tested bit for bit)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
         "-ffp-contract=fast", "-w")


def kernel_step(params_h, state: QuadState, command, wind, wrench) -> QuadState:
    """The step the kernel runs, for one vehicle: ``rk4_step_c`` with this tick's ``wind``
    (3,) in place of ``params.wind`` and the body ``wrench`` (6,) — exactly what the engine's
    XLA path runs per substep (``quadjax.engine``). ``params_h`` = (params, h)."""
    params, h = params_h
    P = split_params(params).replace(wind=split(wind))
    external = (split(wrench[:3]), split(wrench[3:]))
    return join_state(rk4_step_c(P, split_state(state), split(command), h, external))


def _example(rotors: int, dtype) -> dict:
    """Abstract (ShapeDtypeStruct) arguments of :func:`kernel_step` for ``rotors`` and ``dtype``."""
    def leaf(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)

    shapes = {"inertia": (3, 3), "rotor_positions": (rotors, 3), "rotor_spins": (rotors,), "drag_linear": (3,),
              "drag_quadratic": (3,), "drag_rotational": (3,), "wind": (3,)}
    params = QuadParams(**{f.name: leaf(*shapes.get(f.name, ())) for f in dataclasses.fields(QuadParams)})
    state = QuadState(position=leaf(3), velocity=leaf(3), attitude=leaf(4), body_rates=leaf(3),
                      rotor_speeds=leaf(rotors), energy=leaf(), on_ground=leaf())
    return {"P": (params, leaf()), "S": state, "U": leaf(rotors), "Wd": leaf(3), "E": leaf(6)}


def _struct(dtype, rotors: int) -> str:
    return f"qj_{'f32' if np.dtype(dtype) == np.float32 else 'f64'}_r{rotors}"


@functools.lru_cache(maxsize=None)
def source(dtype: str, rotors: int) -> str:
    """The kernel's whole C++ source for ``dtype`` and ``rotors``: the step generated from
    :func:`kernel_step`, then the harness, then its FFI target."""
    dtype = np.dtype(dtype)
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        raise RuntimeError("the float64 kernel is generated from a float64 trace: enable jax_enable_x64")
    step = generate_kernel(kernel_step, _example(rotors, dtype), carry="S", invariant=("P",),
                           namespace=_struct(dtype, rotors), lanes=VECTOR_BYTES // dtype.itemsize)
    return "\n".join([_VECTOR_PRELUDE, step.source, HARNESS.read_text(),
                      f"QUADJAX_ROLLOUT({_target(dtype, rotors)}, {_struct(dtype, rotors)});",
                      f"QUADJAX_STEP({_target(dtype, rotors, 'step')}, {_struct(dtype, rotors)});\n"])


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")


def kernel_filename(dtype: str = "float32", rotors: int = 4, cxx: str | None = None) -> str:
    """The cached library's file name for ``dtype`` and ``rotors``: a hash of everything its bytes depend on
    (the generated source, compiler and its version, flags, jax, machine)."""
    cxx = cxx or _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++, clang++)")
    done = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{cxx} --version failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    key = hashlib.sha256(
        source(np.dtype(dtype).name, rotors).encode() + done.stdout.encode() + " ".join(FLAGS).encode()
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


def _compile(cxx: str, lib: Path, text: str) -> Path:
    """Compile into a private temporary folder, then write the library and its digest into the
    cache atomically (:func:`quadjax.files.write_atomic`): a concurrent process (pytest -n) or
    a crash never leaves half a library under ``lib``; the digest goes first, so a library
    without its own digest is never trusted."""
    with tempfile.TemporaryDirectory(prefix="quadjax-build-") as build:
        out, cc = Path(build) / lib.name, Path(build) / "quadjax_native.cc"
        cc.write_text(text)
        cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", str(out), str(cc)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        data = out.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    write_atomic(_digest_path(lib), lambda f: f.write((digest + "\n").encode()), mode=0o600)
    return write_atomic(lib, lambda f: f.write(data), mode=0o700)


def _register(lib: Path, dtype, rotors: int) -> None:
    handle = ctypes.CDLL(str(lib))
    for name in (_target(dtype, rotors), _target(dtype, rotors, "step")):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handle, name)), platform="cpu")


def _build_and_register(dtype, rotors: int, notes: list) -> None:
    """Load the cached kernel if it is trusted, else (re)build it, at most once. What the
    user should hear about the cache (not used, not trusted, rebuilt) goes into ``notes``."""
    cxx = _compiler()
    name = kernel_filename(dtype, rotors, cxx)
    folder, note = _usable_cache()
    notes += [note] if note else []
    lib = folder / name
    if os.path.lexists(lib):
        why = trust_problem(lib)
        if why is None:
            try:
                return _register(lib, dtype, rotors)
            except (OSError, AttributeError) as err:  # ours but unloadable (e.g. another libc)
                why = f"{lib} did not load ({err})"
        notes.append(f"not loading the cached kernel: {why}; rebuilding it")
    _register(_compile(cxx, lib, source(dtype, rotors)), dtype, rotors)


@functools.lru_cache(maxsize=None)
def _load(dtype: str = "float32", rotors: int = 4) -> str | None:
    """Generate, build, load and register the kernel for ``dtype`` and ``rotors``; why it is
    unavailable, or None."""
    if os.environ.get("QUADJAX_NATIVE", "1") == "0":
        return "disabled by QUADJAX_NATIVE=0"
    if not supports(rotors, dtype):
        return f"no kernel for {rotors} rotors in {dtype} (only {ROTOR_COUNTS} rotors in {DTYPES})"
    notes: list = []
    try:
        _build_and_register(dtype, rotors, notes)
    except Exception as e:  # noqa: BLE001 — any failure means: use XLA, and say why once
        warnings.warn(f"quadjax: native CPU kernel unavailable, using XLA ({'; '.join(notes + [str(e)])})",
                      RuntimeWarning, stacklevel=3)
        return str(e)
    if notes:
        warnings.warn(f"quadjax: native kernel cache: {'; '.join(notes)}", RuntimeWarning, stacklevel=3)
    return None


def _target(dtype, rotors: int, kind: str = "rollout") -> str:
    return f"quadjax_{kind}_{'f32' if np.dtype(dtype) == np.float32 else 'f64'}_r{rotors}"


def available(dtype="float32", rotors: int = 4) -> bool:
    """True when the kernel for ``dtype`` and ``rotors`` is built and registered (generates and
    builds it on the first call)."""
    return _load(np.dtype(dtype).name, rotors) is None


def unavailable_reason(dtype="float32", rotors: int = 4) -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    return _load(np.dtype(dtype).name, rotors)


def supports(rotors: int, dtype) -> bool:
    """True when the kernel covers this rotor count and dtype (it may still be unavailable)."""
    return rotors in ROTOR_COUNTS and np.dtype(dtype).name in DTYPES


# --------------------------------------------------------------------------- packing


def pack_params(params: QuadParams, h) -> jax.Array:
    """(N_P,) kernel parameter row: the QuadParams leaves in field order, raveled, then the step h
    (the :class:`~quadjax.native.generate.Layout` of ``(params, h)``)."""
    return jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves((params, h))])


def pack_state(state: QuadState) -> jax.Array:
    """(..., 15 + R) kernel state rows: the QuadState leaves in field order (leading axes kept)."""
    leaves = jax.tree_util.tree_leaves(state)
    batch = jnp.shape(state.energy)
    return jnp.concatenate([jnp.reshape(x, batch + (-1,)) for x in leaves], axis=-1)


def unpack_state(x: jax.Array, rotors: int) -> QuadState:
    """Inverse of :func:`pack_state` on the last axis."""
    layout = Layout.of(_example(rotors, x.dtype)["S"])
    leaves = [jnp.reshape(x[..., k:k + int(np.prod(shape))], x.shape[:-1] + shape)
              for _, shape, k in layout.entries]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(_example(rotors, x.dtype)["S"]), leaves)


# --------------------------------------------------------------------------- the call


def rollout(params: QuadParams, x0, commands, dt, wind, wrench, *, substeps: int, save_every: int):
    """One vehicle's RK4 rollout in the kernel on a packed state ``x0`` (:func:`pack_state`);
    batch with ``jax.vmap``.

    Inputs already checked and cast to one dtype by the engine; ``wind`` (T, 3) / ``wrench``
    (T, 6) or None (``params.wind``, no wrench). Returns the packed ``(final, saved)``
    (``saved`` None for ``save_every=0``). Not differentiable by itself: the engine supplies
    the derivative.
    """
    dtype = commands.dtype
    T, R = commands.shape
    if not available(dtype, R):
        raise RuntimeError(f"quadjax native kernel unavailable: {unavailable_reason(dtype, R)}")
    S = x0.shape[-1]
    call = _ffi(dtype, R, (), S, T // save_every if save_every else 0)
    h = dt / substeps  # as the XLA path divides: the same bits
    wind = params.wind[None] if wind is None else wind  # a series of length 1 is held
    wrench = jnp.zeros((1, 6), dtype) if wrench is None else wrench
    final, saved = call(pack_params(params, h), x0, commands, wind, wrench,
                        substeps=np.int64(substeps), save_every=np.int64(save_every))
    return final, (saved if save_every else None)


# --------------------------------------------------------------------------- rk4_step on the kernel


def kernel_rk4_step(params: QuadParams, state: QuadState, command, dt, *, fallback):
    """The library's ``rk4_step`` in the kernel where it applies (the CPU backend, 4, 6 or 8
    rotors, params, state and command of one float dtype, the kernel available), else
    ``fallback`` (the XLA form of the same step) itself.

    The two are one function: the kernel is generated from the model the fallback runs, and a
    trace holds both (``lax.platform_dependent``: the kernel on the CPU, the fallback on other
    platforms; the code generator reads the fallback). Leading batch dimensions broadcast as
    in ``fallback``; under ``jax.vmap`` the whole batch is one kernel call, so a user's own
    ``lax.scan`` over ``jax.vmap(rk4_step)`` runs at the kernel's speed. Derivatives (jvp,
    grad, jacfwd, under vmap and checkpoint) are the fallback's.
    """
    command = jnp.asarray(command)
    dtype = jnp.result_type(state.energy)
    leaves = jax.tree_util.tree_leaves((params, state)) + [command]
    R = command.shape[-1] if command.ndim else 0
    applies = (jax.default_backend() == "cpu" and supports(R, dtype) and params.rotor_spins.shape[-1] == R
               and all(jnp.result_type(x) == dtype for x in leaves)
               and (not hasattr(dt, "dtype") or jnp.result_type(dt) == dtype) and available(dtype, R))
    if not applies:
        return fallback(params, state, command, dt)
    dt = jnp.asarray(dt, dtype)
    return jax.lax.platform_dependent(params, state, command, dt, cpu=functools.partial(_kernel_step, fallback),
                                      default=fallback)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _kernel_step(fallback, params, state, command, dt):
    R = command.shape[-1]
    example = _example(R, command.dtype)

    def batch_of(tree, like):  # the leading dims beyond each leaf's own shape, broadcast over the leaves
        return jnp.broadcast_shapes(*[jnp.shape(x)[:jnp.ndim(x) - len(e.shape)]
                                      for x, e in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(like))])

    p_batch = jnp.broadcast_shapes(batch_of(params, example["P"][0]), dt.shape)
    batch = jnp.broadcast_shapes(p_batch, batch_of(state, example["S"]), command.shape[:-1])

    def rows(x, b, width):  # (..b, width), left-padded with 1s to the rank of the batch
        x = jnp.reshape(x, b + (width,))
        return jnp.reshape(x, (1,) * (len(batch) - len(b)) + x.shape)

    def leaf_rows(x, e):  # a state leaf as (..., width) rows of its own batch (no copy: a reshape)
        b = jnp.shape(x)[:jnp.ndim(x) - len(e.shape)]
        return rows(x, b, math.prod(e.shape))

    flat = [jnp.reshape(jnp.broadcast_to(x, p_batch + e.shape), p_batch + (-1,))
            for x, e in zip(jax.tree_util.tree_leaves((params, dt)), jax.tree_util.tree_leaves(example["P"]))]
    P = rows(jnp.concatenate(flat, axis=-1), p_batch, Layout.of(example["P"]).size)
    leaves = [leaf_rows(x, e) for x, e in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(example["S"]))]
    u = leaf_rows(command, example["U"])[..., None, :]
    wind = leaf_rows(params.wind, example["Wd"])[..., None, :]
    wrench = jnp.zeros((1,) * len(batch) + (1, 6), command.dtype)
    widths = [math.prod(e.shape) for e in jax.tree_util.tree_leaves(example["S"])]
    call = jax.ffi.ffi_call(_target(command.dtype, R, "step"),
                            [jax.ShapeDtypeStruct(batch + (w,), command.dtype) for w in widths],
                            vmap_method="expand_dims")
    out = call(P, *leaves, u, wind, wrench)
    shaped = [jnp.reshape(x, batch + e.shape) for x, e in zip(out, jax.tree_util.tree_leaves(example["S"]))]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(example["S"]), shaped)


@_kernel_step.defjvp
def _kernel_step_jvp(fallback, primals, tangents):
    return jax.jvp(fallback, primals, tangents)


def _ffi(dtype, rotors: int, batch: tuple, width: int, slots: int):
    """The kernel's FFI call for ``batch`` vehicles: (final, saved) rows."""
    return jax.ffi.ffi_call(
        _target(dtype, rotors),
        (jax.ShapeDtypeStruct(batch + (width,), dtype), jax.ShapeDtypeStruct(batch + (slots, width), dtype)),
        vmap_method="expand_dims",
    )
