"""Iterative LQR (Li & Todorov 2004; Tassa et al. 2012) with linearisations by ``jax.jacfwd``.

:func:`ilqr` is the generic solver on flat vectors; :class:`ILQR` applies it to the
quadrotor, differentiating the model's own stepper (``rk4_step`` by default) on the
flattened :class:`~quadjax.QuadState`. One iteration:

    linearise   A_k = ∂f/∂x, B_k = ∂f/∂u (jacfwd, vmapped over the horizon);
                ℓ_x, ℓ_u and the Hessian of the stage cost in (x, u), projected onto the
                positive-semidefinite cone (negative eigenvalues set to 0; likewise φ_xx)
    backward    V_x, V_xx ← φ_x, φ_xx at x_H, then for k = H−1 … 0:
                Q_x = ℓ_x + Aᵀ V_x,  Q_u = ℓ_u + Bᵀ V_x
                Q_xx = ℓ_xx + Aᵀ V_xx A,  Q_uu = ℓ_uu + Bᵀ V_xx B,  Q_ux = ℓ_ux + Bᵀ V_xx A
                k_k = −Q̃_uu⁻¹ Q_u,  K_k = −Q̃_uu⁻¹ Q_ux   (Q̃_uu: eigenvalues floored at μ)
                V_x = Q_x + Kᵀ Q_uu k + Kᵀ Q_u + Q_uxᵀ k,  V_xx = Q_xx + Kᵀ Q_uu K + Kᵀ Q_ux + Q_uxᵀ K
    forward     for every α in ``alphas`` at once (vmap): x̂₀ = x₀,
                û_k = clip(u_k + α k_k + K_k (x̂_k − x_k), lower, upper), x̂_{k+1} = f(x̂_k, û_k)
                keep the cheapest; accept it only if it lowers J (so J never rises).

The projection convexifies non-convex terms (the keep-out sphere curves down around its
surface, the attitude error beyond 90°); without it V_xx turns indefinite there and the
line search stalls. On a linear system with convex quadratic cost and Q_uu ≻ μ I, the
first iteration with α = 1 is the exact finite-horizon LQR solution (discrete Riccati
recursion). Box limits are
enforced by the clip in the forward pass (the "clamped" variant, not box-DDP's QP).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from quadjax._pytree import pytree_dataclass
from quadjax.mpc.core import MPCParams, MPCState, PlanConfig, positive_int, accept, from_unit, to_unit
from quadjax.mpc.costs import stage_cost, terminal_cost
from quadjax.engine import SimConfig, simulate
from quadjax.state import QuadState


class ILQRResult(NamedTuple):
    """controls (H, m); states (H + 1, n) under them; cost (); initial_cost () of the
    initial guess; feedforward k (H, m) and gains K (H, m, n) of the last backward pass."""

    controls: jax.Array
    states: jax.Array
    cost: jax.Array
    initial_cost: jax.Array
    feedforward: jax.Array
    gains: jax.Array


def _floor_eigenvalues(M, mu):
    """The symmetric part of M with its eigenvalues raised to at least μ (μ = 0: the nearest
    positive-semidefinite matrix; μ > 0: a positive-definite Q̃_uu)."""
    S = 0.5 * (M + M.T)
    lam, V = jnp.linalg.eigh(S)
    return (V * jnp.maximum(lam, mu)) @ V.T


def _total_cost(stage, terminal, states, controls):
    ks = jnp.arange(controls.shape[0])
    return jnp.sum(jax.vmap(stage)(states[:-1], controls, ks)) + terminal(states[-1])


def _backward(fx, fu, lx, lu, lxx, luu, lux, vx, vxx, mu):
    def body(carry, d):
        Vx, Vxx = carry
        A, B, l_x, l_u, l_xx, l_uu, l_ux = d
        Qx = l_x + A.T @ Vx
        Qu = l_u + B.T @ Vx
        VA = Vxx @ A
        Qxx = l_xx + A.T @ VA
        Quu = l_uu + B.T @ Vxx @ B
        Qux = l_ux + B.T @ VA
        Quu_r = _floor_eigenvalues(Quu, mu)
        kff = -jnp.linalg.solve(Quu_r, Qu)
        K = -jnp.linalg.solve(Quu_r, Qux)
        Vx = Qx + K.T @ (Quu @ kff) + K.T @ Qu + Qux.T @ kff
        Vxx = Qxx + K.T @ Quu @ K + K.T @ Qux + Qux.T @ K
        return (Vx, 0.5 * (Vxx + Vxx.T)), (kff, K)

    _, (kff, K) = jax.lax.scan(body, (vx, vxx), (fx, fu, lx, lu, lxx, luu, lux), reverse=True)
    return kff, K


def ilqr(dynamics, stage, terminal, x0, controls, *, iterations: int, regularization=1e-6,
         alphas=(1.0, 0.5, 0.25, 0.1, 0.03), lower=None, upper=None) -> ILQRResult:
    """Minimise J = Σ_k stage(x_k, u_k, k) + terminal(x_H) s.t. x_{k+1} = dynamics(x_k, u_k, k).

    x0 (n,); controls (H, m), the initial guess; k an int32 node index; ``iterations``
    (static) fixed; ``regularization`` μ () the floor on Q_uu's eigenvalues; ``alphas``
    (static tuple) the line-search step lengths; ``lower``/``upper`` box on u (or None).
    Pure and jittable; vmap it over problems.
    """
    positive_int("ilqr", "iterations", iterations)
    n, H = x0.shape[0], controls.shape[0]
    ks = jnp.arange(H)
    step_lengths = jnp.asarray(alphas, controls.dtype)
    lo = -jnp.inf if lower is None else lower
    hi = jnp.inf if upper is None else upper
    controls = jnp.clip(controls, lo, hi)

    def stage_z(z, k):
        return stage(z[:n], z[n:], k)

    def forward(X, U, kff, K, alpha):
        def body(x, d):
            u, x_ref, kf, Kk, k = d
            u_new = jnp.clip(u + alpha * kf + Kk @ (x - x_ref), lo, hi)
            return dynamics(x, u_new, k), (x, u_new)

        xH, (xs, us) = jax.lax.scan(body, x0, (U, X[:-1], kff, K, ks))
        Xn = jnp.concatenate([xs, xH[None]])
        return Xn, us, _total_cost(stage, terminal, Xn, us)

    def linearise_and_solve(X, U):
        fx, fu = jax.vmap(jax.jacfwd(dynamics, argnums=(0, 1)))(X[:-1], U, ks)
        Z = jnp.concatenate([X[:-1], U], axis=1)
        g = jax.vmap(jax.grad(stage_z))(Z, ks)
        h = jax.vmap(lambda z, k: _floor_eigenvalues(jax.hessian(stage_z)(z, k), 0.0))(Z, ks)
        vx = jax.grad(terminal)(X[-1])
        vxx = _floor_eigenvalues(jax.hessian(terminal)(X[-1]), 0.0)
        return _backward(fx, fu, g[:, :n], g[:, n:], h[:, :n, :n], h[:, n:, n:], h[:, n:, :n], vx, vxx,
                         regularization)

    def iteration(carry, i):
        # pass i: line search along the last backward pass's gains (pass 0 has zero gains, so
        # every α reproduces the initial guess: its rollout and cost); then linearise there
        X, U, J, kff, K = carry
        Xs, Us, Js = jax.vmap(lambda a: forward(X, U, kff, K, a))(step_lengths)
        Js = jnp.where(jnp.isfinite(Js), Js, jnp.inf)
        best = jnp.argmin(Js)
        better = (Js[best] < J) | (i == 0)
        X = jnp.where(better, Xs[best], X)
        U = jnp.where(better, Us[best], U)
        J = jnp.where(better, Js[best], J)
        kff, K = jax.lax.cond(i < iterations, linearise_and_solve, lambda X, U: (kff, K), X, U)
        return (X, U, J, kff, K), Js[0]

    X0 = jnp.zeros((H + 1, n), x0.dtype)
    kff0 = jnp.zeros_like(controls)
    K0 = jnp.zeros((H, controls.shape[1], n), controls.dtype)
    J_init = jnp.asarray(jnp.inf, controls.dtype)
    (X, U, J, kff, K), J_first = jax.lax.scan(iteration, (X0, controls, J_init, kff0, K0),
                                              jnp.arange(iterations + 1))
    J0 = J_first[0]
    return ILQRResult(controls=U, states=X, cost=J, initial_cost=J0, feedforward=kff, gains=K)


@pytree_dataclass
class ILQRParams:
    """regularization μ () [cost units per (unit box)²]: the floor on Q_uu's eigenvalues."""

    regularization: jax.Array

    @classmethod
    def default(cls, dtype=None) -> "ILQRParams":
        return cls(regularization=jnp.asarray(1e-6, dtype))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ILQR(PlanConfig):
    """iLQR config: ``iterations`` per solve, line-search ``alphas`` (plus the PlanConfig fields).
    The state is the flattened :class:`~quadjax.QuadState` (quaternion kept as 4 numbers;
    the renormalisation inside the stepper is differentiated with the rest)."""

    iterations: int = 2
    alphas: tuple = (1.0, 0.5, 0.25, 0.1, 0.03)

    solver_bounds = (("regularization", 0.0, False),)

    def __post_init__(self):
        super().__post_init__()
        positive_int("ILQR", "iterations", self.iterations)
        if not self.alphas or not all(float(a) > 0 for a in self.alphas):
            raise ValueError(f"ILQR.alphas = {self.alphas!r}: must be a non-empty tuple of numbers > 0")

    def vector_problem(self, params: MPCParams, observation: QuadState, t):
        """(x0 (n,), dynamics, stage, terminal, unravel) of the plan problem on flat vectors,
        controls on the unit box — what :func:`ilqr` consumes."""
        model = params.model
        x0, unravel = ravel_pytree(observation)
        times = self.node_times(t, x0.dtype)

        def dynamics(x, a, k):
            config = SimConfig(integrator=self.step, substeps=self.substeps, save_every=0)
            final = simulate(model, unravel(x), self.dt, commands=from_unit(model, a)[None], config=config).final
            return ravel_pytree(final)[0]

        def stage(x, a, k):
            return self.dt * stage_cost(params.cost, model, unravel(x), from_unit(model, a), times[k])

        def terminal(x):
            return terminal_cost(params.cost, model, unravel(x), times[-1])

        return x0, dynamics, stage, terminal, unravel

    def solve(self, params: MPCParams, state: MPCState, observation: QuadState, t) -> MPCState:
        model = params.model
        x0, dynamics, stage, terminal, _ = self.vector_problem(params, observation, t)
        res = ilqr(dynamics, stage, terminal, x0, to_unit(model, state.plan), iterations=self.iterations,
                   regularization=params.solver.regularization, alphas=self.alphas, lower=0.0, upper=1.0)
        return accept(state, state.plan, res.initial_cost, from_unit(model, res.controls), res.cost)
