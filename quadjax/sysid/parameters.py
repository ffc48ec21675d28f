"""Which parameters are fitted, and how: an unconstrained vector θ ↔ (QuadParams, MotorMap).

Every fitted scalar has one entry in θ. Positive quantities are log-parameterised,
value = ref · exp(θ) (θ = 0 at the start, a step in θ is a relative change);
signed ones are affine, value = start + scale · θ, with ``scale`` a typical size
of that quantity. Both keep θ of order one, which is what Adam, L-BFGS and the
Fisher information's rank test need.

Names (``fit(..., names)``, ``quadjax fit --fit``): a group, or one component as
``group.component``:

==================  =================  ==========  =========================================
group               components         transform   meaning
==================  =================  ==========  =========================================
mass                —                  log         kg
k_f                 —                  log         N/(rad/s)²
k_m                 —                  log         m, yaw torque per newton of thrust
motor_tau           —                  log         s, rotor lag (needs motor-command inputs)
rotor_inertia       —                  log         kg·m², gyroscopic term
motor_tau_down_ratio —                 log         spin-down lag / spin-up lag
rotor_reaction_inertia —               log         kg·m², reaction torque −I_a Σ spinᵢ ω̇ᵢ
                                                   (needs motor-command inputs: measured
                                                   speeds drive the rotors without lag)
rotor_drag          —                  log         N/((m/s)·(rad/s)), H-force
blade_flapping      —                  log         N·m/((m/s)·(rad/s)), flapping moment
k_inflow            —                  log         N/((m/s)·(rad/s)), thrust lost to inflow
rotor_radius        —                  log         m, ground effect
inertia             xx, yy, zz         log         kg·m², principal diagonal
inertia_products    xy, xz, yz         affine      kg·m², off-diagonal (kept symmetric)
drag_linear         x, y, z            log         N/(m/s), body axes
drag_quadratic      x, y, z            log         N/(m/s)²
drag_rotational     x, y, z            log         N·m/(rad/s)
wind                x, y, z            affine      m/s, world
com_offset          x, y, z            affine      m, centre of mass in the body frame
                                                   (moves every rotor hub by −offset)
rotor_xy            0x, 0y, 1x, …      affine      m, rotor hub x, y (PX4 order)
motor_offset        0, 1, …            affine      rad/s, MotorMap.offset
motor_gain          0, 1, …            log         MotorMap.gain
motor_exponent      —                  log         MotorMap.exponent
==================  =================  ==========  =========================================

A positive quantity that starts at 0 (no drag in the preset, say) starts at a
small floor instead, since log(0) has no gradient: a 10 s time constant for the drag terms
(0.1·m, 0.1·mean J), 1e-3 of J_zz for the rotor inertia (the reaction torque's starts at the
gyroscopic one's), 1e-3 of the arm for k_m, 1 ms for τ; a 10 s velocity time constant at hover for the
rotor drag (and the same force at a lever of one arm for the flapping), 1 % of the hover thrust per m/s
for the inflow, half the arm for the rotor radius.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.params import QuadParams
from quadjax.sysid.motor import MotorMap

# --- the groups -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Group:
    components: tuple[str, ...]
    positive: bool
    get: Callable  # (QuadParams, MotorMap) -> (n,) array
    put: Callable  # (QuadParams, MotorMap, (n,) values, base QuadParams) -> (QuadParams, MotorMap)
    scale: Callable | None = None  # (QuadParams, MotorMap) -> typical size, for affine groups


def _scalar(field):
    return _Group(
        ("",), True,
        lambda p, m: jnp.reshape(getattr(p, field), (1,)),
        lambda p, m, v, base: (p.replace(**{field: v[0]}), m),
    )


def _vector3(field, positive, scale=None):
    return _Group(
        ("x", "y", "z"), positive,
        lambda p, m: getattr(p, field),
        lambda p, m, v, base: (p.replace(**{field: v}), m),
        scale,
    )


_DIAG = (0, 1, 2)
_OFF = ((0, 1), (0, 2), (1, 2))


def _set_inertia_diag(p, m, v, base):
    J = p.inertia.at[_DIAG, _DIAG].set(v)
    return p.replace(inertia=J), m


def _set_inertia_products(p, m, v, base):
    rows, cols = zip(*_OFF)
    J = p.inertia.at[rows, cols].set(v).at[cols, rows].set(v)
    return p.replace(inertia=J), m


def _arm(p):
    return jnp.mean(jnp.linalg.norm(p.rotor_positions[:, :2], axis=-1))


def _per_rotor(field, positive, scale=None):
    """A MotorMap field with one component per rotor."""
    return lambda R: _Group(
        tuple(str(i) for i in range(R)), positive,
        lambda p, m: getattr(m, field),
        lambda p, m, v, base: (p, m.replace(**{field: v})),
        scale,
    )


def _rotor_xy(R):
    return _Group(
        tuple(f"{i}{a}" for i in range(R) for a in "xy"), False,
        lambda p, m: jnp.reshape(p.rotor_positions[:, :2], (-1,)),
        lambda p, m, v, base: (p.replace(rotor_positions=p.rotor_positions.at[:, :2].set(v.reshape(R, 2))), m),
        lambda p, m: 0.1 * _arm(p),
    )


def _fixed(group):
    return lambda R: group


#: group name → builder (rotor count → _Group), in the order labels are listed
_BUILDERS = {
    "mass": _fixed(_scalar("mass")),
    "k_f": _fixed(_scalar("k_f")),
    "k_m": _fixed(_scalar("k_m")),
    "motor_tau": _fixed(_scalar("motor_tau")),
    "rotor_inertia": _fixed(_scalar("rotor_inertia")),
    "motor_tau_down_ratio": _fixed(_scalar("motor_tau_down_ratio")),
    "rotor_reaction_inertia": _fixed(_scalar("rotor_reaction_inertia")),
    "rotor_drag": _fixed(_scalar("rotor_drag")),
    "blade_flapping": _fixed(_scalar("blade_flapping")),
    "k_inflow": _fixed(_scalar("k_inflow")),
    "rotor_radius": _fixed(_scalar("rotor_radius")),
    "inertia": _fixed(_Group(("xx", "yy", "zz"), True, lambda p, m: jnp.diagonal(p.inertia), _set_inertia_diag)),
    "inertia_products": _fixed(_Group(
        ("xy", "xz", "yz"), False,
        lambda p, m: jnp.stack([p.inertia[i, j] for i, j in _OFF]),
        _set_inertia_products,
        lambda p, m: 0.1 * jnp.mean(jnp.diagonal(p.inertia)),
    )),
    "drag_linear": _fixed(_vector3("drag_linear", True)),
    "drag_quadratic": _fixed(_vector3("drag_quadratic", True)),
    "drag_rotational": _fixed(_vector3("drag_rotational", True)),
    "wind": _fixed(_vector3("wind", False, lambda p, m: 1.0)),
    "com_offset": _fixed(_Group(
        ("x", "y", "z"), False,
        lambda p, m: jnp.zeros(3, p.mass.dtype),
        lambda p, m, v, base: (p.replace(rotor_positions=base.rotor_positions - v), m),
        lambda p, m: 0.1 * _arm(p),
    )),
    "rotor_xy": _rotor_xy,
    "motor_offset": _per_rotor("offset", False, lambda p, m: 50.0),  # rad/s: a few % of a rotor speed
    "motor_gain": _per_rotor("gain", True),
    "motor_exponent": _fixed(_Group(
        ("",), True,
        lambda p, m: jnp.reshape(m.exponent, (1,)),
        lambda p, m, v, base: (p, m.replace(exponent=v[0])),
    )),
}

#: the names of the parameter groups that can be fitted
GROUPS = tuple(_BUILDERS)


def _group(name: str, R: int) -> _Group:
    return _BUILDERS[name](R)


def _floors(p: QuadParams) -> dict:
    """Starting values [SI] for positive quantities that start at 0 (log(0) has no gradient)."""
    jm = jnp.mean(jnp.diagonal(p.inertia))
    w_hover = jnp.sqrt(p.mass * p.gravity / (p.num_rotors * p.k_f))
    return {
        "rotor_reaction_inertia": jnp.where(p.rotor_inertia > 0, p.rotor_inertia, 1e-3 * p.inertia[2, 2]),
        "rotor_drag": 0.1 * p.mass / (p.num_rotors * w_hover),  # a 10 s velocity time constant at hover
        "blade_flapping": 0.1 * p.mass * _arm(p) / (p.num_rotors * w_hover),  # that drag at the arm's height
        "k_inflow": 0.01 * p.k_f * w_hover,                    # 1 % of hover thrust per m/s of climb
        "rotor_radius": 0.5 * _arm(p),
        "drag_linear": 0.1 * p.mass,           # a 10 s velocity time constant
        "drag_quadratic": 0.1 * p.mass,
        "drag_rotational": 0.1 * jm,           # a 10 s body-rate time constant
        "rotor_inertia": 1e-3 * p.inertia[2, 2],
        "k_m": 1e-3 * _arm(p),
        "motor_tau": jnp.asarray(1e-3, p.mass.dtype),
    }


def parse_names(names, num_rotors: int = 4) -> dict[str, tuple[int, ...]]:
    """'inertia,k_f,drag_linear.z' (or a sequence) → {group: component indices}; ValueError on a bad name."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    chosen: dict[str, set] = {}
    for raw in names:
        name = raw.strip()
        group, _, comp = name.partition(".")
        if group not in GROUPS:
            raise ValueError(f"cannot fit {name!r}: choose from {', '.join(GROUPS)} (optionally group.component)")
        g = _group(group, num_rotors)
        if comp:
            if comp not in g.components:
                raise ValueError(f"cannot fit {name!r}: {group} has components {', '.join(g.components)}")
            idx = {g.components.index(comp)}
        else:
            idx = set(range(len(g.components)))
        chosen.setdefault(group, set()).update(idx)
    if not chosen:
        raise ValueError("no parameter to fit: give at least one name")
    if "com_offset" in chosen and "rotor_xy" in chosen:
        raise ValueError("com_offset and rotor_xy both move the rotor hubs: fit one of them")
    order = list(GROUPS)
    return {g: tuple(sorted(chosen[g])) for g in sorted(chosen, key=order.index)}


def _label(group, g, i):
    return group if g.components == ("",) else f"{group}.{g.components[i]}"


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """The map θ (P,) ↔ (QuadParams, MotorMap) for a chosen set of parameters.

    Build it with :meth:`ParamSpec.create`. θ = 0 is the start (``params0``,
    ``motor_map0``, with floors for positive quantities that start at 0).

    A pytree: the arrays are leaves (params0, motor_map0; ref (P,) start values —
    log entries: value = ref·exp θ, affine: value = ref + scale·θ; scale (P,);
    prior_mean, prior_std (P,) in θ, std = inf where no prior; lower, upper (P,)
    bounds in θ) and the structure is static (labels (P,) names of the fitted
    scalars; groups, the chosen components per group; positive (P,) bools), so
    two specs of the same structure share one compiled fit.
    """

    labels: tuple[str, ...]
    groups: tuple[tuple[str, tuple[int, ...]], ...]
    positive: tuple[bool, ...]
    params0: QuadParams
    motor_map0: MotorMap
    ref: np.ndarray
    scale: np.ndarray
    prior_mean: np.ndarray
    prior_std: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @classmethod
    def create(cls, names, params0: QuadParams, motor_map0: MotorMap | None = None, *,
               priors: dict | None = None, bounds: dict | None = None) -> "ParamSpec":
        """Args:
            names: groups or ``group.component`` labels (module docstring), a list or comma string.
            params0, motor_map0: the start (and the values of everything not fitted).
            priors: label or group → (mean, std) in SI units (scalars or per component):
                a Gaussian prior, added to the least-squares objective as (value − mean)/std
                (in θ: log entries use the relative std, std/mean).
            bounds: label or group → (lower, upper) in SI units; θ is projected into
                them after every optimiser step. Positive quantities stay > 0 anyway.
        """
        R = params0.num_rotors
        dtype = params0.mass.dtype
        motor_map0 = motor_map0 if motor_map0 is not None else MotorMap.identity(R, dtype=dtype)
        # one dtype, no weak types: specs built in different ways then share a compiled fit
        params0, motor_map0 = params0.astype(dtype), motor_map0.astype(dtype)
        chosen = parse_names(names, R)
        floors = _floors(params0)
        labels, positive, ref, scale = [], [], [], []
        for group, idx in chosen.items():
            g = _group(group, R)
            start = np.asarray(g.get(params0, motor_map0), np.float64)
            typical = None if g.positive else float(g.scale(params0, motor_map0)) if g.scale else 1.0
            for i in idx:
                labels.append(_label(group, g, i))
                positive.append(g.positive)
                if g.positive:
                    v = start[i]
                    if not v > 0:
                        if group not in floors:
                            raise ValueError(f"cannot fit {labels[-1]}: its start value {v} must be > 0")
                        v = float(np.asarray(floors[group]))
                    ref.append(v)
                    scale.append(v)
                else:
                    ref.append(start[i])
                    scale.append(typical if typical and typical > 0 else 1.0)
        P = len(labels)
        positive, ref, scale = np.array(positive), np.array(ref), np.array(scale)
        prior_mean, prior_std = np.zeros(P), np.full(P, np.inf)
        lower, upper = np.full(P, -np.inf), np.full(P, np.inf)
        for key, (a, b) in (priors or {}).items():
            for k, i in _select(key, labels, R):
                mean, std = _pick(a, k), _pick(b, k)
                if not std > 0:
                    raise ValueError(f"prior of {labels[i]}: std must be > 0, got {std}")
                if positive[i]:
                    if not mean > 0:
                        raise ValueError(f"prior of {labels[i]}: mean must be > 0 (log-parameterised), got {mean}")
                    prior_mean[i], prior_std[i] = math.log(mean / ref[i]), std / mean
                else:
                    prior_mean[i], prior_std[i] = (mean - ref[i]) / scale[i], std / scale[i]
        for key, (lo, hi) in (bounds or {}).items():
            for k, i in _select(key, labels, R):
                lo_i, hi_i = _pick(lo, k), _pick(hi, k)
                if not lo_i < hi_i:
                    raise ValueError(f"bounds of {labels[i]}: need lower < upper, got ({lo_i}, {hi_i})")
                lower[i], upper[i] = _to_theta(lo_i, positive[i], ref[i], scale[i]), \
                    _to_theta(hi_i, positive[i], ref[i], scale[i])
        groups = tuple((g, idx) for g, idx in chosen.items())
        return cls(tuple(labels), groups, tuple(bool(b) for b in positive), params0, motor_map0, ref, scale,
                   prior_mean, prior_std, lower, upper)

    @property
    def size(self) -> int:
        """P, the number of fitted scalars."""
        return len(self.labels)

    def theta0(self, dtype=None):
        """The start, θ = 0, clipped into the bounds."""
        dtype = dtype or self.params0.mass.dtype
        return self.project(jnp.zeros(self.size, dtype))

    def values(self, theta):
        """Fitted scalars in SI units (P,): ref·exp θ or ref + scale·θ. Traceable."""
        ref = jnp.asarray(self.ref, theta.dtype)
        scale = jnp.asarray(self.scale, theta.dtype)
        return jnp.where(np.asarray(self.positive, bool), ref * jnp.exp(theta), ref + scale * theta)

    def value_std(self, theta, theta_std):
        """SI standard deviations (P,) from θ standard deviations, to first order (delta method)."""
        size = np.where(self.positive, np.abs(np.asarray(self.values(jnp.asarray(theta)))), np.asarray(self.scale))
        return size * np.asarray(theta_std)

    def unpack(self, theta) -> tuple[QuadParams, MotorMap]:
        """(QuadParams, MotorMap) at θ; everything not fitted as in the start. Traceable."""
        values = self.values(theta)
        p, m = self.params0.astype(theta.dtype), self.motor_map0.astype(theta.dtype)
        base, R, k = p, p.num_rotors, 0
        for group, idx in self.groups:
            g = _group(group, R)
            current = g.get(p, m)
            new = current.at[jnp.asarray(idx)].set(values[k: k + len(idx)])
            p, m = g.put(p, m, new, base)
            k += len(idx)
        return p, m

    def prior_residuals(self, theta):
        """(θ − mean) / std for the entries with a prior, 0 elsewhere (P,). Traceable."""
        std = jnp.asarray(self.prior_std, theta.dtype)
        has = jnp.isfinite(std)
        return jnp.where(has, (theta - jnp.asarray(self.prior_mean, theta.dtype)) / jnp.where(has, std, 1.0), 0.0)

    def project(self, theta):
        """θ clipped into the bounds."""
        return jnp.clip(theta, jnp.asarray(self.lower, theta.dtype), jnp.asarray(self.upper, theta.dtype))

    def at_bound(self, theta) -> np.ndarray:
        """(P,) True where θ sits on a finite bound."""
        t, lo, hi = np.asarray(theta), np.asarray(self.lower), np.asarray(self.upper)
        return (np.isfinite(lo) & (t <= lo + 1e-9)) | (np.isfinite(hi) & (t >= hi - 1e-9))


jax.tree_util.register_dataclass(
    ParamSpec,
    data_fields=["params0", "motor_map0", "ref", "scale", "prior_mean", "prior_std", "lower", "upper"],
    meta_fields=["labels", "groups", "positive"],
)


def _select(key, labels, R):
    """(component index within its group, label index) pairs that a prior/bound key refers to.

    A label ('inertia.zz') takes a scalar; a group ('inertia') takes a scalar or
    one value per component of the whole group.
    """
    if key in labels:
        return [(0, labels.index(key))]
    if key not in GROUPS:
        raise ValueError(f"prior/bound for {key!r}: not a parameter name")
    comps = _group(key, R).components
    hits = [(comps.index(lab.partition(".")[2]), i) for i, lab in enumerate(labels) if lab.partition(".")[0] == key]
    if not hits:
        raise ValueError(f"prior/bound for {key!r}, which is not fitted (fitted: {', '.join(labels)})")
    return hits


def _pick(x, k):
    arr = np.ravel(np.asarray(x, np.float64))
    return float(arr[k] if arr.size > 1 else arr[0])


def _to_theta(value, positive, ref, scale):
    if positive:
        return math.log(value / ref) if value > 0 else -np.inf
    return (value - ref) / scale
