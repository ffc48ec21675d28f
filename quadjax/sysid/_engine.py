"""The compiled core of a fit: residual Jacobians, their statistics, and the Adam → L-BFGS loop.

One jitted function, :func:`run`, does everything a fit needs (the optimiser
steps, and the statistics of the last iterate for the uncertainty), so a fit
compiles once; :func:`quadjax.sysid.information` calls it with zero steps, so it
shares that compilation too. Everything here is traceable.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from quadjax._pytree import pytree_dataclass
from quadjax.params import params_valid
from quadjax.sysid.objective import LossWeights, residuals
from quadjax.sysid.parameters import ParamSpec
from quadjax.sysid.windows import Windows

#: static length of the objective history: at most this many iterations per fit
MAX_ITERATIONS = 4096


@pytree_dataclass
class Statistics:
    """Σ over windows, at one θ: grad = Σ J_wᵀ r_w (P,), fisher = Σ J_wᵀ J_w (P, P),
    score_outer = Σ (J_wᵀ r_w)(J_wᵀ r_w)ᵀ (P, P) and rss = Σ r²."""

    grad: jax.Array
    fisher: jax.Array
    score_outer: jax.Array
    rss: jax.Array


def jacobian(theta, spec: ParamSpec, windows: Windows, dt, weights: LossWeights, *, mode: str = "rotor_speeds",
             substeps: int = 1):
    """Whitened residuals r (W, H, C) of all windows and J = ∂r/∂θ (P, W, H, C).

    Forward mode, one Jacobian-vector product per parameter in a ``lax.map``:
    on XLA:CPU this compiles several times faster than reverse mode through the
    RK4 scan, and runs about as fast for the few parameters of a fit (a
    ``vmap`` over the tangents, as ``jax.jacfwd`` does, runs far slower here).
    """
    def resid(th):
        params, mm = spec.unpack(th)
        return residuals(params, mm, windows, dt, weights, mode=mode, substeps=substeps)

    basis = jnp.eye(theta.shape[0], dtype=theta.dtype)
    r = resid(theta)
    J = jax.lax.map(lambda t: jax.jvp(resid, (theta,), (t,))[1], basis)
    return r, J


def statistics(theta, spec: ParamSpec, windows: Windows, dt, weights: LossWeights, *, mode: str = "rotor_speeds",
               substeps: int = 1) -> Statistics:
    """:class:`Statistics` of all windows at θ. Traceable."""
    r, J = jacobian(theta, spec, windows, dt, weights, mode=mode, substeps=substeps)
    W = r.shape[0]
    r2 = r.reshape(W, -1)
    J2 = J.reshape(J.shape[0], W, -1)
    g_w = jnp.einsum("pwk,wk->wp", J2, r2)
    F = jnp.einsum("pwk,qwk->pq", J2, J2)
    return Statistics(g_w.sum(0), F, g_w.T @ g_w, jnp.sum(r2 * r2))


def data_count(windows: Windows, weights: LossWeights, mode: str) -> float:
    """n, the number of data residuals that count: Σ mask × (12, + R rotor speeds where measured and weighted)."""
    R = windows.rotor_speeds.shape[-1]
    rotor = (R * np.asarray(windows.rotors_measured)
             if mode == "commands" and weights.rotor_speeds is not None else 0.0)
    return float(np.sum(np.asarray(windows.mask).sum(1) * (12 + rotor)))


def _objective_value(theta, spec, windows, dt, n_data, weights, mode, substeps):
    """f(θ) = [½ Σ r² + ½ Σ prior²] / n (forward only: the line search's evaluations)."""
    p, m = spec.unpack(theta)
    r = residuals(p, m, windows, dt, weights, mode=mode, substeps=substeps)
    prior = spec.prior_residuals(theta)
    return 0.5 * (jnp.sum(r * r) + jnp.sum(prior * prior)) / n_data


def _objective_stats(theta, spec, windows, dt, n_data, weights, mode, substeps):
    """(f, ∇f, Statistics) at θ; ∇f = [Σ J_wᵀ r_w + (θ − μ)/σ²] / n from forward-mode Jacobians."""
    S = statistics(theta, spec, windows, dt, weights, mode=mode, substeps=substeps)
    prior = spec.prior_residuals(theta)
    std = jnp.asarray(spec.prior_std, theta.dtype)
    inv = jnp.where(jnp.isfinite(std), 1.0 / jnp.where(jnp.isfinite(std), std, 1.0), 0.0)
    f = 0.5 * (S.rss + jnp.sum(prior * prior)) / n_data
    g = (S.grad + prior * inv) / n_data
    return f, g, S


@functools.partial(jax.jit, static_argnames=("mode", "substeps"))
def run(theta0, spec, windows, dt, n_data, adam_lr, gtol, ftol, adam_steps, lbfgs_steps, weights, *, mode,
        substeps):
    """Adam for ``adam_steps``, then L-BFGS until ‖∇f‖ < gtol, f stalls (three steps with
    |Δf| ≤ ftol·|f|) or ``lbfgs_steps``, in one compiled loop.

    One body serves both phases (a ``lax.cond`` picks the update), so the
    Jacobian graph is compiled once. Returns the best iterate seen (lowest
    finite f: projection onto bounds can break L-BFGS's monotone descent), its
    :class:`Statistics`, the objective history (MAX_ITERATIONS,) and the number
    of iterations; a non-finite objective ends the loop.
    """
    adam = optax.adam(adam_lr)
    # backtracking (Armijo) needs objective values only, not gradients, at trial points
    lbfgs = optax.lbfgs(linesearch=optax.scale_by_backtracking_linesearch(max_backtracking_steps=40,
                                                                          store_grad=False))

    def value_fn(th):
        return _objective_value(th, spec, windows, dt, n_data, weights, mode, substeps)

    total = adam_steps + lbfgs_steps
    P = theta0.shape[0]
    dtype = theta0.dtype
    zero_stats = Statistics(jnp.zeros(P, dtype), jnp.zeros((P, P), dtype), jnp.zeros((P, P), dtype),
                            jnp.zeros((), dtype))

    def cond(c):
        return ~c[-1]

    def body(c):
        k, theta, adam_state, lbfgs_state, best, f_best, s_best, hist, stalled, _ = c
        f, g, S = _objective_stats(theta, spec, windows, dt, n_data, weights, mode, substeps)
        finite = jnp.isfinite(f) & jnp.all(jnp.isfinite(g))
        # an iterate outside the valid set (inertia breaking the triangle inequality, say) may
        # lower f, but is never what a fit returns (a zero-step run, the statistics at a given θ, takes θ)
        valid = params_valid(spec.unpack(theta)[0]) | (total == 0)
        better = finite & valid & (f < f_best)
        best = jnp.where(better, theta, best)
        f_best = jnp.where(better, f, f_best)
        s_best = jax.tree_util.tree_map(lambda a, b: jnp.where(better, a, b), S, s_best)
        in_lbfgs = k >= adam_steps
        f_prev = jnp.where(k > 0, hist[jnp.maximum(k - 1, 0)], jnp.inf)
        # L-BFGS has stalled when f stops moving (a failed line search takes a null step)
        moved = jnp.abs(f_prev - f) > ftol * jnp.abs(f)
        stalled = jnp.where(in_lbfgs & (k > adam_steps) & ~moved, stalled + 1, 0)
        done = (k >= total) | ~finite | (in_lbfgs & ((optax.tree.norm(g) < gtol) | (stalled >= 3)))

        def adam_step():
            upd, st = adam.update(g, adam_state, theta)
            return optax.apply_updates(theta, upd), st, lbfgs_state

        def lbfgs_step():
            upd, st = lbfgs.update(g, lbfgs_state, theta, value=f, grad=g, value_fn=value_fn)
            return optax.apply_updates(theta, upd), adam_state, st

        new, adam_state, lbfgs_state = jax.lax.cond(in_lbfgs, lbfgs_step, adam_step)
        hist = hist.at[k].set(f)
        return k + 1, spec.project(new), adam_state, lbfgs_state, best, f_best, s_best, hist, stalled, done

    carry = (0, theta0, adam.init(theta0), lbfgs.init(theta0), theta0, jnp.asarray(jnp.inf, dtype), zero_stats,
             jnp.full(MAX_ITERATIONS, jnp.nan, dtype), 0, jnp.asarray(False))
    k, _, _, _, best, f_best, s_best, hist, _, _ = jax.lax.while_loop(cond, body, carry)
    return best, f_best, s_best, hist, k
