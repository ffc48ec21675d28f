"""The thrust coefficient from the IMU: a second signal, independent of the state estimate.

An accelerometer reads the specific force f = a + g e_z (world frame in the nano-drone logs). In
the body frame its z component is the thrust per unit mass, m f_b,z = k_f Σωᵢ² (plus the body
drag's z part, small in level flight), so k_f follows from a least-squares line through the
origin, without differentiating positions or velocities and without the torque channel, which
on small vehicles can drag a multiple-shooting fit's k_f far from its value
(benchmarks/SYSID_RESULTS.md).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from quadjax.logs import FlightLog
from quadjax.quaternion import quat_rotate_inverse


class ThrustFit(NamedTuple):
    """k_f [N/(rad/s)²] ± its standard error, the residual RMS [N] and the number of rows used."""

    k_f: float
    std: float
    residual_rms: float
    rows: int


def k_f_from_specific_force(logs: FlightLog | Sequence[FlightLog], mass: float) -> ThrustFit:
    """k_f = Σ (m f_b,z) S / Σ S², S = Σᵢ ωᵢ² per row, f_b = Rᵀ f: the least-squares thrust
    coefficient from the logs' IMU specific force and measured rotor speeds (rows where the rotors
    turn). ``ValueError`` if no log has both."""
    logs = [logs] if isinstance(logs, FlightLog) else list(logs)
    ys, xs = [], []
    for log in logs:
        if log.specific_force is None or log.rotor_speeds is None:
            continue
        f_b = np.asarray(quat_rotate_inverse(jnp.asarray(log.attitude), jnp.asarray(log.specific_force)))
        s = np.sum(np.asarray(log.rotor_speeds, np.float64) ** 2, axis=1)
        turning = s > 0
        ys.append(mass * f_b[turning, 2])
        xs.append(s[turning])
    if not ys:
        raise ValueError("k_f_from_specific_force: no log has both a specific force and measured rotor speeds")
    y, x = np.concatenate(ys), np.concatenate(xs)
    k_f = float(np.sum(x * y) / np.sum(x * x))
    residual = y - k_f * x
    rms = float(np.sqrt(np.mean(residual ** 2)))
    std = float(rms / np.sqrt(np.sum(x * x)))
    return ThrustFit(k_f, std, rms, int(y.size))
