"""The other vehicles of seed 004 (the c4dynamics "Vehicles" page), on the same core and engine.

The equations of motion do not depend on the vehicle; the vehicle supplies the forces and
moments. Each vehicle here is a params pytree, a state vector and a pure derivative; the
engine (:func:`quadjax.simulate`) flies it through the same tick loop, integrators
(:func:`quadjax.integrators.runge_kutta4`), controllers and hooks, batched by ``vmap`` and
differentiated by ``grad``. ENU world / FLU body, SI units, as everywhere in quadjax (seed
data in NED is converted at the edge, :mod:`quadjax.frames`).

* :mod:`quadjax.vehicles.missile`: a 6-DoF missile on the rigid-body core, Euler-angle (12 + 1
  states) or quaternion (13 + 1), thrust along body x, lift and drag from the angles of attack,
  fin moments, a mass and inertia schedule for the burn; and the 3-DoF point-mass target.
* :mod:`quadjax.vehicles.car`: the kinematic unicycle car and its linearised lateral model.
* :mod:`quadjax.vehicles.helicopter`: the 2-DoF pitch-yaw laboratory helicopter, F(X), G(X), trim.

:class:`VectorVehicle` is what they share with :mod:`quadjax.euler16`: a state that is one
vector, params checked field by field, RK4 and Euler steppers of the derivative.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from quadjax.engine import Vehicle
from quadjax.integrators import runge_kutta4
from quadjax.params import float_dtype


class VectorVehicle(Vehicle):
    """A :class:`quadjax.Vehicle` whose state is one vector (``state_size``,) and whose
    command is (``command_size``,).

    ``derivative(params, x, command) -> ẋ``; ``shapes``: field → shape of one vehicle's params;
    ``checks(params) -> {field: bool}`` (traceable, per vehicle) with ``bounds`` {field: "> 0"}
    for the messages; ``rate(params) -> 1/s`` the params' fastest rate (None: not judged);
    ``finish(params, x) -> x`` the projection after every step (a quaternion renormalised);
    ``violation(params, x) -> code`` what the monitor checks (default: I4, every value finite);
    ``prepare(params, command)``: the part of the derivative that depends on the params and the
    command only, computed once per step (the command is held over it); ``derivative`` then
    takes its result in place of the command.
    """

    def __init__(self, name: str, derivative: Callable, state_size: int, command_size: int, shapes: dict,
                 checks: Callable, bounds: dict, rate: Callable | None = None, rate_name: str = "fastest rate",
                 finish: Callable | None = None, violation: Callable | None = None,
                 prepare: Callable | None = None):
        self.name, self.derivative = name, derivative
        self.state_size, self.command_size, self.shapes = state_size, command_size, shapes
        self.checks, self.bounds, self.rate, self.rate_name = checks, bounds, rate, rate_name
        self.finish, self._violation, self.prepare = finish, violation, prepare
        self.steppers = {"rk4": self.rk4_step, "euler": self.euler_step}

    def _held(self, params, command):
        return command if self.prepare is None else self.prepare(params, command)

    def rk4_step(self, params, x, command, dt):
        """One RK4 step of ẋ = derivative(params, x, command), command held."""
        u = self._held(params, command)
        return self._finish(params, runge_kutta4(lambda s: self.derivative(params, s, u), x, dt))

    def euler_step(self, params, x, command, dt):
        """One explicit Euler step x + dt ẋ."""
        return self._finish(params, x + dt * self.derivative(params, x, self._held(params, command)))

    def _finish(self, params, x):
        return x if self.finish is None else self.finish(params, x)

    def violation(self, params, x):
        code = super().violation(params, x)
        return code if self._violation is None else jnp.where(code == 0, self._violation(params, x), code)

    def boundary(self, params, state0, dt):
        dtype = float_dtype(jnp.result_type(state0), "simulate: state0 (its dtype sets the run's)")
        if jnp.shape(state0) != (self.state_size,):
            raise ValueError(f"simulate: state0 has shape {jnp.shape(state0)}; the state of {self.name} is "
                             f"({self.state_size},) for one vehicle (batch with jax.vmap or map_vehicles)")
        shapes = {k: jnp.shape(getattr(params, k)) for k in self.shapes}
        bad = {k: s for k, s in shapes.items() if s != self.shapes[k]}
        if bad:
            raise ValueError(f"simulate: one vehicle's {type(params).__name__} expected ({self.shapes}); got {bad}")
        params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, dtype), params)
        return params, jnp.asarray(state0, dtype), jnp.asarray(dt, dtype), dtype, self.command_size

    def check_params(self, params):
        for field, good in self.checks(params).items():
            if not bool(np.all(np.asarray(good))):
                raise ValueError(f"{type(params).__name__}.{field} = {np.asarray(getattr(params, field)).tolist()}: "
                                 f"must be finite and {self.bounds[field]}")

    def params_valid(self, params):
        ok = jnp.asarray(True)
        for good in self.checks(params).values():
            ok = ok & jnp.all(good)
        return ok

    def fastest_rate(self, params):
        return jnp.zeros(()) if self.rate is None else self.rate(params)


def positive(x):
    """Finite and > 0 (per element)."""
    return jnp.isfinite(x) & (x > 0)


def nonnegative(x):
    """Finite and ≥ 0 (per element)."""
    return jnp.isfinite(x) & (x >= 0)


def finite(x):
    return jnp.isfinite(x)


def create(cls, vehicle: VectorVehicle, values: dict, dtype=None):
    """``cls(**values)`` cast to ``dtype`` (default: JAX's default float), then checked
    (ValueError naming the first bad field)."""
    dtype = float_dtype(dtype if dtype is not None else jnp.zeros(()).dtype, f"{cls.__name__}.create")
    params = cls(**{k: jnp.asarray(np.asarray(v, np.float64), dtype) for k, v in values.items()})
    vehicle.check_params(params)
    return params


from quadjax.vehicles import car, helicopter, missile  # noqa: E402  (they build on VectorVehicle)

__all__ = ["VectorVehicle", "car", "create", "helicopter", "missile"]
