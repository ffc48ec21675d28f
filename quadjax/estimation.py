"""State estimation: an error-state extended Kalman filter (ESKF) and the observer that flies it.

The filter (Solà, "Quaternion kinematics for the error-state Kalman filter", 2017, §5–7,
local attitude error) keeps a nominal state — position p, velocity v (world ENU), attitude q
(body FLU → world), accelerometer bias b_a, gyroscope bias b_g — and the covariance P
(15, 15) of the error δx = (δp, δv, δθ, δb_a, δb_g), q_true = q ⊗ Exp(δθ).

* :func:`ekf_predict` integrates one IMU sample (ω_m, a_m), the means over its period h
  (:mod:`quadjax.sensors`), so the attitude and velocity steps are those of the truth:
  p ← p + v h + ½ (R a + g) h², v ← v + (R a + g) h, q ← q ⊗ Exp(ω h), a = a_m − b_a,
  ω = ω_m − b_g; P ← Φ P Φᵀ + G Σ Gᵀ with Φ, G the exact Jacobians of that step.
* :func:`ekf_update` fuses one measurement z = h(x) + ν, ν ~ N(0, R), in **Joseph form**
  P ← (I − K H) P (I − K H)ᵀ + K R Kᵀ (kept symmetric), injects δx and resets P for
  the new attitude reference. The sensors: :func:`fix_update` (position, and velocity for a
  GPS), :func:`baro_update`, :func:`mag_update`.

Everything is a pure function of pytrees: vmap it over vehicles, differentiate through it.
:class:`EKFObserver` puts sensors (:mod:`quadjax.sensors`) and the filter in the engine's
observer slot (``quadjax.simulate(..., observe=...)``): each tick it samples the sensors at
the true state, predicts to now with the IMU's means since its last sample, fuses what
arrived and hands the controller the estimate. Because it sees the truth it also scores
itself (NEES, NIS) and stops a vehicle whose filter diverged (status ``estimator``), never the
batch.

Assumptions, said once: the IMU sits at the centre of mass (a lever arm is not compensated);
the magnetometer's hard iron and the barometer's initial offset are calibrated out, its drift
and the IMU's scale and misalignment are not modelled; an IMU slower than the tick leaves the
estimate at its last sample in between; a fix that arrives D ticks late is compared with the
estimate of D ticks ago and corrects the present (the error state is taken as unchanged over
the latency).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass
from quadjax.engine import Observer
from quadjax.quaternion import (
    quat_conjugate, quat_from_rotation_vector, quat_multiply, quat_normalize, quat_rotate_inverse, quat_to_matrix,
    quat_to_rotation_vector,
)
from quadjax.sensors import Sensors, field_array, gm_sigma, sense, sensors_init
from quadjax import status as codes

#: slices of the error state δx (15,)
P_, V_, TH, BA, BG = (slice(i, i + 3) for i in range(0, 15, 3))
STATIC = dict(metadata=dict(static=True))


def skew(v):
    """[v]×, the (3, 3) matrix with [v]× u = v × u."""
    z = jnp.zeros_like(v[0])
    return jnp.stack([jnp.stack([z, -v[2], v[1]]), jnp.stack([v[2], z, -v[0]]), jnp.stack([-v[1], v[0], z])])


@pytree_dataclass
class NavState:
    """The nominal state: position (3,) m and velocity (3,) m/s world ENU, attitude (4,)
    body → world, accel_bias (3,) m/s² and gyro_bias (3,) rad/s (body)."""

    position: jax.Array
    velocity: jax.Array
    attitude: jax.Array
    accel_bias: jax.Array
    gyro_bias: jax.Array


@pytree_dataclass
class EKFParams:
    """The filter's model (its tuning): IMU noise densities accel_noise (3,) [m/s²/√Hz] and
    gyro_noise (3,) [rad/s/√Hz]; bias random walks accel_bias_walk (3,) [m/s²/(s·√Hz)] and
    gyro_bias_walk (3,) [rad/s/(s·√Hz)]; gravity () [m/s²]; mag_field (3,) [T] world;
    calibrations the readings are corrected by: mag_bias (3,) [T] hard iron, baro_offset () [m];
    measurement standard deviations mag_noise (3,) [T], baro_noise () [m], fix_position_noise
    (3,) [m], fix_velocity_noise (3,) [m/s]; nees_limit (): a NEES beyond it is divergence."""

    accel_noise: jax.Array
    gyro_noise: jax.Array
    accel_bias_walk: jax.Array
    gyro_bias_walk: jax.Array
    gravity: jax.Array
    mag_field: jax.Array
    mag_bias: jax.Array
    baro_offset: jax.Array
    mag_noise: jax.Array
    baro_noise: jax.Array
    fix_position_noise: jax.Array
    fix_velocity_noise: jax.Array
    nees_limit: jax.Array

    @classmethod
    def from_sensors(cls, sensors: Sensors, gravity, nees_limit=1e6) -> "EKFParams":
        """The filter tuned to the sensors it flies with: their noise densities (quantisation
        added as step²/12); a bias walk that also covers the Gauss-Markov bias (its short-term
        walk, √(2 σ²/T_c)); the magnetometer's hard iron and the barometer's offset at t = 0
        calibrated out. Not modelled (not states, not in the noise): barometer drift, IMU scale
        factor and misalignment; a filter flown on such sensors is overconfident, by design of
        the comparison. ``nees_limit``: 10⁶ is ~250 σ for 15 dof, beyond any mis-tuning: a
        divergence."""
        imu = sensors.imu
        dtype = imu.lever_arm.dtype

        def walk(axes):
            return jnp.sqrt(axes.random_walk ** 2 + 2 * gm_sigma(axes.bias_instability) ** 2 / axes.correlation_time)

        def quant(step):
            return step * step / 12.0

        zero3, tiny = jnp.zeros(3, dtype), jnp.asarray(1e-3, dtype)
        mag, baro, fix = sensors.mag, sensors.baro, sensors.fix
        return cls(
            accel_noise=jnp.sqrt(imu.accel.noise_density ** 2 + quant(imu.accel.resolution) * sensors.period("imu")),
            gyro_noise=jnp.sqrt(imu.gyro.noise_density ** 2 + quant(imu.gyro.resolution) * sensors.period("imu")),
            accel_bias_walk=walk(imu.accel), gyro_bias_walk=walk(imu.gyro), gravity=jnp.asarray(gravity, dtype),
            mag_field=mag.field if mag is not None else zero3, mag_bias=mag.bias if mag is not None else zero3,
            baro_offset=baro.offset if baro is not None else jnp.zeros((), dtype),
            mag_noise=mag.noise if mag is not None else zero3 + 1.0,
            baro_noise=jnp.sqrt(baro.noise ** 2 + quant(baro.resolution)) if baro is not None else tiny,
            fix_position_noise=fix.position_noise if fix is not None else zero3 + tiny,
            fix_velocity_noise=fix.velocity_noise if fix is not None else zero3 + tiny,
            nees_limit=jnp.asarray(nees_limit, dtype))


@pytree_dataclass
class EKFState:
    """nav: the :class:`NavState`; P (15, 15) its error covariance; history (D, 6): the
    estimated (position, velocity) of the last D ticks, for a fix that arrives D ticks late."""

    nav: NavState
    P: jax.Array
    history: jax.Array


def ekf_init(nav: NavState, sigma, delay: int = 0) -> EKFState:
    """The filter at t = 0: estimate ``nav``, P = diag(sigma²), ``sigma`` (15,) the standard
    deviations of (δp, δv, δθ, δb_a, δb_g); ``delay``: the fix latency in ticks."""
    sigma = jnp.asarray(sigma, nav.position.dtype)
    row = jnp.concatenate([nav.position, nav.velocity])
    return EKFState(nav=nav, P=jnp.diag(sigma * sigma), history=jnp.broadcast_to(row, (delay, 6)))


def _symmetric(P):
    return 0.5 * (P + P.T)


def ekf_predict(fp: EKFParams, est: EKFState, gyro, accel, h) -> EKFState:
    """Propagate through one IMU sample: ``gyro`` (3,) rad/s, ``accel`` (3,) m/s² (body,
    specific force), held for ``h`` [s]."""
    nav, dtype = est.nav, est.P.dtype
    a = accel - nav.accel_bias
    w = gyro - nav.gyro_bias
    R = quat_to_matrix(nav.attitude)
    g = jnp.stack([jnp.zeros_like(fp.gravity), jnp.zeros_like(fp.gravity), -fp.gravity])
    acc = R @ a + g
    rot = quat_from_rotation_vector(w * h)
    nav1 = nav.replace(position=nav.position + nav.velocity * h + 0.5 * acc * h * h, velocity=nav.velocity + acc * h,
                       attitude=quat_normalize(quat_multiply(nav.attitude, rot)))
    Ra = R @ skew(a)
    E = quat_to_matrix(rot).T
    P = _transition(_transition(est.P, Ra, R, E, h).T, Ra, R, E, h)  # Φ P Φᵀ = Φ (Φ P)ᵀ, P symmetric
    # noise G Σ Gᵀ: white accel (variance N_a²/h per sample) into δp, δv; white gyro into δθ;
    # the bias walks (variance K² h) into δb
    qa, qg = fp.accel_noise ** 2 / h, fp.gyro_noise ** 2 / h
    RqR = (R * qa) @ R.T
    Q = jnp.zeros((15, 15), dtype)
    Q = Q.at[P_, P_].set(0.25 * h ** 4 * RqR).at[P_, V_].set(0.5 * h ** 3 * RqR).at[V_, P_].set(0.5 * h ** 3 * RqR)
    Q = Q.at[V_, V_].set(h * h * RqR).at[TH, TH].set(jnp.diag(qg * h * h))
    Q = Q.at[BA, BA].set(jnp.diag(fp.accel_bias_walk ** 2 * h)).at[BG, BG].set(jnp.diag(fp.gyro_bias_walk ** 2 * h))
    return est.replace(nav=nav1, P=_symmetric(P + Q))


def _transition(M, Ra, R, E, h):
    """Φ M for the error-state transition of one IMU step, by its blocks (Φ is mostly identity):
    rows δp: M_p + h M_v − ½h² (R[a]× M_θ + R M_ba); δv: M_v − h (R[a]× M_θ + R M_ba);
    δθ: Exp(ωh)ᵀ M_θ − h M_bg; δb_a, δb_g: unchanged."""
    drive = Ra @ M[TH] + R @ M[BA]
    return jnp.concatenate([M[P_] + h * M[V_] - 0.5 * h * h * drive, M[V_] - h * drive, E @ M[TH] - h * M[BG],
                            M[BA], M[BG]])


def ekf_update(est: EKFState, residual, H, noise, valid=True):
    """Fuse one measurement: ``residual`` (m,) = z − h(x̂), ``H`` (m, 15) — or a tuple of m
    error-state indices (static ints), the rows of H that pick one component each (a position
    or a height fix): then P h is a column of P and no product is formed — ``noise`` (m,) the
    standard deviations of its independent components (R = diag(noise²)). The components are
    fused one after the other (exact for a diagonal R), each in Joseph form
    P ← (I − k hᵀ) P (I − k hᵀ)ᵀ + r k kᵀ computed as two rank-one corrections (no m × m
    inverse, no 15 × 15 product); then the injection and the reset. ``valid`` () bool: False
    leaves ``est`` as it was. Returns (est, NIS = Σ rᵢ² / sᵢ of the sequence = rᵀ S⁻¹ r; 0 where
    not valid)."""
    P = est.P
    dx = jnp.zeros(15, P.dtype)
    nis = jnp.zeros((), P.dtype)
    picks = isinstance(H, tuple)
    for i in range(len(H) if picks else H.shape[0]):  # static: m ≤ 6
        r = noise[i] ** 2
        if picks:
            j = H[i]
            innovation = residual[i] - dx[j]  # against the state already corrected by components < i
            Ph = P[:, j]
            s = Ph[j] + r
        else:
            hi = H[i]
            innovation = residual[i] - hi @ dx
            Ph = P @ hi
            s = hi @ Ph + r
        k = Ph / s
        A = P - jnp.outer(k, Ph)  # (I − k hᵀ) P
        Ah = A[:, j] if picks else A @ hi
        P = A - jnp.outer(Ah, k) + r * jnp.outer(k, k)  # · (I − h kᵀ) + r k kᵀ
        dx = dx + k * innovation
        nis = nis + innovation * innovation / s
    P1 = _symmetric(P)
    nav = est.nav
    nav1 = nav.replace(position=nav.position + dx[P_], velocity=nav.velocity + dx[V_],
                       attitude=quat_normalize(quat_multiply(nav.attitude, quat_from_rotation_vector(dx[TH]))),
                       accel_bias=nav.accel_bias + dx[BA], gyro_bias=nav.gyro_bias + dx[BG])
    # reset: the error is now about the corrected attitude, δθ⁺ = (I − [½ δθ]×) δθ
    B = jnp.eye(3, dtype=P.dtype) - skew(0.5 * dx[TH])  # G = I but for this block: G P Gᵀ by its rows and columns
    P1 = P1.at[TH].set(B @ P1[TH])
    P1 = _symmetric(P1.at[:, TH].set(P1[:, TH] @ B.T))
    out = est.replace(nav=nav1, P=P1)
    out = jax.tree_util.tree_map(lambda new, old: jnp.where(valid, new, old), out, est)
    return out, jnp.where(valid, nis, 0.0)


def fix_update(fp: EKFParams, est: EKFState, position, velocity, predicted, valid=True):
    """A position fix ``position`` (3,) m world, with ``velocity`` (3,) m/s (GPS) or None
    (mocap), against ``predicted`` (6,): the estimated (position, velocity) when it was taken."""
    if velocity is None:
        H = (0, 1, 2)  # δp
        return ekf_update(est, position - predicted[:3], H, fp.fix_position_noise, valid)
    H = (0, 1, 2, 3, 4, 5)  # δp, δv
    noise = jnp.concatenate([fp.fix_position_noise, fp.fix_velocity_noise])
    return ekf_update(est, jnp.concatenate([position, velocity]) - predicted, H, noise, valid)


def baro_update(fp: EKFParams, est: EKFState, z, valid=True):
    """A barometric altitude ``z`` () m (world up), less its calibrated offset."""
    H = (2,)  # δp_z
    r = jnp.reshape(z - fp.baro_offset - est.nav.position[2], (1,))
    return ekf_update(est, r, H, jnp.reshape(fp.baro_noise, (1,)), valid)


def mag_update(fp: EKFParams, est: EKFState, z, valid=True):
    """A magnetometer reading ``z`` (3,) T body, less its hard iron: h = R̂ᵀ m, ∂h/∂δθ = [R̂ᵀ m]×."""
    m_b = quat_rotate_inverse(est.nav.attitude, fp.mag_field)
    H = jnp.zeros((3, 15), est.P.dtype).at[:, TH].set(skew(m_b))
    return ekf_update(est, z - fp.mag_bias - m_b, H, fp.mag_noise, valid)


def error_state(nav: NavState, position, velocity, attitude, accel_bias, gyro_bias):
    """δx (15,) of the truth against the estimate: (p − p̂, v − v̂, Log(q̂* ⊗ q), b_a − b̂_a, b_g − b̂_g)."""
    dtheta = quat_to_rotation_vector(quat_multiply(quat_conjugate(nav.attitude), attitude))
    return jnp.concatenate([position - nav.position, velocity - nav.velocity, dtheta, accel_bias - nav.accel_bias,
                            gyro_bias - nav.gyro_bias])


def nees(est: EKFState, dx):
    """Normalised estimation error squared δxᵀ P⁻¹ δx (NaN where P is not positive definite)."""
    white = jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(est.P), dx, lower=True)
    return jnp.sum(white * white)


# --------------------------------------------------------------------------- in the loop

#: NIS kinds an :class:`EKFObserver` scores, in its arrays' order, and their dimensions
NIS_KINDS = ("fix", "baro", "mag")


@pytree_dataclass
class EKFObserver(Observer):
    """Sensors → ESKF in the engine's observer slot.

    sensors: the :class:`quadjax.sensors.Sensors` suite (its ``dt`` must be the run's tick);
    filter: the :class:`EKFParams`; key: this vehicle's PRNG key (every draw of its sensors and
    its initial error); sigma0 (15,): the initial standard deviations of δx (P₀ = diag(σ²));
    offset0 (15,): a deterministic initial error added to the draw; draw_initial (static): the
    initial estimate is truth ⊕ (offset0 + σ₀ ⊙ z), z ~ N(0, I) (else truth ⊕ offset0).

    The controller reads a :class:`quadjax.QuadState` of estimates (position, velocity,
    attitude; body rates = gyro − b̂_g; rotor speeds, energy and ground contact true). Per tick
    it records {"nees", "nis" (3,), "sigma" (15,)} beside that state; :meth:`result` gives the
    running sums (:func:`summary` turns them into means).
    """

    sensors: Sensors
    filter: EKFParams
    key: jax.Array
    sigma0: jax.Array
    offset0: jax.Array
    draw_initial: bool = dataclasses.field(default=True, **STATIC)

    @classmethod
    def create(cls, sensors: Sensors, key, sigma0, offset0=None, filter: EKFParams | None = None, gravity=9.81,
               draw_initial=True) -> "EKFObserver":
        dtype = sensors.imu.lever_arm.dtype
        sigma0 = field_array(sigma0, (15,), dtype)
        offset0 = field_array(0.0 if offset0 is None else offset0, (15,), dtype)
        if not isinstance(sigma0, jax.core.Tracer) and not bool(jnp.all(sigma0 > 0) & jnp.all(jnp.isfinite(sigma0))):
            raise ValueError(f"EKFObserver.sigma0 = {sigma0.tolist()}: expected finite standard deviations > 0")
        filter = filter if filter is not None else EKFParams.from_sensors(sensors, gravity)
        _check_fused_noise(sensors, filter)
        return cls(sensors=sensors, filter=filter,
                   key=key, sigma0=sigma0, offset0=offset0, draw_initial=draw_initial)

    def init(self, params, state0, dt):
        _check_fused_noise(self.sensors, self.filter)
        if not isinstance(dt, jax.core.Tracer) and abs(float(dt) - self.sensors.dt) > 1e-6 * self.sensors.dt:
            raise ValueError(f"EKFObserver: the sensors were built for a tick of {self.sensors.dt:g} s, "
                             f"the run's is {float(dt):g} s")
        dtype = state0.position.dtype
        k_sens, k_init = jax.random.split(self.key)
        sstate = sensors_init(self.sensors, k_sens, state0)
        err = self.offset0
        if self.draw_initial:
            err = err + self.sigma0 * jax.random.normal(k_init, (15,), dtype)
        accel, gyro = self.sensors.imu.accel, self.sensors.imu.gyro
        true_ba, true_bg = accel.bias + sstate.accel_gm, gyro.bias + sstate.gyro_gm
        # the estimate is the truth minus the error: δx = x − x̂
        nav = NavState(position=state0.position - err[P_], velocity=state0.velocity - err[V_],
                       attitude=quat_normalize(quat_multiply(state0.attitude, quat_from_rotation_vector(-err[TH]))),
                       accel_bias=true_ba - err[BA], gyro_bias=true_bg - err[BG])
        zero = jnp.zeros((), dtype)
        return {"sensors": sstate, "ekf": ekf_init(nav, self.sigma0, self.sensors.fix_delay),
                "gyro": state0.body_rates, "nees": zero, "nis": jnp.zeros(3, dtype), "sigma": self.sigma0,
                "sums": {"nees": zero, "nees_n": zero, "nis": jnp.zeros(3, dtype), "nis_n": jnp.zeros(3, dtype),
                         "position_sq": zero, "velocity_sq": zero, "attitude_sq": zero, "nees_max": zero}}

    def update(self, carry, at):
        sensors, fp = self.sensors, self.filter
        truth, k = at.state, at.k
        key = jax.random.fold_in(self.key, k + 1)  # tick k's draws (the init drew from the key itself)
        params = at.params if at.wind is None else at.params.replace(wind=at.wind)
        readings, sstate = sense(sensors, carry["sensors"], params, truth, at.command, k, key, at.wrench)
        est = carry["ekf"]
        dtype = truth.position.dtype
        # propagate to t with the IMU's means since its last sample (none at t = 0)
        h = jnp.asarray(sensors.period("imu"), dtype)
        est = jax.lax.cond(readings.imu_fresh & (k > 0), lambda e: ekf_predict(fp, e, readings.gyro, readings.accel, h),
                           lambda e: e, est)
        nis, n_nis = jnp.zeros(3, dtype), jnp.zeros(3, dtype)

        def fuse(est, due, update, valid):
            # ``due`` depends on the tick only (the same for every vehicle): a real branch under
            # vmap, so the updates cost nothing between samples; ``valid`` (dropout) is per vehicle
            return jax.lax.cond(due, lambda e: update(e, valid), lambda e: (e, jnp.zeros((), dtype)), est)

        if sensors.fix is not None:
            D = sensors.fix_delay
            then = est.history[k % D] if D else jnp.concatenate([est.nav.position, est.nav.velocity])
            valid = readings.fix_fresh & (k >= D)
            due = ((k - D) % sensors.fix_every == 0) & (k >= D)
            est, s = fuse(est, due, lambda e, ok: fix_update(fp, e, readings.fix_position, readings.fix_velocity,
                                                              then, ok), valid)
            nis, n_nis = nis.at[0].set(s), n_nis.at[0].set(valid)
        if sensors.baro is not None:
            est, s = fuse(est, k % sensors.baro_every == 0, lambda e, ok: baro_update(fp, e, readings.baro, ok),
                          readings.baro_fresh)
            nis, n_nis = nis.at[1].set(s), n_nis.at[1].set(readings.baro_fresh)
        if sensors.mag is not None:
            est, s = fuse(est, k % sensors.mag_every == 0, lambda e, ok: mag_update(fp, e, readings.mag, ok),
                          readings.mag_fresh)
            nis, n_nis = nis.at[2].set(s), n_nis.at[2].set(readings.mag_fresh)
        # score the posterior at t against the truth (the simulation knows it)
        imu = sensors.imu
        dx = error_state(est.nav, truth.position, truth.velocity, truth.attitude,
                         imu.accel.bias + sstate.accel_gm + sstate.accel_rw, imu.gyro.bias + sstate.gyro_gm + sstate.gyro_rw)
        score = nees(est, dx)
        finite = jnp.all(jnp.isfinite(est.P)) & jnp.all(jnp.isfinite(jnp.concatenate(jax.tree_util.tree_leaves(est.nav))))
        diverged = ~(finite & (score <= fp.nees_limit))  # a NaN NEES (P not positive definite) too
        gyro = jnp.where(readings.imu_fresh, readings.gyro, carry["gyro"])
        seen = truth.replace(position=est.nav.position, velocity=est.nav.velocity, attitude=est.nav.attitude,
                             body_rates=gyro - est.nav.gyro_bias)
        if sensors.fix_delay:  # keep this tick's estimate for the fix that arrives D ticks late
            row = jnp.concatenate([est.nav.position, est.nav.velocity])
            est = est.replace(history=est.history.at[k % sensors.fix_delay].set(row))
        s = carry["sums"]
        d2 = lambda v: jnp.sum(v * v)  # noqa: E731
        sums = {"nees": s["nees"] + score, "nees_n": s["nees_n"] + 1.0, "nis": s["nis"] + nis,
                "nis_n": s["nis_n"] + n_nis, "position_sq": s["position_sq"] + d2(dx[P_]),
                "velocity_sq": s["velocity_sq"] + d2(dx[V_]), "attitude_sq": s["attitude_sq"] + d2(dx[TH]),
                "nees_max": jnp.maximum(s["nees_max"], score)}
        carry = {"sensors": sstate, "ekf": est, "gyro": gyro, "nees": score, "nis": nis,
                 "sigma": jnp.sqrt(jnp.diagonal(est.P)), "sums": sums}
        code = jnp.where(diverged, codes.ESTIMATOR, codes.OK).astype(jnp.int32)
        return seen, carry, code

    def record(self, observation, carry):
        return {"state": observation, "nees": carry["nees"], "nis": carry["nis"], "sigma": carry["sigma"]}

    def result(self, carry):
        return {"ekf": carry["ekf"], "sums": carry["sums"]}


def _check_fused_noise(sensors: Sensors, fp: EKFParams):
    """Every measurement the filter fuses needs a noise > 0 in its model: a perfect one would make
    P singular (and the NEES undefined). Concrete values only; traced ones are judged per vehicle."""
    fused = {"fix_position_noise": sensors.fix is not None,
             "fix_velocity_noise": sensors.fix is not None and sensors.fix_velocity,
             "baro_noise": sensors.baro is not None, "mag_noise": sensors.mag is not None,
             "accel_noise": True, "gyro_noise": True}
    for name, used in fused.items():
        value = getattr(fp, name)
        if used and not isinstance(value, jax.core.Tracer) and not np.all(np.asarray(value) > 0):
            raise ValueError(f"EKFObserver: filter.{name} = {np.asarray(value).tolist()}: the filter fuses this "
                             "sensor and needs its noise > 0 (a noise-free sensor: give the filter a small one)")


def summary(result) -> dict:
    """Means of an :class:`EKFObserver` result (batched or not): NEES, NIS per kind
    (:data:`NIS_KINDS`, per update), RMS position [m], velocity [m/s] and attitude [rad] errors."""
    s = result["sums"]
    n = jnp.maximum(s["nees_n"], 1.0)
    return {"nees": s["nees"] / n, "nis": s["nis"] / jnp.maximum(s["nis_n"], 1.0),
            "rms_position": jnp.sqrt(s["position_sq"] / n), "rms_velocity": jnp.sqrt(s["velocity_sq"] / n),
            "rms_attitude": jnp.sqrt(s["attitude_sq"] / n), "nees_max": s["nees_max"]}
