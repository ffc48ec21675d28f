"""``quadjax fit``: fit parameters to flight logs, print estimates ± std and validation errors, write JSON."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import jax

_EPILOG = """\
examples:
  quadjax fit --data nanodrone/multisine_20251017_run1.parquet --fit k_f,drag_linear \\
      --horizon 10 --weights 0.01,0.02,1e3,1e3 --out fitted.json
  quadjax fit --data flights/ --validate held_out.csv --fit k_f,inertia --preset iris --out iris_fit.json

Logs: .parquet files of the nano-drone benchmark, or .csv in the generic schema
(quadjax.logs). Parameter names: quadjax.sysid.parameters (group or group.component).
Load the result with quadjax.sysid.io.load_params(path).

The first example scores position and velocity only (attitude and rate scales of 1e3 weigh
them out): k_f = 3.74e-8 (the published least-squares value is 3.72e-8) and a linear drag of
0.02-0.04 N/(m/s), in 15 s. Scoring the attitude and rates as well, the nano-drone's torque
channel pulls k_f 20-65 % low and the inertia to any bound given (benchmarks/SYSID_RESULTS.md):
bound them (--bound inertia=LO,HI) or weigh them out. The fit returns its best iterate among
valid parameters, with that iterate's objective."""


def _pairs(items, what):
    """['name=a,b', ...] → {name: (a, b)}."""
    out = {}
    for item in items or []:
        name, _, rest = item.partition("=")
        try:
            a, b = (float(x) for x in rest.split(","))
        except ValueError:
            raise ValueError(f"--{what} {item!r}: expected NAME=NUMBER,NUMBER") from None
        out[name.strip()] = (a, b)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quadjax fit", description=__doc__, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", required=True, metavar="PATH", help="flight logs (files or folders) to fit")
    p.add_argument("--fit", required=True, metavar="NAMES", help="comma-separated parameters, e.g. k_f,inertia,k_m")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON file for the fitted parameters")
    p.add_argument("--preset", default="crazyflie21_brushless", help="start values (default: %(default)s)")
    p.add_argument("--init", metavar="FILE", help="start from a fit file instead of a preset")
    p.add_argument("--inputs", choices=("rotor_speeds", "commands"), default="rotor_speeds",
                   help="what drives the model (default: %(default)s)")
    p.add_argument("--motor-map", choices=("auto", "identity", "nanodrone"), default="auto",
                   help="input map: auto = identity for rotor speeds, nanodrone for commands in .parquet logs")
    p.add_argument("--validate", nargs="+", metavar="PATH", help="held-out logs for the validation table")
    p.add_argument("--horizon", type=int, default=50, help="prediction steps per window (default: %(default)s)")
    p.add_argument("--stride", type=int, help="rows between window starts (default: the horizon)")
    p.add_argument("--max-windows", type=int, default=600, help="cap on windows, spread evenly (default: %(default)s)")
    p.add_argument("--adam-steps", type=int, default=200)
    p.add_argument("--adam-lr", type=float, default=0.05)
    p.add_argument("--lbfgs-steps", type=int, default=100)
    p.add_argument("--prior", action="append", metavar="NAME=MEAN,STD", help="Gaussian prior (SI units), repeatable")
    p.add_argument("--bound", action="append", metavar="NAME=LO,HI", help="bounds (SI units), repeatable")
    p.add_argument("--weights", metavar="P,V,Q,W[,R]",
                   help="residual scales in m, m/s, rad, rad/s (default 0.01,0.02,0.01,0.05), and optionally "
                        "rotor speeds in rad/s (scored with --inputs commands where the logs measure them)")
    p.add_argument("--covariance", choices=("sandwich", "gauss_newton"), default="sandwich")
    p.add_argument("--val-stride", type=int, default=1, help="validation start-index stride (1 = every index)")
    p.add_argument("--raw", action="store_true", help="do not low-pass filter nano-drone logs")
    p.add_argument("--float32", action="store_true", help="fit in float32 (default float64)")
    return p


def fit_main(argv: list[str]) -> int:
    """``quadjax fit --data PATH... --fit NAMES --out FILE``; returns the exit code.

    Every failure the user can cause (a missing, unreadable or malformed log or
    ``--init`` file, an unwritable ``--out``, a bad option value) is one line
    ``quadjax fit: error: <path>: <reason>`` on stderr and exit code 2.
    """
    args = _parser().parse_args(argv)
    # float64 for the fit unless asked otherwise, scoped to this command (jax.config stays untouched)
    keep = args.float32 or jax.config.jax_enable_x64
    precision = contextlib.nullcontext() if keep else jax.enable_x64(True)
    with precision:
        try:
            return _fit(args)
        except (ValueError, OSError, ImportError) as err:
            print(f"quadjax fit: error: {_one_line(err)}", file=sys.stderr)
            return 2


def _one_line(err: Exception) -> str:
    """The reason of ``err`` on one line, with the file it concerns where the error knows it."""
    if isinstance(err, OSError) and err.filename is not None:
        text = f"{err.filename}: {err.strerror or err}"
    else:
        text = str(err) or type(err).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _check_out(args) -> None:
    """``--out`` can be written, and is none of the logs (checked before any work, so that a
    long fit is never thrown away at the end)."""
    from quadjax.sysid.io import check_writable

    target = check_writable(args.out)
    for log in (args.data or []) + (args.validate or []):
        if Path(log).is_file() and Path(log).resolve() == target:
            raise ValueError(f"{args.out}: is one of the logs given; it would be overwritten")


def _options(args):
    """(weights, priors, bounds) from the command line (``ValueError`` names a bad value)."""
    from quadjax.sysid.objective import LossWeights

    weights = LossWeights()
    if args.weights:
        try:
            weights = LossWeights(*[float(x) for x in args.weights.split(",")])
        except (TypeError, ValueError) as err:
            raise ValueError(f"--weights {args.weights!r}: {err}") from None
    return weights, _pairs(args.prior, "prior"), _pairs(args.bound, "bound")


def _start(args, dtype):
    """(params0, motor_map0): from ``--init`` or ``--preset``, and ``--motor-map``."""
    from quadjax import presets
    from quadjax.sysid.io import load_fit
    from quadjax.sysid.motor import MotorMap, nanodrone_motor_map

    if args.init:
        start = load_fit(args.init, dtype=dtype)
        params0, mm0 = start["params"], start["motor_map"]
    else:
        params0, mm0 = presets.get(args.preset, dtype=dtype), None
    if mm0 is None:
        parquet = all(Path(p).suffix == ".parquet" or Path(p).is_dir() for p in args.data)
        choice = args.motor_map
        if choice == "auto":
            choice = "nanodrone" if (args.inputs == "commands" and parquet) else "identity"
        mm0 = nanodrone_motor_map(dtype) if choice == "nanodrone" else MotorMap.identity(params0.num_rotors, dtype)
    return params0, mm0


def _fit(args) -> int:
    from quadjax.logs import check_rotor_speeds, load_logs
    from quadjax.sysid.optimize import fit
    from quadjax.sysid.parameters import parse_names

    # the cheap checks first: a mistake in --out or an option must not cost a log load or a fit
    _check_out(args)
    weights, priors, bounds = _options(args)
    dtype = "float32" if args.float32 else "float64"
    params0, mm0 = _start(args, dtype)
    parse_names(args.fit, params0.num_rotors)
    kw = {"filtered": not args.raw}
    train = load_logs(args.data, **kw)
    held = load_logs(args.validate, **kw) if args.validate else None
    for log in held or []:  # fit checks its own logs; these only feed the validation table
        if log.rotor_speeds is not None:
            check_rotor_speeds(log.rotor_speeds, f"--validate log {log.name!r}", omega_max=float(params0.omega_max))

    n_rows = sum(len(lg) for lg in train)
    print(f"fitting {args.fit} to {len(train)} log(s), {n_rows} rows; inputs={args.inputs}, horizon={args.horizon}")
    t0 = time.perf_counter()
    result = fit(train, args.fit, params0, motor_map0=mm0, inputs=args.inputs, horizon=args.horizon,
                 stride=args.stride, max_windows=args.max_windows, weights=weights, priors=priors, bounds=bounds,
                 adam_steps=args.adam_steps, adam_lr=args.adam_lr, lbfgs_steps=args.lbfgs_steps,
                 covariance=args.covariance)
    seconds = time.perf_counter() - t0
    print(result.table())
    print(f"({len(result.loss_history)} iterations, objective {result.loss_history[0]:.4g} → "
          f"{result.objective:.4g} at the returned iterate, {seconds:.1f} s)")
    try:
        validation = _validation(args, result, params0, mm0, held if held is not None else train, held is not None)
    except (ValueError, FloatingPointError) as err:  # a fit that took minutes is saved all the same
        validation = {"error": _one_line(err)}
        print(f"quadjax fit: warning: validation failed ({_one_line(err)}); the fit is saved without it",
              file=sys.stderr)
    worse = _worse_than_start(validation)
    if worse:
        print(f"quadjax fit: warning: the fitted model predicts worse than the start on {validation['on']} "
              f"({', '.join(worse)}); the fit is saved all the same", file=sys.stderr)
    _save(args, result, validation, seconds, dtype)
    print(f"\nwrote {args.out}")
    return 0


def _worse_than_start(validation: dict) -> list[str]:
    """The quantities whose summed open-loop error the fit made worse than the start's."""
    if "fitted" not in validation:
        return []
    fitted, start = validation["fitted"]["sum"], validation["start"]["sum"]
    return [k for k in fitted if isinstance(fitted[k], float) and fitted[k] > start[k]]


def _validation(args, result, params0, mm0, logs, held_out: bool) -> dict:
    """Print the open-loop error table of the naive, start and fitted models; its summary for the file."""
    from quadjax.sysid.validation import format_table, open_loop_errors

    where = "held-out logs" if held_out else "the training logs (no --validate given)"
    horizon = min(50, min(len(lg) for lg in logs) - 1)
    rows = {}
    for name, (p, mm) in {"naive": (None, None), "start": (params0, mm0),
                          "fitted": (result.params, result.motor_map)}.items():
        rows[name] = open_loop_errors(p, logs, motor_map=mm, inputs=args.inputs, max_horizon=horizon,
                                      stride=args.val_stride)
    hs = tuple(h for h in (1, 10, 50) if h <= horizon)
    print(f"\nopen-loop errors on {where} (mean over {rows['fitted'].n_starts} start indices):")
    print(format_table(rows, horizons=hs))
    return {"on": where, **{k: v.summary(hs) for k, v in rows.items()}}


def _save(args, result, validation: dict, seconds: float, dtype: str) -> None:
    from quadjax.sysid.io import save_fit

    info = {"names": args.fit, "data": [str(p) for p in args.data], "windows": result.windows,
            "horizon": result.horizon, "iterations": int(len(result.loss_history)),
            "objective": [float(result.loss_history[0]), result.objective],
            "covariance": result.covariance, "fisher_rank": result.uncertainty.rank,
            "unidentifiable": list(result.uncertainty.unidentifiable), "seconds": seconds, "dtype": dtype}
    try:
        save_fit(args.out, result.params, motor_map=result.motor_map, inputs=args.inputs,
                 estimates=result.estimates(), validation=validation, fit_info=info)
    except OSError as err:  # e.g. the disk filled during the fit: the error must still name the file
        raise ValueError(f"{args.out}: cannot write the fit ({err.strerror or err})") from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(fit_main(sys.argv[1:]))
