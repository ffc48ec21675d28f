"""What the MPC solvers share: the problem, the warm-started plan, prediction and cost.

Decision variable. Every solver plans the plant's own command: rotor speeds u (H, R)
[rad/s], held constant over each node (zero-order hold), inside the box
[ω_min, ω_max] of the *prediction model*. Internally the solvers work on the unit
box a = (u − ω_min) / (ω_max − ω_min) ∈ [0, 1], so noise levels, step sizes and
regularisation do not depend on the vehicle's size.

Static structure (horizon length, node spacing, integrator, samples, iterations) lives
in a frozen, hashable config (:class:`MPPI`, :class:`Shooting`, :class:`ILQR`); every
number a user may vmap or differentiate lives in :class:`MPCParams` (prediction model,
cost weights and reference, solver settings). Each config offers:

    init(params, observation, key=None) → MPCState          plan at the model's hover speed
    solve(params, mpc_state, observation, t) → MPCState     optimised plan (warm start = mpc_state.plan)
    control(params, mpc_state, observation, t) → (command (R,), MPCState)

``control`` has the signature of a :func:`quadjax.simulate` controller with
``ctrl_params = MPCParams`` and ``ctrl_state = MPCState``: it solves, applies the first
node and shifts the plan one controller tick for the next warm start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass
from quadjax.integrators import rk4_step
from quadjax.model import hover_rotor_speed
from quadjax.mpc.costs import stage_cost, terminal_cost
from quadjax.params import QuadParams, check_params
from quadjax.engine import SimConfig, simulate
from quadjax.state import QuadState

#: MPCState.status bits
STATUS_OK = 0
STATUS_NONFINITE_SOLVE = 1  # the solver's plan or cost was not finite: the warm start was kept
STATUS_NONFINITE_GUESS = 2  # the warm start's own cost was not finite (bad observation or model)


@pytree_dataclass
class MPCParams:
    """ctrl_params of an MPC controller.

    model: the :class:`~quadjax.QuadParams` the MPC predicts with (may differ from the plant).
    cost: a :class:`~quadjax.mpc.Cost` (its terms carry the reference and weights).
    solver: the solver's numbers (:class:`MPPIParams`, :class:`ShootingParams`, :class:`ILQRParams`).
    """

    model: QuadParams
    cost: object
    solver: object


@pytree_dataclass
class MPCState:
    """ctrl_state of an MPC controller.

    plan: (H, R) rotor-speed commands [rad/s], one per node (the warm start of the next solve).
    key: (2,) uint32 PRNG key (used by MPPI; carried unchanged by the others).
    cost: () J of the plan the last solve returned; guess_cost: () J of its warm start.
    status: () int32, bits STATUS_NONFINITE_SOLVE | STATUS_NONFINITE_GUESS (0 = ok).
    """

    plan: jax.Array
    key: jax.Array
    cost: jax.Array
    guess_cost: jax.Array
    status: jax.Array


def to_unit(model: QuadParams, plan):
    """a = (u − ω_min) / (ω_max − ω_min): rotor speeds [rad/s] → the unit box."""
    return (plan - model.omega_min) / (model.omega_max - model.omega_min)


def from_unit(model: QuadParams, a):
    """u = ω_min + a (ω_max − ω_min) [rad/s]: the unit box → rotor speeds."""
    return model.omega_min + a * (model.omega_max - model.omega_min)


def shift_plan(plan, nodes: float):
    """The plan advanced by ``nodes`` (a static float ≥ 0) node spacings: linear interpolation
    between nodes, the last node held beyond the end. (H, R) → (H, R)."""
    H = plan.shape[0]
    s = jnp.arange(H, dtype=plan.dtype) + nodes
    lo = jnp.clip(jnp.floor(s).astype(jnp.int32), 0, H - 1)
    hi = jnp.clip(lo + 1, 0, H - 1)
    frac = jnp.clip(s - jnp.floor(s), 0.0, 1.0)[:, None]
    frac = jnp.where((lo == H - 1)[:, None], 0.0, frac)
    return (1.0 - frac) * plan[lo] + frac * plan[hi]


def positive_int(owner, name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}.{name} = {value!r}: must be an int >= 1")


def _positive_float(owner, name, value):
    try:
        ok = float(value) > 0.0 and float(value) < float("inf")
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{owner}.{name} = {value!r}: must be a finite number > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """Static structure shared by the solvers (hashable: a jit static argument).

    horizon: H nodes; dt: node spacing [s] (the plan covers H·dt seconds);
    substeps: integrator steps per node (dt/substeps each, e.g. to keep RK4 stable
    with motor lag: dt/substeps < 2.8 τ); control_dt: the controller tick [s], by
    which ``control`` shifts the plan (None: one node); step: the stepper the
    prediction uses (the simulator's own ``rk4_step`` by default).
    """

    horizon: int
    dt: float
    substeps: int = 1
    control_dt: float | None = None
    step: Callable = rk4_step

    def __post_init__(self):
        name = type(self).__name__
        positive_int(name, "horizon", self.horizon)
        _positive_float(name, "dt", self.dt)
        positive_int(name, "substeps", self.substeps)
        if self.control_dt is not None:
            _positive_float(name, "control_dt", self.control_dt)

    # ---- shared pieces -------------------------------------------------------------

    def node_times(self, t, dtype):
        """t_k = t + k·dt, k = 0..H (H + 1,) [s]."""
        return jnp.asarray(t, dtype) + self.dt * jnp.arange(self.horizon + 1, dtype=dtype)

    def predict(self, params: MPCParams, observation: QuadState, plan):
        """The model's states after each node (H, ...) under ``plan`` (H, R) [rad/s]
        (:func:`quadjax.simulate` with the config's dt, substeps and stepper)."""
        config = SimConfig(integrator=self.step, substeps=self.substeps, save=("state",))
        return simulate(params.model, observation, self.dt, commands=plan, config=config).states

    def plan_cost(self, params: MPCParams, observation: QuadState, plan, t):
        """J of ``plan`` (H, R) [rad/s] from ``observation`` at time ``t`` [s] (see :class:`Cost`)."""
        states = self.predict(params, observation, plan)
        return self.cost_of(params, observation, states, plan, t)

    def cost_of(self, params, observation, states, plan, t):
        """J from predicted ``states`` (H, ...) (x₁..x_H) and the plan that made them."""
        dtype = plan.dtype
        times = self.node_times(t, dtype)
        before = jax.tree_util.tree_map(lambda x0, xs: jnp.concatenate([x0[None], xs[:-1]]), observation, states)
        stage = jax.vmap(lambda s, u, tk: stage_cost(params.cost, params.model, s, u, tk))(before, plan, times[:-1])
        last = jax.tree_util.tree_map(lambda xs: xs[-1], states)
        return self.dt * jnp.sum(stage) + terminal_cost(params.cost, params.model, last, times[-1])

    def check(self, params: MPCParams) -> None:
        """Raise ``ValueError`` naming the first bad prediction-model field or solver number
        (only where concrete: traced ones are the caller's, under jit)."""
        if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(params.model)):
            try:
                check_params(params.model)
            except ValueError as err:
                raise ValueError(f"{type(self).__name__}: the prediction model: {err}") from None
        for name, lower, strict in self.solver_bounds:
            value = getattr(params.solver, name)
            if isinstance(value, jax.core.Tracer):
                continue
            v = np.asarray(value)  # numpy: a concrete check must not be staged into a trace
            ok = bool(np.all(np.isfinite(v)) & np.all(v > lower if strict else v >= lower))
            if not ok:
                bound = f"> {lower}" if strict else f">= {lower}"
                raise ValueError(f"{type(params.solver).__name__}.{name} = {v.tolist()}: must be finite and {bound}")

    #: (field of the solver params, lower bound, strict) checked by :meth:`check`
    solver_bounds = ()

    def init(self, params: MPCParams, observation: QuadState, key=None) -> MPCState:
        """A state whose plan holds the model's hover speed on every node (checks the
        solver numbers first, see :meth:`check`)."""
        self.check(params)
        dtype = observation.position.dtype
        hover = hover_rotor_speed(params.model).astype(dtype)
        plan = jnp.broadcast_to(hover, (self.horizon,) + hover.shape)
        key = jax.random.PRNGKey(0) if key is None else jnp.asarray(key)
        zero = jnp.zeros((), dtype)
        return MPCState(plan=plan, key=key, cost=zero, guess_cost=zero, status=jnp.zeros((), jnp.int32))

    def control(self, params: MPCParams, state: MPCState, observation: QuadState, t):
        """One controller tick: solve, apply the first node, shift the plan one tick."""
        solved = self.solve(params, state, observation, t)
        shift = 1.0 if self.control_dt is None else self.control_dt / self.dt
        return solved.plan[0], solved.replace(plan=shift_plan(solved.plan, shift))

    def solve(self, params: MPCParams, state: MPCState, observation: QuadState, t) -> MPCState:
        raise NotImplementedError


def accept(state: MPCState, guess, guess_cost, plan, cost, key=None) -> MPCState:
    """Keep the better of the warm start and the solver's plan; flag non-finite results.

    A non-finite plan or cost never replaces a finite warm start, so one vehicle's bad
    solve cannot put NaN into its commands (or those of the batch).
    """
    finite = jnp.isfinite(cost) & jnp.all(jnp.isfinite(plan))
    better = finite & ~(cost > guess_cost)  # also taken when the guess cost is NaN
    status = (jnp.where(finite, 0, STATUS_NONFINITE_SOLVE)
              | jnp.where(jnp.isfinite(guess_cost), 0, STATUS_NONFINITE_GUESS)).astype(jnp.int32)
    return MPCState(
        plan=jnp.where(better, plan, guess),
        key=state.key if key is None else key,
        cost=jnp.where(better, cost, guess_cost),
        guess_cost=guess_cost,
        status=status,
    )
