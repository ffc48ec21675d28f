"""Vehicle state: a pytree of float arrays, world frame ENU, body frame FLU."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from quadjax._pytree import pytree_dataclass
from quadjax.params import model_dtype


def energy_dtype(dtype) -> np.dtype:
    """The dtype of the energy state of a state in ``dtype``: the wider accumulator.

    Energy is the one state that only ever grows by small increments (Ė dt ≈ 0.25 J per
    1 ms step at RP-1's hover against a running sum of hundreds of J): in a 16-bit float the
    increment falls below half an ulp of the sum and the sum stalls (bfloat16, 8 significant
    bits: at 64 J, where its ulp is 0.5 J). A state in bfloat16 or float16 therefore keeps its
    energy in float32; float32 and float64 keep their own. The steppers keep whatever dtype the
    energy has (x + h·Ė promotes to it), so a state built by :meth:`QuadState.create` or
    :func:`quadjax.hover_state` keeps the accumulator, and a hand-built all-16-bit state does not.
    The one place the choice is made (docs/precision.md).
    """
    d = np.dtype(dtype)
    return np.dtype(np.float32) if d.itemsize < 4 else d


@pytree_dataclass
class QuadState:
    """State of one vehicle (or a batch, with leading axes). Also the type of its derivative.

    Fields (R rotors):
        position: (3,) m, world (ENU, z up).
        velocity: (3,) m/s, world.
        attitude: (4,) unit quaternion (w, x, y, z), rotating body (FLU) → world.
        body_rates: (3,) rad/s, body frame (p, q, r).
        rotor_speeds: (R,) rad/s, ≥ 0.
        energy: () J, electrical energy drawn since the start (≥ 0). In the state's dtype,
            except for a bfloat16 or float16 state: float32 there (:func:`energy_dtype`).
        on_ground: () 1.0 resting on the ground, 0.0 airborne (a float so that
            the whole state can be differentiated and batched alike).
    """

    position: jax.Array
    velocity: jax.Array
    attitude: jax.Array
    body_rates: jax.Array
    rotor_speeds: jax.Array
    energy: jax.Array
    on_ground: jax.Array

    @classmethod
    def create(
        cls,
        *,
        position=(0.0, 0.0, 0.0),
        velocity=(0.0, 0.0, 0.0),
        attitude=(1.0, 0.0, 0.0, 0.0),
        body_rates=(0.0, 0.0, 0.0),
        rotor_speeds=(0.0, 0.0, 0.0, 0.0),
        energy=0.0,
        on_ground=0.0,
        dtype=None,
    ) -> "QuadState":
        """A state from array-likes, at rest at the origin by default; energy in
        :func:`energy_dtype` (``dtype``)."""
        dtype = model_dtype(dtype if dtype is not None else jnp.zeros(()).dtype, "QuadState.create")
        fields = dict(
            position=position, velocity=velocity, attitude=attitude, body_rates=body_rates,
            rotor_speeds=rotor_speeds, energy=energy, on_ground=on_ground,
        )
        dtypes = dict.fromkeys(fields, dtype) | {"energy": energy_dtype(dtype)}
        return cls(**{k: jnp.asarray(v, dtype=dtypes[k]) for k, v in fields.items()})


def state_axpy(state: QuadState, h, d: QuadState) -> QuadState:
    """state + h·d, field by field (the building block of every integrator).

    ``on_ground`` is a discrete flag, not integrated: it is carried unchanged.
    """
    out = jax.tree_util.tree_map(lambda x, dx: x + h * dx, state, d)
    return out.replace(on_ground=state.on_ground)
