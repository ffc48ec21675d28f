"""The mixer: body wrench ↔ rotor thrusts, with the saturation priority of seed 002.

A wrench is an array (..., 4) = (F, τx, τy, τz): the collective thrust F [N] along
body +z and the torques τ [N·m] about the body axes, body frame FLU (x forward, y left,
z up). Thrusts are (..., R) [N] in the vehicle's rotor order (PX4 Quad X by default:
0 front-right CCW, 1 rear-left CCW, 2 front-left CW, 3 rear-right CW).

:func:`allocate` inverts the allocation with no limits, :func:`wrench` is the forward
map, and :func:`mix` keeps every rotor in [T_min, T_max] and gives up the demand in a
fixed order (seed 002):

1. roll and pitch shrink by a common σ ∈ (0, 1], keeping their direction, only when
   they fit at no collective (and no yaw s ∈ [0, 1]);
2. the collective moves as little as possible (both ways: at low throttle it rises,
   "airmode") for which some yaw s ∈ [0, 1] still fits;
3. yaw is scaled by the largest s ∈ [0, 1] that fits around that collective.

Which algorithm runs is structure, fixed by :class:`MixerLayout`, a static field of
:class:`MixerParams`:

* ``"quad_x"``, ``"plus"``, ``"opposed_pairs"`` — four rotors whose two CCW rotors sit
  opposite each other about the centre, and so do the two CW ones (Quad X, the seed-003
  "+", H/rectangular frames). Then every allocation is (u_a ± σd_a, u_b ± σd_b) with pair
  means u_a = c − t, u_b = c + t, and the three steps are closed form (≈ 60 operations).
* ``"generic"`` — any other layout (iris-like, hexacopters, …): the documented fallback.
  The allocation is the pseudo-inverse P = Bᵀ(BBᵀ)⁻¹, T = c·P₀ + σ·(P₁τx + P₂τy) + s·P₃τz,
  and the same three steps are solved exactly over (c, σ, s): steps 1 and 2 are linear
  programs in two unknowns, reduced by Helly's theorem to closed-form two-line problems
  over all pairs of constraints: O(R⁴) operations, see :func:`_mix_generic` (in the native
  closed loop, float32, 2 cores: Iris's PID tick costs 2.2× a Quad X's, and the kernel's first
  build takes ~12 s for 4 rotors, ~40 s for 6, ~2.5 min for 8; benchmarks/README.md). It moves
  thrust only along the pseudo-inverse's directions, never in the null space of B
  (R > 4), so it can cut a demand that another thrust distribution would still meet:
  the fallback is the seed's priority *within* the pseudo-inverse allocation. A demand
  whose pseudo-inverse allocation fits comes back unchanged.

Defined outputs (every function is pure, un-jitted, works under jit/vmap/grad, and keeps
the dtype of its inputs):

* any finite demand — no NaN, thrusts in [T_min, T_max]. Demands beyond
  (float max)^¼ (≈ 4.3e9 in float32, 1.1e77 in float64) are first scaled down, keeping
  the torque direction; σ and s are reported against the original demand (so for such
  demands they may underflow to 0).
* a non-finite demand (NaN or ±inf in any component) — every rotor at T_min,
  ``valid = False``, σ = s = 0, ``collective_moved = True``, and an all-zero report
  from :func:`saturation_from`.
* gradients are finite everywhere (safe divisions); kinks sit where a limit becomes
  active, as in the seed's piecewise-linear mapping.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._components import join, split, split_matrix, total
from quadjax._pytree import pytree_dataclass
from quadjax.presets import quad_x_positions
from quadjax.quadrotor import rotor_moment_c, rotor_thrusts

# Relative tolerance of the layout geometry (opposite rotors, equal |x| and |y|).
_GEOMETRY_RTOL = 1e-5
_CLOSED_FORM_KINDS = ("quad_x", "plus", "opposed_pairs")


class MixerLayout(NamedTuple):
    """Static structure of a mixer: which algorithm runs (hashable, never traced).

    kind: ``"quad_x"``, ``"plus"`` or ``"opposed_pairs"`` (closed form, four rotors) or
        ``"generic"`` (pseudo-inverse, any R ≥ 4).
    order: closed form: rotor indices (a₊, a₋, b₊, b₋) — pair a the CCW rotors, pair b
        the CW rotors; a₋ sits opposite a₊, b₋ opposite b₊. Generic: ``()``.
    """

    kind: str
    order: tuple = ()

    @property
    def closed_form(self) -> bool:
        return self.kind in _CLOSED_FORM_KINDS


GENERIC = MixerLayout("generic", ())


@dataclasses.dataclass(frozen=True)
class MixerParams:
    """Parameters of the mixer of one vehicle (leading batch axes: vmap the mixer over them).

    Fields (R rotors), all float arrays (pytree leaves) except ``layout``:
        rotor_positions: (R, 3) m, rotor hubs in the body frame (FLU); z plays no part.
        rotor_spins: (R,) +1 counter-clockwise seen from above, −1 clockwise.
        k_m: () m, yaw reaction torque per newton of thrust (−spin·k_m·T).
        k_f: () N/(rad/s)², T = k_f ω² (used only by :func:`to_rotor_command`).
        t_min, t_max: () N, the thrust range of every rotor.
        layout: :class:`MixerLayout`, static (pytree metadata).

    Build it with :meth:`create`, :meth:`quad_x` or :func:`mixer_params_from`, which check
    every field and detect the layout.
    """

    rotor_positions: jax.Array
    rotor_spins: jax.Array
    k_m: jax.Array
    k_f: jax.Array
    t_min: jax.Array
    t_max: jax.Array
    layout: MixerLayout

    @classmethod
    def create(cls, *, rotor_positions, rotor_spins, k_m, k_f, t_max, t_min=0.0, layout=None, dtype=None):
        """Checked constructor. Raises ``ValueError`` naming the first bad field.

        ``layout``: None detects it from the geometry (:func:`detect_layout`);
        ``"generic"`` forces the pseudo-inverse path; a :class:`MixerLayout` is checked
        against the geometry. ``rotor_positions`` may be (R, 2). ``dtype`` defaults to
        JAX's default float.
        """
        raw = dict(rotor_positions=rotor_positions, rotor_spins=rotor_spins, k_m=k_m, k_f=k_f, t_min=t_min, t_max=t_max)
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype
        values = {}
        for name, value in raw.items():
            try:
                values[name] = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise ValueError(f"MixerParams.{name}: not a number array ({err})") from None
        pos = values["rotor_positions"]
        if pos.ndim == 2 and pos.shape[1] == 2:
            values["rotor_positions"] = np.concatenate([pos, np.zeros((pos.shape[0], 1))], axis=1)
        _raise_on_bad_shape(values)
        layout = _resolve_layout(layout, values["rotor_positions"], values["rotor_spins"])
        _raise_on_bad_value(values, layout)
        return cls(**{k: jnp.asarray(v, dtype=dtype) for k, v in values.items()}, layout=layout)

    @classmethod
    def quad_x(cls, *, arm, k_m, k_f, t_max, t_min=0.0, dtype=None):
        """A Quad X in PX4 order with arm length L = ``arm`` [m]: rotors at (±a, ±a, 0), a = L/√2."""
        return cls.create(
            rotor_positions=quad_x_positions(arm / math.sqrt(2.0)),
            rotor_spins=(1.0, 1.0, -1.0, -1.0),
            k_m=k_m, k_f=k_f, t_min=t_min, t_max=t_max, dtype=dtype,
        )

    @property
    def num_rotors(self) -> int:
        """R (static: read from a shape)."""
        return self.rotor_spins.shape[-1]

    def astype(self, dtype) -> MixerParams:
        """The same parameters in another float dtype."""
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), self)

    def replace(self, **changes) -> MixerParams:
        """A copy with some fields replaced (unchecked: use in traced code)."""
        return dataclasses.replace(self, **changes)


_DATA_FIELDS = ["rotor_positions", "rotor_spins", "k_m", "k_f", "t_min", "t_max"]
jax.tree_util.register_dataclass(MixerParams, data_fields=_DATA_FIELDS, meta_fields=["layout"])


@pytree_dataclass
class MixerOutput:
    """What :func:`mix` returns (leading axes of the demand).

    Fields:
        thrusts: (..., R) N, every one in [T_min, T_max].
        achieved: (..., 4) the wrench (F [N], τ [N·m], body FLU) the thrusts make.
        rp_scale: (...,) σ ∈ (0, 1], achieved (τx, τy) = σ·(τx, τy) demanded.
        yaw_scale: (...,) s ∈ [0, 1], achieved τz = s·τz demanded.
        collective_moved: (...,) bool, the collective differs from the demand.
        valid: (...,) bool, False where the demand was not finite (then thrusts = T_min).
    """

    thrusts: jax.Array
    achieved: jax.Array
    rp_scale: jax.Array
    yaw_scale: jax.Array
    collective_moved: jax.Array
    valid: jax.Array


# --- layout detection and parameter checks -------------------------------------------------------


def detect_layout(rotor_positions, rotor_spins) -> MixerLayout:
    """The layout of concrete (numpy) geometry: opposed pairs → closed form, else generic.

    rotor_positions: (R, 2 or 3) m, body FLU; rotor_spins: (R,) ±1. The closed form needs
    R = 4, two CCW rotors opposite each other about the centre, two CW rotors likewise,
    and the two pair axes not parallel. It is labelled ``"quad_x"`` when every rotor has
    |x| = |y| = a, ``"plus"`` when every rotor sits on a body axis at one radius.
    """
    pos = np.asarray(rotor_positions, dtype=np.float64)[..., :2]
    spins = np.asarray(rotor_spins, dtype=np.float64)
    if spins.shape != (4,) or sorted(spins.tolist()) != [-1.0, -1.0, 1.0, 1.0]:
        return GENERIC
    a0, a1 = (int(i) for i in np.flatnonzero(spins > 0))
    b0, b1 = (int(i) for i in np.flatnonzero(spins < 0))
    layout = MixerLayout("opposed_pairs", (a0, a1, b0, b1))
    if not bool(_pairs_geometry_ok(pos, layout, np)):
        return GENERIC
    x, y = np.abs(pos[:, 0]), np.abs(pos[:, 1])
    r = np.hypot(x, y)
    tol = _GEOMETRY_RTOL * r.max()
    if np.all(np.abs(x - y) <= tol) and np.ptp(x) <= tol:
        return layout._replace(kind="quad_x")
    if np.all(np.minimum(x, y) <= tol) and np.ptp(r) <= tol:
        return layout._replace(kind="plus")
    return layout


def _resolve_layout(layout, positions, spins) -> MixerLayout:
    """None → detected from the geometry; "generic" → GENERIC; a MixerLayout → itself, if it
    fits the rotor count (its geometry is checked with the values)."""
    if layout is None:
        return detect_layout(positions, spins)
    if layout == "generic" or (isinstance(layout, MixerLayout) and layout.kind == "generic"):
        return GENERIC
    if (
        isinstance(layout, MixerLayout)
        and layout.kind in _CLOSED_FORM_KINDS
        and sorted(layout.order) == [0, 1, 2, 3]
        and np.shape(spins)[-1:] == (4,)
    ):
        return MixerLayout(layout.kind, tuple(int(i) for i in layout.order))
    raise ValueError(
        f"MixerParams.layout = {layout!r}: must be None, 'generic' or a MixerLayout "
        f"(a closed-form one orders four rotors)"
    )


def _shape_errors(p, batch=()):
    """Field → message for wrongly shaped fields (shapes after ``batch``)."""
    shape = {k: tuple(np.shape(v))[len(batch):] for k, v in p.items()}
    R = shape["rotor_spins"][0] if len(shape["rotor_spins"]) == 1 else None
    want = dict(k_m=(), k_f=(), t_min=(), t_max=())
    want.update(rotor_spins=(R,) if R and R >= 4 else "(R,), R >= 4", rotor_positions=(R, 3) if R else "(R, 3)")
    return {name: f"shape {shape[name]}, expected {exp}" for name, exp in want.items() if shape[name] != exp}


def _pairs_geometry_ok(pos, layout, xp):
    """Opposed pairs: a₋ = −a₊ and b₋ = −b₊ in the xy plane, pair axes not parallel."""
    a0, a1, b0, b1 = layout.order
    pa, pa_, pb, pb_ = pos[..., a0, :2], pos[..., a1, :2], pos[..., b0, :2], pos[..., b1, :2]
    na, nb = xp.linalg.norm(pa, axis=-1), xp.linalg.norm(pb, axis=-1)
    opposite = (xp.linalg.norm(pa + pa_, axis=-1) <= _GEOMETRY_RTOL * na) & (
        xp.linalg.norm(pb + pb_, axis=-1) <= _GEOMETRY_RTOL * nb
    )
    cross = pa[..., 0] * pb[..., 1] - pa[..., 1] * pb[..., 0]
    return opposite & (xp.abs(cross) > 1e-3 * na * nb)


def _generic_geometry_checks(p):
    """(rank, collective) for the pseudo-inverse, as arrays of ``p``'s batch shape: B of full
    row rank with every rotor lifting under a pure collective (P₀ > 0), and a pure
    collective that fits in [T_min, T_max] (max T_min/P₀ < min T_max/P₀). Computed with
    jax.numpy for numpy and traced inputs alike."""
    p = {k: jnp.asarray(v) for k, v in p.items()}
    B = allocation_matrix(types.SimpleNamespace(**p))
    Bn = B / jnp.sqrt(jnp.sum(B * B, axis=-1, keepdims=True))
    rank_ok = jnp.linalg.eigvalsh(Bn @ jnp.swapaxes(Bn, -1, -2))[..., 0] > 1e-6
    u = _pinv(B)[..., :, 0]
    lifting = jnp.all(u > 0, axis=-1)
    fits = jnp.max(p["t_min"][..., None] / u, axis=-1) < jnp.min(p["t_max"][..., None] / u, axis=-1)
    return rank_ok & lifting, fits


def _value_checks(p, layout, xp):
    """Field → boolean array (True = within bounds), for numpy or jax.numpy ``xp``."""

    def finite(x, n):
        ok = xp.isfinite(x)
        return xp.all(ok.reshape(ok.shape[: ok.ndim - n] + (-1,)), axis=-1) if n else ok

    spins = p["rotor_spins"]
    spin_ok = xp.all(xp.abs(xp.abs(spins) - 1) == 0, axis=-1)
    geometry_ok = finite(p["rotor_positions"], 2)
    t_max_ok = finite(p["t_max"], 0) & (p["t_max"] > p["t_min"])
    if layout.closed_form:
        a0, a1, b0, b1 = layout.order
        spin_ok = spin_ok & (spins[..., a0] > 0) & (spins[..., a1] > 0) & (spins[..., b0] < 0) & (spins[..., b1] < 0)
        geometry_ok = geometry_ok & _pairs_geometry_ok(p["rotor_positions"], layout, xp)
    else:
        rank_ok, fits = _generic_geometry_checks(p)
        as_xp = np.asarray if xp is np else jnp.asarray
        geometry_ok = geometry_ok & as_xp(rank_ok)
        t_max_ok = t_max_ok & as_xp(fits)
    return {
        "rotor_positions": geometry_ok,
        "rotor_spins": spin_ok,
        "k_m": finite(p["k_m"], 0) & (p["k_m"] > 0),
        "k_f": finite(p["k_f"], 0) & (p["k_f"] > 0),
        "t_min": finite(p["t_min"], 0) & (p["t_min"] >= 0),
        "t_max": t_max_ok,
    }


def _bounds(name, layout):
    if name == "rotor_positions":
        if layout.closed_form:
            return f"finite, the CCW rotors {layout.order[:2]} opposite each other, the CW rotors {layout.order[2:]} too"
        return "finite, with an allocation of full rank in which every rotor lifts"
    if name == "rotor_spins":
        return "each +1 (CCW) or -1 (CW)" + (", as the layout's pairs" if layout.closed_form else "")
    return {
        "k_m": "finite and > 0",
        "k_f": "finite and > 0",
        "t_min": "finite and >= 0",
        "t_max": "finite and > t_min (generic: a pure collective must fit)",
    }[name]


def mixer_params_valid(mp: MixerParams) -> jax.Array:
    """Invariant I1 of the mixer: shapes right, every value finite, k_m > 0, k_f > 0,
    0 ≤ T_min < T_max, spins ±1, geometry fit for ``mp.layout``.

    Works under jit and on batched params (judged per vehicle): a bool array of the
    batch shape. A wrong shape gives a constant False.
    """
    p = {name: jnp.asarray(getattr(mp, name)) for name in _DATA_FIELDS}
    batch = jnp.shape(p["k_m"])
    if _shape_errors(p, batch) or (mp.layout.closed_form and p["rotor_spins"].shape[-1] != 4):
        return jnp.zeros(batch, dtype=bool)
    ok = jnp.ones(batch, dtype=bool)
    for good in _value_checks(p, mp.layout, jnp).values():
        ok = ok & good
    return ok


def mixer_params_from(quad_params, layout=None) -> MixerParams:
    """The mixer for the vehicle ``quad_params`` (a :class:`~quadjax.QuadParams`) describes.

    T_min = 0 and T_max = k_f ω_max² (full battery); geometry, spins, k_m, k_f copied.
    The layout is detected with numpy on the concrete geometry (so call it outside jit,
    or pass ``layout``). For batched params every vehicle must share one layout; mixed
    batches get ``"generic"``. Raises ``ValueError`` naming a bad field.
    """
    t_max = rotor_thrusts(quad_params, jnp.asarray(quad_params.omega_max)[..., None], 0.0)[..., 0]
    if layout is None:
        try:
            pos = np.asarray(quad_params.rotor_positions, dtype=np.float64)
            spins = np.asarray(quad_params.rotor_spins, dtype=np.float64)
        except jax.errors.TracerArrayConversionError:
            raise ValueError(
                "mixer_params_from: layout detection needs concrete rotor_positions and rotor_spins; "
                "call it outside jit or pass layout="
            ) from None
        R = spins.shape[-1]
        found = {detect_layout(q, s) for q, s in zip(pos.reshape(-1, R, 3), spins.reshape(-1, R), strict=True)}
        layout = found.pop() if len(found) == 1 else GENERIC
    layout = _resolve_layout(layout, None, quad_params.rotor_spins)
    mp = MixerParams(
        rotor_positions=quad_params.rotor_positions,
        rotor_spins=quad_params.rotor_spins,
        k_m=quad_params.k_m,
        k_f=quad_params.k_f,
        t_min=jnp.zeros_like(t_max),
        t_max=t_max,
        layout=layout,
    )
    _raise_if_concrete_and_bad(mp)
    return mp


def _raise_on_bad_shape(values):
    errors = _shape_errors(values, np.shape(values["k_m"]))
    if errors:
        name, msg = next(iter(errors.items()))
        raise ValueError(f"MixerParams.{name}: {msg}")


def _raise_on_bad_value(values, layout):
    for name, ok in _value_checks(values, layout, np).items():
        if not np.all(ok):
            raise ValueError(f"MixerParams.{name} = {values[name].tolist()}: must be {_bounds(name, layout)}")


def _raise_if_concrete_and_bad(mp):
    try:
        values = {name: np.asarray(getattr(mp, name), dtype=np.float64) for name in _DATA_FIELDS}
    except jax.errors.TracerArrayConversionError:
        return  # traced: mixer_params_valid judges it
    _raise_on_bad_shape(values)
    _raise_on_bad_value(values, mp.layout)


# --- the linear maps ----------------------------------------------------------------------------


def _moment_fields(rotor_positions, rotor_spins, k_m):
    """The fields :func:`quadjax.quadrotor.rotor_moment_c` reads, split into components."""
    return types.SimpleNamespace(
        rotor_positions=split_matrix(rotor_positions), rotor_spins=split(rotor_spins), k_m=jnp.asarray(k_m)
    )


def wrench(mp: MixerParams, thrusts) -> jax.Array:
    """w = B·T: the wrench (..., 4) = (F [N], τx, τy, τz [N·m]) that thrusts (..., R) [N] make.

    F = Σ Tᵢ along body +z; τ = Σ rᵢ × (0, 0, Tᵢ) − (0, 0, k_m Σ spinᵢ Tᵢ), body FLU
    (the rotor moment of :func:`quadjax.quadrotor.rotor_moment_c`).
    """
    thrusts = split(thrusts)
    moment = rotor_moment_c(_moment_fields(mp.rotor_positions, mp.rotor_spins, mp.k_m), thrusts)
    return join((total(thrusts),) + moment)


def allocation_matrix(mp) -> jax.Array:
    """B (..., 4, R): column j is the wrench of rotor j alone at 1 N (the map :func:`wrench` applies)."""
    R = mp.rotor_spins.shape[-1]
    # one rotor at a time on a new axis before the rotors; the moment broadcasts over it
    fields = _moment_fields(
        mp.rotor_positions[..., None, :, :], mp.rotor_spins[..., None, :], jnp.asarray(mp.k_m)[..., None]
    )
    unit = split(jnp.eye(R, dtype=jnp.result_type(mp.rotor_positions)))
    return jnp.swapaxes(join((total(unit),) + rotor_moment_c(fields, unit)), -1, -2)


def _pinv(B):
    """P = Bᵀ (B Bᵀ)⁻¹ (..., R, 4), the minimum-norm right inverse of B (B⁻¹ when R = 4)."""
    return jnp.swapaxes(_spd_solve(B @ jnp.swapaxes(B, -1, -2), B), -1, -2)


def _spd_solve(A, B):
    """X = A⁻¹ B for a symmetric positive definite A (..., n, n) and B (..., n, m): Cholesky
    A = L Lᵀ unrolled over the static n, then forward and back substitution. Element-wise
    arithmetic only, so the native generator compiles a mixer whose geometry is traced (a
    controller passed as an argument); jnp.linalg.solve's pivoted LU it cannot. B Bᵀ of a
    full-rank allocation matrix is SPD, and Cholesky needs no pivoting there."""
    n = A.shape[-1]
    L: dict = {}
    for i in range(n):
        for j in range(i + 1):
            s = A[..., i, j] - sum((L[i, k] * L[j, k] for k in range(j)), jnp.zeros_like(A[..., i, j]))
            L[i, j] = jnp.sqrt(s) if i == j else s / L[j, j]
    Y: list = []
    for i in range(n):  # L Y = B
        acc = sum((L[i, k][..., None] * Y[k] for k in range(i)), jnp.zeros_like(B[..., i, :]))
        Y.append((B[..., i, :] - acc) / L[i, i][..., None])
    X: dict = {}
    for i in reversed(range(n)):  # Lᵀ X = Y
        acc = sum((L[k, i][..., None] * X[k] for k in range(i + 1, n)), jnp.zeros_like(Y[i]))
        X[i] = (Y[i] - acc) / L[i, i][..., None]
    return jnp.stack([X[i] for i in range(n)], axis=-2)


def _pair_demand(mp, F, tx, ty, tz):
    """Closed form: (f, d_a, d_b, Y) [N per rotor] of a wrench (F, τx, τy, τz), components (...,).

    With the CCW pair at ±p_a and the CW pair at ±p_b (xy, m), every allocation is
    T_a± = f − Y ± d_a, T_b± = f + Y ± d_b with f = F/4, Y = τz/(4k_m) and
    (d_a, d_b) solving 2 d_a (y_a, −x_a) + 2 d_b (y_b, −x_b) = (τx, τy):
    d_a = −(x_b τx + y_b τy)/(2D), d_b = (x_a τx + y_a τy)/(2D), D = x_a y_b − x_b y_a.
    Quad X (a = L/√2): d_a = −(τx + τy)/(4a), d_b = (τx − τy)/(4a), the seed's table.
    """
    a0, a1, b0, b1 = mp.layout.order
    pos = mp.rotor_positions
    xa, ya = 0.5 * (pos[a0, 0] - pos[a1, 0]), 0.5 * (pos[a0, 1] - pos[a1, 1])
    xb, yb = 0.5 * (pos[b0, 0] - pos[b1, 0]), 0.5 * (pos[b0, 1] - pos[b1, 1])
    half_inv_det = 0.5 / (xa * yb - xb * ya)
    d_a = -(xb * tx + yb * ty) * half_inv_det
    d_b = (xa * tx + ya * ty) * half_inv_det
    return 0.25 * F, d_a, d_b, tz * (0.25 / mp.k_m)


def _pair_thrusts(layout, c, t, d_a, d_b):
    """Thrusts (..., 4) in rotor order: pair a = (c − t) ± d_a, pair b = (c + t) ± d_b.

    Broadcast against constant sign rows rather than stacking four components: XLA
    vectorises the former; the stack made a thrusts-only mix ~8× slower on CPU.
    """
    a0, a1, b0, b1 = layout.order
    signs = np.zeros((3, 4))
    signs[0, [a0, a1]], signs[0, [b0, b1]] = -1.0, 1.0  # t: pair a down, pair b up
    signs[1, a0], signs[1, a1] = 1.0, -1.0
    signs[2, b0], signs[2, b1] = 1.0, -1.0
    signs = jnp.asarray(signs, jnp.result_type(c))
    return c[..., None] + t[..., None] * signs[0] + d_a[..., None] * signs[1] + d_b[..., None] * signs[2]


def allocate(mp: MixerParams, w) -> jax.Array:
    """T = B⁻¹·w (..., R) [N], no limits (pseudo-inverse Bᵀ(BBᵀ)⁻¹ for the generic layout).

    w: (..., 4) = (F [N], τx, τy, τz [N·m]), body FLU. Pre: w finite (a non-finite
    demand gives non-finite thrusts; :func:`mix` guards it). Post: wrench(allocate(w)) = w.
    Quad X: Tᵢ = F/4 + sxᵢ τx/(4a) + syᵢ τy/(4a) + szᵢ τz/(4k_m) (seed 002).
    """
    w = _as_wrench(mp, w)
    if mp.layout.closed_form:
        f, d_a, d_b, Y = _pair_demand(mp, *split(w))
        return _pair_thrusts(mp.layout, f, Y, d_a, d_b)
    P = _pinv(allocation_matrix(mp))
    return jnp.sum(P * w[..., None, :], axis=-1)


def _as_wrench(mp, w):
    """w as an array of the promoted float dtype; ``mp`` must hold one vehicle (static check)."""
    if np.ndim(mp.rotor_spins) != 1:
        raise ValueError(
            f"MixerParams.rotor_spins has shape {np.shape(mp.rotor_spins)}: the mixer takes one "
            "vehicle's parameters; vmap it over a batch of vehicles"
        )
    w = jnp.asarray(w)
    return w.astype(jnp.promote_types(w.dtype, jnp.result_type(mp.t_max)))


# --- mix ---------------------------------------------------------------------------------------


def _clamp_guarded(x, lo, hi):
    """clamp(x, lo, hi); the midpoint when rounding has left the interval empty (lo > hi)."""
    return jnp.where(lo <= hi, jnp.clip(x, lo, hi), 0.5 * (lo + hi))


def _bounded_demand(F, tx, ty, tz):
    """Scale a finite demand into ±(float max)^¼ so that no product, nor a gradient, overflows.

    Returns ((F', τx', τy', τz'), g_rp, g_yaw): F clipped, (τx, τy) scaled by g_rp
    (direction kept), τz by g_yaw; g = 1 exactly for any demand below the bound.
    """
    big = jnp.asarray(float(jnp.finfo(F.dtype).max) ** 0.25, F.dtype)
    g_rp = big / jnp.maximum(jnp.maximum(jnp.abs(tx), jnp.abs(ty)), big)
    g_yaw = big / jnp.maximum(jnp.abs(tz), big)
    return (jnp.clip(F, -big, big), tx * g_rp, ty * g_rp, tz * g_yaw), g_rp, g_yaw


def _mix_pairs(mp, F, tx, ty, tz):
    """The seed's three steps in closed form for an opposed-pairs layout.

    Thrusts (u_a ± σd_a, u_b ± σd_b), u_a = c − t, u_b = c + t, per rotor [N]:
    1. σ = W / max(2 max(|d_a|, |d_b|), W), W = T_max − T_min;
    2. c = clamp(F/4, c_lo, c_hi), the range of c for which some t between 0 and Y fits:
       with u_a ∈ [L_a, H_a] = [T_min + σ|d_a|, T_max − σ|d_a|] (b alike),
       c_lo = max((L_a + L_b)/2, L_b − max(Y, 0), L_a + min(Y, 0)), c_hi symmetric;
    3. t = clamp(Y, max(c − H_a, L_b − c, min(Y, 0)), min(c − L_a, H_b − c, max(Y, 0))),
       the largest s = t/Y that fits around c.
    """
    f, d_a, d_b, Y = _pair_demand(mp, F, tx, ty, tz)
    lo, hi = mp.t_min, mp.t_max
    width = hi - lo
    sigma = width / jnp.maximum(2.0 * jnp.maximum(jnp.abs(d_a), jnp.abs(d_b)), width)
    e_a, e_b = sigma * jnp.abs(d_a), sigma * jnp.abs(d_b)
    lo_a, hi_a, lo_b, hi_b = lo + e_a, hi - e_a, lo + e_b, hi - e_b
    t_dn, t_up = jnp.minimum(Y, 0.0), jnp.maximum(Y, 0.0)
    c_lo = jnp.maximum(jnp.maximum(0.5 * (lo_a + lo_b), lo_b - t_up), lo_a + t_dn)
    c_hi = jnp.minimum(jnp.minimum(0.5 * (hi_a + hi_b), hi_a + t_up), hi_b - t_dn)
    c = _clamp_guarded(f, c_lo, c_hi)
    t_lo = jnp.maximum(jnp.maximum(c - hi_a, lo_b - c), t_dn)
    t_hi = jnp.minimum(jnp.minimum(c - lo_a, hi_b - c), t_up)
    t = _clamp_guarded(Y, t_lo, t_hi)
    thrusts = _pair_thrusts(mp.layout, c, t, sigma * d_a, sigma * d_b)
    return thrusts, sigma, _safe_ratio(t, Y, width), c != f


def _safe_ratio(t, Y, width):
    """s = t / Y ∈ [0, 1]; 1 where the yaw demand is below rounding (|Y| ≤ ε·W)."""
    small = jnp.abs(Y) <= jnp.finfo(Y.dtype).eps * width
    return jnp.where(small, 1.0, jnp.clip(t / jnp.where(small, 1.0, Y), 0.0, 1.0))


def _pairs(x):
    """(x_k, x_l) over the K(K − 1)/2 pairs k < l of the last axis (K ≥ 2), as slices and
    broadcasts: XLA fuses these, where a gather by an index array runs ~20 % slower under vmap."""
    K = x.shape[-1]
    first = [jnp.broadcast_to(x[..., k:k + 1], x.shape[:-1] + (K - 1 - k,)) for k in range(K - 1)]
    return jnp.concatenate(first, axis=-1), jnp.concatenate([x[..., k + 1:] for k in range(K - 1)], axis=-1)


def _max_of_min(p, q, lo, hi):
    """max over s ∈ [lo, hi] of min_k (p_k + q_k s), lines (..., K), interval (...,).

    By Helly's theorem in the plane this is the minimum over pairs of the two-line problem,
    whose maximum sits at lo, hi or the pair's crossing: K(K − 1)/2 closed-form problems, the
    pairs k < l only (a pair's maximum is at most either line's alone, and (l, k) is (k, l)).
    Pairs whose slopes differ by less than rounding are taken as parallel (ends only).
    """
    eps = jnp.finfo(p.dtype).eps
    pk, pl, qk, ql = *_pairs(p), *_pairs(q)
    lo, hi = lo[..., None], hi[..., None]
    den = qk - ql
    crossing = jnp.abs(den) > 64 * eps * (jnp.abs(pk) + jnp.abs(pl) + jnp.abs(qk) + jnp.abs(ql))
    s_x = jnp.where(crossing, jnp.clip((pl - pk) / jnp.where(crossing, den, 1.0), lo, hi), lo)

    def pair_min(s):
        return jnp.minimum(pk + qk * s, pl + ql * s)

    best = jnp.maximum(jnp.maximum(pair_min(lo), pair_min(hi)), pair_min(s_x))
    return jnp.min(best, axis=-1)


def _bound(cond, num, den, default):
    """min(num/den, 1) where ``cond`` (num ≥ 0, den > 0 there), else ``default``; never a
    division by a small number (num/max(den, num)), nor by zero where ``cond`` is False."""
    num, den = jnp.where(cond, num, 0.0), jnp.where(cond, den, 1.0)
    return jnp.where(cond, num / jnp.maximum(den, num), default)


def _mix_generic(mp, F, tx, ty, tz):
    """The seed's three steps for any layout, on the pseudo-inverse allocation.

    Tᵢ = c·uᵢ + σ·rᵢ + s·yᵢ with u = P₀, r = P₁τx + P₂τy, y = P₃τz and c the collective [N].
    Divided by uᵢ > 0 (ρ = r/u, η = y/u, λ = T_min/u, μ = T_max/u), rotor i fits iff
    λᵢ ≤ c + σρᵢ + sηᵢ ≤ μᵢ. Eliminating c pairwise, some collective fits iff
    σ aₖ + s bₖ ≤ cₖ for every pair k = (i, j), i ≠ j, with aₖ = ρⱼ − ρᵢ, bₖ = ηⱼ − ηᵢ,
    cₖ = μⱼ − λᵢ > 0. Rounding can leave a range empty by a few ulps: its midpoint is then
    taken, and the final per-rotor clamp keeps the bounds exact.
    1. σ = max over s ∈ [0, s_b] of U(s) = min(1, (cₖ − bₖ s)/aₖ for aₖ > 0), where
       [0, s_b] is where U ≥ L = max(0, (bₖ s − cₖ)/|aₖ| for aₖ < 0) and the aₖ ≈ 0 rows
       hold (:func:`_max_of_min`);
    2. c = clamp(F, c_lo, c_hi): over the s ∈ [s_a, s_b] ⊂ [0, 1] where every rotor pair
       leaves room at σ, c_hi = max of min_j (μⱼ − σρⱼ − ηⱼ s), c_lo = min of max_i
       (λᵢ − σρᵢ − ηᵢ s);
    3. s = the largest s ∈ [0, 1] with every rotor fitting at c.
    O(R⁴) operations, none of them a division by a small number: XLA counts ≈ 3.4·10³ flops
    per demand for R = 4 and ≈ 1.2·10⁴ for R = 6, against ≈ 3·10² for the closed form (with
    each row and pair of rows taken once; 8.5·10³ and 3.8·10⁴ when both orders were).
    """
    dtype = F.dtype
    eps = jnp.finfo(dtype).eps
    P = _pinv(allocation_matrix(mp).astype(dtype))
    u = P[:, 0]
    r = P[:, 1] * tx[..., None] + P[:, 2] * ty[..., None]
    y = P[:, 3] * tz[..., None]
    lam, mu = mp.t_min / u, mp.t_max / u
    rho, eta = r / u, y / u
    # step 1: rows k = (i lower, j upper) of σ aₖ + s bₖ ≤ cₖ, taken a pair of rotors {i < j} at a
    # time: the row (j, i) has −aₖ and −bₖ, so of the two at most one bounds σ from above (aₖ > 0)
    # and at most one from below, and each pair gives U one line and L one (R(R − 1)/2 each, not
    # R(R − 1): the pairwise work below is 3–8× smaller for R = 4)
    i, j = np.triu_indices(u.shape[-1], 1)
    a, b = rho[..., j] - rho[..., i], eta[..., j] - eta[..., i]  # row (i, j); row (j, i) is (−a, −b)
    c_ij = jnp.broadcast_to(mu[j] - lam[i], a.shape)  # > 0 for valid parameters
    c_ji = jnp.broadcast_to(mu[i] - lam[j], a.shape)
    # σ|aₖ| must exceed rounding of cₖ, else the row bounds s alone ("flat")
    up_ij, down_ij = a > 64 * eps * c_ij, a < -64 * eps * c_ij
    up_ji, down_ji = a < -64 * eps * c_ji, a > 64 * eps * c_ji
    up, down = up_ij | up_ji, down_ij | down_ji
    safe_a = jnp.where(up | down, jnp.abs(a), 1.0)
    slope = jnp.where(a > 0, -b, b) / safe_a  # −bₖ/aₖ, the same for both rows
    one, zero = jnp.ones(a.shape[:-1] + (1,), dtype), jnp.zeros(a.shape[:-1] + (1,), dtype)
    # U's lines σ = p + q s (σ ≤ 2 stands for "no line"), L's lines likewise (σ ≥ −1)
    p_up = jnp.concatenate([jnp.where(up, jnp.where(up_ij, c_ij, c_ji) / safe_a, 2.0), one], axis=-1)
    q_up = jnp.concatenate([jnp.where(up, slope, 0.0), zero], axis=-1)
    p_dn = jnp.concatenate([jnp.where(down, -jnp.where(down_ij, c_ij, c_ji) / safe_a, -1.0), zero], axis=-1)
    q_dn = jnp.concatenate([jnp.where(down, slope, 0.0), zero], axis=-1)
    gap0 = p_up[..., :, None] - p_dn[..., None, :]  # > 0: s = 0 fits
    gap1 = q_up[..., :, None] - q_dn[..., None, :]
    s_b = jnp.min(_bound(gap1 < 0, gap0, -gap1, 1.0), axis=(-2, -1))
    flat_ij, flat_ji = ~(up_ij | down_ij) & (b > 0), ~(up_ji | down_ji) & (b < 0)  # aₖ ≈ 0: s bₖ ≤ cₖ
    flat = jnp.minimum(_bound(flat_ij, c_ij, b, 1.0), _bound(flat_ji, c_ji, -b, 1.0))
    s_b = jnp.minimum(s_b, jnp.min(flat, axis=-1))
    sigma = jnp.clip(_max_of_min(p_up, q_up, jnp.zeros_like(s_b), s_b), 0.0, 1.0)
    # step 2: rows h_j(s) = A_j − η_j s ≥ c ≥ ℓ_i(s) = B_i − η_i s
    A, B = mu - sigma[..., None] * rho, lam - sigma[..., None] * rho
    room0 = A[..., None, :] - B[..., :, None]  # [i, j]: h_j − ℓ_i at s = 0
    room1 = eta[..., :, None] - eta[..., None, :]  # its slope in s
    # room0 + room1·s ≥ 0, a negative room0 from rounding taken as 0 where room1 ≤ 0
    s_lo = _bound((room1 > 0) & (room0 < 0), -room0, room1, 0.0)
    s_hi = _bound(room1 < 0, jnp.maximum(room0, 0.0), -room1, 1.0)
    s_a, s_z = jnp.max(s_lo, axis=(-2, -1)), jnp.min(s_hi, axis=(-2, -1))
    s_a, s_z = jnp.where(s_a <= s_z, s_a, 0.5 * (s_a + s_z)), jnp.where(s_a <= s_z, s_z, 0.5 * (s_a + s_z))
    c_hi = _max_of_min(A, -eta, s_a, s_z)
    c_lo = -_max_of_min(-B, eta, s_a, s_z)
    c = _clamp_guarded(F, c_lo, c_hi)
    # step 3: ηᵢ s ≥ B_i − c and ηᵢ s ≤ A_i − c for every rotor
    below, above = B - c[..., None], A - c[..., None]
    abs_eta = jnp.abs(eta)
    reach = jnp.maximum(jnp.max(jnp.abs(A), axis=-1), jnp.max(jnp.abs(B), axis=-1))
    active = abs_eta > eps * reach[..., None]  # else this rotor's yaw share is below rounding
    safe_eta = jnp.where(active, abs_eta, 1.0)
    up = jnp.where(eta > 0, above, -below) / safe_eta
    dn = jnp.where(eta > 0, below, -above) / safe_eta
    s_up = jnp.minimum(jnp.min(jnp.where(active, up, 1.0), axis=-1), 1.0)
    s_dn = jnp.maximum(jnp.max(jnp.where(active, dn, 0.0), axis=-1), 0.0)
    s = jnp.clip(jnp.where(s_dn <= s_up, s_up, 0.5 * (s_dn + s_up)), 0.0, 1.0)
    thrusts = c[..., None] * u + sigma[..., None] * r + s[..., None] * y
    return thrusts, sigma, s, c != F


def mix(mp: MixerParams, w) -> MixerOutput:
    """Rotor thrusts for the wrench w (..., 4) = (F [N], τx, τy, τz [N·m], body FLU), within limits.

    Every thrust in [T_min, T_max]; achieved = wrench(thrusts); achieved torque
    (σ τx, σ τy, s τz), σ ∈ (0, 1], s ∈ [0, 1]; a demand within the limits comes back
    unchanged with σ = s = 1; continuous in the demand. The priority and its algorithm
    are in the module docstring. A non-finite demand gives every rotor at T_min and
    ``valid = False`` (σ = s = 0). ``mp`` is one vehicle's parameters (vmap over a batch).
    """
    demand = split(_as_wrench(mp, w))  # components (GUIDE §3): element-wise work, no small stacks
    valid = jnp.isfinite(demand[0]) & jnp.isfinite(demand[1]) & jnp.isfinite(demand[2]) & jnp.isfinite(demand[3])
    bounded, g_rp, g_yaw = _bounded_demand(*(jnp.where(valid, x, 0.0) for x in demand))
    mixed = _mix_pairs if mp.layout.closed_form else _mix_generic
    thrusts, sigma, s, moved = mixed(mp, *bounded)
    lo, hi = jnp.asarray(mp.t_min, demand[0].dtype), jnp.asarray(mp.t_max, demand[0].dtype)
    thrusts = jnp.where(valid[..., None], jnp.clip(thrusts, lo, hi), lo)
    return MixerOutput(
        thrusts=thrusts,
        achieved=wrench(mp, thrusts),
        rp_scale=jnp.where(valid, sigma * g_rp, 0.0),
        yaw_scale=jnp.where(valid, s * g_yaw, 0.0),
        collective_moved=jnp.where(valid, moved, True),
        valid=valid,
    )


def saturation_from(w, out: MixerOutput) -> jax.Array:
    """The saturation report (..., 4) int32 for (roll, pitch, yaw, collective), seed 002.

    +1: delivered less than the demand (cut high), −1: delivered more (cut low), 0: met.
    Roll and pitch are cut when σ < 1, yaw when s < 1, each toward its demand's sign; the
    collective, when it moved, toward sign(F − F_achieved) (airmode reports −1).
    All zeros for a non-finite demand (``out.valid`` False).
    """
    w = jnp.asarray(w)
    rp_cut, yaw_cut = out.rp_scale < 1, out.yaw_scale < 1
    report = jnp.stack(
        [
            jnp.where(rp_cut, jnp.sign(w[..., 1]), 0),
            jnp.where(rp_cut, jnp.sign(w[..., 2]), 0),
            jnp.where(yaw_cut, jnp.sign(w[..., 3]), 0),
            jnp.where(out.collective_moved, jnp.sign(w[..., 0] - out.achieved[..., 0]), 0),
        ],
        axis=-1,
    )
    return jnp.where(out.valid[..., None], report, 0).astype(jnp.int32)


def to_rotor_command(mp: MixerParams, thrusts) -> jax.Array:
    """ωᵢ = √(Tᵢ / k_f) (..., R) [rad/s], inverting T = k_f ω² for a full battery.

    Pre: thrusts finite and ≥ 0; a negative or non-finite thrust gives ω = 0. The
    gradient at T = 0 is taken as 0 (the true one is infinite).
    """
    thrusts = jnp.asarray(thrusts)
    positive = jnp.isfinite(thrusts) & (thrusts > 0)
    safe = jnp.where(positive, thrusts, 1.0)
    return jnp.where(positive, jnp.sqrt(safe / jnp.asarray(mp.k_f)[..., None]), 0.0)
