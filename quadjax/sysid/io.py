"""Fitted parameters as JSON: written by ``quadjax fit``, read back by :func:`load_params`.

The file holds every ``QuadParams`` field in SI units, rotor order PX4 Quad X
(the loaders convert logs to it), the ``MotorMap`` the inputs went through, the
estimates with their standard deviations, and the validation errors:

    {"format": "quadjax.fit/1",
     "conventions": "...",
     "params": {"mass": 0.045, "inertia": [[...], ...], ...},
     "motor_map": {"offset": [...], "gain": [...], "exponent": 1.0},
     "inputs": "rotor_speeds",
     "estimates": [{"label": "k_f", "value": ..., "std": ..., "start": ..., "identifiable": true}, ...],
     "validation": {...}, "fit": {...}}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from quadjax.params import QuadParams
from quadjax.sysid.motor import MotorMap

FORMAT = "quadjax.fit/1"
CONVENTIONS = ("SI units; world ENU (z up), body FLU; quaternion (w, x, y, z) body->world; "
               "rotor order PX4 Quad X (0 FR CCW, 1 RL CCW, 2 FL CW, 3 RR CW)")


def params_to_dict(params: QuadParams) -> dict:
    """Every field as (nested) lists of floats."""
    return {f.name: np.asarray(getattr(params, f.name), np.float64).tolist() for f in dataclasses.fields(params)}


def params_from_dict(fields: dict, dtype=None) -> QuadParams:
    """A checked :class:`QuadParams` from :func:`params_to_dict` output (``ValueError`` names a bad field)."""
    known = {f.name for f in dataclasses.fields(QuadParams)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown QuadParams field(s) {sorted(unknown)}")
    missing = {"mass", "inertia", "rotor_positions", "rotor_spins", "k_f", "k_m", "omega_max"} - set(fields)
    if missing:
        raise ValueError(f"missing QuadParams field(s) {sorted(missing)}")
    return QuadParams.create(**fields, dtype=dtype)


def save_fit(path, params: QuadParams, *, motor_map: MotorMap | None = None, inputs: str = "rotor_speeds",
             estimates: list | None = None, validation: dict | None = None, fit_info: dict | None = None) -> None:
    """Write a fit (or any parameter set) as JSON (module docstring)."""
    doc = {
        "format": FORMAT,
        "conventions": CONVENTIONS,
        "params": params_to_dict(params),
        "motor_map": None if motor_map is None else {
            "offset": np.asarray(motor_map.offset, np.float64).tolist(),
            "gain": np.asarray(motor_map.gain, np.float64).tolist(),
            "exponent": float(motor_map.exponent),
        },
        "inputs": inputs,
        "estimates": estimates or [],
        "validation": validation or {},
        "fit": fit_info or {},
    }
    Path(path).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")


def load_fit(path, dtype=None) -> dict:
    """The whole file: {"params": QuadParams, "motor_map": MotorMap | None, "inputs", "estimates",
    "validation", "fit"}. ``ValueError`` for a file that is not a quadjax fit or has bad values."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise ValueError(f"{path}: not a quadjax fit file (format {found!r}, expected {FORMAT!r})")
    mm = doc.get("motor_map")
    return {
        "params": params_from_dict(doc["params"], dtype=dtype),
        "motor_map": None if mm is None else MotorMap.create(mm["offset"], mm["gain"], mm["exponent"],
                                                             num_rotors=len(mm["gain"]), dtype=dtype),
        "inputs": doc.get("inputs", "rotor_speeds"),
        "estimates": doc.get("estimates", []),
        "validation": doc.get("validation", {}),
        "fit": doc.get("fit", {}),
    }


def load_params(path, dtype=None) -> QuadParams:
    """The :class:`QuadParams` of a fit file written by ``quadjax fit`` / :func:`save_fit`.

    SI units, rotor order PX4 Quad X (as the data were converted on loading);
    checked like :meth:`QuadParams.create`. ``dtype`` defaults to JAX's default float.
    """
    return load_fit(path, dtype=dtype)["params"]
