"""The one table of per-vehicle status codes (engine, monitor, sweep, repro files).

A code is a () int32 per vehicle; 0 means it flew to the end. The first non-zero code of a
vehicle stops it (the engine freezes it at its state before that tick).

    code  name               seed invariant  who sets it
    0     ok                 —               —
    1     non_finite         I4              the monitor (a value is NaN or ±inf)
    2     attitude_not_unit  I2              the monitor (|‖q‖² − 1| > 8 ε)
    3     rotor_speed        I3              the monitor (ωᵢ < 0 or ωᵢ > ω_max)
    4     energy             I3              the monitor (energy < 0)
    5     below_ground       I5              the monitor (z < ground_z)
    6     params_invalid     I1              the engine, at t = 0 (a vehicle with such params never flies)
    7     ground             —               the sweep's crash rules (touched down while the reference is aloft)
    8     tilt               —               the sweep's crash rules (tilt beyond max_tilt_deg)
    9     lost               —               the sweep's crash rules (tracking error beyond max_error)
    10    coarse_step        —               the engine, at t = 0 (the step makes the stepper unstable on
                                             the params' own rates), or the monitor (a step too long for the
                                             dynamics: rate × step > 0.5, :mod:`quadjax.resolution`)
    11    estimator          —               an observer (:mod:`quadjax.estimation`): its estimator diverged
                                             (a non-finite estimate or covariance, or NEES beyond its limit)

Codes 1–5 are :data:`quadjax.invariants.INVARIANT_IDS` (``state_violation`` returns them).
"""

from quadjax.invariants import INVARIANT_IDS

STATUS_IDS = INVARIANT_IDS + ("params_invalid", "ground", "tilt", "lost", "coarse_step", "estimator")
OK = 0
PARAMS_INVALID, GROUND, TILT, LOST, COARSE_STEP, ESTIMATOR = (
    STATUS_IDS.index(n) for n in ("params_invalid", "ground", "tilt", "lost", "coarse_step", "estimator"))
#: the seed's invariant number of each code ("" for codes that are not invariants)
INVARIANT_NUMBERS = ("", "I4", "I2", "I3", "I3", "I5", "I1", "", "", "", "", "")
#: codes the monitor reports: invariant violations (I1 parameters, I2–I5 state) and a step
#: that does not resolve the dynamics (the result would be finite but wrong)
VIOLATION_CODES = tuple(range(1, len(INVARIANT_IDS))) + (PARAMS_INVALID, COARSE_STEP)

assert len(INVARIANT_NUMBERS) == len(STATUS_IDS)


def status_id(code) -> str:
    """The name of a status code (a Python int or a concrete 0-d array)."""
    return STATUS_IDS[int(code)]


def describe_code(code) -> str:
    """``"I5 below_ground"``, ``"tilt"``: the code's invariant number (if any) and name."""
    code = int(code)
    number = INVARIANT_NUMBERS[code]
    return f"{number} {STATUS_IDS[code]}" if number else STATUS_IDS[code]
