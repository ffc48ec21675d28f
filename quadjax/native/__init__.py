"""Native CPU kernel for the open-loop RK4 rollout, generated from the JAX model, behind ``jax.ffi``.

The engine (:func:`quadjax.simulate`) uses it on the CPU backend (``backend="auto"``) for the
library's RK4 stepper with 4, 6 or 8 rotors, float32 or float64, and no ``reduce``, and
``quadjax.rk4_step`` runs in it on the CPU; everything else and every other backend take the
XLA path, whose numbers it matches to rounding (tests/test_native.py). Its first derivatives
are native too: ``jax.jvp`` runs a generated tangent kernel, ``jax.grad`` a generated reverse
sweep (the transpose of the tangent, over the states its forward pass kept, :data:`TRAIL_BYTES`,
or recomputed from the checkpoints it kept), each one call for the whole horizon
(:data:`rollout_p`, tests/test_native_derivatives.py); second derivatives are XLA's. A run that
saves its states gets them from the kernel leaf by leaf (:func:`rollout_states`), as the
engine's QuadState holds them, not as packed rows to split afterwards.

Why native code: XLA's CPU backend compiles one RK4 step into ~150 single-output loop fusions
that each recompute the shared subexpressions they need (GUIDE §3, benchmarks/README.md).

One statement of the physics: the kernel's step is *generated* from the same JAX function
the XLA path runs (:func:`kernel_step`, i.e. ``quadjax.integrators.rk4_step_c``) by
:func:`quadjax.native.generate.generate_kernel`, as straight-line C++ over GCC vector types
(one vehicle per SIMD lane, what depends on the parameters alone hoisted out of the time
loop). ``rollout.cc`` is only the harness: batch broadcasting, blocks, command staging,
substeps, saving, threads and the FFI binding. The parameter and state layouts are the
dataclasses' fields in order (:class:`quadjax.native.generate.Layout`); nothing restates them.
The forward library holds the step twice, over a full vector and over half of one: a batch that
fits in half a vector runs the narrow copy, whose divisions and square roots wait about half as
long (N = 1: 134 against 190 ns per step on an AVX-512 host). The generator places every fused
multiply-add and the compiler contracts none (:data:`FLAGS`), so both copies round alike and a
vehicle's bits never depend on its batch (tests/test_native.py).

The tangent and adjoint steps are generated the same way, from ``jax.jvp`` and ``jax.vjp`` of
that function (:func:`tangent_step`, :func:`adjoint_step`), into a second library built on the
first derivative (so a user who never differentiates never compiles it). Each comes twice: with
the parameters' derivatives (system identification) and with the parameters fixed
(:func:`tangent_step_fixed`, :func:`adjoint_step_fixed`: MPC, iLQR, sensitivities to the state or
the commands), which a parameters' tangent that is a symbolic zero selects. Their divisions are
products by shared reciprocals (``generate_kernel``'s ``reciprocals``): they agree with XLA's
derivatives to rounding, not bit for bit. A ``vmap`` over tangents with the primals unmapped
(``jax.jacfwd``, iLQR's linearisation) with the parameters fixed pushes :data:`TANGENTS` tangents
through one step of a third library (kind "tangents", built on first use): the primal once per
vehicle, not once per tangent; each tangent gets the bits the one-tangent kernel gives it. With the
parameters differentiated, each tangent runs the one-tangent kernel (:func:`_joint_batched`).

The kernel for a dtype is generated and compiled on its first use with the system C++
compiler (``$CXX``, else ``c++``; ``-O3 -march=native``) against jaxlib's FFI headers and cached
per user in :func:`cache_dir` (``$QUADJAX_CACHE_DIR``, default ``~/.cache/quadjax``) under a hash
of the generated source, the compiler, the flags and the jaxlib version, with its sha256 beside
it. Loading a library runs its code, so a cached one is loaded only if :func:`trust_problem`
finds nothing wrong (private folder and file, digest equal); otherwise it is rebuilt once. Each
use marks a cached library or source used, and :func:`prune_cache` (``quadjax cache --prune``)
removes those unused for a while (an upgrade or an edit leaves the old ones behind); building a
new library removes those unused for :data:`AUTO_PRUNE_DAYS`. A
cache folder that is not private or not writable is not used: the kernel is built in a fresh
private temporary folder instead, with a warning. Without a compiler, or with
``QUADJAX_NATIVE=0``, :func:`available` is False and everything runs on XLA (a warning, once).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import dataclasses
import math

import jax
import jax.extend.core
import jaxlib
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.interpreters import ad, batching, mlir
from jax.interpreters import partial_eval as pe

from quadjax._components import gated_tangents, join_state, split, split_params, split_state
from quadjax.files import exclusive_lock, is_temporary, write_atomic
from quadjax.integrators import rk4_step_c
from quadjax.native.generate import VECTOR_PRELUDE, Layout, generate_kernel
from quadjax.params import QuadParams
from quadjax.state import QuadState

HARNESS = Path(__file__).with_name("rollout.cc")
LOOP_HARNESS = Path(__file__).with_name("loop.cc")  # the closed loop's (quadjax.native.loop)
ROTOR_COUNTS = (4, 6, 8)
DTYPES = ("float32", "float64")
#: tangents one call of the multi-tangent kernel pushes (source kind "tangents", the parameters
#: fixed): a vmap over m tangents (``jax.jacfwd``) runs ceil(m / TANGENTS) of them, one primal each.
#: The k-tangent step is one primal and k tangents of generated code (k = 4: 12 761 lines, against
#: 4 × 4 883 for four one-tangent steps), and its compile time grows with k.
TANGENTS = 4


def _vector_bytes() -> int:
    """One SIMD register per vector (W vehicles in its lanes): 64 bytes where the CPU has AVX-512F
    (-march=native then targets it; float32 rollouts 15-25 % and the default sweep 15-20 % faster
    than with 32 on an AMD EPYC with AVX-512, measured 2026-12-04), else 32 (AVX2; there a vector
    wider than a register spills: W = 16 floats was 5x slower)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 32
    return 64 if platform.machine() == "x86_64" and " avx512f" in flags else 32


VECTOR_BYTES = _vector_bytes()
# -ffp-contract=off: the generator writes every fused multiply-add itself (generate.py, _VectorEmitter.fuse:
# a product whose every use is a sum is fused into them), so the step rounds the same at every vector width
# and the rollout may run a half-width copy for small batches (rollout.cc's Narrow; GCC's own contraction
# fused 486 products at one width and 482 at the other). Fused: the same speed as GCC's contraction
# (one-core rollout 14.2 ns, grad and jvp unchanged, benchmarks/README.md 2026-12-05, tenth session), 12 %
# less CPU time than none. The kernel rounds differently from XLA's un-fused operations (agreement to
# ~1e-13 in float64, tested), but every vehicle runs the same instructions in every lane, block, batch
# size and shard, so its result never depends on them (tested bit for bit)
# -mprefer-vector-width=512 where the vectors are 64 bytes: GCC otherwise (its tuning for these CPUs)
# vectorises a lane-wise helper (fabs, sqrt, ...) in 256-bit halves, stores both halves and loads the
# whole vector back, which cannot be forwarded from two stores: a stall at every such call. With it, the
# rollout took 14.7-15.3 against 19.5 ns CPU per vehicle-step on one core, grad 56 against 70 ns wall
# (benchmarks/README.md, 2026-12-05). It changes no lane's arithmetic.
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
         "-ffp-contract=off", "-w") + (("-mprefer-vector-width=512",) if VECTOR_BYTES == 64 else ())
#: the jax.monitoring duration event of each C++ compile of a generated kernel, in seconds (a cache
#: hit records none): register_event_duration_secs_listener sees it beside JAX's compile events
BUILD_EVENT = "/quadjax/native/build_duration"


def kernel_step(params_h, state: QuadState, command, wind, wrench) -> QuadState:
    """The step the kernel runs, for one vehicle: ``rk4_step_c`` with this tick's ``wind``
    (3,) in place of ``params.wind`` and the body ``wrench`` (6,) — exactly what the engine's
    XLA path runs per substep (``quadjax.engine``). ``params_h`` = (params, h)."""
    params, h = params_h
    P = split_params(params).replace(wind=split(wind))
    external = (split(wrench[:3]), split(wrench[3:]))
    return join_state(rk4_step_c(P, split_state(state), split(command), h, external))


def tangent_step(P, S, U, Wd, E):
    """The tangent kernel's step: each input is a tuple (primal, tangent 1, ..., tangent k) and so
    is the result, ``jax.jvp`` of :func:`kernel_step` once per tangent (forward mode through the same
    statement of the physics; an effect's tangents gated as its values are where the parameters are
    not differentiated: :func:`quadjax._components.gated_tangents`). The k traces share their
    primal, which the generator's value numbering emits once: a step pushing k tangents costs one
    primal and k tangents' arithmetic."""
    with gated_tangents():
        return _pushed(kernel_step, (P, S, U, Wd, E))


def tangent_step_fixed(P, S, U, Wd, E):
    """:func:`tangent_step` with the parameters held fixed: ``P`` a primal alone, its tangent zero.
    What ``jax.jvp`` and ``jax.grad`` with respect to anything but the parameters run (MPC, iLQR,
    state sensitivities): the parameters' derivative terms gone, the step ~25 % shorter."""
    with gated_tangents():
        return _pushed(functools.partial(kernel_step, P), (S, U, Wd, E))


def _pushed(fn, args) -> tuple:
    """(fn's primal, its tangent along each tangent of ``args``), each arg (primal, t1, ..., tk)."""
    primals = tuple(a[0] for a in args)
    outs = [jax.jvp(fn, primals, tuple(a[j] for a in args)) for j in range(1, len(args[0]))]
    return (outs[0][0], *(t for _, t in outs))


def _swept(step, X, held, C):
    """``C`` = cotangents (state, *held) after ``step(X, *held)``; returns them before it: the
    state's from ``jax.vjp``, the held inputs' accumulated (they are held over substeps and ticks)."""
    ct_state, *acc = C
    with gated_tangents():  # an effect switched off costs the adjoint a test where the parameters are fixed
        g_state, *g_held = jax.vjp(step, X, *held)[1](ct_state)
    return (g_state, *jax.tree_util.tree_map(jnp.add, acc, g_held))


def adjoint_step(P, X, U, Wd, E, C):
    """The adjoint kernel's step: ``C`` = cotangents (state, params_h, command, wind, wrench) after
    the step of :func:`kernel_step` from state ``X``; returns them before it (:func:`_swept`)."""
    return _swept(lambda X, P, U, Wd, E: kernel_step(P, X, U, Wd, E), X, (P, U, Wd, E), C)


def adjoint_step_fixed(P, X, U, Wd, E, C):
    """:func:`adjoint_step` with the parameters held fixed: ``C`` = cotangents (state, command,
    wind, wrench), no parameters' cotangent (a third of the adjoint step's work, measured)."""
    return _swept(lambda X, U, Wd, E: kernel_step(P, X, U, Wd, E), X, (U, Wd, E), C)


@functools.lru_cache(maxsize=None)
def step_example(rotors: int, dtype) -> dict:
    """Abstract (ShapeDtypeStruct) arguments of :func:`kernel_step` for ``rotors`` and ``dtype``
    (cached: every trace of rk4_step on the kernel asks for it; read-only)."""
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


def _traced_dtype(dtype) -> np.dtype:
    """``dtype`` as numpy's: a float64 kernel is generated from a float64 trace, which needs x64."""
    dtype = np.dtype(dtype)
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        raise RuntimeError("the float64 kernel is generated from a float64 trace: enable jax_enable_x64")
    return dtype


@functools.lru_cache(maxsize=None)
def source(dtype: str, rotors: int, kind: str = "forward") -> str:
    """The C++ source of the ``kind`` library for ``dtype`` and ``rotors`` (:func:`generate_source`),
    read from the kernel cache when it holds the source generated from the same trace.

    Generating the derivative libraries takes 3-4 s per dtype (tracing ``jax.jvp`` and ``jax.vjp``
    of the step, then writing their C++), which every fresh process paid before it could even look
    for the library it had built before. The cached source's key (:func:`source_key`) is what the
    source is a function of: the step's jaxpr as traced now (so a model changed in a file or patched
    in the process is a new key), quadjax's own code (the generator, the derivative rules), jax and
    jaxlib, and the options."""
    dtype = _traced_dtype(dtype)
    traced = _step_jaxpr(dtype, rotors)
    # the derivative kernels are jax.jvp and jax.vjp of this step, and the model's one custom rule
    # (_components._gate) is the JVP of its branch, which the jaxpr holds: the step's jaxpr is the key
    key = source_key(traced, dtype.name, rotors, kind, VECTOR_BYTES, TANGENTS)
    return cached_source(key, lambda: generate_source(dtype, rotors, kind))


@functools.lru_cache(maxsize=None)
def _step_jaxpr(dtype: np.dtype, rotors: int):
    """:func:`kernel_step` traced for ``dtype`` and ``rotors``: once per process, not once per kind."""
    ex = step_example(rotors, dtype)
    return jax.make_jaxpr(kernel_step)(ex["P"], ex["S"], ex["U"], ex["Wd"], ex["E"])


def source_key(jaxpr, *options) -> str:
    """A key of generated C++: sha256 of the ClosedJaxpr ``jaxpr`` it is generated from (its text
    and its constants' bytes), quadjax's own code (:func:`_code_fingerprint`: the generator, the
    harnesses, any derivative rule), jax, jaxlib and the generator's ``options``."""
    h = hashlib.sha256(_code_fingerprint().encode())
    for part in (str(jaxpr), jax.__version__, jaxlib.__version__, *map(str, options)):
        h.update(part.encode() + b"\0")
    for c in jaxpr.consts:
        c = np.asarray(c)
        h.update(f"{c.dtype}{c.shape}".encode() + c.tobytes())
    return h.hexdigest()[:24]


def cached_source(key: str, generate) -> str:
    """The C++ text that ``generate()`` returns for ``key`` (:func:`source_key`), kept in the kernel
    cache: a fresh process reads it instead of tracing and generating it again."""
    path = _usable_cache()[0] / f"{SOURCE_PREFIX}{key}.cc"
    text = _read_trusted(path)
    if text is not None:
        _mark_used(path)
    else:
        with _turn(path, []):  # processes starting together (pytest -n) generate it once
            text = _read_trusted(path)
            if text is None:
                text = generate()
                try:
                    _write_with_digest(path, text.encode(), mode=0o600)
                except OSError:  # a cache that cannot keep it (full, read-only) costs the next process time
                    pass
    return text


@functools.lru_cache(maxsize=None)
def _code_fingerprint() -> str:
    """sha256 of quadjax's own source files (.py, .cc): any edit to the package is a new key."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".cc") and path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _read_trusted(path: Path) -> str | None:
    """The text of the cached ``path`` when it may be used (:func:`trust_problem`), else None
    (absent, damaged, not ours, or removed while being read by a prune: generated again and
    rewritten). Read once: the bytes checked are the bytes returned."""
    try:
        data, why = _trusted_bytes(path)
        return None if why else data.decode()
    except (OSError, UnicodeDecodeError):
        return None


def _write_with_digest(path: Path, data: bytes, mode: int) -> Path:
    """``data`` to ``path`` and its sha256 beside it, each atomically; the digest first, so a file
    without its own digest is never trusted."""
    digest = hashlib.sha256(data).hexdigest()
    write_atomic(_digest_path(path), lambda f: f.write((digest + "\n").encode()), mode=0o600)
    return write_atomic(path, lambda f: f.write(data), mode=mode)


def generate_source(dtype: str, rotors: int, kind: str = "forward") -> str:
    """The C++ source of one kernel library for ``dtype`` and ``rotors``: the generated step(s),
    then the harness, then the FFI targets. ``kind`` "forward": the rollout and the step entry
    points; "derivatives": the tangent rollout (:func:`tangent_step` in the rollout harness, every
    row primal then tangent) and the reverse sweep (:func:`adjoint_step`), each also with the
    parameters fixed (:func:`tangent_step_fixed`, :func:`adjoint_step_fixed`); "tangents": the
    tangent rollout pushing :data:`TANGENTS` tangents at once (rows primal then each tangent), the
    parameters fixed (what ``jax.jacfwd`` and a ``vmap`` over tangents run)."""
    dtype = _traced_dtype(dtype)
    name, lanes, ex = _struct(dtype, rotors), VECTOR_BYTES // dtype.itemsize, step_example(rotors, dtype)
    step = generate_kernel(kernel_step, ex, carry="S", invariant=("P",), namespace=name, lanes=lanes)
    if kind == "forward":
        # the step also over half the lanes, for batches that fit in it (rollout.cc's Narrow)
        narrow = generate_kernel(kernel_step, ex, carry="S", invariant=("P",), namespace=f"{name}_n", lanes=lanes // 2)
        parts = [step.source, narrow.source, HARNESS.read_text(), f"QUADJAX_NARROW({name}, {name}_n)",
                 f"QUADJAX_ROLLOUT({_target(dtype, rotors)}, {name});",
                 f"QUADJAX_ROLLOUT_LEAVES({_target(dtype, rotors, 'leaves')}, {name});",
                 f"QUADJAX_STEP({_target(dtype, rotors, 'step')}, {name});\n"]
    elif kind == "tangents":
        # the parameters fixed only: pushed with theirs, k tangents cost more than k one-tangent
        # steps (_joint_batched)
        tuples = {k: (v,) * (TANGENTS + 1) if k != "P" else v for k, v in ex.items()}
        struct = generate_kernel(tangent_step_fixed, tuples, carry="S", invariant=("P",), namespace=f"{name}_m_fixed",
                                 lanes=lanes, reciprocals=True).source
        parts = [struct, HARNESS.read_text(),
                 f"QUADJAX_ROLLOUT_TANGENT({_target(dtype, rotors, 'tangents_fixed')}, {name}_m_fixed);\n"]
    else:
        # each derivative twice: with the parameters' derivatives and with the parameters fixed; a
        # division in them is a product by a shared reciprocal (generate_kernel's reciprocals)
        structs, targets = [step.source], []
        inputs = {"P": ex["P"], "X": ex["S"], "U": ex["U"], "Wd": ex["Wd"], "E": ex["E"]}
        for suffix, tangent, adjoint, with_params in (("", tangent_step, adjoint_step, True),
                                                      ("_fixed", tangent_step_fixed, adjoint_step_fixed, False)):
            pairs = {k: (v, v) if with_params or k != "P" else v for k, v in ex.items()}
            held = [v for k, v in inputs.items() if k != "X" and (with_params or k != "P")]
            structs += [generate_kernel(tangent, pairs, carry="S", invariant=("P",), namespace=f"{name}_t{suffix}",
                                        lanes=lanes, reciprocals=True).source,
                        generate_kernel(adjoint, dict(inputs, C=(ex["S"], *held)), carry="C", invariant=("P",),
                                        namespace=f"{name}_a{suffix}", lanes=lanes, reciprocals=True).source]
            targets += [f"QUADJAX_ROLLOUT_TANGENT({_target(dtype, rotors, 'tangent' + suffix)}, {name}_t{suffix});",
                        f"QUADJAX_ADJOINT({_target(dtype, rotors, 'adjoint' + suffix)}, {name}, {name}_a{suffix});"]
        # jax.grad's forward pass, keeping the trail the sweep reads (the same blocks and lanes)
        targets.append(f"QUADJAX_TRAIL({_target(dtype, rotors, 'trail')}, {name}, {name}_a_fixed);")
        parts = [*structs, HARNESS.read_text(), "\n".join(targets) + "\n"]
    return "\n".join([VECTOR_PRELUDE, *parts])


def compiler() -> str | None:
    """The C++ compiler the kernels are built with ($CXX, c++, g++ or clang++), or None."""
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")


def kernel_filename(dtype: str = "float32", rotors: int = 4, cxx: str | None = None, kind: str = "forward") -> str:
    """The cached library's file name for ``dtype``, ``rotors`` and ``kind``: a hash of everything its
    bytes depend on (the generated source, compiler and its version, flags, jax, machine)."""
    return library_filename(source(np.dtype(dtype).name, rotors, kind), cxx)


def library_filename(text: str, cxx: str | None = None) -> str:
    """The cached file name of the library compiled from the C++ ``text``: a hash of it, the
    compiler and its version, the flags, jax and the machine."""
    cxx = cxx or compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found ($CXX, c++, g++, clang++)")
    done = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{cxx} --version failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    key = hashlib.sha256(
        text.encode() + done.stdout.encode() + " ".join(FLAGS).encode()
        + jax.__version__.encode() + platform.machine().encode() + platform.node().encode()
    ).hexdigest()[:16]
    return f"{LIBRARY_PREFIX}{key}.so"


#: the names of the cache's entries: compiled libraries and kept generated sources, each with its
#: ``.sha256`` and ``.lock`` beside it (:func:`cache_entries`)
LIBRARY_PREFIX, SOURCE_PREFIX = "quadjax_native_", "quadjax_source_"


def cache_dir() -> Path:
    """The per-user kernel cache: ``$QUADJAX_CACHE_DIR``, else ``~/.cache/quadjax``.

    Never a shared folder: a library found there would run its code in this process
    (a predictable name in ``/tmp`` is an invitation to plant one)."""
    return Path(os.environ.get("QUADJAX_CACHE_DIR") or Path.home() / ".cache" / "quadjax")


def _digest_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def _lock_path(entry: Path) -> Path:
    """The build lock of a cache entry (:func:`_turn`), which loading, building and pruning take."""
    return entry.with_name(entry.name + ".lock")


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
    """Why the cached library ``lib`` must not be loaded (None when it may be); the same rule for a
    kept source (:func:`cached_source`), whose code is compiled into a library.

    Loading runs the library's code, so it must be ours: its folder and it are private
    (:func:`_private`), and its sha256 equals the digest recorded beside it when it was built
    (a truncated or overwritten file fails here, before ``dlopen`` could crash on it)."""
    return _trusted_bytes(lib)[1]


def _trusted_bytes(lib: Path) -> tuple[bytes | None, str | None]:
    """(the bytes of ``lib``, None) when :func:`trust_problem` finds nothing wrong, else (None, why)."""
    for path, kind in ((lib.parent, "folder"), (lib, "file"), (_digest_path(lib), "file")):
        why = _private(path, kind)
        if why:
            return None, why
    recorded = _digest_path(lib).read_text().strip()
    data = lib.read_bytes()
    if hashlib.sha256(data).hexdigest() != recorded:
        return None, f"{lib}: sha256 differs from the digest recorded at build time (damaged or replaced)"
    return data, None


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
    private = _fallback_folder(str(folder))
    return private, (f"cache folder not used ({why}); built in the private folder {private} for this "
                     f"process only; set QUADJAX_CACHE_DIR to a folder of your own to keep the kernel")


@functools.lru_cache(maxsize=None)
def _fallback_folder(cache: str) -> Path:
    """This process's stand-in for the unusable cache folder ``cache``: one per process and folder
    (a new one per call left a folder per library and kept source), removed when the process ends."""
    # mkdtemp: a new folder with mode 0700 and an unpredictable name, used by this process only
    private = tempfile.mkdtemp(prefix="quadjax-native-")
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    return Path(private)


def _compile(cxx: str, lib: Path, text: str) -> Path:
    """Compile into a private temporary folder, then write the library and its digest into the
    cache atomically (:func:`quadjax.files.write_atomic`): a concurrent process (pytest -n) or
    a crash never leaves half a library under ``lib``; the digest goes first, so a library
    without its own digest is never trusted."""
    with tempfile.TemporaryDirectory(prefix="quadjax-build-") as build:
        out, cc = Path(build) / lib.name, Path(build) / "quadjax_native.cc"
        cc.write_text(text)
        cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", "-o", str(out), str(cc)]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        # beside JAX's own compile events, so one listener sees where first-call time goes
        jax.monitoring.record_event_duration_secs(BUILD_EVENT, time.perf_counter() - start)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        data = out.read_bytes()
    return _write_with_digest(lib, data, mode=0o700)


_TARGETS = {"forward": ("rollout", "leaves", "step"),
            "derivatives": ("tangent", "adjoint", "tangent_fixed", "adjoint_fixed", "trail"),
            "tangents": ("tangents_fixed",)}


def _register(lib: Path, targets) -> None:
    handle = ctypes.CDLL(str(lib))
    for name in targets:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handle, name)), platform="cpu")


#: how long a process waits for another that is building the same library before building it too [s]
BUILD_WAIT_S = 600.0


def build_library(text: str, targets, notes: list) -> None:
    """Compile the C++ ``text`` (or load it from the cache if it is trusted, else rebuild it) and
    register its FFI ``targets`` on the CPU. What the user should hear about the cache (not used,
    not trusted, rebuilt, waited for too long) goes into ``notes``; a failure raises.

    Processes that need the same library at once (pytest -n, a sweep's or a cluster job's processes
    on one host) take turns on ``<library>.lock`` beside it: one compiles, the others wait and load
    what it wrote, instead of each compiling the same 5-20 s of g++ on the same cores."""
    cxx = compiler()
    name = library_filename(text, cxx)
    folder, note = _usable_cache()
    notes += [note] if note else []
    lib = folder / name
    with _turn(lib, notes):
        _load_or_build(cxx, lib, text, targets, notes)


@contextlib.contextmanager
def _turn(path: Path, notes: list):
    """This process's turn at making ``path``: an exclusive lock on ``<path>.lock`` for the block,
    so that processes needing it at once make it once (the others then find it made). A holder
    stuck past :data:`BUILD_WAIT_S`, or a lock file that cannot be made (a full disk), is worked
    around, with a note: the writes are atomic."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(_lock_path(path), BUILD_WAIT_S))
        except OSError as err:  # TimeoutError is one
            notes.append(f"{err}; making it in this process as well")
        yield


def _load_or_build(cxx: str, lib: Path, text: str, targets, notes: list) -> None:
    if os.path.lexists(lib):
        why = trust_problem(lib)
        if why is None:
            try:
                _register(lib, targets)
                return _mark_used(lib)
            except (OSError, AttributeError) as err:  # ours but unloadable (e.g. another libc)
                why = f"{lib} did not load ({err})"
        notes.append(f"not loading the cached kernel: {why}; rebuilding it")
    _register(_compile(cxx, lib, text), targets)
    # a new library is what an upgrade or an edit brings: the moment to drop what has long gone unused
    with contextlib.suppress(OSError, ValueError):
        prune_cache(unused_days=AUTO_PRUNE_DAYS, folder=lib.parent)


# --------------------------------------------------------------------------- the cache's upkeep
#
# Every library and kept source is keyed by what it is made from, so an upgrade of quadjax, jax or
# the compiler, or any edit of quadjax's code, leaves the old ones behind: nothing ever reads them
# again, and a developer's cache gathered hundreds. Each use refreshes an entry's modification time
# (:func:`_mark_used`), so the entries not used for a while are the ones to remove (:func:`prune_cache`,
# ``quadjax cache --prune``).


def _mark_used(path: Path) -> None:
    """Record a use of the cache entry ``path`` (its modification time, which :func:`prune_cache`
    reads as its last use; the digest is of its bytes, so this changes no trust). A cache that
    cannot record it (read-only) only loses that entry's place in the order."""
    with contextlib.suppress(OSError):
        os.utime(path)


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """A library or kept source in the kernel cache: ``path`` (the ``.so`` or ``.cc``), ``kind``
    ("library" or "source"), ``bytes`` (with its digest) and ``last_used`` (seconds since the epoch)."""
    path: Path
    kind: str
    bytes: int
    last_used: float


def cache_entries(folder: Path | None = None) -> list[CacheEntry]:
    """The kernel cache's entries in ``folder`` (default :func:`cache_dir`), least recently used
    first. Only quadjax's own names count: another tool's files, and the SITL's ``sitl/``, are not
    entries."""
    folder = cache_dir() if folder is None else Path(folder)
    entries = []
    for prefix, suffix, kind in ((LIBRARY_PREFIX, ".so", "library"), (SOURCE_PREFIX, ".cc", "source")):
        for path in folder.glob(f"{prefix}*{suffix}"):
            with contextlib.suppress(OSError):  # removed meanwhile by another process
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    digest = _digest_path(path)
                    size = st.st_size + (digest.stat().st_size if digest.exists() else 0)
                    entries.append(CacheEntry(path, kind, size, st.st_mtime))
    return sorted(entries, key=lambda e: (e.last_used, e.path.name))


#: entries unused this long are removed whenever a library is built anew (:func:`build_library`) [days]
AUTO_PRUNE_DAYS = 90.0
#: a temporary of :func:`quadjax.files.write_atomic` this old is a killed writer's, not a live one's [s]
STALE_TEMPORARY_S = 3600.0


def prune_cache(*, unused_days: float | None = None, max_bytes: int | None = None, folder: Path | None = None,
                dry_run: bool = False) -> list[CacheEntry]:
    """Remove the kernel cache's entries not used for ``unused_days``, then the least recently used
    until the rest hold at most ``max_bytes``; also what is left of interrupted work (a digest or a
    lock without its entry, a killed writer's temporary). Returns the entries removed (with
    ``dry_run``, those it would remove, touching nothing).

    Safe beside running processes: an entry is removed only under its build lock (the one a process
    holds while it loads or builds the library, :func:`build_library`), and an entry whose lock is
    held, or that was used after the listing, is kept. A kept source is read without the lock; a
    reader that loses it to a removal generates it again. The folder must be the user's own
    (:func:`cache_dir`'s rule): in any other, nothing is removed and ``ValueError`` says why."""
    folder = cache_dir() if folder is None else Path(folder)
    why = _private(folder, "folder")
    if why:
        raise ValueError(f"quadjax cache: not pruning {folder}: {why}")
    now = time.time()
    entries = cache_entries(folder)
    cutoff = None if unused_days is None else now - unused_days * 86400.0
    total, removed = sum(e.bytes for e in entries), []
    for e in entries:  # least recently used first; one that cannot go now is passed over
        due = (cutoff is not None and e.last_used < cutoff) or (max_bytes is not None and total > max_bytes)
        if due and (dry_run or _remove_under_lock(e.path, functools.partial(_unused_since_listed, e))):
            removed.append(e)
            total -= e.bytes
    if not dry_run:
        _remove_leftovers(folder, now)
    return removed


def _unused_since_listed(entry: CacheEntry) -> bool:
    return os.lstat(entry.path).st_mtime <= entry.last_used


def _remove_under_lock(entry: Path, doomed) -> bool:
    """The cache ``entry`` with its digest and lock removed under its lock if ``doomed()`` still holds
    there; False when another process holds the lock (it is loading or building the entry) or
    ``doomed()`` no longer holds. The entry goes first: a digest left by an interruption is a
    leftover, never a trusted file."""
    lock = _lock_path(entry)
    try:
        with exclusive_lock(lock, 0.0):
            if not doomed():
                return False
            for path in (entry, _digest_path(entry), lock):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    except OSError:  # held (TimeoutError), or gone already
        return False
    return True


def _remove_leftovers(folder: Path, now: float) -> None:
    """In the cache ``folder``: a digest or lock whose entry is gone, removed under that lock (a
    builder holds it while it writes the digest and then the library), and a temporary of a writer
    killed more than :data:`STALE_TEMPORARY_S` ago."""
    for path in folder.iterdir():
        name = path.name.lstrip(".")
        if not name.startswith((LIBRARY_PREFIX, SOURCE_PREFIX)):
            continue
        with contextlib.suppress(OSError):  # removed meanwhile
            if is_temporary(path):
                if now - os.lstat(path).st_mtime > STALE_TEMPORARY_S:
                    os.unlink(path)
            elif path.suffix in (".sha256", ".lock") and not os.path.lexists(entry := path.with_suffix("")):
                _remove_under_lock(entry, lambda entry=entry: not os.path.lexists(entry))


@functools.lru_cache(maxsize=None)
def _load(dtype: str = "float32", rotors: int = 4, kind: str = "forward") -> str | None:
    """Generate, build, load and register the ``kind`` library for ``dtype`` and ``rotors``; why
    it is unavailable, or None."""
    if os.environ.get("QUADJAX_NATIVE", "1") == "0":
        return "disabled by QUADJAX_NATIVE=0"
    if not supports(rotors, dtype):
        return f"no kernel for {rotors} rotors in {dtype} (only {ROTOR_COUNTS} rotors in {DTYPES})"
    what = "native CPU kernel" if kind == "forward" else "native derivative kernels"
    try:
        text = source(dtype, rotors, kind)
    except Exception as e:  # noqa: BLE001 — a kernel that cannot be generated: use XLA, and say why once
        warnings.warn(f"quadjax: {what} unavailable, using XLA ({e})", RuntimeWarning, stacklevel=2)
        return str(e)
    return load_library(text, tuple(_target(dtype, rotors, t) for t in _TARGETS[kind]), what)


@functools.lru_cache(maxsize=None)
def load_library(text: str, targets: tuple, what: str) -> str | None:
    """Build (or load from the cache), load and register the library of the C++ ``text`` with its
    FFI ``targets``, at most once per process; why it is unavailable (a warning, once, saying
    ``what`` falls back to XLA), or None."""
    if os.environ.get("QUADJAX_NATIVE", "1") == "0":
        return "disabled by QUADJAX_NATIVE=0"
    notes: list = []
    try:
        build_library(text, list(targets), notes)
    except Exception as e:  # noqa: BLE001 — any failure means: use XLA, and say why once
        warnings.warn(f"quadjax: {what} unavailable, using XLA ({'; '.join(notes + [str(e)])})",
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


def _unpack(x: jax.Array, like):
    """The pytree ``like`` (of ShapeDtypeStructs) read from rows ``x`` in its :class:`Layout`
    on the last axis (leading axes kept)."""
    leaves = [jnp.reshape(x[..., k:k + math.prod(shape)], x.shape[:-1] + shape) for _, shape, k in Layout.of(like).entries]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


def unpack_state(x: jax.Array, rotors: int) -> QuadState:
    """Inverse of :func:`pack_state` on the last axis."""
    return _unpack(x, step_example(rotors, np.dtype(x.dtype))["S"])


# --------------------------------------------------------------------------- the call


def rollout(params: QuadParams, x0, commands, dt, wind, wrench, *, substeps: int, save_every: int, segment: int = 0):
    """One vehicle's RK4 rollout in the kernel on a packed state ``x0`` (:func:`pack_state`);
    batch with ``jax.vmap``.

    Inputs already checked and cast to one dtype by the engine; ``wind`` (T, 3) / ``wrench``
    (T, 6) or None (``params.wind``, no wrench). Returns the packed ``(final, saved)``
    (``saved`` None for ``save_every=0``). Differentiable in every input (``jax.jvp``,
    ``jax.grad``, under ``jax.vmap``, any order): the first derivatives run in the native
    tangent and adjoint kernels (:data:`rollout_p`), higher ones on XLA. ``segment``: ticks
    per segment that the reverse sweep recomputes from a checkpoint that the forward pass kept
    (0: none recomputed while the whole trail fits :data:`TRAIL_BYTES`, else as many ticks as fill
    :data:`TRAIL_VECTORS`).
    """
    P, wind, wrench = _rows(params, commands, dt, substeps, wind, wrench)
    final, saved = rollout_p.bind(P, x0, commands, wind, wrench, substeps=int(substeps), save_every=int(save_every),
                                  rotors=int(commands.shape[-1]), segment=int(segment))
    return final, (saved if save_every else None)


def _rows(params, commands, dt, substeps, wind, wrench):
    """The primitives' params row and wind and wrench series (a series of length 1 is held),
    after checking that a kernel runs these commands' rotor count and dtype."""
    dtype, R = commands.dtype, commands.shape[-1]
    if on_gpu():
        if not supports(R, dtype):
            raise RuntimeError(f"quadjax GPU kernel: it covers {ROTOR_COUNTS} rotors in {DTYPES}")
    elif not available(dtype, R):
        raise RuntimeError(f"quadjax native kernel unavailable: {unavailable_reason(dtype, R)}")
    wind = params.wind[None] if wind is None else wind
    wrench = jnp.zeros((1, 6), dtype) if wrench is None else wrench
    return pack_params(params, dt / substeps), wind, wrench  # h as the XLA path divides: the same bits


def rollout_states(params: QuadParams, x0, commands, dt, wind, wrench, *, substeps: int, save_every: int,
                   segment: int = 0):
    """:func:`rollout` with the saved states (``save_every`` > 0) as a :class:`QuadState`, which
    the CPU kernel writes leaf by leaf (:data:`rollout_leaves_p`), not as packed rows to be split
    afterwards (a copy of every saved value, the larger part of a call that saves every step).
    Differentiable as :func:`rollout` is (its tangent and adjoint kernels)."""
    if on_gpu() or save_every <= 0:
        final, saved = rollout(params, x0, commands, dt, wind, wrench, substeps=substeps, save_every=save_every,
                               segment=segment)
        return final, (None if saved is None else unpack_state(saved, commands.shape[-1]))
    P, wind, wrench = _rows(params, commands, dt, substeps, wind, wrench)
    return _saving(P, x0, commands, wind, wrench, int(substeps), int(save_every), int(commands.shape[-1]), int(segment))


@functools.partial(jax.custom_jvp, nondiff_argnums=(5, 6, 7, 8))
def _saving(P, x0, U, Wd, E, substeps, save_every, rotors, segment):
    """(final row, saved QuadState): the leaves kernel forward; its derivatives rollout_p's
    (packed rows, unpacked), so every mode and order works as there."""
    final, *leaves = rollout_leaves_p.bind(P, x0, U, Wd, E, substeps=substeps, save_every=save_every, rotors=rotors)
    like = step_example(rotors, np.dtype(U.dtype))["S"]
    return final, jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


@functools.partial(_saving.defjvp, symbolic_zeros=True)
def _saving_jvp(substeps, save_every, rotors, segment, primals, tangents):
    def unpacked(*args):
        final, saved = rollout_p.bind(*args, substeps=substeps, save_every=save_every, rotors=rotors, segment=segment)
        return final, unpack_state(saved, rotors)

    # parameters not differentiated stay a constant of the jvp, so rollout_p's rule sees their zero
    # tangent and runs the kernels without their terms; another zero tangent becomes an array
    if _zero(tangents[0]):
        return jax.jvp(functools.partial(unpacked, primals[0]), tuple(primals[1:]), _arrays(tangents[1:]))
    return jax.jvp(unpacked, tuple(primals), _arrays(tangents))


def _zero(tangent) -> bool:
    """A custom_jvp rule's tangent (with symbolic_zeros) is zero in every leaf."""
    return all(isinstance(t, SymbolicZero) for t in jax.tree_util.tree_leaves(tangent))


def _arrays(tangents) -> tuple:
    """A custom_jvp rule's tangents with every symbolic zero made an array."""
    return tuple(jax.tree_util.tree_map(lambda t: jnp.zeros(t.shape, t.dtype) if isinstance(t, SymbolicZero) else t, x)
                 for x in tangents)


# --------------------------------------------------------------------------- derivatives
#
# The rollout is three primitives over packed rows (params (N_P,), state (N_S,), commands (T, R),
# wind (Tw, 3), wrench (Tr, 6), each with the same number of leading batch dims, 1 or the batch's):
#
#   rollout_p  (P, x0, U, Wd, E)                 -> (final, saved)       the forward kernel
#   tangent_p  (P, x0, U, Wd, E, dP, dx0, ...)   -> (dfinal, dsaved)     linear in the tangents
#   adjoint_p  (P, x0, U, Wd, E, ct_final, ct_saved[, trail]) -> cotangents of (P, x0, U, Wd, E)
#   trail_p    (P, x0, U, Wd, E)                 -> (final, saved, trail) the forward, keeping states
#
# rollout_p's JVP is tangent_p; tangent_p's transpose is adjoint_p: so jax.jvp runs the tangent
# kernel and jax.grad the reverse sweep, each one call for the whole horizon. Linearised (jax.grad),
# the primal is trail_p's, and what it kept (the whole trail, or the checkpoints beyond TRAIL_BYTES)
# goes through tangent_p (a last argument, unread there) to the sweep, which then runs no forward
# pass of its own beyond recomputing segments. Second derivatives
# (the JVPs of tangent_p and adjoint_p) are those of the same rollout on XLA (:func:`_xla`).
# Without the derivative library (no compiler) the first derivatives are XLA's too.

_CORE = (1, 1, 2, 2, 2)  # the ranks of one vehicle's P, x0, U, Wd, E


def _batch(args, core) -> tuple:
    """The batch shape of primitive arguments with the given core ranks (leading dims 1 or equal)."""
    dims = [a.shape[:len(a.shape) - c] for a, c in zip(args, core)]
    if len({len(d) for d in dims}) != 1:
        raise ValueError(f"quadjax native: arguments with different batch ranks {dims}")
    return tuple(jnp.broadcast_shapes(*dims))


def _sizes(x0, U, save_every):
    return x0.shape[-1], U.shape[-2], (U.shape[-2] // save_every if save_every else 0)


def _forward_ffi(P, x0, U, Wd, E, *, substeps, save_every, rotors, segment=0):
    batch, (NS, _, slots) = _batch((P, x0, U, Wd, E), _CORE), _sizes(x0, U, save_every)
    call = jax.ffi.ffi_call(_target(U.dtype, rotors), (jax.ShapeDtypeStruct(batch + (NS,), U.dtype),
                                                       jax.ShapeDtypeStruct(batch + (slots, NS), U.dtype)))
    return call(P, x0, U, Wd, E, substeps=np.int64(substeps), save_every=np.int64(save_every))


def _leaves_ffi(P, x0, U, Wd, E, *, substeps, save_every, rotors, leaves=None):
    """The forward kernel with its saved states as the state's leaves (..., slots, *leaf shape); a
    leaf that ``leaves`` (a bool per leaf; None: all) leaves out has no slots and is not saved
    (nothing reads it: :func:`_unsaved`)."""
    batch, (NS, _, slots) = _batch((P, x0, U, Wd, E), _CORE), _sizes(x0, U, save_every)
    like = jax.tree_util.tree_leaves(step_example(rotors, np.dtype(U.dtype))["S"])
    outs = [jax.ShapeDtypeStruct(batch + (NS,), U.dtype)] + [
        jax.ShapeDtypeStruct(batch + (slots if keep else 0,) + x.shape, U.dtype)
        for x, keep in zip(like, leaves or (True,) * len(like))]
    return jax.ffi.ffi_call(_target(U.dtype, rotors, "leaves"), outs)(
        P, x0, U, Wd, E, substeps=np.int64(substeps), save_every=np.int64(save_every))


def _joint_ffi(P, x0, U, Wd, E, dP, dx0, dU, dWd, dE, *, substeps, save_every, rotors, segment=0, params_fixed=False,
               pushed=1):
    """The tangent kernel runs the rollout harness on rows [primal | tangent] (:func:`tangent_step`):
    (final, saved, dfinal, dsaved), the primal and the tangent of one call. ``params_fixed``: ``dP``
    is zero, and the kernel that leaves it out runs (:func:`tangent_step_fixed`). ``pushed``: the
    number of tangents, 1 or :data:`TANGENTS` (the parameters fixed); each tangent argument and
    result holds them side by side on its last axis (:func:`_packed`), and the multi-tangent kernel
    runs. The commands and their tangents go in as they are, and the kernel pairs them as it stages
    them: concatenated here, they were a copy of every command and tangent per call (the largest
    inputs: (..., T, R) each)."""
    if pushed > 1 and not params_fixed:
        raise ValueError("quadjax native: the multi-tangent kernel is built with the parameters fixed only")
    primals, tangents = (P, x0, U, Wd, E), (dP, dx0, dU, dWd, dE)
    batch, (NS, _, slots) = _batch(primals + tangents, _CORE * 2), _sizes(x0, U, save_every)

    def pair(x, dx, c):  # one batch shape for both, then side by side on the last axis
        b = jnp.broadcast_shapes(x.shape[:x.ndim - c], dx.shape[:dx.ndim - c])
        return jnp.concatenate([jnp.broadcast_to(x, b + x.shape[x.ndim - c:]),
                                jnp.broadcast_to(dx, b + dx.shape[dx.ndim - c:])], axis=-1)

    rows = [P if params_fixed else pair(P, dP, 1), pair(x0, dx0, 1), U, dU, pair(Wd, dWd, 2), pair(E, dE, 2)]
    kind = ("tangent" if pushed == 1 else "tangents") + ("_fixed" if params_fixed else "")
    width = (1 + pushed) * NS
    call = jax.ffi.ffi_call(_target(U.dtype, rotors, kind), (jax.ShapeDtypeStruct(batch + (width,), U.dtype),
                                                             jax.ShapeDtypeStruct(batch + (slots, width), U.dtype)))
    final, saved = call(*rows, substeps=np.int64(substeps), save_every=np.int64(save_every))
    return final[..., :NS], saved[..., :NS], final[..., NS:], saved[..., NS:]


def _tangent_ffi(*args, trail=False, **params):
    """The tangent part of :func:`_joint_ffi` (``trail``: a last argument, the forward pass's trail
    for the transpose, :func:`_tangent_transpose`; not read here)."""
    return _joint_ffi(*args[:10], **params)[2:]


def _adjoint_ffi(P, x0, U, Wd, E, ct_final, ct_saved, *held, substeps, save_every, rotors, segment, params_fixed=False,
                 trail=False):
    """The reverse sweep: cotangents of (P, x0, U, Wd, E), one row per vehicle of the batch;
    ``params_fixed``: none for P (width 0), from the adjoint without it (:func:`adjoint_step_fixed`).
    ``trail``: ``held`` is what the forward pass kept (:data:`trail_p`), the whole trail or the
    checkpoints; the sweep reads it where it covers this very batch (not under a ``vmap`` over
    cotangents alone, say), else runs a forward pass of its own."""
    batch = _batch((P, x0, U, Wd, E, ct_final, ct_saved), _CORE + (1, 2))
    NS, T, _ = _sizes(x0, U, save_every)
    L = _segment(segment, T, substeps, NS)
    widths = _kept_widths(T, substeps, NS, L)
    kept = held[0] if trail and held[0].shape[:-1] == batch and held[0].shape[-1] in widths else jnp.zeros((0,), U.dtype)
    out = [jax.ShapeDtypeStruct(batch + x.shape[x.ndim - c:], U.dtype) for x, c in zip((P, x0, U, Wd, E), _CORE)]
    if params_fixed:
        out[0] = jax.ShapeDtypeStruct(batch + (0,), U.dtype)
    call = jax.ffi.ffi_call(_target(U.dtype, rotors, "adjoint_fixed" if params_fixed else "adjoint"), out)
    return call(P, x0, U, Wd, E, ct_final, ct_saved, kept, substeps=np.int64(substeps),
                save_every=np.int64(save_every), segment=np.int64(L))


#: The most bytes of states that jax.grad's forward pass keeps for its reverse sweep: the state
#: before every substep of every vehicle, T · substeps · N_S values each. Within it the sweep reads
#: them and runs no forward pass of its own; beyond it the forward keeps the checkpoints (the state
#: at each segment's start) and the sweep recomputes each segment from its own.
TRAIL_BYTES = 64 << 20
#: The reverse sweep's recomputed trail per thread, in vectors of the kernel's width (2 MiB of AVX2
#: vectors, 4 MiB of AVX-512 ones): the ticks per segment where the caller gives none.
TRAIL_VECTORS = 1 << 16


def _kept_widths(T: int, substeps: int, NS: int, L: int) -> tuple:
    """What jax.grad's forward pass may keep per vehicle: (the whole trail, the checkpoints of
    segments of ``L`` ticks)."""
    return T * substeps * NS, -(-T // L) * NS


def _segment(segment: int, T: int, substeps: int, NS: int) -> int:
    """Ticks per segment of the reverse sweep: ``segment``, or as many as :data:`TRAIL_VECTORS`
    holds; within [1, T]."""
    return max(1, min(T, segment if segment > 0 else TRAIL_VECTORS // (substeps * NS)))


def _trail_ffi(P, x0, U, Wd, E, *, substeps, save_every, rotors, segment=0):
    """rollout_p's (final, saved) and what the reverse sweep reads: the whole trail of states
    (``segment`` 0 and within :data:`TRAIL_BYTES`), else the checkpoints at its segments' starts.
    What it keeps does not depend on ``save_every``, so that saving nothing (the saved states unused:
    :func:`_unsaved`) changes no other result's shape."""
    batch, (NS, T, slots) = _batch((P, x0, U, Wd, E), _CORE), _sizes(x0, U, save_every)
    L = _segment(segment, T, substeps, NS)
    whole, checkpoints = _kept_widths(T, substeps, NS, L)
    within = segment == 0 and math.prod(batch) * whole * np.dtype(U.dtype).itemsize <= TRAIL_BYTES
    width = whole if within else checkpoints
    call = jax.ffi.ffi_call(_target(U.dtype, rotors, "trail"), [jax.ShapeDtypeStruct(batch + shape, U.dtype)
                                                                for shape in ((NS,), (slots, NS), (width,))])
    return tuple(call(P, x0, U, Wd, E, substeps=np.int64(substeps), save_every=np.int64(save_every),
                      segment=np.int64(L)))


def unpack_params(row: jax.Array, rotors: int) -> tuple:
    """Inverse of :func:`pack_params` for one vehicle: ``(params, h)``."""
    return _unpack(row, step_example(rotors, np.dtype(row.dtype))["P"])


def _xla(P, x0, U, Wd, E, *, substeps, save_every, rotors, segment=0, params_fixed=False, pushed=1, trail=False):
    """rollout_p on XLA: :func:`kernel_step` scanned, one vehicle per row of the broadcast batch
    (the reference for the kernels' derivatives, and their second derivatives; ``params_fixed``
    changes no value: the parameters' tangent is then zero; nor does ``trail``, the forward pass's
    states, which this recomputes)."""
    args = (P, x0, U, Wd, E)
    batch = _batch(args, _CORE)
    flat = [jnp.reshape(jnp.broadcast_to(x, batch + x.shape[x.ndim - c:]), (-1,) + x.shape[x.ndim - c:])
            for x, c in zip(args, _CORE)]

    def one(P, x0, U, Wd, E):
        params_h, T = unpack_params(P, rotors), U.shape[0]

        def tick(S, x):
            for _ in range(substeps):
                S = kernel_step(params_h, S, *x)
            return S, pack_state(S)

        series = [jnp.broadcast_to(x, (T, x.shape[-1])) for x in (Wd, E)]
        final, states = jax.lax.scan(tick, unpack_state(x0, rotors), (U, *series))
        saved = states[save_every - 1::save_every] if save_every else states[:0]
        return pack_state(final), saved

    final, saved = jax.vmap(one)(*flat)
    return jnp.reshape(final, batch + final.shape[1:]), jnp.reshape(saved, batch + saved.shape[1:])


def _derivatives(dtype, rotors) -> bool:
    """The derivative library is there (built on first use; else the derivatives run on XLA).
    On a GPU they are XLA's of the same rollout (:func:`_xla`)."""
    if on_gpu():
        return False
    return _load(np.dtype(dtype).name, rotors) is None and _load(np.dtype(dtype).name, rotors, "derivatives") is None


def _sum_to(x, shape):
    """``x`` summed over the leading dims that ``shape`` has as 1 (the transpose of a broadcast)."""
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return jnp.reshape(jnp.sum(x, axis=axes, keepdims=True), shape) if axes else jnp.reshape(x, shape)


def _primitive(name, impl, n_out):
    prim = jax.extend.core.Primitive(name)
    prim.multiple_results = True
    prim.def_impl(impl)
    prim.def_abstract_eval(lambda *args, **params: [jax.core.ShapedArray(o.shape, o.dtype)
                                                    for o in jax.eval_shape(functools.partial(impl, **params), *args)])
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=True), platform="cpu")
    batching.primitive_batchers[prim] = functools.partial(_all_mapped, prim, n_out)
    return prim


def _all_mapped(prim, n_out, args, dims, **params):
    """The batching rule of every primitive here: every vmapped axis leads; an unmapped argument gets
    a 1 there; every result is mapped."""
    args = [jnp.expand_dims(x, 0) if d is None else jnp.moveaxis(x, d, 0) for x, d in zip(args, dims)]
    return prim.bind(*args, **params), (0,) * n_out


rollout_p = _primitive("quadjax_rollout", _forward_ffi, 2)
#: rollout_p's forward with the saved states as the state's 7 leaves (:func:`rollout_states`; no rules of
#: its own: differentiated through rollout_p)
rollout_leaves_p = _primitive("quadjax_rollout_leaves", _leaves_ffi, 8)
tangent_p = _primitive("quadjax_rollout_tangent", _tangent_ffi, 2)
#: rollout_p's primal and tangent from one tangent-kernel call (what jax.jvp runs; not linear)
joint_p = _primitive("quadjax_rollout_joint", _joint_ffi, 4)


def _joint_batched(args, dims, **params):
    """joint_p batched like the others, except where only tangents are mapped (``jax.jacfwd``, a
    ``vmap`` over tangents) with the parameters fixed: its primal halves then leave unmapped, as
    rollout_p's would, and the tangents go :data:`TANGENTS` at a time through the multi-tangent
    kernel (:func:`_pushed_batch`).

    With the parameters differentiated, each tangent runs the one-tangent kernel with its primal:
    there, k tangents pushed together cost more than k one-tangent steps (2, 3, 4: 9.2, 13.5, 17.6
    forward steps against 3.9 for one). The parameters' tangents are held over the rollout, so the
    step hoists what depends on them into its prologue once per tangent (646 values at k = 4), and
    its frame (71 KB) outgrows an L1 cache. Measured in benchmarks/generated_steps.py and
    jacfwd_grouping.py (benchmarks/README.md, 2026-12-06, thirteenth session)."""
    if any(d is not None for d in dims[:5]):
        return _all_mapped(joint_p, 4, args, dims, **params)
    dtype, m = args[2].dtype, next(x.shape[d] for x, d in zip(args[5:], dims[5:]) if d is not None)
    # fewer than TANGENTS - 1 tangents: each in the one-tangent kernel costs less than a padded group
    if (params.get("pushed", 1) == 1 and params.get("params_fixed", False) and m >= TANGENTS - 1
            and _load(np.dtype(dtype).name, params["rotors"], "tangents") is None):
        return _pushed_batch(m, args, dims, **params)
    outs, _ = _all_mapped(joint_p, 4, args, dims, **params)
    return [outs[0][0], outs[1][0], *outs[2:]], (None, None, 0, 0)


def _packed(t, k: int):
    """(c·k, *rest) -> (c, *rest[:-1], k·rest[-1]): each group of k tangents side by side on the last
    axis, as the multi-tangent kernel's rows hold them (primal, then tangent 1, 2, ...)."""
    t = jnp.moveaxis(jnp.reshape(t, (t.shape[0] // k, k) + t.shape[1:]), 1, -2)  # explicit sizes: t may be empty
    return jnp.reshape(t, t.shape[:-2] + (k * t.shape[-1],))


def _unpacked(t, k: int):
    """The inverse of :func:`_packed`: (c, *rest[:-1], k·w) -> (c·k, *rest[:-1], w)."""
    t = jnp.moveaxis(jnp.reshape(t, t.shape[:-1] + (k, t.shape[-1] // k)), -2, 1)
    return jnp.reshape(t, (t.shape[0] * k,) + t.shape[2:])


def _pushed_batch(m, args, dims, **params):
    """joint_p over m mapped tangents with unmapped primals: full groups of :data:`TANGENTS` in the
    multi-tangent kernel (one primal per group and vehicle). A rest of fewer than TANGENTS - 1
    tangents runs in the one-tangent kernel, each with its primal; a rest of TANGENTS - 1 is padded
    with a zero tangent (four tangents' step, params fixed: 13 202 instructions, against 3 × 4 817 for
    three one-tangent steps; benchmarks/README.md, 2026-12-05). A grouped joint_p is bound from a
    batching rule, so it reaches no partial evaluator (those see joint_p as rollout_p's JVP binds it,
    one tangent); its own derivatives are its JVP rule's, on XLA (:func:`_joint_xla`)."""
    k = TANGENTS
    tangents = [jnp.broadcast_to(x[None], (m,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)
                for x, d in zip(args[5:], dims[5:])]
    rest = m % k
    pad = k - rest if rest == k - 1 else 0
    groups = (m + pad) // k
    if pad:
        tangents = [jnp.concatenate([t, jnp.zeros((pad,) + t.shape[1:], t.dtype)]) for t in tangents]
    primals = [x[None] for x in args[:5]]
    calls = []
    if groups:
        final, saved, *d = joint_p.bind(*primals, *[_packed(t[:groups * k], k) for t in tangents], **params, pushed=k)
        calls.append((final, saved, *[_unpacked(x, k) for x in d]))
    if groups * k < m:
        calls.append(joint_p.bind(*primals, *[t[groups * k:m] for t in tangents], **params))
    final, saved = calls[0][:2]  # the primal of the first call (every call computes it)
    d_final, d_saved = (jnp.concatenate([c[i] for c in calls])[:m] for i in (2, 3))
    return [final[0], saved[0], d_final, d_saved], (None, None, 0, 0)


batching.primitive_batchers[joint_p] = _joint_batched
adjoint_p = _primitive("quadjax_rollout_adjoint", _adjoint_ffi, 5)
#: rollout_p's forward as jax.grad runs it: (final, saved, kept), what adjoint_p reads kept
trail_p = _primitive("quadjax_rollout_trail", _trail_ffi, 3)


def on_gpu() -> bool:
    """True when JAX's default backend is a GPU: the kernel is then the Pallas one (:mod:`quadjax.gpu`)."""
    return jax.default_backend() == "gpu"


def _forward_gpu(P, x0, U, Wd, E, *, substeps, save_every, rotors, segment=0):
    """rollout_p on a GPU: the Pallas kernel, from the same step as the C one."""
    from quadjax import gpu

    return gpu.rollout_rows(P, x0, U, Wd, E, substeps=substeps, save_every=save_every, rotors=rotors)


for _platform in ("cuda", "rocm"):
    mlir.register_lowering(rollout_p, mlir.lower_fun(_forward_gpu, multiple_results=True), platform=_platform)


def _rollout_jvp(primals, tangents, **params):
    """jax.jvp: the primal and tangent from one tangent-kernel call (joint_p), whose primal half
    the kernel computes anyway. Linearised (jax.grad, jax.linearize; jax.checkpoint), joint_p splits
    into rollout_p and tangent_p (:func:`_joint_partial_eval`, :func:`_joint_partial_eval_jaxpr`: the
    same split in JAX's two partial evaluators, one on traces, one on jaxprs)."""
    # parameters not differentiated (a symbolic zero tangent): the kernels without their terms
    fixed = type(tangents[0]) is ad.Zero
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    if not _derivatives(primals[2].dtype, params["rotors"]):
        return rollout_p.bind(*primals, **params), jax.jvp(functools.partial(_xla, **params), tuple(primals),
                                                           tuple(tangents))[1]
    final, saved, d_final, d_saved = joint_p.bind(*primals, *tangents, **params, params_fixed=fixed)
    return (final, saved), (d_final, d_saved)


def _joint_partial_eval(trace, *tracers, **params):
    """joint_p with the primals known and tangents not (being linearised: jax.grad, jax.linearize):
    the primal from rollout_p, now, and the tangent from tangent_p, staged: linear, its transpose the
    adjoint kernel. Otherwise as any primitive."""
    primals = [t.pval.get_known() for t in tracers[:5]]
    if any(x is None for x in primals) or all(t.pval.is_known() for t in tracers[5:]):
        return trace.default_process_primitive(joint_p, tracers, params)
    if params.get("pushed", 1) > 1:
        return [*rollout_p.bind(*primals, **_forward(params)), *trace.default_process_primitive(tangent_p, tracers, params)]
    # the forward pass keeps its trail (within TRAIL_BYTES; else the checkpoints) for the transpose's sweep
    final, saved, trail = trail_p.bind(*primals, **_forward(params))
    staged = trace.default_process_primitive(tangent_p, (*tracers, trace.new_const(trail)), dict(params, trail=True))
    return [final, saved, *staged]


def _joint_partial_eval_jaxpr(saveable, unknowns, instantiated, eqn):
    """:func:`_joint_partial_eval` on a jaxpr (``jax.checkpoint`` differentiated): the known primals'
    rollout_p on the known side, tangent_p staged; otherwise all known (its results saved) or all
    staged. Returns (known eqn, staged eqn, unknown outputs, instantiated outputs, residuals)."""
    del saveable  # the primal outputs are saved, never recomputed: they are what the known side is for
    needed = [v for v, inst in zip(eqn.invars, instantiated) if isinstance(v, jax.extend.core.Var) and not inst]
    if not any(unknowns):
        return eqn, None, [False] * 4, [False] * 4, []
    if any(unknowns[:5]):
        return None, eqn, [True] * 4, [True] * 4, needed
    known = eqn.replace(primitive=rollout_p, invars=eqn.invars[:5], outvars=eqn.outvars[:2], params=_forward(eqn.params))
    staged = eqn.replace(primitive=tangent_p, outvars=eqn.outvars[2:])
    return known, staged, [False, False, True, True], [False, False, True, True], needed


def _tangent_transpose(cts, *args, **params):
    primals, tangents, held = args[:5], args[5:10], args[10:]
    if any(ad.is_undefined_primal(x) for x in primals):
        raise ValueError("quadjax native: the tangent rollout is linear in its tangents only")
    if params.get("params_fixed") and ad.is_undefined_primal(tangents[0]):
        raise ValueError("quadjax native: a tangent rollout with the parameters fixed has no parameters' cotangent")
    outs = jax.eval_shape(functools.partial(_forward_ffi, **_forward(params)), *primals)
    cts = [jnp.zeros(o.shape, o.dtype) if type(ct) is ad.Zero else ct for ct, o in zip(cts, outs)]
    grads = adjoint_p.bind(*primals, *cts, *held, **params)
    return [None] * 5 + [_sum_to(g, t.aval.shape) if ad.is_undefined_primal(t) else None
                         for g, t in zip(grads, tangents)] + [None] * len(held)


def _forward(params: dict) -> dict:
    """rollout_p's parameters among a derivative primitive's (all but ``params_fixed``, ``pushed``
    and ``trail``)."""
    return {k: v for k, v in params.items() if k not in ("params_fixed", "pushed", "trail")}


def _adjoint_xla(xla, args):
    """What adjoint_p computes, on XLA: with the parameters fixed, no parameters' cotangent."""
    grads = jax.vjp(xla, *args[:5])[1](tuple(args[5:7]))  # the trail (args[7], if any) is recomputed
    if xla.keywords.get("params_fixed"):
        return (jnp.zeros(_batch(args[:7], _CORE + (1, 2)) + (0,), grads[1].dtype), *grads[1:])
    return grads


def _on_xla(form):
    """A JVP rule (second order) from ``form(xla)``: what the primitive computes, written with
    the XLA rollout ``xla`` (:func:`_xla`), differentiated by JAX."""
    def jvp(primals, tangents, **params):
        fn = form(functools.partial(_xla, **params))
        return jax.jvp(fn, tuple(primals), tuple(ad.instantiate_zeros(t) for t in tangents))
    return jvp


def _joint_xla(xla, a) -> tuple:
    """What joint_p computes, on XLA: the primal and the tangent of ``a`` = (primals, tangents),
    the tangents ``pushed`` at a time side by side on their last axis (:func:`_packed`)."""
    # primals and tangents broadcast to one batch: the primitive takes either with 1s in its batch
    pushed, batch = xla.keywords.get("pushed", 1), _batch(a, _CORE * 2)
    primals = tuple(jnp.broadcast_to(x, batch + x.shape[x.ndim - c:]) for x, c in zip(a[:5], _CORE))
    tangents = [jnp.broadcast_to(t, batch + t.shape[t.ndim - c:]) for t, c in zip(a[5:], _CORE)]
    if pushed == 1:
        return tuple(x for pair in jax.jvp(xla, primals, tuple(tangents)) for x in pair)
    # one tangent per row of a vmap: (pushed, batch..., core)
    out, d = jax.vmap(lambda *t: jax.jvp(xla, primals, t), out_axes=(None, 0))(
        *[_unpacked(t[None], pushed) for t in tangents])
    return (*out, *[_packed(x, pushed)[0] for x in d])


ad.primitive_jvps[rollout_p] = _rollout_jvp
ad.primitive_jvps[tangent_p] = _on_xla(lambda xla: lambda *a: _joint_xla(xla, a[:10])[2:])  # a[10]: a trail
pe.custom_partial_eval_rules[joint_p] = _joint_partial_eval
pe.partial_eval_jaxpr_custom_rules[joint_p] = _joint_partial_eval_jaxpr
ad.primitive_jvps[joint_p] = _on_xla(lambda xla: lambda *a: _joint_xla(xla, a))
ad.primitive_jvps[adjoint_p] = _on_xla(lambda xla: lambda *a: _adjoint_xla(xla, a))
ad.primitive_transposes[tangent_p] = _tangent_transpose


def _trail_jvp(primals, tangents, **params):
    """trail_p differentiated (a second derivative): rollout_p's derivative, and the trail with a
    zero tangent, which is every reader's own: tangent_p and adjoint_p differentiate as their XLA
    forms, which recompute the trail from the primals (:func:`_xla`)."""
    (final, saved), (d_final, d_saved) = _rollout_jvp(primals, tangents, **params)
    trail = trail_p.bind(*primals, **params)[2]
    return (final, saved, trail), (d_final, d_saved, ad.Zero(jax.typeof(trail).to_tangent_aval()))


ad.primitive_jvps[trail_p] = _trail_jvp


def _unsaved(saved, used_outputs, eqn):
    """The dead-code elimination rule of a primitive whose results ``saved`` (their indices) are
    the saved states and their tangents: where none of them is used, the primitive saves nothing
    (``save_every`` 0), since every other result is the same; where the state's leaves are saved
    one result each, it saves only those used. A user's ``simulate(...).final`` under the default
    ``SimConfig(save_every=1)`` thus costs what ``save_every=0`` does (N = 256, T = 1 000: the
    forward had taken twice as long, ``jax.grad`` 3x; benchmarks/README.md, sixteenth session).
    ``jax.jit`` runs this as it lowers (its unused-input pruning), and linearisation on the tangent
    jaxpr (the tangent's saved states unused)."""
    if not any(used_outputs):
        return [False] * len(eqn.invars), None
    read = tuple(bool(used_outputs[i]) for i in saved)
    if eqn.params["save_every"] == 0 or all(read):
        return [True] * len(eqn.invars), eqn
    if eqn.primitive is rollout_leaves_p:
        if any(read):
            return [True] * len(eqn.invars), rebound(eqn, used_outputs, rollout_leaves_p, dict(eqn.params, leaves=read))
        # none of the leaves: the packed rows, with no slots (their result stands for the first leaf's)
        params = {k: v for k, v in eqn.params.items() if k != "leaves"}
        return [True] * len(eqn.invars), rebound(eqn, used_outputs, rollout_p, dict(params, save_every=0))
    if any(read):  # packed rows, some read: all saved
        return [True] * len(eqn.invars), eqn
    return [True] * len(eqn.invars), rebound(eqn, used_outputs, eqn.primitive, dict(eqn.params, save_every=0))


def rebound(eqn, used_outputs, prim, params):
    """``eqn`` as a binding of ``prim`` with ``params`` on the same inputs, its results that
    ``used_outputs`` marks unused dropped: what a dead-code elimination rule that saves less returns
    (:func:`_unsaved`, and the closed loop's in :mod:`quadjax.native.loop`)."""
    avals, _ = prim.abstract_eval(*[v.aval for v in eqn.invars], **params)
    outvars = [v if used else jax.extend.core.DropVar(a) for v, used, a in zip(eqn.outvars, used_outputs, avals)]
    return eqn.replace(primitive=prim, params=params, outvars=outvars)


for _prim, _saved in ((rollout_p, (1,)), (rollout_leaves_p, range(1, 8)), (trail_p, (1,)), (tangent_p, (1,)),
                      (joint_p, (1, 3))):
    pe.dce_rules[_prim] = functools.partial(_unsaved, tuple(_saved))


# --------------------------------------------------------------------------- rk4_step on the kernel


def kernel_rk4_step(params: QuadParams, state: QuadState, command, dt, *, fallback):
    """The library's ``rk4_step`` in the kernel where it applies (the CPU backend, 4, 6 or 8
    rotors, params, state and command of one float dtype, the kernel available), else
    ``fallback`` (the XLA form of the same step) itself.

    The two are one function: the kernel is generated from the model the fallback runs, and a
    trace holds both (``lax.platform_dependent``: the kernel on the CPU, the fallback on other
    platforms; the code generator reads the fallback). Leading batch dimensions broadcast as
    in ``fallback``; under ``jax.vmap`` the whole batch is one kernel call, so a user's own
    ``lax.scan`` over ``jax.vmap(rk4_step)`` runs at the kernel's speed. Its derivatives (jvp,
    grad, jacfwd, under vmap and checkpoint) run in the tangent and adjoint kernels
    (:func:`_kernel_step_jvp`), and are the fallback's where those are missing.
    """
    command = jnp.asarray(command)
    dtype = jnp.result_type(state.energy)
    leaves = jax.tree_util.tree_leaves((params, state)) + [command]
    R = command.shape[-1] if command.ndim else 0
    applies = (jax.default_backend() == "cpu" and supports(R, dtype) and params.rotor_spins.shape[-1] == R
               and all(jnp.result_type(x) == dtype for x in leaves)
               # a dt that would not promote the step (a Python float, also traced as a weak float64
               # under x64: jit(rk4_step)(p, s, u, 1e-3) took the XLA form where the eager call took
               # the kernel), not only one of the step's own dtype
               and jnp.result_type(dtype, dt) == dtype and available(dtype, R))
    if not applies:
        return fallback(params, state, command, dt)
    dt = jnp.asarray(dt, dtype)
    return jax.lax.platform_dependent(params, state, command, dt, cpu=functools.partial(_kernel_step, fallback),
                                      default=fallback)


def _batch_of(tree, like) -> tuple:
    """The leading dims of ``tree``'s leaves beyond those of ``like``'s, broadcast over the leaves."""
    return jnp.broadcast_shapes(*[jnp.shape(x)[:jnp.ndim(x) - len(e.shape)]
                                  for x, e in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(like))])


def _step_batch(params, state, command, dt) -> tuple:
    """(the parameters' batch shape, the whole step's) for ``rk4_step``'s broadcasting."""
    example = step_example(command.shape[-1], command.dtype)
    p_batch = jnp.broadcast_shapes(_batch_of(params, example["P"][0]), jnp.shape(dt))
    return p_batch, jnp.broadcast_shapes(p_batch, _batch_of(state, example["S"]), command.shape[:-1])


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _kernel_step(fallback, params, state, command, dt):
    R = command.shape[-1]
    example = step_example(R, command.dtype)
    p_batch, batch = _step_batch(params, state, command, dt)

    def padded(x, core):  # x of its own batch, left-padded with 1s to the rank of the batch
        return jnp.reshape(x, (1,) * (len(batch) + core - jnp.ndim(x)) + jnp.shape(x))

    flat = [jnp.reshape(jnp.broadcast_to(x, p_batch + e.shape), p_batch + (-1,))
            for x, e in zip(jax.tree_util.tree_leaves((params, dt)), jax.tree_util.tree_leaves(example["P"]))]
    P = padded(jnp.concatenate(flat, axis=-1), 1)  # the params' rows (..., N_P)
    leaves = [padded(x, len(e.shape)) for x, e in zip(jax.tree_util.tree_leaves(state),
                                                      jax.tree_util.tree_leaves(example["S"]))]
    u = padded(command, 1)[..., None, :]
    wind = padded(params.wind, 1)[..., None, :]
    wrench = jnp.zeros((1,) * len(batch) + (1, 6), command.dtype)
    out = _step_call(P, *leaves, u, wind, wrench)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(example["S"]), out)


@jax.custom_batching.custom_vmap
def _step_call(P, *args):
    """The step kernel on the whole batch: the params' rows and the state's leaves (batch..., *leaf
    shape), vehicle-minor (the batch dims minor, so that XLA keeps a scan's carry in that layout and
    the kernel reads each block's values as vectors), and the command (batch..., 1, R), row-major (a scan's tick of
    time-major commands as XLA holds it; the kernel transposes each block's), every argument of one rank
    per core shape (batch dims equal or 1). A leaf with the results' shape is updated in place.
    Batched by :func:`_step_call_vmap`, so that a ``vmap`` of it stays one call whose layout is
    vehicle-minor over all the batch dims (``jax.ffi.ffi_call``'s own batching would make the
    new dim the most major)."""
    *leaves, u, wind, wrench = args
    cores = [len(e.shape) for e in jax.tree_util.tree_leaves(step_example(u.shape[-1], u.dtype)["S"])]
    batch = jnp.broadcast_shapes(P.shape[:-1], *[x.shape[:-2] for x in (u, wind, wrench)],
                                 *[x.shape[:x.ndim - c] for x, c in zip(leaves, cores)])
    shapes = [batch + x.shape[len(batch):] for x in leaves]

    def minor(rank, core):  # major-to-minor: the core dims (last first), then the batch dims
        return tuple(range(rank - 1, rank - 1 - core, -1)) + tuple(range(rank - core))

    call = jax.ffi.ffi_call(
        _target(u.dtype, u.shape[-1], "step"), [jax.ShapeDtypeStruct(sh, u.dtype) for sh in shapes],
        input_layouts=[minor(P.ndim, 1)] + [minor(x.ndim, c) for x, c in zip(leaves, cores)] + [None, None, None],
        output_layouts=[minor(len(sh), c) for sh, c in zip(shapes, cores)],
        input_output_aliases={1 + l: l for l, x in enumerate(leaves) if x.shape == shapes[l]})
    return list(call(P, *leaves, u, wind, wrench))


@_step_call.def_vmap
def _step_call_vmap(axis_size, in_batched, *args):
    """A vmapped step is one call over the larger batch: an unbatched argument gets a leading 1."""
    out = _step_call(*[x if b else x[None] for x, b in zip(args, in_batched)])
    return out, [True] * len(out)


@functools.partial(_kernel_step.defjvp, symbolic_zeros=True)
def _kernel_step_jvp(fallback, primals, tangents):
    """The step's derivatives: those of a one-tick rollout (the tangent and adjoint kernels),
    each vehicle of the broadcast batch a row; the fallback's where those kernels are missing.
    Params and dt not differentiated: the kernels without the parameters' terms."""
    params, state, command, dt = primals
    R = command.shape[-1]
    if not _derivatives(command.dtype, R):
        return jax.jvp(fallback, primals, _arrays(tangents))
    _, batch = _step_batch(params, state, command, dt)
    example = step_example(R, command.dtype)
    like = (example["P"][0], example["S"], example["U"], example["P"][1])

    def rows(x, e):  # (n, *e.shape): every vehicle of the batch
        return jnp.reshape(jnp.broadcast_to(x, batch + e.shape), (-1,) + e.shape)

    def one(params, state, command, dt):
        final, _ = rollout(params, pack_state(state), command[None], dt, None, None, substeps=1, save_every=0)
        return unpack_state(final, R)

    def step(*args):
        flat = jax.tree_util.tree_map(rows, args, like)
        out = jax.vmap(one)(*flat)
        return jax.tree_util.tree_map(lambda x, e: jnp.reshape(x, batch + e.shape), out, example["S"])

    if _zero(tangents[0]) and _zero(tangents[3]):
        return jax.jvp(lambda state, command: step(params, state, command, dt), (state, command), _arrays(tangents[1:3]))
    return jax.jvp(step, primals, _arrays(tangents))
