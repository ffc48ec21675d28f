"""Model-predictive path integral control (Williams et al., 2017), on the simulator's dynamics.

Per iteration, K perturbed copies of the plan are rolled out through the prediction
model (vmap over samples, ``lax.scan`` over the horizon) and averaged with
exponential weights:

    a⁽ᵏ⁾ = clip(a + εᵏ, 0, 1),  εᵏ ~ N(0, diag(σ²)) per node and rotor (ε⁰ = 0: the current plan)
    wₖ = exp(−(Jₖ − min J) / λ) / Σ exp(…),   a ← Σₖ wₖ a⁽ᵏ⁾

a the plan on the unit box (see :mod:`quadjax.mpc.core`), λ the temperature in cost
units. Control limits hold by construction (each sample is clipped, a convex
combination stays inside). The control-cost term λ aᵀΣ⁻¹ε of the original derivation is
left out: it pulls towards a = 0 (rotors off), which is not a passive input for a
multirotor. Non-finite sample costs get zero weight.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from quadjax._pytree import pytree_dataclass
from quadjax.mpc.core import MPCParams, MPCState, PlanConfig, positive_int, accept, from_unit, to_unit
from quadjax.state import QuadState


@pytree_dataclass
class MPPIParams:
    """temperature λ () [cost units]; noise_std σ () or (R,) on the unit box [1]."""

    temperature: jax.Array
    noise_std: jax.Array

    @classmethod
    def default(cls, dtype=None) -> "MPPIParams":
        return cls(temperature=jnp.asarray(1.0, dtype), noise_std=jnp.asarray(0.05, dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MPPI(PlanConfig):
    """MPPI config: ``samples`` K rollouts per iteration, ``iterations`` per solve
    (plus the :class:`~quadjax.mpc.core.PlanConfig` fields)."""

    samples: int = 256
    iterations: int = 1

    solver_bounds = (("temperature", 0.0, True), ("noise_std", 0.0, False))

    def __post_init__(self):
        super().__post_init__()
        positive_int("MPPI", "samples", self.samples)
        positive_int("MPPI", "iterations", self.iterations)

    def solve(self, params: MPCParams, state: MPCState, observation: QuadState, t) -> MPCState:
        """One MPPI solve from the warm start ``state.plan``; consumes one PRNG split."""
        model, sp = params.model, params.solver
        a0 = to_unit(model, state.plan)
        key, sub = jax.random.split(state.key)

        def cost(a):
            return self.plan_cost(params, observation, from_unit(model, a), t)

        def iteration(a, k):
            eps = sp.noise_std * jax.random.normal(k, (self.samples,) + a.shape, a.dtype)
            eps = eps.at[0].set(0.0)
            candidates = jnp.clip(a + eps, 0.0, 1.0)
            J = jax.vmap(cost)(candidates)
            J = jnp.where(jnp.isfinite(J), J, jnp.inf)
            w = jax.nn.softmax(-(J - jnp.min(J)) / sp.temperature)
            w = jnp.where(jnp.isfinite(w), w, 0.0)
            return jnp.tensordot(w, candidates, axes=1), J[0]

        a, J_means = jax.lax.scan(iteration, a0, jax.random.split(sub, self.iterations))
        # sample 0 of the first iteration is the warm start itself
        return accept(state, state.plan, J_means[0], from_unit(model, a), cost(a), key=key)
