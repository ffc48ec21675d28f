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

Files are written atomically (a temp file in the same folder, fsync, rename), so
a crash never leaves half a file; loading a damaged or foreign file raises
``ValueError`` naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from quadjax.files import write_atomic
from quadjax.params import QuadParams, check_params
from quadjax.sysid.motor import MotorMap
from quadjax.sysid.windows import INPUT_MODES

FORMAT = "quadjax.fit/1"
CONVENTIONS = ("SI units; world ENU (z up), body FLU; quaternion (w, x, y, z) body->world; "
               "rotor order PX4 Quad X (0 FR CCW, 1 RL CCW, 2 FL CW, 3 RR CW)")

#: every field of one vehicle is at most 2-D (inertia, rotor_positions); deeper nesting is damage,
#: and stopping there keeps a hostile file from recursing through the checks
_MAX_NESTING = 2


def params_to_dict(params: QuadParams) -> dict:
    """Every field as (nested) lists of floats."""
    return {f.name: np.asarray(getattr(params, f.name), np.float64).tolist() for f in dataclasses.fields(params)}


def _check_numbers(value, where: str, depth: int = 0) -> None:
    """``ValueError`` unless ``value`` is a finite JSON number or a list of them, at most 2-D.

    Strict on purpose: numpy would also take "1.5" or true as a number, and that is damage here.
    """
    if isinstance(value, list):
        if depth >= _MAX_NESTING:
            raise ValueError(f"{where}: lists nested deeper than {_MAX_NESTING} levels")
        for item in value:
            _check_numbers(item, where, depth + 1)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a number or a list of numbers, found {type(value).__name__}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(f"{where}: {value!r} is not a finite number")


def params_from_dict(fields: dict, dtype=None) -> QuadParams:
    """A checked :class:`QuadParams` from :func:`params_to_dict` output (``ValueError`` names a bad field)."""
    if not isinstance(fields, dict):
        raise ValueError(f"params: expected an object of QuadParams fields, found {type(fields).__name__}")
    known = {f.name for f in dataclasses.fields(QuadParams)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown QuadParams field(s) {sorted(unknown)}")
    missing = {"mass", "inertia", "rotor_positions", "rotor_spins", "k_f", "k_m", "omega_max"} - set(fields)
    if missing:
        raise ValueError(f"missing QuadParams field(s) {sorted(missing)}")
    for name, value in fields.items():
        _check_numbers(value, f"QuadParams.{name}")
    return QuadParams.create(**fields, dtype=dtype)


def _json_safe(obj):
    """``obj`` with non-finite floats as None (JSON has no NaN): a diverged validation error
    must not make the save fail after the whole fit ran."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def save_fit(path, params: QuadParams, *, motor_map: MotorMap | None = None, inputs: str = "rotor_speeds",
             estimates: list | None = None, validation: dict | None = None, fit_info: dict | None = None) -> None:
    """Write a fit (or any parameter set) as JSON (module docstring), atomically.

    ``ValueError`` for params that :func:`load_params` would reject, or a ``path``
    that cannot be written (:func:`check_writable`); the old file then stays as it was.
    """
    check_params(params)
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
        "estimates": _json_safe(estimates or []),
        "validation": _json_safe(validation or {}),
        "fit": _json_safe(fit_info or {}),
    }
    _write_atomic(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def check_writable(path) -> Path:
    """The real path a file at ``path`` would be written to; ``ValueError`` "<path>: <reason>" unless
    its folder exists and takes a new file, and ``path`` is not a folder or a device.

    ``quadjax fit`` calls it before fitting, so that an unwritable ``--out`` does not
    throw the result away at the end. A probe file is created and removed in the folder:
    permission bits alone do not tell (root, read-only mounts, ACLs).
    """
    if not str(path).strip():
        raise ValueError(f"{str(path)!r}: empty file name")
    target = Path(os.path.realpath(path))  # a symlink is written through, as a plain open() would
    if target.is_dir():
        raise ValueError(f"{path}: is a folder; give a file name, e.g. {Path(path) / 'fit.json'}")
    if target.exists() and not target.is_file():
        raise ValueError(f"{path}: exists and is not a regular file; it would be replaced")
    if target.exists() and not os.access(target, os.W_OK):  # the rename would replace it all the same
        raise ValueError(f"{path}: file is read-only")
    folder = target.parent
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{path}: {folder} is not a folder")
    if not folder.is_dir():
        raise ValueError(f"{path}: folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
    except OSError as err:
        raise ValueError(f"{path}: cannot write in folder {folder} ({err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)
    return target


def _write_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` (checked writable) so that a reader sees the old file or the whole new one."""
    write_atomic(check_writable(path), lambda f: f.write(text.encode("utf-8")))


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON (fit files hold finite numbers only)")


def _read_document(path: Path) -> dict:
    """The parsed JSON object of a fit file; ``ValueError`` naming ``path`` for anything else."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a quadjax fit file (JSON nested too deeply to read)") from None
    except ValueError as err:  # from _reject_constant
        raise ValueError(f"{path}: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{path}: not a quadjax fit file (format {found!r}, expected {FORMAT!r})")
    return doc


def _motor_map_from(mm, num_rotors: int, dtype) -> MotorMap | None:
    """The ``motor_map`` entry (None or {"offset", "gain", "exponent"}) as a checked MotorMap."""
    if mm is None:
        return None
    if not isinstance(mm, dict) or not {"offset", "gain", "exponent"} <= set(mm):
        raise ValueError('motor_map: expected null or an object with "offset", "gain" and "exponent"')
    for key in ("offset", "gain", "exponent"):
        _check_numbers(mm[key], f"motor_map.{key}")
    try:
        return MotorMap.create(mm["offset"], mm["gain"], mm["exponent"], num_rotors=num_rotors, dtype=dtype)
    except ValueError as err:
        raise ValueError(f"motor_map ({num_rotors} rotors): {err}") from None


def _entry(doc: dict, key: str, kind: type, default):
    """``doc[key]`` (or ``default`` where absent), checked to be of JSON type ``kind``."""
    value = doc.get(key, default)
    if not isinstance(value, kind):
        raise ValueError(f"{key!r}: expected {kind.__name__}, found {type(value).__name__}")
    return value


def _fit_from_document(doc: dict, dtype) -> dict:
    if "params" not in doc:
        raise ValueError("no 'params' entry")
    params = params_from_dict(doc["params"], dtype=dtype)
    inputs = _entry(doc, "inputs", str, "rotor_speeds")
    if inputs not in INPUT_MODES:
        raise ValueError(f"inputs {inputs!r}: expected one of {INPUT_MODES}")
    return {
        "params": params,
        "motor_map": _motor_map_from(doc.get("motor_map"), params.num_rotors, dtype),
        "inputs": inputs,
        "estimates": _entry(doc, "estimates", list, []),
        "validation": _entry(doc, "validation", dict, {}),
        "fit": _entry(doc, "fit", dict, {}),
    }


def load_fit(path, dtype=None) -> dict:
    """The whole file: {"params": QuadParams, "motor_map": MotorMap | None, "inputs", "estimates",
    "validation", "fit"}.

    ``ValueError`` naming ``path`` for a file that is not a quadjax fit, is damaged
    (truncated, wrong types, missing entries, NaN) or has values ``QuadParams.create``
    rejects; ``OSError`` where it cannot be read at all.
    """
    path = Path(path)
    doc = _read_document(path)
    try:
        return _fit_from_document(doc, dtype)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def load_params(path, dtype=None) -> QuadParams:
    """The :class:`QuadParams` of a fit file written by ``quadjax fit`` / :func:`save_fit`.

    SI units, rotor order PX4 Quad X (as the data were converted on loading);
    checked like :meth:`QuadParams.create`. ``dtype`` defaults to JAX's default float.
    ``ValueError`` naming the file for a damaged one (:func:`load_fit`).
    """
    return load_fit(path, dtype=dtype)["params"]
