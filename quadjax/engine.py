"""The simulation engine: the one place where vehicles are stepped through time.

:func:`simulate` flies ONE vehicle (batch it with ``jax.vmap`` or :func:`map_vehicles`)
for ``num_ticks`` ticks of ``dt`` [s]. Each tick:

1. ``edit(state, k)`` (optional): the caller's code that touches the state between steps;
2. the controller maps the observation to a rotor-speed command (R,) [rad/s]. Open loop is
   the controller that replays ``commands`` (T, R);
3. the physics advances ``config.substeps`` steps of ``dt / substeps`` with the command held
   (zero-order hold), on the native CPU kernel or on XLA (``config.backend``);
4. the hooks judge the tick: the invariant monitor (``config.check``), the sweep's crash
   rules, streaming reductions (:class:`Reduce`), or any :class:`Hook`. A hook that returns a
   non-zero status code (:mod:`quadjax.status`) stops the vehicle: it is frozen at its state
   (and controller state) before that tick, its code and tick are recorded, and the others
   fly on untouched. Nothing raises inside a batched run (diffrax's ``throw=False``), unless
   ``config.check="raise"`` asks for it.

Parameters that break I1 (:func:`quadjax.params_valid`): concrete ones are refused with a
ValueError naming the field; traced ones (under ``jit``/``vmap``) give status 6
(``params_invalid``), and every run with per-tick work (a controller, ``edit``, hooks or
``check``) stops such a vehicle at t = 0. The bare open loop (``commands=``, nothing else)
flags them and still flies them: it is what optimisers differentiate (sysid, MPC), and a
vehicle frozen at state0 would give them a zero gradient as soon as a step leaves the valid set.

Other vehicle models (a :class:`Vehicle`: seed 003's 16-state Euler-angle model,
:mod:`quadjax.euler16`; the missile, car and helicopter of :mod:`quadjax.vehicles`) fly through the
same tick loop, hooks, status codes, monitor (``check``: the vehicle's own ``violation``, by default
I4) and saved outputs: their params name their :class:`Vehicle`, which checks them at the boundary
and gives the steppers. Wind and wrench inputs and the native kernel are the quadrotor's.

The result is a :class:`Trajectory`. All arithmetic is in the dtype of ``state0``: params,
commands, inputs and ``dt`` are cast to it, so float32 stays float32 under x64.

Speed (benchmarks/RESULTS.md): an open loop with no hook runs the whole horizon in one
native kernel call; anything with per-tick work runs one kernel call per tick inside the
scan (or, on XLA, the component form of the stepper, split once before the scan and joined
only where a hook or the saved output needs the array form). Every path is differentiable:
on the kernel, ``jax.jvp`` / ``jax.grad`` run its generated tangent and adjoint
(:mod:`quadjax.native`), on XLA its program of the same model.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from quadjax import native
from quadjax import status as codes
from quadjax._components import join_state, split, split_params, split_state
from quadjax._pytree import pytree_dataclass
from quadjax.integrators import STEPPERS, component_stepper, rk4_step
from quadjax.invariants import NON_FINITE
from quadjax.params import QuadParams, check_params, float_dtype
from quadjax.resolution import STABILITY, fixed_rate, start_code, status_at_start
from quadjax.state import QuadState

BACKENDS = ("auto", "xla", "native")
CHECKS = ("off", "monitor", "raise")
SAVE_FIELDS = ("state", "command", "estimate")


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """The static options of a run (hashable; pass it through ``jit`` as a constant).

    integrator: ``"rk4"``, ``"euler"``, ``"semi_implicit_euler"`` or a stepper
        ``(params, state, command, dt) -> state``. The library's steppers run in component form.
    substeps: physics steps per tick, each ``dt / substeps`` long, the command held.
    save_every: keep the outputs (``save``) after every ``save_every``-th tick (it must divide
        ``num_ticks``); 0 keeps only the final state. In the native kernels, a jitted program
        saves only the outputs it reads (dead-code elimination): none read is as 0.
    save: which per-tick outputs are kept: a subset of ``("state", "command", "estimate")``
        (the estimate: what an :class:`Observer` gave the controller). Hooks' own per-tick
        outputs are kept whenever ``save_every`` > 0.
    checkpoint: rematerialise each tick in the backward pass (``jax.checkpoint``): reverse-mode
        memory drops to one carry per tick. (The kernel's reverse sweep bounds its own memory.)
    backend: ``"auto"`` (the generated kernel where it applies, else XLA), ``"xla"``, or
        ``"native"`` (the kernel, or a ValueError saying why it does not apply). The kernel is
        generated C on the CPU (:mod:`quadjax.native`) and a Pallas kernel on a GPU
        (:mod:`quadjax.gpu`), both from the model's one step.
    check: ``"off"``; ``"monitor"`` runs the invariant monitor (I1 once, I2–I5 before and
        after every tick; :class:`quadjax.monitor.MonitorReport`) and stops a vehicle at its
        first violation; ``"raise"`` does the same and, inside ``checkify.checkify`` (or
        ``chex.chexify``), raises naming the invariant, the vehicle and the tick.
    unroll: passed to ``lax.scan``.
    """

    integrator: Any = "rk4"
    substeps: int = 1
    save_every: int = 1
    save: tuple = SAVE_FIELDS
    checkpoint: bool = False
    backend: str = "auto"
    check: str = "off"
    unroll: int = 1

    def __post_init__(self):
        if isinstance(self.integrator, str) and self.integrator not in STEPPERS:
            raise ValueError(f"SimConfig.integrator={self.integrator!r}: choose one of {sorted(STEPPERS)} "
                             "or pass a stepper function")
        if not (isinstance(self.integrator, str) or callable(self.integrator)):
            raise ValueError(f"SimConfig.integrator={self.integrator!r}: expected a name or a stepper function")
        for name in ("substeps", "unroll"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SimConfig.{name}={value!r}: expected an int >= 1")
        if not isinstance(self.save_every, int) or isinstance(self.save_every, bool) or self.save_every < 0:
            raise ValueError(f"SimConfig.save_every={self.save_every!r}: expected an int >= 0 (0: final state only)")
        save = tuple(self.save)
        if any(f not in SAVE_FIELDS for f in save):
            raise ValueError(f"SimConfig.save={self.save!r}: a subset of {SAVE_FIELDS}")
        object.__setattr__(self, "save", save)
        if self.backend not in BACKENDS:
            raise ValueError(f"SimConfig.backend={self.backend!r}: expected one of {BACKENDS}")
        if self.check not in CHECKS:
            raise ValueError(f"SimConfig.check={self.check!r}: expected one of {CHECKS}")

    @property
    def stepper(self) -> Callable:
        """The array-form stepper function."""
        return STEPPERS[self.integrator] if isinstance(self.integrator, str) else self.integrator

    @property
    def stability(self) -> float | None:
        """The largest λ·h the stepper is stable at (:data:`quadjax.resolution.STABILITY`); None
        for a stepper of the caller's (not judged)."""
        name = next((n for n, fn in STEPPERS.items() if fn is self.stepper), None)
        return STABILITY.get(name)

    def replace(self, **changes) -> "SimConfig":
        return dataclasses.replace(self, **changes)


@pytree_dataclass
class Inputs:
    """Per-tick exogenous inputs (None where absent).

    wind: (T, 3) m/s, world frame: the wind during each tick (replaces ``params.wind``).
    wrench: (T, 6) body frame: an external force [N] (first three) and moment [N·m] (last
        three) during each tick, added to the vehicle's own (a disturbance, a payload).
    """

    wind: jax.Array | None = None
    wrench: jax.Array | None = None


class Tick(NamedTuple):
    """What a hook sees of one tick of one vehicle (array form).

    k: () int32 tick index; t: () time at the start of the tick [s]; params: the vehicle's
    params (state dtype); before: the state going into the tick's step (after ``edit``);
    command: (R,) [rad/s]; after: what the step produced; ctrl_state: the controller's state
    after the tick; wind, wrench: this tick's inputs or None; flying: () bool, False once the
    vehicle has stopped (its tick is then computed and discarded); h: () the physics step,
    dt / substeps [s]; estimate: what the :class:`Observer` gave the controller (None without one).
    """

    k: jax.Array
    t: jax.Array
    params: QuadParams
    before: QuadState
    command: jax.Array
    after: QuadState
    ctrl_state: Any
    wind: jax.Array | None
    wrench: jax.Array | None
    flying: jax.Array
    h: jax.Array
    estimate: Any = None


class Sense(NamedTuple):
    """What an :class:`Observer` sees at the start of tick ``k`` of one vehicle (array form).

    k: () int32; t: () [s]; params: the vehicle's params; state: the true state at t (after
    ``edit``); command: (R,) the command being flown (the previous tick's; zeros at k = 0);
    wind (3,), wrench (6,): this tick's inputs or None.
    """

    k: jax.Array
    t: jax.Array
    params: Any
    state: Any
    command: jax.Array
    wind: jax.Array | None
    wrench: jax.Array | None


class Observer:
    """The observer slot: what stands between the plant and the controller (sensors, then an
    estimator). Pass one as ``simulate(..., observe=observer)``; subclass and override.

    ``init(params, state0, dt)`` → carry. ``update(carry, sense)`` → ``(observation, carry,
    code)``: ``observation`` is what the controller reads (a state-like pytree), ``code`` a
    () int32 status code, non-zero to stop the vehicle (an estimator that diverged:
    ``status.ESTIMATOR``). ``record(observation, carry)`` → what is kept per tick in
    :attr:`Trajectory.estimates` (default: the observation). ``result(carry)`` →
    :attr:`Trajectory.observer`. Observers are pytrees or hashable; their parameters may be
    batched with the vehicles.
    """

    def init(self, params, state0, dt):
        return None

    def update(self, carry, sense: Sense):
        return sense.state, carry, jnp.zeros((), jnp.int32)

    def record(self, observation, carry):
        return observation

    def result(self, carry):
        return carry


@dataclasses.dataclass(frozen=True)
class _Stateless(Observer):
    """``observe(params, state, t)`` (a plain function) in the observer slot."""

    fn: Callable

    def update(self, carry, sense):
        return self.fn(sense.params, sense.state, sense.t), carry, jnp.zeros((), jnp.int32)


class Hook:
    """A per-tick observer of one vehicle; subclass and override what you need.

    ``init(params, state0, dt)`` → carry. ``update(carry, tick)`` → ``(carry, code, output)``:
    ``code`` a () int32 status code, non-zero to stop the vehicle (:mod:`quadjax.status`);
    ``output`` a pytree kept every ``save_every``-th tick (None for none). ``result(carry)``
    → what :attr:`Trajectory.hooks` holds for it. Hooks must be hashable (static).
    """

    def init(self, params: QuadParams, state0: QuadState, dt):
        return None

    def update(self, carry, tick: Tick):
        return carry, jnp.zeros((), jnp.int32), None

    def result(self, carry):
        return carry


@dataclasses.dataclass(frozen=True)
class Reduce(Hook):
    """A streaming reduction: ``fn(carry, state) -> carry`` folded over the state after every
    tick, from ``init``: a 10⁶-vehicle sweep then never holds (N, T, ...) in memory."""

    fn: Callable
    init_value: Any = None

    def init(self, params, state0, dt):
        return self.init_value

    def update(self, carry, tick):
        return self.fn(carry, tick.after), jnp.zeros((), jnp.int32), None


class Vehicle:
    """A vehicle model other than the quadrotor, flown by :func:`simulate`.

    Its params name it in an attribute ``vehicle`` (of the class, or a property that picks one by
    a static field, as the missile's attitude form does); :func:`simulate` then asks it:

    * ``boundary(params, state0, dt) -> (params, state0, dt, dtype, width)``: shapes of one
      vehicle checked (ValueError naming the field), params and ``dt`` cast to the state's
      dtype; ``width`` is the command's length;
    * ``check_params(params)``: ValueError naming the first bad field (concrete params);
    * ``params_valid(params) -> () bool``: the same judgement, traceable;
    * ``fastest_rate(params) -> () 1/s``: the params' own fastest rate, against which the
      engine judges the step as for the quadrotor (ValueError, or status ``coarse_step``);
      ``rate_name`` says what it is;
    * ``steppers``: integrator name → ``stepper(params, state, command, h) -> state``;
    * ``violation(params, state) -> () int32``: the monitor's judgement of a state
      (:mod:`quadjax.status` codes; by default I4, ``non_finite``), run after every tick with
      ``check="monitor"`` or ``"raise"``.

    The engine does the rest as for the quadrotor: ``dt`` and a finite ``state0`` checked,
    ``params_invalid`` / ``coarse_step`` status codes for traced params.
    """

    name = "vehicle"
    rate_name = "fastest rate"
    steppers: dict = {}

    def boundary(self, params, state0, dt):
        raise NotImplementedError

    def check_params(self, params):
        raise NotImplementedError

    def params_valid(self, params):
        raise NotImplementedError

    def fastest_rate(self, params):
        raise NotImplementedError

    def violation(self, params, state):
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(state)]))
        return jnp.where(finite, codes.OK, NON_FINITE).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class _VehicleMonitor(Hook):
    """``check="monitor"`` for another :class:`Vehicle`: its ``violation`` after every tick."""

    vehicle: Vehicle

    def update(self, carry, tick):
        return carry, self.vehicle.violation(tick.params, tick.after), None


def _vehicle_of(params) -> Vehicle | None:
    """None for the quadrotor's :class:`QuadParams`, else the :class:`Vehicle` the params name."""
    if isinstance(params, QuadParams):
        return None
    vehicle = getattr(params, "vehicle", None)
    if not isinstance(vehicle, Vehicle):
        raise ValueError(f"params: expected a QuadParams or the params of a quadjax.Vehicle, "
                         f"got {type(params).__name__}")
    return vehicle


@functools.partial(jax.tree_util.register_dataclass, data_fields=[
    "final", "states", "commands", "estimates", "ctrl_state", "observer", "status", "status_tick", "report", "hooks",
    "outputs"],
    meta_fields=["config", "backend"])
@dataclasses.dataclass(frozen=True)
class Trajectory:
    """What :func:`simulate` returns (leading batch axes when batched).

    final: QuadState (another :class:`Vehicle`: its state) after the last tick (a stopped vehicle:
        its state when it stopped).
    states: QuadState (T // save_every, ...) after every ``save_every``-th tick, or None.
    commands: (T // save_every, R) the commands of those ticks [rad/s], or None (after a vehicle
        stopped: the command of the tick it stopped in, frozen like its state).
    estimates: what the :class:`Observer` gave the controller in those ticks, or None.
    ctrl_state: the controller's final state (None in open loop).
    observer: the observer's ``result`` (None without one).
    status: () int32, :mod:`quadjax.status` code of the vehicle (0: flew to the end).
    status_tick: () int32, the tick in which it stopped (0 for invalid params), −1 if it did not.
    report: the monitor's :class:`quadjax.monitor.MonitorReport` (``config.check`` on), else None.
    hooks: per hook, its ``result``. outputs: per hook, its saved per-tick outputs, or None.
    config, backend: the run's :class:`SimConfig` and the backend that ran (static).
    """

    final: QuadState
    states: QuadState | None
    commands: jax.Array | None
    estimates: Any
    ctrl_state: Any
    observer: Any
    status: jax.Array
    status_tick: jax.Array
    report: Any
    hooks: tuple
    outputs: tuple
    config: SimConfig
    backend: str

    @property
    def ok(self):
        """True where the vehicle flew to the end (status 0)."""
        return self.status == codes.OK


# --------------------------------------------------------------------------- the boundary


def _cast_inputs(params, state0, dt):
    """Check the types at the boundary and cast params and dt to the state's dtype."""
    if not isinstance(state0, QuadState):
        raise ValueError(f"state0: expected a QuadState, got {type(state0).__name__}")
    if not isinstance(params, QuadParams):
        raise ValueError(f"params: expected a QuadParams, got {type(params).__name__}")
    dtype = float_dtype(jnp.result_type(state0.position), "simulate: state0.position (its dtype sets the run's)")
    R = params.rotor_spins.shape[-1] if jnp.ndim(params.rotor_spins) else 0
    _check_shapes(params, state0, R)
    state0 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), state0)
    return params.astype(dtype), state0, jnp.asarray(dt, dtype), dtype, R


def _check_shapes(params: QuadParams, state0: QuadState, R: int):
    """Shapes of one vehicle (chex), so a batched argument passed unbatched fails here, by name."""
    if jnp.shape(state0.rotor_speeds)[-1:] != (R,):
        raise ValueError(f"simulate: state0.rotor_speeds has shape {jnp.shape(state0.rotor_speeds)} but the params "
                         f"have {R} rotors (rotor_spins {jnp.shape(params.rotor_spins)}): one vehicle's state expected")
    try:
        chex.assert_shape([params.mass, params.k_f, params.motor_tau], ())
        chex.assert_shape(params.inertia, (3, 3))
        chex.assert_shape(params.rotor_positions, (R, 3))
        chex.assert_shape(params.rotor_spins, (R,))
        chex.assert_shape([state0.position, state0.velocity, state0.body_rates], (3,))
        chex.assert_shape(state0.attitude, (4,))
        chex.assert_shape(state0.rotor_speeds, (R,))
        chex.assert_shape([state0.energy, state0.on_ground], ())
    except AssertionError as err:
        raise ValueError(f"simulate: one vehicle's params and state expected (batch with jax.vmap or "
                         f"map_vehicles): {err}") from None


def _check_concrete(params, state0, dt, config: SimConfig, vehicle: Vehicle | None = None):
    """Values that are concrete at trace time are checked here, with a message; traced ones
    become per-vehicle status codes (:func:`quadjax.resolution.start_code`) instead."""
    leaves = [*jax.tree_util.tree_leaves(params), dt]
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return
    try:
        (check_params if vehicle is None else vehicle.check_params)(params)
    except ValueError as err:
        raise ValueError(f"simulate: invalid params: {err}") from None
    if not (float(dt) > 0 and np.isfinite(float(dt))):
        raise ValueError(f"simulate: dt = {float(dt)}: expected a finite time step > 0 [s]")
    h, limit = float(dt) / config.substeps, _stability(config, vehicle)
    if vehicle is None:
        rate, what = float(fixed_rate(params)), "drag or gyroscopic coupling, quadjax.resolution.fixed_rate"
    else:
        rate, what = float(vehicle.fastest_rate(params)), vehicle.rate_name
    if limit is not None and rate * h > limit:
        raise ValueError(
            f"simulate: step dt/substeps = {h:g} s is unstable for these params: their fastest rate "
            f"({what}) is {rate:.4g} 1/s and {getattr(config.integrator, '__name__', config.integrator)} "
            f"needs rate × step <= {limit:.3g}; use dt/substeps <= {limit / rate:.3g} s")
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(state0)):
        try:
            chex.assert_tree_all_finite(state0)
        except AssertionError:
            raise ValueError("simulate: state0 has a non-finite value") from None


def _series(name, x, num_ticks, width, dtype):
    if x is None:
        return None
    x = jnp.asarray(x, dtype)
    if x.shape != (num_ticks, width):
        raise ValueError(f"inputs.{name}: shape {x.shape}, expected ({num_ticks}, {width}) (one row per tick)")
    return x


def _stability(config: SimConfig, vehicle: Vehicle | None) -> float | None:
    """The largest λ·h the run's stepper is stable at (None: a stepper of the caller's)."""
    if vehicle is None:
        return config.stability
    return STABILITY.get(config.integrator) if isinstance(config.integrator, str) else None


def why_not_native(config: SimConfig, rotors: int, dtype) -> str | None:
    """Why a run with ``config``, ``rotors`` and ``dtype`` would not run its physics in the
    native kernel (None: it would, unless ``backend="xla"``)."""
    if config.stepper is not rk4_step:
        return "it runs the library's RK4 only"
    if not native.supports(rotors, dtype):
        return f"it covers {native.ROTOR_COUNTS} rotors in {native.DTYPES}"
    if native.on_gpu():
        return None  # the Pallas kernel (quadjax.gpu), generated from the same step
    if jax.default_backend() != "cpu":
        return f"it runs on the CPU (generated C) and on GPUs (Pallas), not on {jax.default_backend()}"
    if not native.available(dtype, rotors):
        return native.unavailable_reason(dtype, rotors)
    return None


def _use_native(config: SimConfig, rotors: int, dtype) -> bool:
    """Whether the physics runs in the native kernel (``backend="native"`` insists)."""
    if config.backend == "xla":
        return False
    why = why_not_native(config, rotors, dtype)
    if why and config.backend == "native":
        raise ValueError(f"backend='native': not available here ({why})")
    return why is None


# --------------------------------------------------------------------------- the engine


def simulate(
    params: QuadParams,
    state0: QuadState,
    dt,
    *,
    commands=None,
    controller: Callable | None = None,
    ctrl_params=None,
    ctrl_state=None,
    num_ticks: int | None = None,
    inputs: Inputs | None = None,
    observe: "Callable | Observer | None" = None,
    edit: Callable | None = None,
    hooks: tuple = (),
    config: SimConfig = SimConfig(),
) -> Trajectory:
    """Fly one vehicle for ``num_ticks`` ticks of ``dt`` [s]; returns a :class:`Trajectory`.

    Open loop: ``commands`` (T, R) rotor-speed commands [rad/s], one per tick (``num_ticks``
    is then T). Closed loop: ``controller(ctrl_params, ctrl_state, observation, t) ->
    (command (R,), ctrl_state)`` runs at t = k·dt, its command held for the tick; the
    observation is the true state, or ``observe(params, state, t)``, or what an
    :class:`Observer` (sensors and an estimator, :mod:`quadjax.estimation`) makes of the
    truth. An Observer also runs in open loop (its estimates saved, nothing steered by them).
    ``inputs``: per-tick :class:`Inputs` (wind, wrench). ``edit(state, k) -> state``: the
    caller's code run on the state before tick k (the monitor checks what it produces).
    ``hooks``: per-tick :class:`Hook` s (crash rules, reductions). ``config``: :class:`SimConfig`.

    Batch with ``jax.vmap`` (``vehicle_axes`` for params) or :func:`map_vehicles`.
    """
    if not isinstance(config, SimConfig):
        raise ValueError(f"config: expected a SimConfig, got {type(config).__name__}")
    vehicle = _vehicle_of(params)
    if vehicle is None:
        params, state0, dt, dtype, R = _cast_inputs(params, state0, dt)
    else:
        params, state0, dt, dtype, R = vehicle.boundary(params, state0, dt)
        _vehicle_options(vehicle, config, inputs)
    if (commands is None) == (controller is None):
        raise ValueError("simulate: give either commands= (open loop) or controller= (closed loop)")
    if commands is not None:
        commands = jnp.asarray(commands, dtype)
        if commands.ndim != 2 or commands.shape[1] != R:
            raise ValueError(f"commands: shape {commands.shape}, expected (T, {R}) "
                             f"{'rotor-speed commands' if vehicle is None else 'commands'}")
        if num_ticks is not None and num_ticks != commands.shape[0]:
            raise ValueError(f"num_ticks={num_ticks} but commands has {commands.shape[0]} rows")
        num_ticks = commands.shape[0]
        if observe is not None and not isinstance(observe, Observer):
            raise ValueError("simulate: observe= a function needs a controller (open loop replays commands); "
                             "an Observer runs in open loop too")
    if observe is not None and not isinstance(observe, Observer):
        if not callable(observe):
            raise ValueError(f"observe: expected a function or a quadjax.Observer, got {type(observe).__name__}")
        observe = _Stateless(observe)
    if not isinstance(num_ticks, int) or isinstance(num_ticks, bool) or num_ticks < 1:
        raise ValueError(f"num_ticks={num_ticks!r}: expected an int >= 1 (static under jit)")
    if config.save_every and num_ticks % config.save_every:
        raise ValueError(f"SimConfig.save_every={config.save_every}: must divide num_ticks ({num_ticks})")
    inputs = Inputs() if inputs is None else inputs
    wind = _series("wind", inputs.wind, num_ticks, 3, dtype)
    wrench = _series("wrench", inputs.wrench, num_ticks, 6, dtype)
    hooks = tuple(hooks)
    if any(not isinstance(h, Hook) for h in hooks):
        raise ValueError("hooks: expected Hook instances (quadjax.engine.Hook, Reduce, ...)")
    if not isinstance(config.integrator, str) and config.stepper not in STEPPERS.values() and wrench is not None:
        raise ValueError("inputs.wrench needs one of the library's steppers (euler, semi-implicit, rk4)")
    _check_concrete(params, state0, dt, config, vehicle)
    if vehicle is not None:
        if config.check != "off":
            hooks = (_VehicleMonitor(vehicle),) + hooks
        physics = _VehiclePhysics(vehicle, params, dt, config, R)
        policy, cs0, per_tick = _policy(commands, controller, ctrl_params, ctrl_state)
        traj = _run(physics, state0, cs0, policy, per_tick, None, None, num_ticks, hooks, edit, observe, config,
                    "xla")
        if config.check == "raise":
            _raise_on_violation(traj)
        return traj
    on_native = _use_native(config, R, dtype)
    backend = "native" if on_native else "xla"
    if config.check != "off":
        from quadjax.monitor import Monitor

        hooks = (Monitor(wind=wind is not None, wrench=wrench is not None, config=config),) + hooks

    if commands is not None and not hooks and edit is None and observe is None:  # the fast open loop
        final, states = _open_loop(params, state0, commands, dt, wind, wrench, config, on_native)
        # invalid params (I1) or an unstable step are flagged (status 6, 10) but flown: this bare
        # open loop is what optimisers (sysid, MPC) differentiate, and freezing would zero their
        # gradient the moment a step leaves the valid set. Anything with per-tick work stops them
        # at t = 0.
        start = start_code(params, dt / config.substeps, config.stability)
        saved = commands[config.save_every - 1::config.save_every] if config.save_every else None
        return Trajectory(
            final=final, states=states if "state" in config.save else None,
            commands=saved if "command" in config.save else None, estimates=None, ctrl_state=None, observer=None,
            status=start, status_tick=jnp.where(start == codes.OK, -1, 0).astype(jnp.int32),
            report=None, hooks=(), outputs=(),
            config=config, backend=backend)

    policy, cs0, per_tick = _policy(commands, controller, ctrl_params, ctrl_state)
    # the whole horizon in one native call (quadjax.native.loop), series streamed in and saved
    # outputs streamed out: the physics then in the component form, compiled with the rest of the
    # tick (not under jax.checkpoint: the native loop's derivatives run the XLA scan whole)
    whole = on_native and not config.checkpoint and jax.default_backend() == "cpu"
    traj = None
    if whole:
        physics = _Physics(params, dt, config, False, R)
        traj = _run(physics, state0, cs0, policy, per_tick, wind, wrench, num_ticks, hooks, edit, observe, config,
                    backend, whole=True)
    if traj is None:  # not whole, or a tick the generator cannot compile: the physics' kernel per tick
        physics = _Physics(params, dt, config, on_native, R)
        traj = _run(physics, state0, cs0, policy, per_tick, wind, wrench, num_ticks, hooks, edit, observe, config,
                    backend)
    if config.check == "raise":
        _raise_on_violation(traj)
    return traj


def _policy(commands, controller, ctrl_params, ctrl_state):
    """(policy, its initial state, per-tick input): the replay of ``commands`` (open loop) or
    the controller on the observation."""
    if commands is not None:
        return _replay, None, commands
    return functools.partial(_closed_loop, controller, ctrl_params), ctrl_state, None


def _vehicle_options(vehicle: Vehicle, config: SimConfig, inputs):
    """Options only the quadrotor has, refused by name for another vehicle."""
    if inputs is not None and (inputs.wind is not None or inputs.wrench is not None):
        raise ValueError(f"simulate: {vehicle.name} takes no wind or wrench inputs (the quadrotor's)")
    if config.backend == "native":
        raise ValueError(f"backend='native': the kernel flies the quadrotor model, not {vehicle.name}")
    if isinstance(config.integrator, str) and config.integrator not in vehicle.steppers:
        raise ValueError(f"SimConfig.integrator={config.integrator!r}: {vehicle.name} has "
                         f"{sorted(vehicle.steppers)} (or pass a stepper function)")


def _replay(cs, obs, t, u_k):
    """The open-loop policy: this tick's row of ``commands``."""
    return u_k, cs


def _closed_loop(controller, ctrl_params, cs, obs, t, u_k):
    """The closed-loop policy: ``controller`` on the observation (``u_k`` is None)."""
    return controller(ctrl_params, cs, obs, t)


class _Physics:
    """One tick's physics on the carry form of the state: packed rows for the native kernel,
    component tuples for XLA (split once before the scan)."""

    def __init__(self, params, dt, config, on_native, R):
        self.params, self.dt, self.config, self.native, self.R = params, dt, config, on_native, R
        self.h = dt / config.substeps
        if on_native:
            self.advance_native = _native_advance(params, dt, config.substeps)
        else:
            self.P = split_params(params)
            self.step_c = component_stepper(config.stepper)

    def start(self):
        """The vehicle's status before the first tick."""
        return start_code(self.params, self.h, self.config.stability)

    def pack(self, state: QuadState):
        return native.pack_state(state) if self.native else split_state(state)

    def view(self, carry) -> QuadState:
        return native.unpack_state(carry, self.R) if self.native else join_state(carry)

    def advance(self, carry, command, wind_t, wrench_t):
        """``substeps`` steps of ``dt / substeps`` with ``command`` (R,) held."""
        if self.native:
            return self.advance_native(carry, command, wind_t, wrench_t)
        P = self.P if wind_t is None else self.P.replace(wind=tuple(split(wind_t)))
        external = None if wrench_t is None else (tuple(split(wrench_t[:3])), tuple(split(wrench_t[3:])))
        return _hold(self.step_c, P, carry, split(command), self.dt / self.config.substeps, self.config.substeps,
                     external)


class _VehiclePhysics:
    """:class:`_Physics` for another :class:`Vehicle`: its state is the carry, its stepper
    steps it."""

    def __init__(self, vehicle: Vehicle, params, dt, config: SimConfig, width):
        self.vehicle, self.params, self.dt, self.config, self.R = vehicle, params, dt, config, width
        self.h = dt / config.substeps
        integrator = config.integrator
        self.stepper = vehicle.steppers[integrator] if isinstance(integrator, str) else integrator

    def start(self):
        v = self.vehicle
        return status_at_start(v.params_valid(self.params), v.fastest_rate(self.params), self.h,
                               _stability(self.config, v))

    def pack(self, state):
        return state

    def view(self, carry):
        return carry

    def advance(self, carry, command, wind_t, wrench_t):
        def step(params, x, u, h, external):  # _hold's stepper form (no external wrench here)
            return self.stepper(params, x, u, h)

        return _hold(step, self.params, carry, command, self.h, self.config.substeps, None)


def _hold(step_c, P, S, u, h, substeps, external):
    """``substeps`` steps of ``h`` with command ``u`` held, all in component form."""
    if substeps == 1:
        return step_c(P, S, u, h, external)
    S, _ = jax.lax.scan(lambda s, _: (step_c(P, s, u, h, external), None), S, None, length=substeps)
    return S


def _where(flag, a, b):
    return jax.tree_util.tree_map(lambda x, y: jnp.where(flag, x, y), a, b)


def _run(physics, state0, cs0, policy, per_tick, wind, wrench, num_ticks, hooks, edit, observer, config, backend,
         whole=False):
    """The tick scan with hooks: every closed loop, every checked, hooked or observed run.
    ``whole``: the ticks go to :func:`quadjax.native.loop.run_ticks`; None if it cannot compile them."""
    params, dt = physics.params, physics.dt
    dtype = dt.dtype
    start = physics.start()  # a vehicle that does not start ok never flies
    ok = start == codes.OK
    R = physics.R
    carry0 = dict(
        x=physics.pack(state0), cs=cs0, flying=ok, u=jnp.zeros((R,), dtype),
        status=start, status_tick=jnp.where(ok, -1, 0).astype(jnp.int32),
        hooks=tuple(h.init(params, state0, dt) for h in hooks),
        obs=None if observer is None else observer.init(params, state0, dt),
    )
    xs = (jnp.arange(num_ticks, dtype=jnp.int32), per_tick, wind, wrench)

    def tick(c, x):
        k, u_k, wind_t, wrench_t = x
        t = k.astype(dtype) * dt
        state = physics.view(c["x"])
        before = state if edit is None else edit(state, k)
        x_in = c["x"] if edit is None else physics.pack(before)
        code = jnp.zeros((), jnp.int32)
        if observer is None:
            seen, obs1 = before, None
        else:
            seen, obs1, code = observer.update(c["obs"], Sense(k=k, t=t, params=params, state=before, command=c["u"],
                                                               wind=wind_t, wrench=wrench_t))
            code = jnp.asarray(code, jnp.int32)
        command, cs1 = policy(c["cs"], seen, t, u_k)
        command = jnp.asarray(command, dtype)
        x1 = physics.advance(x_in, command, wind_t, wrench_t)
        after = physics.view(x1)
        info = Tick(k=k, t=t, params=params, before=before, command=command, after=after, ctrl_state=cs1,
                    wind=wind_t, wrench=wrench_t, flying=c["flying"], h=physics.h,
                    estimate=None if observer is None else seen)
        new_hooks, outputs = [], []
        for hook, hc in zip(hooks, c["hooks"]):
            hc, hook_code, out = hook.update(hc, info)
            code = jnp.where(code == 0, jnp.asarray(hook_code, jnp.int32), code)
            new_hooks.append(hc)
            outputs.append(out)
        stop = c["flying"] & (code != 0)
        flying = c["flying"] & (code == 0)
        c1 = dict(
            x=_where(flying, x1, c["x"]), cs=_where(flying, cs1, c["cs"]), flying=flying,
            u=jnp.where(c["flying"], command, c["u"]),  # a stopped vehicle's command is frozen too
            status=jnp.where(stop, code, c["status"]), status_tick=jnp.where(stop, k, c["status_tick"]),
            hooks=tuple(new_hooks), obs=None if observer is None else _where(flying, obs1, c["obs"]),
        )
        y = {"outputs": tuple(outputs)}
        if "state" in config.save:
            y["state"] = physics.view(c1["x"])
        if "command" in config.save:
            y["command"] = c1["u"]
        if "estimate" in config.save and observer is not None:
            y["estimate"] = observer.record(seen, c1["obs"])
        return c1, y

    if whole:
        from quadjax.native.loop import run_ticks

        ran = run_ticks(lambda c, k, x: tick(c, (k, *x)), carry0, xs[1:], num_ticks, config.save_every)
        if ran is None:
            return None
        c, out = ran
    else:
        c, out = _drive(tick, carry0, xs, num_ticks, config)
    saved = out or {}
    results = tuple(h.result(hc) for h, hc in zip(hooks, c["hooks"]))
    return Trajectory(
        final=physics.view(c["x"]), states=saved.get("state"), commands=saved.get("command"),
        estimates=saved.get("estimate"), ctrl_state=c["cs"],
        observer=None if observer is None else observer.result(c["obs"]),
        status=c["status"], status_tick=c["status_tick"],
        report=results[0] if config.check != "off" else None,
        hooks=results,
        outputs=tuple(saved["outputs"]) if out is not None else tuple(None for _ in hooks),
        config=config, backend=backend,
    )


def _drive(tick, carry0, xs, num_ticks, config: SimConfig):
    """Scan ``tick(carry, x) -> (carry, y)`` over the ticks; ``y`` kept every ``save_every``-th
    tick, stacked on a leading time axis (None for ``save_every`` = 0)."""
    body = jax.checkpoint(tick) if config.checkpoint else tick
    return scan_ticks(body, carry0, xs, num_ticks, config.save_every, config.unroll)


def scan_ticks(body, carry0, xs, num_ticks: int, every: int, unroll: int = 1):
    """The engine's time loop on XLA: ``lax.scan`` of ``body(carry, x) -> (carry, y)`` over
    ``xs`` (leading axis ``num_ticks``), ``y`` kept every ``every``-th tick, stacked on a leading
    time axis (None for ``every`` = 0); the other ticks' ``y`` is never computed."""
    def quiet(c, x):
        return body(c, x)[0], None

    if not every:
        return jax.lax.scan(quiet, carry0, xs, length=num_ticks, unroll=unroll)[0], None
    if every == 1:
        return jax.lax.scan(body, carry0, xs, length=num_ticks, unroll=unroll)
    blocks = jax.tree_util.tree_map(lambda x: x.reshape((-1, every) + x.shape[1:]), xs)

    def block(c, xb):
        c, _ = jax.lax.scan(quiet, c, jax.tree_util.tree_map(lambda x: x[:-1], xb), unroll=unroll)
        return body(c, jax.tree_util.tree_map(lambda x: x[-1], xb))

    return jax.lax.scan(block, carry0, blocks)


def _raise_on_violation(traj: Trajectory):
    """``config.check="raise"``: a checkify error naming the invariant, the vehicle and the tick.

    Run the jitted call under ``checkify.checkify`` (or ``chex.chexify``) and ``.throw()``. The
    vehicle is its index in :func:`map_vehicles` (with or without ``mesh``; with ``block`` the
    tiles are ``lax.map``-ped, which names no axis, and the index reads 0); 0 for a single
    vehicle."""
    try:
        vehicle = jax.lax.axis_index(VEHICLE_AXIS)
    except NameError:  # not inside map_vehicles: one vehicle
        vehicle = jnp.zeros((), jnp.int32)
    if _SHARD_OFFSET:  # inside map_vehicles(mesh=...): the device's share starts there
        vehicle = vehicle + _SHARD_OFFSET[-1]
    for code in range(1, len(codes.STATUS_IDS)):  # checkify formats arrays, not strings: one check per code
        checkify.check(traj.status != code,
                       f"quadjax: {codes.describe_code(code)} in vehicle {{vehicle}} at tick {{tick}}",
                       vehicle=vehicle, tick=traj.status_tick)


# --------------------------------------------------------------------------- the open loop fast path


def _open_loop(params, state0, commands, dt, wind, wrench, config, on_native):
    """The whole horizon, no per-tick work: one kernel call, or the XLA scan on components."""
    if on_native and native.on_gpu():
        return _open_loop_gpu(params, state0, commands, dt, wind, wrench, config)
    if on_native:
        # differentiable: the kernel's own tangent and adjoint (quadjax.native.rollout_p)
        return _open_loop_kernel(params, state0, commands, dt, wind, wrench, config)
    return _open_loop_xla(params, state0, commands, dt, wind, wrench, config)


def _open_loop_kernel(params, state0, commands, dt, wind, wrench, config):
    """The open loop in one kernel call (C on the CPU, Pallas on a GPU), on unpacked states."""
    R = commands.shape[1]
    final, saved = native.rollout_states(params, native.pack_state(state0), commands, dt, wind, wrench,
                                         substeps=config.substeps, save_every=config.save_every)
    return native.unpack_state(final, R), saved


def _open_loop_gpu(params, state0, commands, dt, wind, wrench, config):
    """The open loop on a GPU: the Pallas kernel forward; its derivatives (any mode, any order)
    those of :func:`_open_loop_xla` on the caller's own pytrees.

    Why not rollout_p's rule: that one differentiates the kernel's packed rows, where every
    parameter is per vehicle once one is (``pack_params`` concatenates them), so under ``vmap``
    the XLA derivative carries all ~60 parameters per vehicle per step. On an H200, ``jax.grad``
    that way took 1.86 s against 0.55 s for ``backend="xla"`` (N = 1e4, T = 1000,
    benchmarks/GPU_RESULTS.md); here ``vmap`` batches only the leaves that vary."""
    fly = jax.custom_jvp(functools.partial(_open_loop_kernel, config=config))
    xla = functools.partial(_open_loop_xla, config=config)
    # the primal through ``fly`` again, not the kernel: a derivative of the rule (second order)
    # then lands on this rule too, never on rollout_p's
    fly.defjvp(lambda primals, tangents: (fly(*primals), jax.jvp(xla, primals, tangents)[1]))
    return fly(params, state0, commands, dt, wind, wrench)


def _open_loop_xla(params, state0, commands, dt, wind, wrench, config):
    """The open loop on XLA: per-tick inputs scanned as one (T,) series per component, so under
    vmap each step reads contiguous (N,) rows, not strided columns of (N, R) (2× faster)."""
    P, S = split_params(params), split_state(state0)
    step_c = component_stepper(config.stepper)
    h = dt / config.substeps
    xs = (split(commands), None if wind is None else split(wind), None if wrench is None else split(wrench))

    def tick(S, x):
        u, wind_t, wrench_t = x
        P_t = P if wind_t is None else P.replace(wind=tuple(wind_t))
        external = None if wrench_t is None else (tuple(wrench_t[:3]), tuple(wrench_t[3:]))
        S = _hold(step_c, P_t, S, u, h, config.substeps, external)
        return S, join_state(S)

    final, states = _drive(tick, S, xs, commands.shape[0], config)
    return join_state(final), states


def _native_advance(params, dt, substeps):
    """``advance(x, command, wind_t, wrench_t) -> x``: one tick's physics in the kernel on a
    packed state ``x`` (``wind_t`` (3,) / ``wrench_t`` (6,) or None)."""
    def advance(x, command, wind_t, wrench_t):
        rows = [None if v is None else v[None] for v in (wind_t, wrench_t)]
        return native.rollout(params, x, command[None], dt, *rows, substeps=substeps, save_every=0)[0]

    return advance


# --------------------------------------------------------------------------- batching

VEHICLE_AXIS = "vehicles"
#: trace-time stack: inside map_vehicles(mesh=...), the index of the device's first vehicle
_SHARD_OFFSET: list = []


def vehicle_axes(params: QuadParams, *fields: str) -> QuadParams:
    """An ``in_axes`` pytree for ``params``: 0 (one value per vehicle) for ``fields``, None (shared) for the rest.

    ``vehicle_axes(p)`` with no field names maps every leaf. Example: a mass sweep with
    everything else shared is ``vehicle_axes(p, "mass")`` with ``p.mass`` (N,).
    """
    names = [f for f in params.__dataclass_fields__]
    unknown = [f for f in fields if f not in names]
    if unknown:
        raise ValueError(f"vehicle_axes: unknown QuadParams fields {unknown}")
    chosen = set(fields) if fields else set(names)
    return params.replace(**{f: (0 if f in chosen else None) for f in names})


def expand_axes(axes, tree):
    """Broadcast an in_axes prefix (None/0 or a pytree of them) to the full structure of ``tree``."""
    return jax.tree_util.tree_map(
        lambda a, sub: jax.tree_util.tree_map(lambda _: a, sub),
        axes, tree, is_leaf=lambda a: a is None or isinstance(a, int),
    )


def map_vehicles(fn, args: tuple, in_axes: tuple, *, block: int | None = None, mesh=None):
    """``jax.vmap(fn, in_axes)(*args)`` over vehicles, outputs batch-first (N, ...).

    The one batch helper: ``fn`` is typically a lambda around :func:`simulate`.

    * ``block``: vehicles run ``block`` at a time (``lax.map`` over tiles, each tile vmapped
      through the whole horizon); same results per vehicle.
    * ``mesh``: a one-axis ``jax.sharding.Mesh`` (:func:`quadjax.sharding.vehicle_mesh`): the
      vehicles are split across its devices (``shard_map``; N padded to a multiple of the
      device count with copies of the last vehicle, the padding dropped). Call it inside ``jit``.

    The vmap axis is named ``"vehicles"`` (``config.check="raise"`` names the vehicle by it).
    """
    args = tuple(args)
    axes = expand_axes(tuple(in_axes), args)
    leaves, treedef = jax.tree_util.tree_flatten(args)
    flat_axes = treedef.flatten_up_to(axes)
    if any(a not in (0, None) for a in flat_axes):
        raise ValueError("map_vehicles: in_axes entries must be 0 or None")
    sizes = {jnp.shape(x)[0] for x, a in zip(leaves, flat_axes) if a == 0}
    if not sizes:
        raise ValueError("map_vehicles: no argument is mapped over vehicles (all in_axes None)")
    if len(sizes) != 1:
        raise ValueError(f"map_vehicles: mapped arguments disagree on the number of vehicles {sorted(sizes)}")
    if block is not None and (not isinstance(block, int) or block < 1):
        raise ValueError(f"block={block!r}: expected an int >= 1")
    if mesh is not None:
        return _sharded(fn, leaves, treedef, flat_axes, in_axes, sizes.pop(), block, mesh)
    return _local(fn, leaves, treedef, flat_axes, block)


def _local(fn, leaves, treedef, flat_axes, block):
    """vmap over the vehicle axis, or ``lax.map`` over tiles of ``block`` vehicles (each tile
    vmapped through the whole horizon; a remainder tile handled)."""
    def call(*flat):
        return fn(*jax.tree_util.tree_unflatten(treedef, list(flat)))

    if block is None:
        return jax.vmap(call, in_axes=tuple(flat_axes), axis_name=VEHICLE_AXIS)(*leaves)
    mapped = [x for x, a in zip(leaves, flat_axes) if a == 0]

    def one(xs):
        it = iter(xs)
        return call(*[next(it) if a == 0 else x for x, a in zip(leaves, flat_axes)])

    return jax.lax.map(one, mapped, batch_size=block)


def _sharded(fn, leaves, treedef, flat_axes, in_axes, n, block, mesh):
    from jax.sharding import PartitionSpec as P

    name = mesh.axis_names[0]
    devices = mesh.devices.size
    pad = (-n) % devices

    def padded(x):
        return jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x

    leaves = [padded(jnp.asarray(x)) if a == 0 else x for x, a in zip(leaves, flat_axes)]
    specs = tuple(P(name) if a == 0 else P() for a in flat_axes)

    def local(*flat):
        # the first vehicle of this device's share, for check="raise" to name the vehicle
        _SHARD_OFFSET.append(jax.lax.axis_index(name) * ((n + pad) // devices))
        try:
            return _local(fn, list(flat), treedef, flat_axes, block)
        finally:
            _SHARD_OFFSET.pop()

    out = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(name), check_vma=False)(*leaves)
    return jax.tree_util.tree_map(lambda x: x[:n], out) if pad else out
