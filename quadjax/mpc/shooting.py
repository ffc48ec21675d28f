"""Gradient-based single shooting with optax: the plan is the parameter, J the loss.

Each iteration differentiates J through the whole predicted rollout (reverse mode through
``lax.scan`` of the model's stepper) and applies an optax update, optax's convention:

    g = ∇J(z),  updates, opt_state = optimizer.update(g, opt_state, z, value=J, grad=g, value_fn=J)
    z ← z + η · updates,   then z ← clip(z, 0, 1)   (box "clip": z = a, projection)
                            or a = σ(z)               (box "sigmoid": z unconstrained)

a the plan on the unit box (see :mod:`quadjax.mpc.core`), η = ``ShootingParams.step_scale``
(1 keeps the optimiser's own step). The default optimiser is L-BFGS with optax's zoom line
search (``optax.lbfgs()``): on this ill-conditioned problem (early commands move the whole
predicted path, late ones barely) it reaches in 3–5 iterations what Adam does not in 30.
Any optax transformation works (``value``, ``grad`` and ``value_fn`` are passed for those
that take them). The optimiser state restarts at every solve (its memory would not match
the shifted plan); the plan itself is warm-started. A fixed iteration budget; the best
iterate seen is returned.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from quadjax._pytree import pytree_dataclass
from quadjax.mpc.core import MPCParams, MPCState, PlanConfig, positive_int, accept, from_unit, to_unit
from quadjax.state import QuadState


@pytree_dataclass
class ShootingParams:
    """step_scale () [1]: multiplies the optimiser's updates (1 = the optimiser's own step)."""

    step_scale: jax.Array

    @classmethod
    def default(cls, dtype=None) -> "ShootingParams":
        return cls(step_scale=jnp.asarray(1.0, dtype))


def _logit(a):
    a = jnp.clip(a, 1e-4, 1.0 - 1e-4)
    return jnp.log(a) - jnp.log1p(-a)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shooting(PlanConfig):
    """Shooting config: ``iterations`` optimiser steps per solve; ``optimizer`` any optax
    transformation (updates are added, optax's convention; ``value``, ``grad`` and
    ``value_fn`` are passed for line searches such as ``optax.lbfgs()``); ``box``
    "clip" (projection after each step) or "sigmoid" (a = σ(z), z unconstrained)."""

    iterations: int = 10
    optimizer: optax.GradientTransformation = optax.lbfgs()
    box: str = "clip"

    solver_bounds = (("step_scale", 0.0, True),)

    def __post_init__(self):
        super().__post_init__()
        positive_int("Shooting", "iterations", self.iterations)
        if self.box not in ("clip", "sigmoid"):
            raise ValueError(f"Shooting.box = {self.box!r}: must be 'clip' or 'sigmoid'")

    def _to_z(self, a):
        return a if self.box == "clip" else _logit(a)

    def _to_a(self, z):
        return jnp.clip(z, 0.0, 1.0) if self.box == "clip" else jax.nn.sigmoid(z)

    def solve(self, params: MPCParams, state: MPCState, observation: QuadState, t) -> MPCState:
        model = params.model
        opt = optax.with_extra_args_support(self.optimizer)

        def cost(z):
            return self.plan_cost(params, observation, from_unit(model, self._to_a(z)), t)

        value_and_grad = jax.value_and_grad(cost)

        def iteration(carry, i):
            # iteration i evaluates the current plan, then steps; the extra last one only evaluates
            z, opt_state, best_z, best_J = carry
            J, g = value_and_grad(z)
            better = J < best_J
            best_z = jnp.where(better, z, best_z)
            best_J = jnp.where(better, J, best_J)

            def step(operand):
                z, opt_state = operand
                updates, opt_state = opt.update(g, opt_state, z, value=J, grad=g, value_fn=cost)
                z = z + params.solver.step_scale * updates
                return (jnp.clip(z, 0.0, 1.0) if self.box == "clip" else z), opt_state

            z, opt_state = jax.lax.cond(i < self.iterations, step, lambda operand: operand, (z, opt_state))
            return (z, opt_state, best_z, best_J), J

        z0 = self._to_z(to_unit(model, state.plan))
        inf = jnp.asarray(jnp.inf, z0.dtype)
        (_, _, best_z, best_J), Js = jax.lax.scan(iteration, (z0, opt.init(z0), z0, inf),
                                                 jnp.arange(self.iterations + 1))
        return accept(state, state.plan, Js[0], from_unit(model, self._to_a(best_z)), best_J)
