"""Wind gusts as an Ornstein–Uhlenbeck process carried in the rollout.

Per world axis, the gust velocity w [m/s] obeys

    dw = −w / τ dt + σ √(2/τ) dW,

a stationary Gaussian process with standard deviation σ [m/s] and autocorrelation
exp(−|Δt|/τ), τ [s] the correlation time. It is exactly the Dryden model's longitudinal
shaping filter σ √(2L/πV) / (1 + (L/V) s) with τ = L/V (MIL-F-8785C); Dryden's lateral
and vertical filters are second order and are not modelled here.

The update is the exact discretisation over a step h (no Euler error, any h):

    w' = a w + σ √(1 − a²) ξ,   a = exp(−h/τ),   ξ ~ N(0, I),

and the process starts from its stationary law, w₀ = σ ξ₀. The gust adds to the
vehicle's constant wind (``QuadParams.wind``, world ENU); the sweep steps it every
``update_every`` controller ticks (default 5: 25 Hz at 125 Hz, far faster than τ ≥ 1 s)
and holds it in between, which saves most of the random-number cost.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass


@pytree_dataclass
class Gusts:
    """sigma (3,) [m/s] stationary standard deviation per world axis; tau (3,) [s] > 0
    correlation time per axis."""

    sigma: jax.Array
    tau: jax.Array

    @classmethod
    def create(cls, sigma=(1.0, 1.0, 0.5), tau=(2.0, 2.0, 1.0), dtype=None) -> "Gusts":
        """Checked constructor: σ ≥ 0 and τ > 0, finite, each a scalar or (3,)."""
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype
        out = {}
        for name, value, ok in (("sigma", sigma, lambda x: x >= 0), ("tau", tau, lambda x: x > 0)):
            try:
                arr = np.broadcast_to(np.asarray(value, np.float64), (3,))
            except (TypeError, ValueError):
                raise ValueError(f"gusts.{name} = {value!r}: must be a number or 3 numbers") from None
            if not np.all(np.isfinite(arr) & ok(arr)):
                bound = ">= 0" if name == "sigma" else "> 0"
                raise ValueError(f"gusts.{name} = {arr.tolist()}: must be finite and {bound}")
            out[name] = jnp.asarray(arr, dtype)
        return cls(**out)


def gust_init(gusts: Gusts, xi):
    """A draw from the stationary law, w₀ = σ ξ (3,) [m/s]; ξ (3,) standard normal."""
    return gusts.sigma * xi


def gust_step(gusts: Gusts, w, xi, h):
    """Exact OU step over h [s]: w' = a w + σ √(1 − a²) ξ, a = exp(−h/τ); ξ (3,) standard normal."""
    a = jnp.exp(-h / gusts.tau)
    return a * w + gusts.sigma * jnp.sqrt(1.0 - a * a) * xi
