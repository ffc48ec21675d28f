"""Sensors: what an IMU, a magnetometer, a barometer and a position fix (GPS / mocap) report.

Pure, batched (``vmap`` over vehicles and over sensor parameters), differentiable; every
random draw comes from an explicit PRNG key (:func:`sense` takes the tick's key). The
parameters are float pytrees, so a sweep can randomise them per vehicle; the sample rates
and the latency are structure, fixed by :meth:`Sensors.create` against the engine's tick.

Frames and units (GUIDE §2):

* accelerometer: specific force [m/s²] in the body frame (FLU) at the IMU's lever arm r [m]
  (body): f = Rᵀ(a − g) + α × r + ω × (ω × r), a the world acceleration of the centre of
  mass, g = (0, 0, −g), α = ω̇. It reads (0, 0, +g) level at rest and 0 in free fall
  (seed 004: F_b/m is what an accelerometer at the centre of mass measures).
* gyroscope: body rates [rad/s], body frame.
* Both report, as MEMS IMUs after their decimation filter do, the mean over their last sample
  period h (the delta angle and delta velocity divided by h): ω̄ = Log(q(t−h)* ⊗ q(t)) / h and
  f̄ = R(t−h)ᵀ((v(t) − v(t−h)) / h − g) + the lever-arm terms (with the mean angular
  acceleration); the first sample (t = 0) is the instantaneous value. An estimator that integrates them then reproduces the truth's
  attitude and velocity increments exactly, whatever the manoeuvre (:mod:`quadjax.estimation`).
* magnetometer: the local field [T] in the body frame, Rᵀ m_world, plus a hard-iron bias.
* barometer: altitude [m] above the world origin (ENU z), with a drifting offset.
* position fix (GPS / mocap): position [m] and velocity [m/s] in the world frame (ENU),
  delivered ``latency`` late and lost with probability ``dropout``.

IMU error model, per axis (IEEE Std 952 terms), for a sample of period Δt:

    y = sat(quant((I + diag(scale) + misalignment) x + b + N/√Δt · w))
    b = bias + b_gm + b_rw,   b_rw ← b_rw + K √Δt · w,
    b_gm ← φ b_gm + σ_gm √(1 − φ²) · w,   φ = e^(−Δt/T_c)

N the noise density (angle / velocity random walk) [unit/√Hz], K the bias random walk
[unit/(s·√Hz)], and b_gm a first-order Gauss-Markov bias whose Allan deviation peaks at
0.664·B (the IEEE reading of the bias instability B off the flat of the Allan deviation):
σ_gm = 0.664·B / :data:`GM_ADEV_PEAK`. The tests recover N and B from the Allan deviation of a
long simulated record.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._components import join, split, split_params, split_state
from quadjax._pytree import pytree_dataclass
from quadjax.model import derivative_c
from quadjax.params import QuadParams, float_dtype
from quadjax.quaternion import quat_conjugate, quat_multiply, quat_rotate_inverse, quat_to_rotation_vector
from quadjax.state import QuadState

STATIC = dict(metadata=dict(static=True))


def _gm_allan_variance(x):
    """Allan variance of a unit first-order Gauss-Markov process at τ = x·T_c:
    (1/x)² (2x − 3 + 4e^(−x) − e^(−2x))."""
    return (2 * x - 3 + 4 * np.exp(-x) - np.exp(-2 * x)) / (x * x)


#: max over τ of the Allan deviation of a unit-variance first-order Gauss-Markov process
#: (at τ ≈ 1.89 T_c); it ties the configured bias instability to the process's σ.
GM_ADEV_PEAK = float(np.sqrt(np.max(_gm_allan_variance(np.linspace(0.5, 5.0, 20001)))))
#: the flat of the Allan deviation of a flicker (bias-instability) process is 0.664·B
FLICKER_FLAT = math.sqrt(2 * math.log(2) / math.pi)


def gm_sigma(bias_instability):
    """σ_gm of the Gauss-Markov bias that reads as ``bias_instability`` B on an Allan plot."""
    return FLICKER_FLAT * bias_instability / GM_ADEV_PEAK


# --------------------------------------------------------------------------- parameters


@pytree_dataclass
class ImuAxes:
    """Error model of one IMU triad: accelerometer [m/s²] or gyroscope [rad/s], body axes.

    noise_density N (3,) [unit/√Hz]; bias_instability B (3,) [unit]; correlation_time T_c ()
    [s] of its Gauss-Markov process; random_walk K (3,) [unit/(s·√Hz)]; bias (3,) [unit], the
    turn-on bias; scale (3,) [1] scale-factor errors; misalignment (3, 3) [rad] cross-axis
    terms (zero diagonal); resolution () [unit] quantisation step (0: none); range () [unit]
    saturation |y| ≤ range (inf: none).
    """

    noise_density: jax.Array
    bias_instability: jax.Array
    correlation_time: jax.Array
    random_walk: jax.Array
    bias: jax.Array
    scale: jax.Array
    misalignment: jax.Array
    resolution: jax.Array
    range: jax.Array

    @classmethod
    def create(cls, noise_density=0.0, bias_instability=0.0, correlation_time=1.0, random_walk=0.0, bias=0.0,
               scale=0.0, misalignment=None, resolution=0.0, range=math.inf, dtype=None) -> "ImuAxes":
        dtype = _dtype(dtype)
        v3 = lambda x: field_array(x, (3,), dtype)  # noqa: E731
        m = field_array(0.0 if misalignment is None else misalignment, (3, 3), dtype)
        axes = cls(noise_density=v3(noise_density), bias_instability=v3(bias_instability),
                   correlation_time=field_array(correlation_time, (), dtype), random_walk=v3(random_walk),
                   bias=v3(bias), scale=v3(scale), misalignment=m, resolution=field_array(resolution, (), dtype),
                   range=field_array(range, (), dtype))
        axes.check("ImuAxes")
        return axes

    def check(self, where: str):
        _nonnegative(where, noise_density=self.noise_density, bias_instability=self.bias_instability,
                     random_walk=self.random_walk, resolution=self.resolution)
        _finite(where, bias=self.bias, scale=self.scale, misalignment=self.misalignment)
        _positive(where, range=self.range)
        _finite(where, correlation_time=self.correlation_time)
        _positive(where, correlation_time=self.correlation_time)
        if np.shape(self.misalignment)[-2:] != (3, 3):
            raise ValueError(f"{where}.misalignment: shape {np.shape(self.misalignment)}, expected (3, 3)")
        if not _traced(self.misalignment) and np.any(np.diagonal(np.asarray(self.misalignment), axis1=-2, axis2=-1)):
            raise ValueError(f"{where}.misalignment: the diagonal must be zero (scale errors go in scale)")


@pytree_dataclass
class Imu:
    """An accelerometer and a gyroscope at ``lever_arm`` (3,) [m] from the centre of mass (body)."""

    accel: ImuAxes
    gyro: ImuAxes
    lever_arm: jax.Array

    @classmethod
    def create(cls, accel: ImuAxes | None = None, gyro: ImuAxes | None = None, lever_arm=0.0, dtype=None) -> "Imu":
        dtype = _dtype(dtype)
        arm = field_array(lever_arm, (3,), dtype)
        _finite("Imu", lever_arm=arm)
        return cls(accel=accel if accel is not None else ImuAxes.create(dtype=dtype),
                   gyro=gyro if gyro is not None else ImuAxes.create(dtype=dtype), lever_arm=arm)


@pytree_dataclass
class Magnetometer:
    """field (3,) [T] world ENU (default: 22 µT north, 42 µT down); bias (3,) [T] hard iron,
    body; noise (3,) [T] standard deviation per sample."""

    field: jax.Array
    bias: jax.Array
    noise: jax.Array

    @classmethod
    def create(cls, field=(0.0, 22e-6, -42e-6), bias=0.0, noise=0.0, dtype=None) -> "Magnetometer":
        dtype = _dtype(dtype)
        v3 = lambda x: field_array(x, (3,), dtype)  # noqa: E731
        mag = cls(field=v3(field), bias=v3(bias), noise=v3(noise))
        _finite("Magnetometer", field=mag.field, bias=mag.bias)
        _nonnegative("Magnetometer", noise=mag.noise)
        return mag


@pytree_dataclass
class Barometer:
    """noise () [m] standard deviation per sample; drift () [m/√s] random walk of its offset;
    offset () [m] at t = 0; resolution () [m] (0: none)."""

    noise: jax.Array
    drift: jax.Array
    offset: jax.Array
    resolution: jax.Array

    @classmethod
    def create(cls, noise=0.0, drift=0.0, offset=0.0, resolution=0.0, dtype=None) -> "Barometer":
        dtype = _dtype(dtype)
        baro = cls(*(field_array(x, (), dtype) for x in (noise, drift, offset, resolution)))
        _nonnegative("Barometer", noise=baro.noise, drift=baro.drift, resolution=baro.resolution)
        _finite("Barometer", offset=baro.offset)
        return baro


@pytree_dataclass
class PositionFix:
    """GPS or mocap: position_noise (3,) [m] and velocity_noise (3,) [m/s] standard deviations
    per sample (world ENU); dropout () probability in [0, 1) that a sample is lost."""

    position_noise: jax.Array
    velocity_noise: jax.Array
    dropout: jax.Array

    @classmethod
    def create(cls, position_noise=0.0, velocity_noise=0.0, dropout=0.0, dtype=None) -> "PositionFix":
        dtype = _dtype(dtype)
        v3 = lambda x: field_array(x, (3,), dtype)  # noqa: E731
        fix = cls(position_noise=v3(position_noise), velocity_noise=v3(velocity_noise),
                  dropout=field_array(dropout, (), dtype))
        _nonnegative("PositionFix", position_noise=fix.position_noise, velocity_noise=fix.velocity_noise)
        if not _traced(fix.dropout) and not (0.0 <= float(fix.dropout) < 1.0):
            raise ValueError(f"PositionFix.dropout = {float(fix.dropout)}: expected a probability in [0, 1)")
        return fix


@pytree_dataclass
class Sensors:
    """A sensor suite on a tick of ``dt`` [s]: which sensors, their parameters (pytrees, per
    vehicle), and how often each samples (every ``*_every`` ticks, static). The position fix
    arrives ``fix_delay`` ticks after it is taken. Absent sensors are None. Build it with
    :meth:`create`, which turns rates [Hz] and the latency [s] into ticks."""

    imu: Imu
    mag: Magnetometer | None = None
    baro: Barometer | None = None
    fix: PositionFix | None = None
    dt: float = dataclasses.field(default=0.0, **STATIC)
    imu_every: int = dataclasses.field(default=1, **STATIC)
    mag_every: int = dataclasses.field(default=1, **STATIC)
    baro_every: int = dataclasses.field(default=1, **STATIC)
    fix_every: int = dataclasses.field(default=1, **STATIC)
    fix_delay: int = dataclasses.field(default=0, **STATIC)
    fix_velocity: bool = dataclasses.field(default=False, **STATIC)

    @classmethod
    def create(cls, dt: float, imu: Imu, *, imu_rate=None, mag=None, mag_rate=None, baro=None, baro_rate=None,
               fix=None, fix_rate=None, fix_latency=0.0, fix_velocity=False) -> "Sensors":
        """``dt``: the engine's tick [s]; each rate [Hz] (None: every tick) must make a sample
        period that is a whole number of ticks, and ``fix_latency`` [s] a whole number of ticks.
        ``fix_velocity``: the fix reports velocity too (a GPS; False: position only, mocap)."""
        dt = float(dt)
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"Sensors.create: dt = {dt}: expected a finite tick > 0 [s]")
        if not isinstance(imu, Imu):
            raise ValueError(f"Sensors.create: imu: expected an Imu, got {type(imu).__name__}")
        for name, part, kind in (("mag", mag, Magnetometer), ("baro", baro, Barometer), ("fix", fix, PositionFix)):
            if part is not None and not isinstance(part, kind):
                raise ValueError(f"Sensors.create: {name}: expected a {kind.__name__} or None, got {type(part).__name__}")
        delay = _ticks("fix_latency", fix_latency, dt, allow_zero=True)
        return cls(imu=imu, mag=mag, baro=baro, fix=fix, dt=dt, imu_every=_every("imu_rate", imu_rate, dt),
                   mag_every=_every("mag_rate", mag_rate, dt), baro_every=_every("baro_rate", baro_rate, dt),
                   fix_every=_every("fix_rate", fix_rate, dt), fix_delay=delay, fix_velocity=bool(fix_velocity))

    def period(self, name: str) -> float:
        """The sample period [s] of ``"imu"``, ``"mag"``, ``"baro"`` or ``"fix"``."""
        return getattr(self, f"{name}_every") * self.dt


def _every(name, rate, dt) -> int:
    if rate is None:
        return 1
    rate = float(rate)
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"Sensors.create: {name} = {rate}: expected a finite rate > 0 [Hz]")
    if rate * dt > 1 + 1e-9:
        raise ValueError(f"Sensors.create: {name} = {rate:g} Hz is faster than the tick ({1 / dt:g} Hz)")
    return _ticks(name, 1.0 / rate, dt, allow_zero=False, rate=rate)


def _ticks(name, seconds, dt, allow_zero, rate=None) -> int:
    seconds = float(seconds)
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"Sensors.create: {name} = {seconds}: expected a finite value >= 0")
    n = round(seconds / dt)
    if abs(n * dt - seconds) > 1e-9 * max(seconds, dt) or (n == 0 and not allow_zero):
        what = f"{rate:g} Hz (a period of {seconds:g} s)" if rate is not None else f"{seconds:g} s"
        raise ValueError(f"Sensors.create: {name} = {what} is not a whole number of ticks of {dt:g} s")
    return n


# --------------------------------------------------------------------------- checks


def _dtype(dtype):
    """The parameters' dtype: float32 or float64 (JAX's default float when None)."""
    return float_dtype(dtype if dtype is not None else jnp.zeros(()).dtype, "quadjax.sensors")


def field_array(x, shape, dtype):
    """``x`` broadcast to ``shape`` in ``dtype``: through numpy where it is concrete (so it can
    be checked with a message, even inside ``jit``), through JAX where it is traced."""
    if isinstance(x, jax.core.Tracer):
        return jnp.broadcast_to(jnp.asarray(x, dtype), shape)
    return jnp.asarray(np.broadcast_to(np.asarray(x, np.float64), shape), dtype)


def _traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _concrete(fields: dict):
    return {k: np.asarray(v) for k, v in fields.items() if not _traced(v)}


def _nonnegative(where, **fields):
    for k, v in _concrete(fields).items():
        if not (np.all(np.isfinite(v)) and np.all(v >= 0)):
            raise ValueError(f"{where}.{k} = {v.tolist()}: expected finite values >= 0")


def _finite(where, **fields):
    for k, v in _concrete(fields).items():
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{where}.{k} = {v.tolist()}: expected finite values")


def _positive(where, **fields):
    """Values > 0; +inf allowed (a range without saturation)."""
    for k, v in _concrete(fields).items():
        if not np.all(v > 0):
            raise ValueError(f"{where}.{k} = {v.tolist()}: expected values > 0")


# --------------------------------------------------------------------------- true signals


def specific_force(params: QuadParams, state: QuadState, command, lever_arm, wrench=None):
    """What an ideal accelerometer at ``lever_arm`` (3,) [m] (body) reads [m/s²], body frame:
    f = Rᵀ(a − g) + α × r + ω × (ω × r). a and α come from the model (:func:`quadjax.derivative`
    with ``command`` (R,), the command being flown, and the body ``wrench`` (6,) if any). On the
    ground the contact holds the vehicle still: a = 0 there (the steppers' constraint)."""
    external = None if wrench is None else (tuple(split(wrench[:3])), tuple(split(wrench[3:])))
    rates = derivative_c(split_params(params), split_state(state), split(command), external)
    a = jnp.where(state.on_ground > 0.5, 0.0, join(rates.velocity))
    return (quat_rotate_inverse(state.attitude, a - _gravity(params))
            + _lever_arm_term(join(rates.body_rates), state.body_rates, lever_arm))


def _gravity(params):
    """g = (0, 0, −g) [m/s²], world."""
    zero = jnp.zeros_like(params.gravity)
    return jnp.stack([zero, zero, -params.gravity])


def _lever_arm_term(alpha, w, r):
    """α × r + ω × (ω × r) [m/s²]: what a point at r (body) accelerates by beside the centre of mass."""
    return jnp.cross(alpha, r) + jnp.cross(w, jnp.cross(w, r))


def mean_imu_signals(params: QuadParams, state: QuadState, command, lever_arm, sstate: SensorState, h, k,
                     wrench=None):
    """(f̄, ω̄): the true specific force [m/s²] and body rates [rad/s] an IMU sampling every ``h``
    [s] reports at tick ``k``: their means since its last sample (attitude, velocity and rates
    in ``sstate``), ω̄ = Log(q₀* ⊗ q) / h, f̄ = R(q₀)ᵀ(Δv / h − g) + ᾱ × r + ω × (ω × r) with
    ᾱ = (ω − ω₀) / h. Its first sample (k = 0, nothing to average over) is the instantaneous
    value, the only one that needs the model's accelerations: ``k`` is the same for every
    vehicle, so under vmap this is a real branch and the other ticks never evaluate the model."""
    def first(_):
        return specific_force(params, state, command, lever_arm, wrench), state.body_rates

    def mean(_):
        alpha = (state.body_rates - sstate.imu_rates) / h
        f = (quat_rotate_inverse(sstate.imu_attitude, (state.velocity - sstate.imu_velocity) / h - _gravity(params))
             + _lever_arm_term(alpha, state.body_rates, lever_arm))
        w = quat_to_rotation_vector(quat_multiply(quat_conjugate(sstate.imu_attitude), state.attitude)) / h
        return f, w

    return jax.lax.cond(k == 0, first, mean, None)


def magnetic_field(mag: Magnetometer, state: QuadState):
    """The field in the body frame [T]: Rᵀ m_world (no noise, no bias)."""
    return quat_rotate_inverse(state.attitude, mag.field)


# --------------------------------------------------------------------------- the sampled sensors


@pytree_dataclass
class SensorState:
    """What the sensors remember between samples: the IMU's Gauss-Markov and random-walk biases
    (3,) each; the attitude (4,), velocity (3,) and body rates (3,) at its last sample (its
    means run from there); the barometer's offset (); the position fixes in flight
    (D, 7) (position, velocity, valid) for a latency of D ticks."""

    accel_gm: jax.Array
    accel_rw: jax.Array
    gyro_gm: jax.Array
    gyro_rw: jax.Array
    imu_attitude: jax.Array
    imu_velocity: jax.Array
    imu_rates: jax.Array
    baro_offset: jax.Array
    fix_queue: jax.Array


@pytree_dataclass
class Readings:
    """One tick's readings; a sensor's values are None when the suite has none, and ``*_fresh``
    () bool says whether it sampled this tick (values of a tick that is not fresh are no sample).
    gyro (3,) rad/s and accel (3,) m/s² body; mag (3,) T body; baro () m; fix_position (3,) m and
    fix_velocity (3,) m/s world, taken ``fix_delay`` ticks ago."""

    gyro: jax.Array
    accel: jax.Array
    imu_fresh: jax.Array
    mag: jax.Array | None = None
    mag_fresh: jax.Array | None = None
    baro: jax.Array | None = None
    baro_fresh: jax.Array | None = None
    fix_position: jax.Array | None = None
    fix_velocity: jax.Array | None = None
    fix_fresh: jax.Array | None = None


def sensors_init(sensors: Sensors, key, state0: QuadState) -> SensorState:
    """The sensors on a vehicle at ``state0`` (t = 0): Gauss-Markov biases drawn from their
    stationary distribution, random walks at 0, the barometer at its offset, no fix in flight."""
    ka, kg = jax.random.split(key)
    dtype = state0.position.dtype
    imu = sensors.imu

    def stationary(axes, k):
        return gm_sigma(axes.bias_instability) * jax.random.normal(k, (3,), dtype)

    zero3 = jnp.zeros(3, dtype)
    offset = sensors.baro.offset if sensors.baro is not None else jnp.zeros((), dtype)
    return SensorState(accel_gm=stationary(imu.accel, ka), accel_rw=zero3, gyro_gm=stationary(imu.gyro, kg),
                       gyro_rw=zero3, imu_attitude=state0.attitude, imu_velocity=state0.velocity,
                       imu_rates=state0.body_rates, baro_offset=jnp.asarray(offset, dtype),
                       fix_queue=jnp.zeros((sensors.fix_delay, 7), dtype))


def imu_axes_sample(axes: ImuAxes, x, gm, rw, dt, key):
    """One sample of a triad reading true ``x`` (3,), its biases ``gm``, ``rw`` advanced by the
    sample period ``dt`` [s] → (reading (3,), gm, rw). The error model is the module's."""
    return _triad(axes, x, gm, rw, dt, jax.random.normal(key, (9,), x.dtype))


def _triad(axes: ImuAxes, x, gm, rw, dt, z):
    """:func:`imu_axes_sample` on given standard-normal draws ``z`` (9,): white, Gauss-Markov, walk."""
    phi = jnp.exp(-dt / axes.correlation_time)
    gm = phi * gm + gm_sigma(axes.bias_instability) * jnp.sqrt(1 - phi * phi) * z[3:6]
    rw = rw + axes.random_walk * jnp.sqrt(dt) * z[6:9]
    white = axes.noise_density / jnp.sqrt(dt) * z[0:3]
    cross = axes.misalignment @ x
    y = x + axes.scale * x + cross + axes.bias + gm + rw + white
    return saturate(quantise(y, axes.resolution), axes.range), gm, rw


def quantise(y, step):
    """y rounded to a multiple of ``step`` (unchanged where step = 0). Its derivative is taken
    as 1 (straight-through): a rounding has none, and a gradient through the sensors would
    otherwise vanish."""
    safe = jnp.where(step > 0, step, 1.0)
    rounded = jnp.round(y / safe) * safe
    return jnp.where(step > 0, y + jax.lax.stop_gradient(rounded - y), y)


def saturate(y, limit):
    """y clipped to [−limit, limit]."""
    return jnp.clip(y, -limit, limit)


#: standard normals one tick of :func:`sense` draws: accel 9, gyro 9, mag 3, baro 2, fix 6, dropout 1
DRAWS = 30


def sense(sensors: Sensors, sstate: SensorState, params: QuadParams, state: QuadState, command, k, key,
          wrench=None):
    """The readings at tick ``k`` (the time of ``state``) and the sensors' new state.

    ``command`` (R,): the command being flown (the model's rotor speeds lag it; with τ = 0 it sets
    the thrust, hence the specific force); ``wrench`` (6,) a body-frame external wrench. The
    tick's key ``key`` feeds every draw: one call for all of them (:data:`DRAWS` standard normals; the
    dropout's uniform is Φ of one of them), since the PRNG, not the arithmetic, is what costs.
    A sensor samples at ticks k ≡ 0 mod its ``*_every``.
    """
    dtype = state.position.dtype
    z = jax.random.normal(key, (DRAWS,), dtype)
    imu = sensors.imu
    h = jnp.asarray(sensors.period("imu"), dtype)
    f, w = mean_imu_signals(params, state, command, imu.lever_arm, sstate, h, k, wrench)
    accel, agm, arw = _triad(imu.accel, f, sstate.accel_gm, sstate.accel_rw, h, z[0:9])
    gyro, ggm, grw = _triad(imu.gyro, w, sstate.gyro_gm, sstate.gyro_rw, h, z[9:18])
    fresh = k % sensors.imu_every == 0
    new = sstate.replace(accel_gm=jnp.where(fresh, agm, sstate.accel_gm), accel_rw=jnp.where(fresh, arw, sstate.accel_rw),
                         gyro_gm=jnp.where(fresh, ggm, sstate.gyro_gm), gyro_rw=jnp.where(fresh, grw, sstate.gyro_rw),
                         imu_attitude=jnp.where(fresh, state.attitude, sstate.imu_attitude),
                         imu_velocity=jnp.where(fresh, state.velocity, sstate.imu_velocity),
                         imu_rates=jnp.where(fresh, state.body_rates, sstate.imu_rates))
    out = dict(gyro=gyro, accel=accel, imu_fresh=fresh)
    if sensors.mag is not None:
        m = sensors.mag
        out["mag"] = magnetic_field(m, state) + m.bias + m.noise * z[18:21]
        out["mag_fresh"] = k % sensors.mag_every == 0
    if sensors.baro is not None:
        b = sensors.baro
        hb = jnp.asarray(sensors.period("baro"), dtype)
        baro_fresh = k % sensors.baro_every == 0
        offset = jnp.where(baro_fresh, sstate.baro_offset + b.drift * jnp.sqrt(hb) * z[21], sstate.baro_offset)
        out["baro"] = quantise(state.position[2] + offset + b.noise * z[22], b.resolution)
        out["baro_fresh"] = baro_fresh
        new = new.replace(baro_offset=offset)
    if sensors.fix is not None:
        fx = sensors.fix
        lost = jax.scipy.special.ndtr(z[29]) < fx.dropout  # Φ(z) is uniform on (0, 1)
        taken = (k % sensors.fix_every == 0) & ~lost
        row = jnp.concatenate([state.position + fx.position_noise * z[23:26],
                               state.velocity + fx.velocity_noise * z[26:29], taken.astype(dtype)[None]])
        if sensors.fix_delay:  # a ring of D ticks: the slot of tick k holds the fix taken at k − D
            slot = k % sensors.fix_delay
            row, queue = sstate.fix_queue[slot], sstate.fix_queue.at[slot].set(row)
            new = new.replace(fix_queue=queue)
        out["fix_position"] = row[:3]
        out["fix_velocity"] = row[3:6] if sensors.fix_velocity else None
        out["fix_fresh"] = row[6] > 0.5
    return Readings(**out), new

