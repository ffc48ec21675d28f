"""Vehicle parameters: a pytree of float arrays in SI, checked at the API boundary."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass


@pytree_dataclass
class QuadParams:
    """Physical parameters of one multirotor (or a batch, with leading axes).

    Every field is a float array; nothing derived (J⁻¹, hover speed, arm length)
    is stored. Build it with :meth:`QuadParams.create`, which checks every field.

    Fields (R rotors):
        mass: () kg.
        inertia: (3, 3) kg·m², full, symmetric positive definite, body frame (FLU).
        rotor_positions: (R, 3) m, rotor hubs in the body frame (FLU).
        rotor_spins: (R,) +1 counter-clockwise seen from above, −1 clockwise.
        k_f: () N/(rad/s)², thrust T = k_f ω².
        k_m: () m, yaw reaction torque per newton of thrust (−spin·k_m·T).
        motor_tau: () s, first-order rotor lag; 0 means rotors follow the command.
        omega_min, omega_max: () rad/s, the command clamp.
        drag_linear: (3,) N/(m/s), body-axis drag on the air-relative velocity.
        drag_quadratic: (3,) N/(m/s)², body-axis drag ∝ v_b|v_b|.
        drag_rotational: (3,) N·m/(rad/s), opposing the body rates.
        rotor_inertia: () kg·m², one rotor about its spin axis (gyroscopic term).
        k_p: () W/(rad/s)³, electrical power P = Σ k_p ω³.
        battery_capacity: () J, energy at which the sag is complete.
        battery_sag: () 1, thrust scale s = 1 − sag·min(E/capacity, 1).
        ground_z: () m, world height of the ground plane.
        gravity: () m/s², along world −z.
        wind: (3,) m/s, world frame (ENU).

    Effects for small vehicles and real flights, each off at its default (every preset stays
    bit-identical; :mod:`quadjax.quadrotor` has the equations):
        motor_tau_down_ratio: () 1, spin-down lag over spin-up lag (τ_down = ratio · τ); 1 = symmetric.
        rotor_reaction_inertia: () kg·m², the spinning mass whose acceleration reacts on the
            body about z (−I_a Σ spinᵢ ω̇ᵢ); physically the rotor's (and motor bell's) inertia,
            kept apart from ``rotor_inertia`` so that each term is switched on, and fitted, alone.
        rotor_drag: () N/((m/s)·(rad/s)), the H-force −k_h ωᵢ v⊥ of each rotor in its plane.
        blade_flapping: () N·m/((m/s)·(rad/s)), the moment k_β Σωᵢ (v_b,y, −v_b,x, 0) of the
            rotor discs tilting away from the in-plane airflow.
        k_inflow: () N/((m/s)·(rad/s)), thrust lost to axial inflow, ΔTᵢ = −k_in ωᵢ v_z,i.
        rotor_radius: () m, the propeller radius of the ground effect; 0 = no ground effect.
    """

    mass: jax.Array
    inertia: jax.Array
    rotor_positions: jax.Array
    rotor_spins: jax.Array
    k_f: jax.Array
    k_m: jax.Array
    motor_tau: jax.Array
    omega_min: jax.Array
    omega_max: jax.Array
    drag_linear: jax.Array
    drag_quadratic: jax.Array
    drag_rotational: jax.Array
    rotor_inertia: jax.Array
    k_p: jax.Array
    battery_capacity: jax.Array
    battery_sag: jax.Array
    ground_z: jax.Array
    gravity: jax.Array
    wind: jax.Array
    motor_tau_down_ratio: jax.Array
    rotor_reaction_inertia: jax.Array
    rotor_drag: jax.Array
    blade_flapping: jax.Array
    k_inflow: jax.Array
    rotor_radius: jax.Array

    @classmethod
    def create(
        cls,
        *,
        mass,
        inertia,
        rotor_positions,
        rotor_spins,
        k_f,
        k_m,
        omega_max,
        motor_tau=0.0,
        omega_min=0.0,
        drag_linear=(0.0, 0.0, 0.0),
        drag_quadratic=(0.0, 0.0, 0.0),
        drag_rotational=(0.0, 0.0, 0.0),
        rotor_inertia=0.0,
        k_p=0.0,
        battery_capacity=1.0e5,
        battery_sag=0.0,
        ground_z=0.0,
        gravity=9.80665,
        wind=(0.0, 0.0, 0.0),
        motor_tau_down_ratio=1.0,
        rotor_reaction_inertia=0.0,
        rotor_drag=0.0,
        blade_flapping=0.0,
        k_inflow=0.0,
        rotor_radius=0.0,
        dtype=None,
    ) -> "QuadParams":
        """Checked constructor. Raises ``ValueError`` naming the first bad field.

        ``inertia`` may be given as its diagonal (3,); ``drag_*`` and ``wind``
        as scalars (broadcast to 3 axes). ``dtype`` (one of :data:`MODEL_DTYPES`: float32 or
        float64, or bfloat16 or float16 for the model functions alone) defaults to JAX's
        default float (float32 unless x64 is enabled by the caller). The checks run on the
        values as cast to it: ``k_f = 1e-50`` is 0 in float32, and refused there; every value
        must be 0 or a normal number of the dtype (RP-1's k_f = 8.9e-7 is subnormal in
        float16, whose smallest normal is 6.1e-5, and refused there).
        """
        raw = dict(locals())
        raw.pop("cls")
        raw.pop("dtype")
        dtype = model_dtype(dtype if dtype is not None else jnp.zeros(()).dtype, "QuadParams.create")
        values = {}
        for name, value in raw.items():
            try:
                arr = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise ValueError(f"QuadParams.{name}: not a number array ({err})") from None
            if name == "inertia" and arr.shape == (3,):
                arr = np.diag(arr)
            if name in _VECTOR3 and arr.shape == ():
                arr = np.full(3, float(arr))
            values[name] = arr
        with np.errstate(over="ignore"):  # a value past the dtype's range is inf there: refused below, by name
            cast = {k: np.asarray(v, dtype) for k, v in values.items()}
        _raise_on_bad(values, cast)
        return cls(**{k: jnp.asarray(v, dtype=dtype) for k, v in cast.items()})

    @property
    def num_rotors(self) -> int:
        """R, the number of rotors (static: read from a shape)."""
        return self.rotor_spins.shape[-1]

    def astype(self, dtype) -> "QuadParams":
        """The same parameters in another float dtype (one of :data:`MODEL_DTYPES`). A cast, not
        a check: :func:`check_params` (or :func:`params_valid`) judges the result."""
        dtype = model_dtype(dtype, "QuadParams.astype")
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), self)


#: the dtypes quadjax computes in everywhere (the engine, sensors, other vehicles, the kernel)
FLOAT_DTYPES = (np.dtype("float32"), np.dtype("float64"))
#: the dtypes the quadrotor model's pure functions also run in (:func:`quadjax.derivative`,
#: :func:`quadjax.rk4_step`, :func:`quadjax.hover_state`, :func:`quadjax.state_violation`):
#: reduced precision is a characterisation mode (docs/precision.md), with every parameter a
#: normal number of the dtype (RP-1 is not representable in float16: its k_f is subnormal there)
MODEL_DTYPES = FLOAT_DTYPES + (np.dtype(jnp.bfloat16), np.dtype("float16"))
_REDUCED = "bfloat16 and float16 run only in the model functions (quadjax.derivative, rk4_step, hover_state)"


def _as_dtype(dtype, where: str) -> np.dtype:
    try:
        return np.dtype(jnp.dtype(dtype))
    except TypeError:
        raise ValueError(f"{where}: dtype {dtype!r} is not a dtype; use float32 or float64") from None


def float_dtype(dtype, where: str) -> np.dtype:
    """``dtype`` as a numpy dtype if it is float32 or float64, else a ValueError naming ``where``."""
    d = _as_dtype(dtype, where)
    if d not in FLOAT_DTYPES:
        raise ValueError(f"{where}: dtype {d}: quadjax computes in float32 or float64 only here; {_REDUCED}")
    return d


def model_dtype(dtype, where: str) -> np.dtype:
    """``dtype`` as a numpy dtype if it is one of :data:`MODEL_DTYPES`, else a ValueError naming ``where``."""
    d = _as_dtype(dtype, where)
    if d not in MODEL_DTYPES:
        raise ValueError(f"{where}: dtype {d}: quadjax computes in float32 or float64 ({_REDUCED})")
    return d


def normal_or_zero(x, xp=jnp):
    """True where ``x`` is 0 or a normal number of its own float dtype (not subnormal; inf and
    NaN are the finiteness checks' business). Read from the bits, because XLA's CPU backend
    treats subnormal operands as zero, so ``|x| >= tiny`` cannot see them under jit."""
    dtype = np.dtype(x.dtype)
    info = np.finfo(dtype)
    uint = np.dtype(f"uint{8 * dtype.itemsize}")
    bits = x.view(uint) if xp is np else jax.lax.bitcast_convert_type(x, uint)
    exponent = np.asarray(((1 << info.nexp) - 1) << info.nmant, uint)
    magnitude = np.asarray((1 << (8 * dtype.itemsize - 1)) - 1, uint)  # all but the sign bit
    return ((bits & exponent) != 0) | ((bits & magnitude) == 0)


_VECTOR3 = ("drag_linear", "drag_quadratic", "drag_rotational", "wind")
_MATRICES = ("inertia", "rotor_positions")
_SCALARS = (
    "mass", "k_f", "k_m", "motor_tau", "omega_min", "omega_max", "rotor_inertia",
    "k_p", "battery_capacity", "battery_sag", "ground_z", "gravity",
    "motor_tau_down_ratio", "rotor_reaction_inertia", "rotor_drag", "blade_flapping", "k_inflow", "rotor_radius",
)


def _shape_errors(p, batch=()):
    """Field → message for wrongly shaped fields (static; shapes after ``batch``).

    The number of rotors R is read from ``rotor_positions`` (R, 3).
    """
    shape = {k: tuple(np.shape(v))[len(batch):] for k, v in p.items()}
    pos = shape["rotor_positions"]
    R = pos[0] if len(pos) == 2 and pos[1] == 3 and pos[0] > 0 else None
    want = {name: () for name in _SCALARS}
    want.update({name: (3,) for name in _VECTOR3})
    want.update(inertia=(3, 3), rotor_positions=(R, 3) if R else "(R, 3) with R >= 1",
                rotor_spins=(R,) if R else "(R,)")
    mismatch = f" (R read from QuadParams.rotor_positions, shape {pos})"
    errors = {}
    for name, expected in want.items():
        if shape[name] != expected:
            errors[name] = f"shape {shape[name]}, expected {expected}" + (mismatch if name == "rotor_spins" else "")
    return errors


def _value_checks(p, xp):
    """Field → boolean array (True = within bounds), for numpy or jax.numpy ``xp``.

    The bounds are invariant I1: every value finite; mass, k_f, capacity > 0;
    inertia symmetric positive definite and physical (triangle inequality);
    spins ±1; k_m, tau, drags, rotor inertias, k_p, gravity, rotor drag, flapping, k_inflow,
    rotor radius ≥ 0; 0 ≤ omega_min < omega_max; 0 ≤ sag < 1; spin-down ratio > 0.
    """
    def all_last(ok, n):
        # reduce the n trailing (component) axes, keep the batch axes
        return xp.all(ok.reshape(ok.shape[: ok.ndim - n] + (-1,)), axis=-1) if n else ok

    def finite(x, n):
        return all_last(xp.isfinite(x), n)

    def nonneg(x, n):
        return all_last(x >= 0, n)

    J = p["inertia"]
    j00, j11, j22 = J[..., 0, 0], J[..., 1, 1], J[..., 2, 2]
    j01, j02, j12 = J[..., 0, 1], J[..., 0, 2], J[..., 1, 2]
    scale = xp.abs(j00) + xp.abs(j11) + xp.abs(j22)
    sym = (
        (xp.abs(J[..., 0, 1] - J[..., 1, 0]) <= 1e-6 * scale)
        & (xp.abs(J[..., 0, 2] - J[..., 2, 0]) <= 1e-6 * scale)
        & (xp.abs(J[..., 1, 2] - J[..., 2, 1]) <= 1e-6 * scale)
    )
    m2 = j00 * j11 - j01 * j01
    det = j00 * (j11 * j22 - j12 * j12) - j01 * (j01 * j22 - j12 * j02) + j02 * (j01 * j12 - j11 * j02)
    # principal moments of a rigid body obey the triangle inequality; checked on the diagonal
    tri = (j00 <= j11 + j22) & (j11 <= j00 + j22) & (j22 <= j00 + j11)
    spins = p["rotor_spins"]
    return {
        "mass": finite(p["mass"], 0) & (p["mass"] > 0),
        "inertia": finite(J, 2) & sym & (j00 > 0) & (m2 > 0) & (det > 0) & tri,
        "rotor_positions": finite(p["rotor_positions"], 2),
        "rotor_spins": xp.all(xp.abs(xp.abs(spins) - 1) == 0, axis=-1),
        "k_f": finite(p["k_f"], 0) & (p["k_f"] > 0),
        "k_m": finite(p["k_m"], 0) & nonneg(p["k_m"], 0),
        "motor_tau": finite(p["motor_tau"], 0) & nonneg(p["motor_tau"], 0),
        "omega_min": finite(p["omega_min"], 0) & nonneg(p["omega_min"], 0),
        "omega_max": finite(p["omega_max"], 0) & (p["omega_max"] > p["omega_min"]),
        "drag_linear": finite(p["drag_linear"], 1) & nonneg(p["drag_linear"], 1),
        "drag_quadratic": finite(p["drag_quadratic"], 1) & nonneg(p["drag_quadratic"], 1),
        "drag_rotational": finite(p["drag_rotational"], 1) & nonneg(p["drag_rotational"], 1),
        "rotor_inertia": finite(p["rotor_inertia"], 0) & nonneg(p["rotor_inertia"], 0),
        "k_p": finite(p["k_p"], 0) & nonneg(p["k_p"], 0),
        "battery_capacity": finite(p["battery_capacity"], 0) & (p["battery_capacity"] > 0),
        "battery_sag": finite(p["battery_sag"], 0) & nonneg(p["battery_sag"], 0) & (p["battery_sag"] < 1),
        "ground_z": finite(p["ground_z"], 0),
        "gravity": finite(p["gravity"], 0) & nonneg(p["gravity"], 0),
        "wind": finite(p["wind"], 1),
        "motor_tau_down_ratio": finite(p["motor_tau_down_ratio"], 0) & (p["motor_tau_down_ratio"] > 0),
        "rotor_reaction_inertia": finite(p["rotor_reaction_inertia"], 0) & nonneg(p["rotor_reaction_inertia"], 0),
        "rotor_drag": finite(p["rotor_drag"], 0) & nonneg(p["rotor_drag"], 0),
        "blade_flapping": finite(p["blade_flapping"], 0) & nonneg(p["blade_flapping"], 0),
        "k_inflow": finite(p["k_inflow"], 0) & nonneg(p["k_inflow"], 0),
        "rotor_radius": finite(p["rotor_radius"], 0) & nonneg(p["rotor_radius"], 0),
    }


_BOUNDS = {
    "mass": "finite and > 0",
    "inertia": "finite, symmetric, positive definite, principal moments obeying the triangle inequality",
    "rotor_positions": "finite",
    "rotor_spins": "each +1 (CCW) or -1 (CW)",
    "k_f": "finite and > 0",
    "omega_max": "finite and > omega_min",
    "battery_capacity": "finite and > 0",
    "battery_sag": "finite, in [0, 1)",
    "ground_z": "finite",
    "wind": "finite",
    "motor_tau_down_ratio": "finite and > 0",
}


def _raise_on_bad(values, own=None):
    """The first bad field of float64 ``values``, in field order; with ``own`` (the same values
    in their own dtype), also the first that is out of bounds there (``k_f = 1e-50`` is 0 in
    float32) or neither 0 nor a normal number there (RP-1's ``k_f = 8.9e-7`` is subnormal in
    float16)."""
    shape_errors = _shape_errors(values)
    if shape_errors:
        name, msg = next(iter(shape_errors.items()))
        raise ValueError(f"QuadParams.{name}: {msg}")
    checks = _value_checks(values, np)
    there = {} if own is None else _value_checks({k: v.astype(np.float64) for k, v in own.items()}, np)
    normal = {} if own is None else _normal_checks(own, np)
    for name in values:
        bound = _BOUNDS.get(name, "finite and >= 0")
        if name in checks and not np.all(checks[name]):
            raise ValueError(f"QuadParams.{name} = {values[name].tolist()}: must be {bound}")
        if name in there and not np.all(there[name]):  # representable in float64, not in the dtype
            raise ValueError(f"QuadParams.{name} = {values[name].tolist()} is {own[name].astype(np.float64).tolist()} "
                             f"in {own[name].dtype}: must be {bound} there (use float64)")
        if name in normal and not np.all(normal[name]):
            raise _subnormal_error(name, values[name], own[name])
    _raise_on_singular_layout(values)


def _raise_on_singular_layout(values):
    """Reject layouts whose allocation B (4×R, thrusts → (F, τx, τy, τz)) is singular: fewer
    than 4 rotors, rotors on one line (no roll or pitch authority), or spins that cannot make
    a yaw moment. Hover trim and the mixer solve with B; a singular one gives garbage."""
    pos, spins = values["rotor_positions"], values["rotor_spins"]
    R = pos.shape[0]
    if R < 4:
        raise ValueError(f"QuadParams.rotor_positions: {R} rotors; a multirotor needs at least 4 to "
                         "control thrust, roll, pitch and yaw independently")
    x, y = pos[:, 0], pos[:, 1]
    B = np.stack([np.ones(R), y, -x, -float(values["k_m"]) * spins])
    rows = B if float(values["k_m"]) > 0 else B[:3]  # k_m = 0: no yaw authority by construction
    scale = np.max(np.abs(B[1:3])) if np.any(B[1:3]) else 1.0
    if np.linalg.matrix_rank(rows / np.maximum(np.abs(rows).max(axis=1, keepdims=True), 1e-300),
                             tol=1e-9) < rows.shape[0]:
        why = ("the rotors lie on one line (no roll or pitch authority)"
               if np.linalg.matrix_rank(B[:3] / np.array([[1.0], [scale], [scale]]), tol=1e-9) < 3
               else "the spins cannot produce a yaw moment (mix CW and CCW rotors)")
        raise ValueError(f"QuadParams.rotor_positions/rotor_spins: singular allocation: {why}")


def _normal_checks(p, xp):
    """Field → boolean array of the batch shape: every value 0 or a normal number of its dtype."""
    def rank(name):
        return 2 if name in _MATRICES else 1 if name in _VECTOR3 or name == "rotor_spins" else 0

    out = {}
    for name, x in p.items():
        ok = normal_or_zero(x, xp)
        n = rank(name)
        out[name] = xp.all(ok.reshape(ok.shape[: ok.ndim - n] + (-1,)), axis=-1) if n else ok
    return out


def _subnormal_error(name, value, cast) -> ValueError:
    dtype = cast.dtype
    return ValueError(f"QuadParams.{name} = {value.tolist()} is {cast.astype(np.float64).tolist()} in {dtype}, a "
                      f"subnormal number there: every parameter must be 0 or a normal number of its dtype, |x| >= "
                      f"{float(np.finfo(dtype).smallest_normal):.4g} (the smallest normal of {dtype})"
                      + (" (use float32 or float64)" if dtype.itemsize < 4 else ""))


def check_params(params: "QuadParams") -> None:
    """Raise ``ValueError`` naming the first bad field of concrete params (I1, host side):
    :meth:`QuadParams.create`'s checks, for params built another way (including every value
    0 or a normal number of its own dtype)."""
    own = {f.name: np.asarray(getattr(params, f.name)) for f in dataclasses.fields(params)}
    _raise_on_bad({k: v.astype(np.float64) for k, v in own.items()}, own)


def params_valid(params: QuadParams) -> jax.Array:
    """Invariant I1: every parameter has its shape, is finite and within bounds, and is 0 or a
    normal number of its dtype.

    Works under jit and on batched params (leading axes, judged per vehicle):
    returns a bool array of the batch shape. A wrong shape gives a constant False.
    """
    p = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    batch = jnp.shape(p["mass"])
    if _shape_errors(p, batch):
        return jnp.zeros(batch, dtype=bool)
    ok = jnp.ones(batch, dtype=bool)
    for good in _value_checks({k: jnp.asarray(v) for k, v in p.items()}, jnp).values():
        ok = ok & good
    for good in _normal_checks({k: jnp.asarray(v) for k, v in p.items()}, jnp).values():
        ok = ok & good
    return ok
