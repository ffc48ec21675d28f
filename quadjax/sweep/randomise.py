"""Per-vehicle randomisation: parameter leaves, initial state, sensor noise.

Everything is drawn from explicit PRNG keys, one per vehicle: vehicle ``i`` of a sweep
with seed ``s`` uses ``fold_in(key(s), i)`` and nothing else, so its draws do not depend
on the chunk it falls in, the chunk size or the number of devices (same seed, same
vehicle, same bits).

A :class:`Perturbation` says how one :class:`~quadjax.QuadParams` field varies: a
distribution (``uniform``, ``normal``, ``lognormal``) and a ``mode`` that says how the
draw x meets the nominal value p₀ (``absolute``: p = x; ``scale``: p = p₀·x; ``offset``:
p = p₀ + x). ``Perturbation.relative(field, 0.1)`` is "±10 %": x ~ U(0.9, 1.1), scale.

Structure (which fields, which distribution, which mode) is static: it is hashed into
the compiled sweep. The distribution's two numbers are traced values, so sweeps that
differ only in them share one compilation.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from quadjax._pytree import pytree_dataclass
from quadjax.model import hover_rotor_speed
from quadjax.params import QuadParams, params_valid
from quadjax.quaternion import quat_multiply
from quadjax.quaternion import quat_from_rotation_vector as small_rotation  # the sweep names it so
from quadjax.state import QuadState

DISTRIBUTIONS = ("uniform", "normal", "lognormal")
MODES = ("absolute", "scale", "offset")
#: fields that are not physical magnitudes and cannot be randomised
FIXED_FIELDS = ("rotor_spins",)
RANDOMISABLE = tuple(f.name for f in dataclasses.fields(QuadParams) if f.name not in FIXED_FIELDS)
_FIELD_INDEX = {f.name: i for i, f in enumerate(dataclasses.fields(QuadParams))}


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """How one QuadParams ``field`` varies across vehicles.

    dist: ``"uniform"`` x ~ U(a, b); ``"normal"`` x ~ N(a, b²) (a mean, b std);
        ``"lognormal"`` x = exp(a + b ξ), ξ ~ N(0, 1) (median eᵃ).
    mode: ``"absolute"`` p = x; ``"scale"`` p = p₀·x; ``"offset"`` p = p₀ + x. Default
        (None): ``"scale"`` for lognormal, ``"absolute"`` otherwise (as in the TOML config).
    per_element: False draws one x per vehicle for the whole leaf (a (3,) drag scales as
        one), True one per element. ``inertia`` is special: its draws act on the principal
        axes (the diagonal), x of shape (3,) or shared; ``scale`` maps J → D J D with
        D = diag(√x), which keeps J symmetric and, for x > 0, positive definite.
    """

    field: str
    dist: str
    a: float
    b: float
    mode: str | None = None
    per_element: bool = False

    def __post_init__(self):
        if self.mode is None:
            object.__setattr__(self, "mode", "scale" if self.dist == "lognormal" else "absolute")
        if self.field not in RANDOMISABLE:
            raise ValueError(f"randomise: unknown or fixed field {self.field!r}; choose from {', '.join(RANDOMISABLE)}")
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"randomise.{self.field}.dist = {self.dist!r}: choose one of {', '.join(DISTRIBUTIONS)}")
        if self.mode not in MODES:
            raise ValueError(f"randomise.{self.field}.mode = {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.dist == "uniform" and not self.a <= self.b:
            raise ValueError(f"randomise.{self.field}: uniform needs low <= high, got low={self.a}, high={self.b}")
        if self.dist != "uniform" and not self.b >= 0:
            raise ValueError(f"randomise.{self.field}: {self.dist} needs a spread >= 0, got {self.b}")

    @classmethod
    def relative(cls, field: str, spread: float, per_element: bool = False) -> "Perturbation":
        """p = p₀·x, x ~ U(1 − spread, 1 + spread): "±spread·100 %"."""
        if not 0.0 <= spread < 1.0:
            raise ValueError(f"randomise.{field}.spread = {spread}: must be in [0, 1) (0.1 means ±10 %)")
        return cls(field, "uniform", 1.0 - spread, 1.0 + spread, "scale", per_element)


@dataclasses.dataclass(frozen=True)
class RandomSpec:
    """All parameter randomisation of a sweep.

    perturbations: one per field at most.
    inertia_with_mass: J ← J·(m/m₀) after the draws: a heavier vehicle of the same
        shape and size (uniform density change); an inertia perturbation acts on top.
    keep_thrust_to_weight: ω_max ← ω_max·√((m g / m₀ g₀)·(k_f₀ / k_f)), so the
        maximum thrust R k_f ω_max² over the weight m g stays the nominal ratio.
    """

    perturbations: tuple = ()
    inertia_with_mass: bool = False
    keep_thrust_to_weight: bool = False

    def __post_init__(self):
        fields = [p.field for p in self.perturbations]
        for f in fields:
            if fields.count(f) > 1:
                raise ValueError(f"randomise: field {f!r} perturbed twice; give one distribution per field")

    def skeleton(self) -> "RandomSpec":
        """The same spec with every distribution's numbers zeroed: the static part, hashed
        into a compiled sweep (the numbers travel as :meth:`values`)."""
        return dataclasses.replace(self, perturbations=tuple(
            dataclasses.replace(p, a=0.0, b=0.0) for p in self.perturbations))

    @property
    def varied_fields(self) -> tuple:
        """The QuadParams fields that differ between vehicles (in field order)."""
        names = {p.field for p in self.perturbations}
        names |= {"inertia"} if self.inertia_with_mass else set()
        names |= {"omega_max"} if self.keep_thrust_to_weight else set()
        return tuple(n for n in RANDOMISABLE if n in names)

    def values(self, dtype) -> tuple:
        """The traced part: ((a, b), …) as arrays of ``dtype``."""
        return tuple((jnp.asarray(p.a, dtype), jnp.asarray(p.b, dtype)) for p in self.perturbations)


#: every random draw of a sweep is made of blocks of this many numbers (one compiled shape:
#: each distinct shape of a threefry draw costs ~0.6 s of XLA compilation on CPU; 4 = two
#: threefry evaluations, what a gust needs each tick)
BLOCK = 4


def raw_draws(key, n: int, dtype):
    """n numbers uniform on the open interval (−1, 1), from ⌈n/4⌉ blocks
    ``uniform(fold_in(key, b), (4,))``."""
    lo = jnp.nextafter(jnp.asarray(-1.0, dtype), jnp.asarray(0.0, dtype))
    blocks = [jax.random.uniform(jax.random.fold_in(key, b), (BLOCK,), dtype, lo, 1.0) for b in range(-(-n // BLOCK))]
    return jnp.concatenate(blocks)[:n]


def standard_normal(w):
    """ξ = √2 erfinv(w) ~ N(0, 1) from w ~ U(−1, 1) (how ``jax.random.normal`` makes them)."""
    return jnp.sqrt(2.0).astype(w.dtype) * jax.scipy.special.erfinv(w)


def draw(dist: str, a, b, w):
    """Draws of U(a, b), N(a, b²) or exp(N(a, b²)) from raw draws w ~ U(−1, 1)."""
    if dist == "uniform":
        return a + (b - a) * (0.5 * (w + 1.0))
    z = standard_normal(w)
    return a + b * z if dist == "normal" else jnp.exp(a + b * z)


def _combine(nominal, x, mode):
    """p from the nominal p₀ and a draw x: x, p₀·x or p₀ + x (x broadcast to p₀)."""
    x = jnp.broadcast_to(x, jnp.shape(nominal))
    return x if mode == "absolute" else nominal * x if mode == "scale" else nominal + x


def _combine_inertia(J, x, mode):
    """Apply a draw x (3,) to the principal axes of J (3, 3); see :class:`Perturbation`."""
    x = jnp.broadcast_to(x, (3,))
    if mode == "scale":
        d = jnp.sqrt(x)  # a negative draw gives NaN, which params_valid rejects
        return J * d[:, None] * d[None, :]
    diag = jnp.diagonal(J)
    new = x if mode == "absolute" else diag + x
    return J + jnp.diag(new - diag)


def sample_params(nominal: QuadParams, spec: RandomSpec, values, key) -> QuadParams:
    """One vehicle's parameters: each perturbation drawn from ``fold_in(key, j)``, j the
    field's index in QuadParams (so a field's draws do not depend on which others vary),
    with the numbers ``values`` (:meth:`RandomSpec.values`; the spec's own numbers are not
    read), then the consistency options. Unchecked: judge the result
    with :func:`quadjax.params_valid` (a normal draw can make a mass negative)."""
    out = {}
    for p, (a, b) in zip(spec.perturbations, values):
        p0 = getattr(nominal, p.field)
        k = jax.random.fold_in(key, _FIELD_INDEX[p.field])
        shape = ((3,) if p.field == "inertia" else jnp.shape(p0)) if p.per_element else ()
        w = raw_draws(k, max(1, math.prod(shape)), p0.dtype).reshape(shape)
        x = draw(p.dist, a, b, w)
        out[p.field] = _combine_inertia(p0, x, p.mode) if p.field == "inertia" else _combine(p0, x, p.mode)
    params = nominal.replace(**out)
    mass_ratio = params.mass / nominal.mass
    if spec.inertia_with_mass:
        params = params.replace(inertia=params.inertia * mass_ratio)
    if spec.keep_thrust_to_weight:
        weight_ratio = mass_ratio * params.gravity / nominal.gravity
        params = params.replace(omega_max=params.omega_max * jnp.sqrt(weight_ratio * nominal.k_f / params.k_f))
    return params


def sample_valid_params(nominal: QuadParams, spec: RandomSpec, values, key):
    """(params, ok): :func:`sample_params`, with the nominal vehicle in place of a draw that
    breaks invariant I1 (``ok`` False), so one bad draw never poisons a batch."""
    params = sample_params(nominal, spec, values, key)
    ok = params_valid(params)
    safe = jax.tree_util.tree_map(lambda x, x0: jnp.where(ok, x, x0), params, nominal)
    return safe, ok


@pytree_dataclass
class InitialSpread:
    """Standard deviations of the initial-state perturbation, each (3,): position [m] and
    velocity [m/s] (world), attitude [rad] (rotation vector, body) and body rates [rad/s]."""

    position: jax.Array
    velocity: jax.Array
    attitude: jax.Array
    body_rates: jax.Array

    @classmethod
    def create(cls, position=0.0, velocity=0.0, attitude=0.0, body_rates=0.0, dtype=None) -> "InitialSpread":
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype
        vals = dict(position=position, velocity=velocity, attitude=attitude, body_rates=body_rates)
        return cls(**{k: jnp.broadcast_to(jnp.asarray(v, dtype), (3,)) for k, v in vals.items()})


def initial_state(params: QuadParams, reference, spread: InitialSpread, z) -> QuadState:
    """The vehicle on its reference at t = 0 (position, velocity, heading), rotors at its
    own hover speed, plus errors ``spread`` ⊙ z, z (4, 3) standard normal draws (rows:
    position, velocity, attitude, body rates). It starts on the ground (``on_ground`` = 1,
    z clamped to ``ground_z``) where the reference does."""
    dtype = params.mass.dtype
    ref = reference(jnp.zeros((), dtype))
    position = ref.position + spread.position * z[0]
    grounded = position[2] <= params.ground_z + 1e-6 * (1.0 + jnp.abs(params.ground_z))
    position = position.at[2].set(jnp.where(grounded, params.ground_z, position[2]))
    yaw = ref.yaw
    q_yaw = jnp.stack([jnp.cos(0.5 * yaw), 0.0 * yaw, 0.0 * yaw, jnp.sin(0.5 * yaw)])
    return QuadState(
        position=position,
        velocity=jnp.where(grounded, 0.0, ref.velocity + spread.velocity * z[1]),
        attitude=quat_multiply(q_yaw, small_rotation(spread.attitude * z[2])),
        body_rates=jnp.where(grounded, 0.0, spread.body_rates * z[3]),
        rotor_speeds=hover_rotor_speed(params),
        energy=jnp.zeros((), dtype),
        on_ground=grounded.astype(dtype),
    )


@pytree_dataclass
class SensorNoise:
    """White noise on what the controller sees, standard deviations (3,) each: position [m],
    velocity [m/s], attitude [rad] (rotation vector, body) and body rates [rad/s]."""

    position: jax.Array
    velocity: jax.Array
    attitude: jax.Array
    body_rates: jax.Array

    @classmethod
    def create(cls, position=0.0, velocity=0.0, attitude=0.0, body_rates=0.0, dtype=None) -> "SensorNoise":
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype
        vals = dict(position=position, velocity=velocity, attitude=attitude, body_rates=body_rates)
        return cls(**{k: jnp.broadcast_to(jnp.asarray(v, dtype), (3,)) for k, v in vals.items()})


def observe(state: QuadState, noise: SensorNoise, z) -> QuadState:
    """The state as a noisy sensor suite reports it: errors ``noise`` ⊙ z, z (4, 3) standard
    normal draws (rows: position, velocity, attitude, body rates); rotor speeds, energy exact."""
    return state.replace(
        position=state.position + noise.position * z[0],
        velocity=state.velocity + noise.velocity * z[1],
        attitude=quat_multiply(state.attitude, small_rotation(noise.attitude * z[2])),
        body_rates=state.body_rates + noise.body_rates * z[3],
    )
