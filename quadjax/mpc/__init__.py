"""Model-predictive control on the simulator's own dynamics: MPPI, gradient shooting, iLQR.

Pick a solver config (static structure), build :class:`MPCParams` (prediction model, cost,
solver numbers), and fly it with :func:`quadjax.simulate`::

    mpc = MPPI(horizon=10, dt=0.1, samples=256, control_dt=0.02)
    params = MPCParams(model=model, cost=Cost(stage=(Tracking(...), Effort(...))), solver=MPPIParams.default())
    run = simulate(plant, s0, 0.02, controller=mpc.control, ctrl_params=params, ctrl_state=mpc.init(params, s0),
                   num_ticks=T)

The prediction model may differ from the plant. Everything is pure: jit the outermost
call, vmap over vehicles (plant, state, MPCParams and MPCState all batch).
"""

from quadjax.mpc.core import (
    STATUS_NONFINITE_GUESS,
    STATUS_NONFINITE_SOLVE,
    STATUS_OK,
    MPCParams,
    MPCState,
    PlanConfig,
    from_unit,
    shift_plan,
    to_unit,
)
from quadjax.mpc.costs import (
    CommandRate,
    Cost,
    Effort,
    KeepOut,
    Tilt,
    Tracking,
    flat_attitude,
    stage_cost,
    terminal_cost,
)
from quadjax.mpc.ilqr import ILQR, ILQRParams, ILQRResult, ilqr
from quadjax.mpc.mppi import MPPI, MPPIParams
from quadjax.mpc.shooting import Shooting, ShootingParams

__all__ = [
    "CommandRate", "Cost", "Effort", "ILQR", "ILQRParams", "ILQRResult", "KeepOut", "MPCParams", "MPCState",
    "MPPI", "MPPIParams", "PlanConfig", "STATUS_NONFINITE_GUESS", "STATUS_NONFINITE_SOLVE", "STATUS_OK",
    "Shooting", "ShootingParams", "Tilt", "Tracking", "flat_attitude", "from_unit", "ilqr", "shift_plan",
    "stage_cost", "terminal_cost", "to_unit",
]
