"""Identifiability and uncertainty from the Jacobian of the whitened residuals.

With r(θ) the stacked whitened residuals (n of them) and J = ∂r/∂θ (n × P):

    F = Σ_w J_wᵀ J_w + diag(1/σ_prior²)          Fisher information (Gauss–Newton Hessian), θ units
    s² = Σ r² / (n − rank)                         residual variance (1 if the weights are the noise stds)
    C_GN = s² F⁺                                   Gauss–Newton covariance
    C_S = F⁺ (W/(W−1) Σ_w g_w g_wᵀ) F⁺,  g_w = J_wᵀ r_w      window-clustered sandwich covariance

F⁺ is the pseudo-inverse on the identifiable subspace: eigen-directions of F
with λ ≤ rtol·λ_max carry no information. The sandwich treats each window as
one independent draw, so it stays honest when the errors inside a window are
correlated (noise on the measured start state propagates along the whole
prediction; model error is correlated in time) — C_GN assumes white residuals.

A parameter is flagged unidentifiable when it loads on an uninformative
direction (Σ over null directions of V_ij² > 0.01), or when its standard
deviation in θ exceeds ``max_rel_std`` (θ is log-relative for positive
quantities: 1.0 means ±100 %).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax.numpy as jnp
import numpy as np

from quadjax.sysid._engine import Statistics, data_count, run
from quadjax.sysid.objective import LossWeights
from quadjax.sysid.parameters import ParamSpec
from quadjax.sysid.windows import Windows


class UnidentifiableWarning(UserWarning):
    """The data cannot determine some fitted parameters."""


@dataclasses.dataclass(frozen=True)
class Information:
    """Sufficient statistics at θ: F (P, P) with priors, B = Σ g_w g_wᵀ (P, P), grad = Σ J_wᵀ r_w (P,)
    (data only: ½ ∂Σr²/∂θ), rss = Σ r², n data residuals, W windows."""

    fisher: np.ndarray
    score_outer: np.ndarray
    grad: np.ndarray
    rss: float
    n: int
    windows: int


def information(theta, spec: ParamSpec, windows: Windows, dt, weights: LossWeights, *, mode: str = "rotor_speeds",
                substeps: int = 1) -> Information:
    """F (with the priors' information), B, Σ J_wᵀ r_w, Σ r² and n at θ, for :func:`uncertainty`.

    Runs the fit's compiled loop with zero steps, so it reuses a fit's compilation.
    """
    theta = jnp.asarray(theta)
    dtype = theta.dtype
    n = data_count(windows, weights, mode)
    z = jnp.zeros((), dtype)
    _, _, S, _, _ = run(theta, spec, windows, jnp.asarray(dt, dtype), jnp.asarray(n, dtype), z, z, z, 0, 0, weights,
                     mode=mode, substeps=substeps)
    return information_from(S, spec, n, windows.num_windows)


def information_from(S: Statistics, spec: ParamSpec, n: float, windows: int) -> Information:
    """:class:`Information` from accumulated :class:`Statistics` (adds the priors: diag(1/σ_prior²))."""
    std = np.asarray(spec.prior_std)
    prior = np.where(np.isfinite(std), 1.0 / np.where(np.isfinite(std), std, 1.0), 0.0)
    F = np.asarray(S.fisher, np.float64) + np.diag(prior ** 2)
    return Information(F, np.asarray(S.score_outer, np.float64), np.asarray(S.grad, np.float64), float(S.rss),
                       int(round(n)), windows)


@dataclasses.dataclass(frozen=True)
class Uncertainty:
    """Covariances and the identifiability verdict, in θ units and in SI.

    Fields: eigenvalues (P,) of F, ascending; rank; unidentifiable, the labels
    flagged; cov_gauss_newton, cov_sandwich (P, P) in θ; std_gauss_newton,
    std_sandwich (P,) in SI (inf where unidentifiable); correlation (P, P) of
    the chosen covariance; residual_variance s²; n data; W windows.
    """

    eigenvalues: np.ndarray
    rank: int
    unidentifiable: tuple[str, ...]
    cov_gauss_newton: np.ndarray
    cov_sandwich: np.ndarray
    std_gauss_newton: np.ndarray
    std_sandwich: np.ndarray
    correlation: np.ndarray
    residual_variance: float
    n: int
    windows: int


def uncertainty(theta, spec: ParamSpec, info: Information, *, rtol: float = 1e-9, max_rel_std: float = 1.0,
                covariance: str = "sandwich", warn: bool = True, stacklevel: int = 2) -> Uncertainty:
    """Covariances, standard deviations and unidentifiable parameters from :func:`information`.

    ``covariance`` ('sandwich' or 'gauss_newton') picks the one used for the
    correlation matrix and the ``max_rel_std`` test. Emits an
    :class:`UnidentifiableWarning` naming the flagged parameters when ``warn``.
    """
    if covariance not in ("sandwich", "gauss_newton"):
        raise ValueError(f"covariance={covariance!r}: choose 'sandwich' or 'gauss_newton'")
    F = 0.5 * (info.fisher + info.fisher.T)
    lam, V = np.linalg.eigh(F)
    P = len(lam)
    top = max(lam[-1], 0.0)
    informative = lam > rtol * top if top > 0 else np.zeros(P, bool)
    rank = int(informative.sum())
    Finv = (V[:, informative] / lam[informative]) @ V[:, informative].T
    s2 = info.rss / max(info.n - rank, 1)
    cov_gn = s2 * Finv
    W = info.windows
    cov_s = Finv @ (info.score_outer * (W / max(W - 1, 1))) @ Finv
    null_load = np.sum(V[:, ~informative] ** 2, axis=1)
    chosen = cov_s if covariance == "sandwich" else cov_gn
    theta_std = np.sqrt(np.maximum(np.diag(chosen), 0.0))
    blind = null_load > 0.01
    bad = blind | (theta_std > max_rel_std)
    std_gn = np.where(null_load > 0.01, np.inf, spec.value_std(theta, np.sqrt(np.maximum(np.diag(cov_gn), 0))))
    std_s = np.where(null_load > 0.01, np.inf, spec.value_std(theta, np.sqrt(np.maximum(np.diag(cov_s), 0))))
    d = np.sqrt(np.maximum(np.diag(chosen), 1e-300))
    corr = chosen / np.outer(d, d)
    flagged = tuple(lab for lab, b in zip(spec.labels, bad) if b)
    if warn and flagged:
        why = []
        if blind.any():
            why.append(f"no information on {', '.join(np.asarray(spec.labels)[blind])} "
                       f"(Fisher information rank {rank} of {P})")
        loose = bad & ~blind
        if loose.any():
            why.append(f"standard deviation above {max_rel_std:g} in θ (±{100 * max_rel_std:g} % for "
                       f"log-parameters) for {', '.join(np.asarray(spec.labels)[loose])}")
        warnings.warn(f"the data cannot determine {', '.join(flagged)}: {'; '.join(why)}. Fix them, add a prior, "
                      "or fly an excitation that moves them", UnidentifiableWarning, stacklevel=stacklevel)
    return Uncertainty(lam, rank, flagged, cov_gn, cov_s, std_gn, std_s, corr, s2, info.n, W)
