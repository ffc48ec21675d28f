"""The sweep's sensors: the ``[estimator]`` table as a :class:`quadjax.sensors.Sensors` suite (each
vehicle flies a :class:`quadjax.estimation.EKFObserver` on it)."""

from __future__ import annotations

import jax.numpy as jnp

from quadjax import sensors as S


def sensor_suite(table: dict, control_dt: float, dtype) -> S.Sensors:
    """The suite of a checked ``[estimator]`` table on the control tick (ValueError where a rate
    or the latency is not a whole number of ticks); a rate of 0 samples every tick."""
    t, d = table, jnp.dtype(dtype)
    imu = S.Imu.create(
        accel=S.ImuAxes.create(noise_density=t["accel_noise"], bias_instability=t["accel_bias_instability"],
                               correlation_time=t["bias_correlation_time"], dtype=d),
        gyro=S.ImuAxes.create(noise_density=t["gyro_noise"], bias_instability=t["gyro_bias_instability"],
                              correlation_time=t["bias_correlation_time"], dtype=d),
        dtype=d)
    gps = t["fix"] == "gps"
    fix = S.PositionFix.create(position_noise=t["fix_position_noise"],
                               velocity_noise=t["fix_velocity_noise"] if gps else 0.0, dropout=t["fix_dropout"], dtype=d)
    return S.Sensors.create(control_dt, imu, imu_rate=t["imu_rate"] or None,
                            mag=S.Magnetometer.create(noise=t["mag_noise"], dtype=d), mag_rate=t["mag_rate"] or None,
                            baro=S.Barometer.create(noise=t["baro_noise"], dtype=d), baro_rate=t["baro_rate"] or None,
                            fix=fix, fix_rate=t["fix_rate"] or None, fix_latency=t["fix_latency"], fix_velocity=gps)


def initial_sigma(table: dict, dtype):
    """σ₀ (15,) of the filter's initial error from the table's five standard deviations."""
    return jnp.repeat(jnp.asarray(table["initial_sigma"], dtype), 3)

