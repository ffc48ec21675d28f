"""The motor input map: logged motor inputs → rotor-speed commands, beside ``QuadParams``.

``QuadParams`` describes the vehicle from the rotor-speed command on (``motor_tau``
is the first-order rotor lag, ``omega_min``/``omega_max`` the clamp). A log gives
either measured rotor speeds or motor commands in the autopilot's units; the
:class:`MotorMap` is the static map in front of the model, kept apart so that
``QuadParams`` stays the physics of the vehicle.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass


@pytree_dataclass
class MotorMap:
    """Steady-state rotor speed [rad/s] for a motor input u ≥ 0, per rotor (PX4 order):

        ω_ss,i = offset_i + gain_i · u_i^exponent

    Fields (R rotors): offset (R,) rad/s; gain (R,) rad/s per input unit^exponent;
    exponent () dimensionless. The identity (0, 1, 1) passes rotor speeds through;
    the Crazyflie 2.1 Brushless fit ω ≈ 2850 √u − 530 (u normalised to [0, 1]) is
    :func:`nanodrone_motor_map`. Fed to the model as its rotor-speed command, so
    the rotors reach ω_ss with the lag ``QuadParams.motor_tau``.
    """

    offset: jax.Array
    gain: jax.Array
    exponent: jax.Array

    @classmethod
    def create(cls, offset=0.0, gain=1.0, exponent=1.0, *, num_rotors: int = 4, dtype=None) -> "MotorMap":
        """Checked constructor; scalars broadcast to ``num_rotors``. ``ValueError`` names a bad field."""
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.zeros(()).dtype
        values = {
            "offset": np.broadcast_to(np.asarray(offset, np.float64), (num_rotors,)),
            "gain": np.broadcast_to(np.asarray(gain, np.float64), (num_rotors,)),
            "exponent": np.asarray(exponent, np.float64),
        }
        if values["exponent"].shape != ():
            raise ValueError(f"MotorMap.exponent: shape {values['exponent'].shape}, expected ()")
        for name, v in values.items():
            if not np.all(np.isfinite(v)):
                raise ValueError(f"MotorMap.{name} = {v.tolist()}: must be finite")
        if np.any(values["gain"] <= 0) or values["exponent"] <= 0:
            raise ValueError("MotorMap.gain and MotorMap.exponent must be > 0")
        return cls(**{k: jnp.asarray(v, dtype=dtype) for k, v in values.items()})

    @classmethod
    def identity(cls, num_rotors: int = 4, dtype=None) -> "MotorMap":
        """ω_ss = u: the input already is the rotor speed in rad/s."""
        return cls.create(0.0, 1.0, 1.0, num_rotors=num_rotors, dtype=dtype)

    @property
    def num_rotors(self) -> int:
        return self.gain.shape[-1]

    def replace(self, **changes) -> "MotorMap":
        """A copy with some fields replaced (unchecked: use in traced code)."""
        return dataclasses.replace(self, **changes)

    def astype(self, dtype) -> "MotorMap":
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), self)


def motor_speed_command(motor_map: MotorMap, u):
    """ω_ss = offset + gain · u^exponent [rad/s] for inputs u (..., R) ≥ 0.

    u^exponent is taken as 0 at u ≤ 0 with a finite gradient (motors off).
    """
    positive = u > 0
    safe = jnp.where(positive, u, 1.0)
    power = jnp.where(positive, safe ** motor_map.exponent, 0.0)
    return motor_map.offset + motor_map.gain * power


def nanodrone_motor_map(dtype=None) -> MotorMap:
    """Crazyflie 2.1 Brushless: ω_ss ≈ 2850 √u − 530 rad/s for the normalised command u.

    A rough least-squares fit on the benchmark logs (data README, "motor speed
    response"); it drifts with the battery voltage, so fit it per data set.
    """
    return MotorMap.create(offset=-530.0, gain=2850.0, exponent=0.5, dtype=dtype)
