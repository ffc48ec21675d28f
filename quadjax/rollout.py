"""Rollouts: ``lax.scan`` of a stepper over time, open loop or under a controller.

Everything here is written for ONE vehicle and batched by ``jax.vmap`` (or the
helpers :func:`rollout_batch` / :func:`rollout_closed_loop_batch`, and
:func:`quadjax.sharding.rollout_sharded` across devices). Outputs are batch-first:
states ``(N, T, ...)``.

Options shared by both rollouts (keyword-only, static under ``jit``):

* ``substeps``: physics steps per command (open loop) or per controller tick
  (closed loop), each ``dt / substeps`` long, the command held (zero-order hold).
* ``step``: the integrator, a stepper ``(params, state, command, dt) -> state``
  or one of the names ``"rk4"``, ``"euler"``, ``"semi_implicit_euler"``. The
  library's steppers run in component form for the whole horizon (fast path); any
  other stepper works, joined and split around every call.
* ``save_every``: keep the state after every ``save_every``-th command (T must be
  a multiple); ``0`` or ``None`` keeps only the final state (the saved output is
  then ``None``).
* ``reduce``, ``reduce_init``: instead of saving states, fold each state (after
  each command, array form) into a carry, ``reduce(carry, state) -> carry``: a
  10⁶-vehicle sweep then never holds (N, T, ...) in memory.
* ``wind`` (T, 3) [m/s], world: the wind during each command (replaces
  ``params.wind``). ``wrench`` (T, 6): an external body-frame force [N] (first
  three) and moment [N·m] (last three) during each command, added to the
  vehicle's own (a disturbance, a payload, a tether). Library steppers only.
* ``checkpoint``: rematerialise each command's physics in the backward pass
  (``jax.checkpoint``): reverse-mode memory drops to one state per command.
* ``unroll``: passed to ``lax.scan`` (measured: no gain on CPU; see benchmarks).
* ``backend``: ``"auto"`` (the native CPU kernel where it applies, else XLA), ``"xla"``, or
  ``"native"`` (the kernel, or a ValueError saying why it does not apply).

All arithmetic is in the dtype of ``state0``: params, commands, inputs and ``dt``
are cast to it, so float32 stays float32 under x64.

Speed (benchmarks/RESULTS.md, benchmarks/README.md): on the CPU backend the open loop,
and each closed-loop tick's physics, run by default in quadjax's native kernel
(:mod:`quadjax.native`, ``backend="auto"``): RK4 with vehicles in SIMD lanes across the
cores, ~7× XLA's throughput, within 1.5× of the hand-vectorised C reference. Derivatives
(``jax.grad``, ``jvp``), ``reduce`` in the open loop, other steppers and other backends (GPU)
run the XLA path below, which matches the kernel to rounding. On the XLA path the state is
split into components once before the scan and joined only where saved, and per-command
inputs are scanned as one series per component, so the jitted step is element-wise work
on contiguous (N,) arrays that XLA vectorises across vehicles. ``block`` (batch helpers)
runs vehicles in tiles of that many, each tile through the whole horizon (an option: it
did not pay on the 2-core test machine).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from quadjax._components import join_state, split, split_params, split_state
from quadjax import native
from quadjax.integrators import STEPPERS, component_stepper, rk4_step
from quadjax.params import QuadParams
from quadjax.state import QuadState

Stepper = Callable[[QuadParams, QuadState, jax.Array, float], QuadState]


# --------------------------------------------------------------------------- inputs


def _stepper(step):
    if isinstance(step, str):
        if step not in STEPPERS:
            raise ValueError(f"step={step!r}: unknown integrator; choose one of {sorted(STEPPERS)}")
        step = STEPPERS[step]
    if not callable(step):
        raise ValueError(f"step={step!r}: expected a stepper function or an integrator name")
    return component_stepper(step)


def _check_options(substeps, save_every, num_ticks, reduce):
    if not isinstance(substeps, int) or substeps < 1:
        raise ValueError(f"substeps={substeps!r}: expected an int >= 1")
    if save_every is not None and (not isinstance(save_every, int) or save_every < 0):
        raise ValueError(f"save_every={save_every!r}: expected an int >= 0 or None")
    if save_every and reduce is None and num_ticks % save_every:
        raise ValueError(f"save_every={save_every}: must divide the number of commands/ticks ({num_ticks})")
    if reduce is not None and not callable(reduce):
        raise ValueError("reduce: expected a function reduce(carry, state) -> carry")


def _series(name, x, num_ticks, width, dtype):
    """A per-command input (T, width), cast to the state's dtype; ``None`` passes through."""
    if x is None:
        return None
    x = jnp.asarray(x, dtype)
    if x.shape != (num_ticks, width):
        raise ValueError(f"{name}: shape {x.shape}, expected ({num_ticks}, {width}) (one row per command)")
    return x


def _setup(params, state0, dt):
    """Cast params and dt to the state's dtype and split params and state into components."""
    if not isinstance(state0, QuadState):
        raise ValueError(f"state0: expected a QuadState, got {type(state0).__name__}")
    if not isinstance(params, QuadParams):
        raise ValueError(f"params: expected a QuadParams, got {type(params).__name__}")
    dtype = jnp.result_type(state0.position)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"state0.position: dtype {dtype}, expected a float dtype")
    state0 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), state0)
    return split_params(params.astype(dtype)), split_state(state0), jnp.asarray(dt, dtype), dtype


def _split_series(x):
    """(T, k) → tuple of k series (T,); ``None`` passes through."""
    return None if x is None else split(x)


def _with_inputs(P, wind_t, wrench_t):
    """Params and external wrench (component form) for one command, from component-form inputs."""
    if wind_t is not None:
        P = P.replace(wind=tuple(wind_t))
    external = None if wrench_t is None else (tuple(wrench_t[:3]), tuple(wrench_t[3:]))
    return P, external


def _hold(step_c, P, S, u, h, substeps, external):
    """``substeps`` steps of ``h`` with command ``u`` held, all in component form."""
    if substeps == 1:
        return step_c(P, S, u, h, external)
    S, _ = jax.lax.scan(lambda s, _: (step_c(P, s, u, h, external), None), S, None, length=substeps)
    return S


# --------------------------------------------------------------------------- scan engine


def _drive(tick, carry0, xs, num_ticks, *, save_every, reduce, reduce_init, checkpoint, unroll):
    """Scan ``tick(carry, x) -> (carry, y)`` over ``num_ticks`` ticks.

    Returns ``(carry, out)``: ``out`` is ``y`` every ``save_every``-th tick stacked on
    a leading time axis, the ``reduce`` fold of every ``y``, or ``None``.
    """
    body = jax.checkpoint(tick) if checkpoint else tick

    def quiet(c, x):
        return body(c, x)[0], None

    if reduce is not None:
        def fold(c, x):
            carry, acc = c
            carry, y = body(carry, x)
            return (carry, reduce(acc, y)), None

        (carry, acc), _ = jax.lax.scan(fold, (carry0, reduce_init), xs, length=num_ticks, unroll=unroll)
        return carry, acc
    if not save_every:
        carry, _ = jax.lax.scan(quiet, carry0, xs, length=num_ticks, unroll=unroll)
        return carry, None
    if save_every == 1:
        return jax.lax.scan(body, carry0, xs, length=num_ticks, unroll=unroll)
    blocks = jax.tree_util.tree_map(lambda x: x.reshape((-1, save_every) + x.shape[1:]), xs)

    def block(c, xb):
        c, _ = jax.lax.scan(quiet, c, jax.tree_util.tree_map(lambda x: x[:-1], xb), unroll=unroll)
        return body(c, jax.tree_util.tree_map(lambda x: x[-1], xb))

    return jax.lax.scan(block, carry0, blocks)


# --------------------------------------------------------------------------- open loop


def rollout(
    params: QuadParams,
    state0: QuadState,
    commands,
    dt,
    *,
    substeps: int = 1,
    step: Stepper | str = rk4_step,
    save_every: int | None = 1,
    wind=None,
    wrench=None,
    reduce: Callable | None = None,
    reduce_init=None,
    checkpoint: bool = False,
    unroll: int = 1,
    backend: str = "auto",
):
    """Fly one vehicle open loop through ``commands`` (T, R) [rad/s], each held for ``dt`` [s].

    Each command is held for ``substeps`` physics steps of ``dt / substeps``.
    Returns ``(final_state, states)``: ``states`` holds the state after every
    ``save_every``-th command with a leading time axis (T // save_every, ...), or is
    ``None`` (``save_every=0``), or is the ``reduce`` carry. Options: module docstring.
    ``backend``: ``"auto"`` runs the native CPU kernel (:mod:`quadjax.native`) where it
    applies and XLA elsewhere; ``"xla"`` always XLA; ``"native"`` the kernel or an error.
    Batch with ``jax.vmap`` or :func:`rollout_batch` (outputs (N, T, ...)).
    """
    P, S, dt, dtype = _setup(params, state0, dt)
    commands = jnp.asarray(commands, dtype)
    R = len(S.rotor_speeds)
    if commands.ndim != 2 or commands.shape[1] != R:
        raise ValueError(f"commands: shape {commands.shape}, expected (T, {R}) rotor-speed commands")
    T = commands.shape[0]
    _check_options(substeps, save_every, T, reduce)
    wind = _series("wind", wind, T, 3, dtype)
    wrench = _series("wrench", wrench, T, 6, dtype)
    options = _Options(substeps=substeps, step=step, save_every=save_every or 0, checkpoint=checkpoint,
                       unroll=unroll)
    if not _use_native(backend, step, R, dtype):
        return _rollout_xla(P, S, commands, dt, wind, wrench, reduce=reduce, reduce_init=reduce_init,
                            **options._asdict())
    x0 = native.pack_state(join_state(S))
    if reduce is None:  # the whole horizon in one kernel call
        final, saved = _native_rollout_core(params.astype(dtype), x0, commands, dt, wind, wrench, options)
        return native.unpack_state(final, R), None if saved is None else native.unpack_state(saved, R)
    # a fold: one kernel call per command inside the scan, so (T, ...) is never held
    advance = _native_advance(params.astype(dtype), dt, substeps)

    def tick(x, inputs):
        x = advance(x, *inputs)
        return x, native.unpack_state(x, R)

    final, acc = _drive(tick, x0, (commands, wind, wrench), T, save_every=save_every, reduce=reduce,
                        reduce_init=reduce_init, checkpoint=checkpoint, unroll=unroll)
    return native.unpack_state(final, R), acc


def _use_native(backend, step, rotors, dtype) -> bool:
    """Whether :func:`rollout` runs in the native kernel (``backend="native"`` insists)."""
    if backend not in ("auto", "xla", "native"):
        raise ValueError(f"backend={backend!r}: expected 'auto', 'xla' or 'native'")
    if backend == "xla":
        return False
    why = None
    if step not in ("rk4", rk4_step):
        why = "it runs the library's RK4 only"
    elif not native.supports(rotors, dtype):
        why = f"it covers {native.ROTOR_COUNTS} rotors in {native.DTYPES}"
    elif jax.default_backend() != "cpu":
        why = "it is a CPU kernel"
    elif not native.available():
        why = native.unavailable_reason()
    if why and backend == "native":
        raise ValueError(f"backend='native': not available here ({why})")
    return why is None


def _rollout_xla(P, S, commands, dt, wind, wrench, *, substeps, step, save_every, checkpoint, unroll,
                 reduce=None, reduce_init=None):
    """The open-loop rollout in JAX on split params ``P`` and state ``S`` (component form)."""
    step_c = _stepper(step)
    # per-command inputs scanned in component form: (T,) series per rotor/axis, so each
    # step reads contiguous (N,) rows under vmap, not strided columns of (N, R) (2× faster)
    xs = (split(commands), _split_series(wind), _split_series(wrench))
    h = dt / substeps

    def tick(S, x):
        u, wind_t, wrench_t = x
        P_t, external = _with_inputs(P, wind_t, wrench_t)
        S = _hold(step_c, P_t, S, u, h, substeps, external)
        return S, join_state(S)

    final, out = _drive(
        tick, S, xs, commands.shape[0], save_every=save_every, reduce=reduce, reduce_init=reduce_init,
        checkpoint=checkpoint, unroll=unroll,
    )
    return join_state(final), out


class _Options(NamedTuple):
    """The static options of one open-loop rollout (``save_every`` 0 for none)."""

    substeps: int
    step: object
    save_every: int
    checkpoint: bool
    unroll: int


@functools.partial(jax.custom_jvp, nondiff_argnums=(6,))
def _native_rollout_core(params, x0, commands, dt, wind, wrench, options: _Options):
    """The kernel's rollout on packed states (:func:`quadjax.native.pack_state`)."""
    return native.rollout(params, x0, commands, dt, wind, wrench, substeps=options.substeps,
                          save_every=options.save_every)


@_native_rollout_core.defjvp
def _native_rollout_jvp(options, primals, tangents):
    """Derivatives of the kernel's rollout are those of the XLA rollout (same model, same
    numbers to rounding), so grad, jvp and checkpointing behave as on the XLA path."""
    def xla(params, x0, commands, dt, wind, wrench):
        R = commands.shape[-1]
        final, saved = _rollout_xla(split_params(params), split_state(native.unpack_state(x0, R)), commands,
                                    dt, wind, wrench, **options._asdict())
        return native.pack_state(final), None if saved is None else native.pack_state(saved)

    return jax.jvp(xla, primals, tangents)


def _native_advance(params, dt, substeps):
    """``advance(x, command, wind_t, wrench_t) -> x``: one command's physics in the kernel on a
    packed state ``x`` (``wind_t`` (3,) / ``wrench_t`` (6,) or None), for scans that need every tick."""
    options = _Options(substeps=substeps, step=rk4_step, save_every=0, checkpoint=False, unroll=1)

    def advance(x, command, wind_t, wrench_t):
        rows = [None if v is None else v[None] for v in (wind_t, wrench_t)]
        return _native_rollout_core(params, x, command[None], dt, *rows, options)[0]

    return advance


# --------------------------------------------------------------------------- closed loop


def rollout_closed_loop(
    params: QuadParams,
    state0: QuadState,
    controller,
    ctrl_params,
    ctrl_state0,
    num_ticks: int,
    dt,
    *,
    substeps: int = 1,
    step: Stepper | str = rk4_step,
    observe: Callable | None = None,
    save_every: int | None = 1,
    wind=None,
    wrench=None,
    reduce: Callable | None = None,
    reduce_init=None,
    checkpoint: bool = False,
    unroll: int = 1,
    backend: str = "auto",
):
    """Fly one vehicle under a pure controller for ``num_ticks`` controller ticks of ``dt`` [s].

    ``controller(ctrl_params, ctrl_state, observation, t) -> (command (R,), ctrl_state)``
    runs once per tick at t = k·dt; its command is held for ``substeps`` physics
    steps of ``dt / substeps`` (the controller's own rate: an integer number of
    physics steps per tick). The observation is ``observe(params, state, t)``,
    by default the true state. Controllers, MPC and system identification all plug
    in here. Returns ``(final_state, final_ctrl_state, states, commands)``, the last
    two every ``save_every``-th tick (T // save_every, ...) or ``None``; with
    ``reduce``, ``states`` is the fold of every state and ``commands`` is ``None``.
    ``wind``/``wrench`` are per tick (num_ticks, 3)/(num_ticks, 6). ``backend`` as in
    :func:`rollout` (the kernel then runs each tick's physics; ``reduce`` is allowed). Batch
    with ``jax.vmap`` or :func:`rollout_closed_loop_batch`.
    """
    P, S, dt, dtype = _setup(params, state0, dt)
    if not isinstance(num_ticks, int) or num_ticks < 1:
        raise ValueError(f"num_ticks={num_ticks!r}: expected an int >= 1 (static under jit)")
    _check_options(substeps, save_every, num_ticks, reduce)
    wind = _series("wind", wind, num_ticks, 3, dtype)
    wrench = _series("wrench", wrench, num_ticks, 6, dtype)
    if _use_native(backend, step, len(S.rotor_speeds), dtype):  # the kernel advances each tick
        advance = _native_advance(params.astype(dtype), dt, substeps)
        R = len(S.rotor_speeds)
        carry0, view = native.pack_state(join_state(S)), (lambda c: native.unpack_state(c, R))
        xs = (jnp.arange(num_ticks), wind, wrench)
    else:
        step_c = _stepper(step)
        h = dt / substeps
        carry0, view = S, join_state
        xs = (jnp.arange(num_ticks), _split_series(wind), _split_series(wrench))

        def advance(c, command, wind_t, wrench_t):
            P_t, external = _with_inputs(P, wind_t, wrench_t)
            return _hold(step_c, P_t, c, split(command), h, substeps, external)

    def tick(carry, x):
        c, cs = carry
        k, wind_t, wrench_t = x
        t = k * dt
        state = view(c)
        obs = state if observe is None else observe(params, state, t)
        command, cs = controller(ctrl_params, cs, obs, t)
        command = jnp.asarray(command, dtype)
        c = advance(c, command, wind_t, wrench_t)
        y = view(c) if reduce is not None else (view(c), command)
        return (c, cs), y

    (c, cs), out = _drive(
        tick, (carry0, ctrl_state0), xs, num_ticks, save_every=save_every, reduce=reduce,
        reduce_init=reduce_init, checkpoint=checkpoint, unroll=unroll,
    )
    if reduce is not None:
        return view(c), cs, out, None
    states, commands = (None, None) if out is None else out
    return view(c), cs, states, commands


# --------------------------------------------------------------------------- batching


def vehicle_axes(params: QuadParams, *fields: str) -> QuadParams:
    """An ``in_axes`` pytree for ``params``: 0 (one value per vehicle) for ``fields``, None (shared) for the rest.

    ``vehicle_axes(p)`` with no field names maps every leaf. Example: a mass sweep
    with everything else shared is ``vehicle_axes(p, "mass")`` with ``p.mass`` (N,).
    """
    names = [f for f in params.__dataclass_fields__]
    unknown = [f for f in fields if f not in names]
    if unknown:
        raise ValueError(f"vehicle_axes: unknown QuadParams fields {unknown}")
    chosen = set(fields) if fields else set(names)
    return params.replace(**{f: (0 if f in chosen else None) for f in names})


def _expand_axes(axes, tree):
    """Broadcast an in_axes prefix (None/0 or a pytree of them) to the full structure of ``tree``."""
    return jax.tree_util.tree_map(
        lambda a, sub: jax.tree_util.tree_map(lambda _: a, sub),
        axes, tree, is_leaf=lambda a: a is None or isinstance(a, int),
    )


def map_vehicles(fn, args: tuple, in_axes: tuple, *, block: int | None = None):
    """``jax.vmap(fn, in_axes)(*args)`` with outputs batch-first, optionally in tiles of ``block`` vehicles.

    With ``block``, vehicles run ``block`` at a time (``lax.map`` over tiles, each
    tile vmapped through the whole horizon); a remainder tile is handled. Same
    results per vehicle; faster for large N (the working set stays in cache).
    """
    if block is None:
        return jax.vmap(fn, in_axes=in_axes)(*args)
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block={block!r}: expected an int >= 1")
    axes = _expand_axes(tuple(in_axes), tuple(args))
    leaves, treedef = jax.tree_util.tree_flatten(tuple(args))
    flat_axes = treedef.flatten_up_to(axes)
    if any(a not in (0, None) for a in flat_axes):
        raise ValueError("map_vehicles with block: in_axes entries must be 0 or None")
    mapped = [x for x, a in zip(leaves, flat_axes) if a == 0]
    if not mapped:
        raise ValueError("map_vehicles: no argument is mapped over vehicles (all in_axes None)")

    def one(xs):
        it = iter(xs)
        full = [next(it) if a == 0 else x for x, a in zip(leaves, flat_axes)]
        return fn(*jax.tree_util.tree_unflatten(treedef, full))

    return jax.lax.map(one, mapped, batch_size=block)


def rollout_batch(
    params: QuadParams,
    state0: QuadState,
    commands,
    dt,
    *,
    params_axes=None,
    state_axes=0,
    commands_axes=0,
    block: int | None = None,
    **options,
):
    """:func:`rollout` over N vehicles; outputs batch-first (N, ...), states (N, T, ...).

    ``params_axes``: ``None`` one parameter set for all vehicles; ``0`` one per
    vehicle (leaves with a leading N axis); or a ``QuadParams`` of 0/None per leaf
    (:func:`vehicle_axes`) to vary only some leaves. ``state_axes`` and
    ``commands_axes`` likewise (``None`` shares one initial state or command
    sequence). ``block``: see :func:`map_vehicles`. Other options: :func:`rollout`.
    """
    def one(p, s, u):
        return rollout(p, s, u, dt, **options)

    return map_vehicles(one, (params, state0, commands), (params_axes, state_axes, commands_axes), block=block)


def rollout_closed_loop_batch(
    params: QuadParams,
    state0: QuadState,
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
    block: int | None = None,
    **options,
):
    """:func:`rollout_closed_loop` over N vehicles (axes as in :func:`rollout_batch`).

    ``ctrl_params_axes``: ``None`` one gain set for all, ``0`` one per vehicle.
    ``ctrl_state_axes``: 0 (per vehicle, the default) or ``None``.
    """
    def one(p, s, cp, cs):
        return rollout_closed_loop(p, s, controller, cp, cs, num_ticks, dt, **options)

    return map_vehicles(
        one, (params, state0, ctrl_params, ctrl_state0),
        (params_axes, state_axes, ctrl_params_axes, ctrl_state_axes), block=block,
    )
