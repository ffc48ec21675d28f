"""Sweep configuration: defaults, a TOML file, ``--set key=value`` overrides, one-line errors.

Every setting has a default (``quadjax sweep --print-config`` prints them all as TOML).
A user file or override is merged over the defaults table by table, except that

* ``[trajectory]`` starts from the defaults of its ``kind`` (switching kind drops the
  other kind's keys);
* a ``[randomise.<field>]`` table with a ``dist`` replaces that field's default entry
  (one without ``dist`` edits it); ``dist = "none"`` removes it.

Every error is a one-line ``ValueError`` that names the key and says what it accepts.

``chunk_size`` is the number of vehicles per results file (the unit of progress and of
resume), rounded up to whole blocks; ``block_size`` the number of vehicles one device
flies per compiled call (what bounds memory: a few kB per vehicle plus the kept
trajectories).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import tomllib

from quadjax.presets import PRESETS
from quadjax.sweep.randomise import DISTRIBUTIONS, MODES, RANDOMISABLE, Perturbation, RandomSpec
from quadjax.sweep.stats import ErrorHistogram
from quadjax.sweep.sensing import sensor_suite

TRAJECTORIES = {
    "figure8": {"center": [0.0, 0.0, 2.0], "a": 2.0, "b": 1.0, "period": 10.0, "yaw": 0.0},
    "circle": {"center": [0.0, 0.0, 2.0], "radius": 1.5, "period": 8.0, "yaw": 0.0},
    "hover": {"position": [0.0, 0.0, 2.0], "yaw": 0.0},
    "c4d_figure8": {"a": 2.0, "b": 1.0, "period": 10.0, "altitude": 2.0, "t_takeoff": 3.0, "t_land": 3.0},
    "minimum_snap": {"waypoints": [[0.0, 0.0, 2.0], [2.0, 1.0, 2.5], [0.0, 2.0, 3.0], [-2.0, 1.0, 2.5],
                                   [0.0, 0.0, 2.0]],
                     "durations": [5.0, 5.0, 5.0, 5.0], "yaw": 0.0},
}

DEFAULTS = {
    "vehicles": 4096,
    "chunk_size": 1024,
    "block_size": 1024,
    "seed": 0,
    "dtype": "float32",
    "keep_trajectories": 16,
    "vehicle": {"preset": "rp1"},
    "mission": {"duration": 20.0, "control_dt": 0.008, "substeps": 2, "stepper": "rk4"},
    "trajectory": {"kind": "figure8", **TRAJECTORIES["figure8"]},
    "controller": {"kind": "pid", "knows_vehicle": False, "position_every": 5, "attitude_every": 1},
    "randomise": {
        "inertia_with_mass": False,
        "keep_thrust_to_weight": False,
        "mass": {"dist": "relative", "spread": 0.10},
        "inertia": {"dist": "relative", "spread": 0.10},
        "k_f": {"dist": "relative", "spread": 0.10},
        "motor_tau": {"dist": "relative", "spread": 0.10},
    },
    "initial": {"position": [0.05, 0.05, 0.05], "velocity": [0.05, 0.05, 0.05], "attitude": [0.02, 0.02, 0.02],
                "body_rates": [0.0, 0.0, 0.0]},
    "gusts": {"enabled": True, "sigma": [1.0, 1.0, 0.5], "tau": [2.0, 2.0, 1.0], "update_every": 5},
    "sensor_noise": {"enabled": False, "position": [0.01, 0.01, 0.01], "velocity": [0.02, 0.02, 0.02],
                     "attitude": [0.005, 0.005, 0.005], "body_rates": [0.01, 0.01, 0.01]},
    # sensors → error-state EKF → controller (quadjax.sensors, quadjax.estimation); typical
    # MEMS (BMI088-class) IMU figures; rates in Hz (0: every control tick; each a whole number of
    # ticks), latency in s
    "estimator": {"enabled": False, "imu_rate": 0.0, "accel_noise": 1.7e-3, "gyro_noise": 2.4e-4,
                  "accel_bias_instability": 4e-4, "gyro_bias_instability": 1e-5, "bias_correlation_time": 100.0,
                  "fix": "mocap", "fix_rate": 0.0, "fix_latency": 0.0, "fix_position_noise": 0.005,
                  "fix_velocity_noise": 0.05, "fix_dropout": 0.0, "baro_rate": 25.0, "baro_noise": 0.1,
                  "mag_rate": 25.0, "mag_noise": 5e-7, "initial_sigma": [0.02, 0.05, 0.02, 0.05, 0.005]},
    "crash": {"max_error": 5.0, "max_tilt_deg": 90.0, "ground": True, "ground_clearance": 0.3},
    "stats": {"error_min": 1e-5, "bins_per_decade": 128, "decades": 8},
}

_RANDOM_KEYS = {
    "relative": ("spread",), "uniform": ("low", "high"), "normal": ("mean", "std"), "lognormal": ("mu", "sigma"),
}
_RANDOM_OPTIONS = ("inertia_with_mass", "keep_thrust_to_weight")


def _fail(path: str, value, what: str):
    raise ValueError(f"config: {path} = {_show(value)}: {what}")


def _show(value) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict, bool, int, float)) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(path, v, *, lo=None, hi=None, lo_open=False, integer=False, unit=""):
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type:
        _fail(path, v, f"expected {'an integer' if integer else 'a number'}{' ' + unit if unit else ''}")
    if not math.isfinite(v):
        _fail(path, v, "must be finite")
    if lo is not None and (v <= lo if lo_open else v < lo):
        _fail(path, v, f"must be {'>' if lo_open else '>='} {lo}{' ' + unit if unit else ''}")
    if hi is not None and v > hi:
        _fail(path, v, f"must be <= {hi}{' ' + unit if unit else ''}")
    return int(v) if integer else float(v)


def _vector(path, v, n=3, *, lo=None, lo_open=False, unit=""):
    """A number (broadcast) or a list of n numbers."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * n
    if not isinstance(v, list) or len(v) != n:
        _fail(path, v, f"expected {n} numbers{' ' + unit if unit else ''} (or one number for all)")
    return [_number(f"{path}[{i}]", x, lo=lo, lo_open=lo_open, unit=unit) for i, x in enumerate(v)]


def _choice(path, v, choices):
    if v not in choices:
        _fail(path, v, f"choose one of {', '.join(map(str, choices))}")
    return v


def _bool(path, v):
    if not isinstance(v, bool):
        _fail(path, v, "expected true or false")
    return v


def _table(path, v):
    if not isinstance(v, dict):
        _fail(path, v, "expected a table")
    return v


def _unknown(path, table, known):
    for key in table:
        if key not in known:
            where = f"{path}.{key}" if path else key
            raise ValueError(f"config: unknown key {where!r}; known here: {', '.join(sorted(known))}")


def merge(base: dict, user: dict) -> dict:
    """The user's settings over ``base`` (see the module docstring for the two special tables)."""
    _table("(top level)", user)
    out = copy.deepcopy(base)
    for key, value in user.items():
        if key == "trajectory" and isinstance(value, dict) and isinstance(out.get("trajectory"), dict):
            kind = value.get("kind", out["trajectory"].get("kind"))
            same = kind == out["trajectory"].get("kind")
            start = out["trajectory"] if same else {"kind": kind, **TRAJECTORIES.get(kind, {})}
            out["trajectory"] = {**start, **value}
        elif key == "randomise" and isinstance(value, dict):
            rnd = out.setdefault("randomise", {})
            for field, entry in value.items():
                if isinstance(entry, dict) and "dist" not in entry and isinstance(rnd.get(field), dict):
                    rnd[field] = {**rnd[field], **entry}
                else:
                    rnd[field] = copy.deepcopy(entry)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _perturbation(field, entry) -> Perturbation | None:
    path = f"randomise.{field}"
    _table(path, entry)
    dist = entry.get("dist")
    if dist == "none":
        return None
    _choice(f"{path}.dist", dist, tuple(_RANDOM_KEYS) + ("none",))
    keys = _RANDOM_KEYS[dist]
    _unknown(path, entry, ("dist", "per_element") + keys + (() if dist == "relative" else ("mode",)))
    for k in keys:
        if k not in entry:
            raise ValueError(f"config: {path} ({dist}) needs {' and '.join(keys)}")
    per_element = _bool(f"{path}.per_element", entry.get("per_element", False))
    a, b = (_number(f"{path}.{k}", entry[k]) for k in keys) if dist != "relative" else (entry["spread"], None)
    if dist == "relative":
        return Perturbation.relative(field, _number(f"{path}.spread", a, lo=0.0, hi=0.999), per_element)
    mode = _choice(f"{path}.mode", entry.get("mode", "scale" if dist == "lognormal" else "absolute"), MODES)
    assert dist in DISTRIBUTIONS
    try:
        return Perturbation(field, dist, a, b, mode, per_element)
    except ValueError as err:
        raise ValueError(f"config: {err}") from None


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """A checked sweep configuration. Build it with :func:`load` or :func:`from_dict`;
    ``resolved`` is the complete settings table (TOML-able) it was built from."""

    vehicles: int
    chunk_size: int
    block_size: int
    seed: int
    dtype: str
    keep_trajectories: int
    preset: str
    duration: float
    control_dt: float
    substeps: int
    stepper: str
    trajectory: dict
    controller: str
    knows_vehicle: bool
    position_every: int
    attitude_every: int
    random: RandomSpec
    initial: dict
    gusts: dict | None
    sensor_noise: dict | None
    estimator: dict | None
    crash: dict
    histogram: ErrorHistogram
    resolved: dict = dataclasses.field(compare=False, repr=False)

    @property
    def num_ticks(self) -> int:
        return int(round(self.duration / self.control_dt))

    def replace(self, **settings) -> "SweepConfig":
        """A new config with ``settings`` (dotted keys, e.g. ``{"mission.duration": 5.0}``) applied."""
        return from_dict(merge(self.resolved, overrides_to_dict(settings)))

    def hash(self) -> str:
        """What identifies the sweep's settings: every checked setting except ``chunk_size``
        (results do not depend on it; they do, to the last bit, on ``block_size``). It hashes
        the checked values, not the user's text: ``duration = 10`` and ``10.0`` (the checks cast
        both to float), ``sigma = 1`` and ``[1, 1, 1]``, or the numbers of a table that is
        switched off are the same sweep. The rest of a sweep's identity (versions, backend,
        dtype) is combined with it by :func:`quadjax.sweep.store.identity_hash`."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("resolved", "chunk_size")}
        body = json.loads(json.dumps(body, default=_plain))  # dataclasses (RandomSpec, …) as tables
        text = json.dumps(body, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(x):
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    raise TypeError(f"config: cannot hash a {type(x).__name__}")


def from_dict(user: dict) -> SweepConfig:
    """Merge ``user`` over :data:`DEFAULTS` and check every value."""
    d = merge(DEFAULTS, user)
    _unknown("", d, DEFAULTS)
    vehicles = _number("vehicles", d["vehicles"], lo=1, integer=True)
    chunk = _number("chunk_size", d["chunk_size"], lo=1, integer=True)
    block = _number("block_size", d["block_size"], lo=1, integer=True)
    seed = _number("seed", d["seed"], lo=0, hi=2**32 - 1, integer=True)
    dtype = _choice("dtype", d["dtype"], ("float32", "float64"))
    keep = _number("keep_trajectories", d["keep_trajectories"], lo=0, hi=4096, integer=True)

    _unknown("vehicle", _table("vehicle", d["vehicle"]), DEFAULTS["vehicle"])
    preset = _choice("vehicle.preset", d["vehicle"]["preset"], tuple(PRESETS))

    m = _table("mission", d["mission"])
    _unknown("mission", m, DEFAULTS["mission"])
    duration = _number("mission.duration", m["duration"], lo=0.0, lo_open=True, unit="s")
    control_dt = _number("mission.control_dt", m["control_dt"], lo=0.0, lo_open=True, hi=1.0, unit="s")
    substeps = _number("mission.substeps", m["substeps"], lo=1, hi=100, integer=True)
    stepper = _choice("mission.stepper", m["stepper"], ("rk4", "euler", "semi_implicit_euler"))
    ticks = duration / control_dt
    if abs(ticks - round(ticks)) > 1e-6 * ticks:
        _fail("mission.duration", duration, f"must be a whole number of control ticks (control_dt = {control_dt} s)")
    if round(ticks) * min(block, vehicles) >= 2**31:
        _fail("block_size", block, "block_size × ticks must stay below 2³¹ (the histogram counts are int32)")

    trajectory = _trajectory(_table("trajectory", d["trajectory"]), duration)

    c = _table("controller", d["controller"])
    _unknown("controller", c, DEFAULTS["controller"])
    controller = _choice("controller.kind", c["kind"], ("pid", "geometric"))
    knows = _bool("controller.knows_vehicle", c["knows_vehicle"])
    pos_every = _number("controller.position_every", c["position_every"], lo=1, integer=True)
    att_every = _number("controller.attitude_every", c["attitude_every"], lo=1, integer=True)

    r = _table("randomise", d["randomise"])
    perts = []
    for field, entry in r.items():
        if field in _RANDOM_OPTIONS:
            _bool(f"randomise.{field}", entry)
            continue
        if field not in RANDOMISABLE:
            raise ValueError(f"config: unknown key 'randomise.{field}'; a QuadParams field "
                             f"({', '.join(RANDOMISABLE)}) or {', '.join(_RANDOM_OPTIONS)}")
        p = _perturbation(field, entry)
        if p is not None:
            perts.append(p)
    order = {name: i for i, name in enumerate(RANDOMISABLE)}
    random = RandomSpec(tuple(sorted(perts, key=lambda p: order[p.field])),
                        r.get("inertia_with_mass", False), r.get("keep_thrust_to_weight", False))

    i = _table("initial", d["initial"])
    _unknown("initial", i, DEFAULTS["initial"])
    units = {"position": "m", "velocity": "m/s", "attitude": "rad", "body_rates": "rad/s"}
    initial = {k: _vector(f"initial.{k}", i[k], lo=0.0, unit=u) for k, u in units.items()}

    g = _table("gusts", d["gusts"])
    _unknown("gusts", g, DEFAULTS["gusts"])
    gusts = None
    if _bool("gusts.enabled", g["enabled"]):
        gusts = {"sigma": _vector("gusts.sigma", g["sigma"], lo=0.0, unit="m/s"),
                 "tau": _vector("gusts.tau", g["tau"], lo=0.0, lo_open=True, unit="s"),
                 "update_every": _number("gusts.update_every", g["update_every"], lo=1, integer=True, unit="ticks")}

    s = _table("sensor_noise", d["sensor_noise"])
    _unknown("sensor_noise", s, DEFAULTS["sensor_noise"])
    noise = None
    if _bool("sensor_noise.enabled", s["enabled"]):
        noise = {k: _vector(f"sensor_noise.{k}", s[k], lo=0.0, unit=u) for k, u in units.items()}

    estimator = _estimator(_table("estimator", d["estimator"]), control_dt)
    if estimator is not None and noise is not None:
        _fail("sensor_noise.enabled", True, "the controller reads either noisy truth or the estimator: "
              "turn one of sensor_noise and estimator off")

    k = _table("crash", d["crash"])
    _unknown("crash", k, DEFAULTS["crash"])
    crash = {
        "max_error": _number("crash.max_error", k["max_error"], lo=0.0, lo_open=True, unit="m"),
        "max_tilt_deg": _number("crash.max_tilt_deg", k["max_tilt_deg"], lo=0.0, lo_open=True, hi=180.0, unit="deg"),
        "ground": _bool("crash.ground", k["ground"]),
        "ground_clearance": _number("crash.ground_clearance", k["ground_clearance"], lo=0.0, unit="m"),
    }

    h = _table("stats", d["stats"])
    _unknown("stats", h, DEFAULTS["stats"])
    histogram = ErrorHistogram(
        _number("stats.error_min", h["error_min"], lo=0.0, lo_open=True, unit="m"),
        _number("stats.bins_per_decade", h["bins_per_decade"], lo=1, hi=4096, integer=True),
        _number("stats.decades", h["decades"], lo=1, hi=30, integer=True),
    )
    if histogram.maximum <= crash["max_error"]:
        _fail("stats.decades", histogram.decades, f"the histogram must reach beyond crash.max_error "
              f"({crash['max_error']} m): error_min·10^decades = {histogram.maximum:g} m")
    return SweepConfig(
        vehicles=vehicles, chunk_size=chunk, block_size=block, seed=seed, dtype=dtype, keep_trajectories=keep,
        preset=preset,
        duration=duration, control_dt=control_dt, substeps=substeps, stepper=stepper, trajectory=trajectory,
        controller=controller, knows_vehicle=knows, position_every=pos_every, attitude_every=att_every,
        random=random, initial=initial, gusts=gusts, sensor_noise=noise, estimator=estimator, crash=crash,
        histogram=histogram,
        resolved=d,
    )


def _estimator(e: dict, control_dt: float) -> dict | None:
    """The ``[estimator]`` table checked; its rates and latency against the control tick."""
    _unknown("estimator", e, DEFAULTS["estimator"])
    if not _bool("estimator.enabled", e["enabled"]):
        return None
    out = {"fix": _choice("estimator.fix", e["fix"], ("mocap", "gps"))}
    units = {"imu_rate": "Hz", "accel_noise": "m/s²/√Hz", "gyro_noise": "rad/s/√Hz", "accel_bias_instability": "m/s²",
             "gyro_bias_instability": "rad/s", "fix_rate": "Hz", "fix_latency": "s", "fix_position_noise": "m",
             "fix_velocity_noise": "m/s", "baro_rate": "Hz", "baro_noise": "m", "mag_rate": "Hz", "mag_noise": "T"}
    fused = ("accel_noise", "gyro_noise", "fix_position_noise", "fix_velocity_noise", "baro_noise", "mag_noise")
    for key, unit in units.items():  # the filter fuses what has a noise: it must be > 0 (P stays regular)
        out[key] = _number(f"estimator.{key}", e[key], lo=0.0, lo_open=key in fused, unit=unit)
    out["bias_correlation_time"] = _number("estimator.bias_correlation_time", e["bias_correlation_time"], lo=0.0,
                                           lo_open=True, unit="s")
    out["fix_dropout"] = _number("estimator.fix_dropout", e["fix_dropout"], lo=0.0, hi=0.99)
    sigma = e["initial_sigma"]
    if not isinstance(sigma, list) or len(sigma) != 5:
        _fail("estimator.initial_sigma", sigma, "expected 5 numbers: position [m], velocity [m/s], attitude [rad], "
              "accel bias [m/s²], gyro bias [rad/s] standard deviations")
    out["initial_sigma"] = [_number(f"estimator.initial_sigma[{i}]", x, lo=0.0, lo_open=True) for i, x in enumerate(sigma)]
    try:  # the suite's own checks, on the control tick
        sensor_suite(out, control_dt, "float32")
    except ValueError as err:
        raise ValueError(f"config: estimator: {err} (mission.control_dt = {control_dt} s)") from None
    return out


def _trajectory(t: dict, duration: float) -> dict:
    kind = _choice("trajectory.kind", t.get("kind"), tuple(TRAJECTORIES))
    _unknown("trajectory", t, ("kind",) + tuple(TRAJECTORIES[kind]))
    out = {"kind": kind}
    for key in TRAJECTORIES[kind]:
        path, v = f"trajectory.{key}", t[key]
        if key in ("center", "position"):
            out[key] = _vector(path, v, unit="m")
        elif key == "waypoints":
            if not isinstance(v, list) or len(v) < 2:
                _fail(path, v, "expected a list of at least 2 points [x, y, z] in metres")
            out[key] = [_vector(f"{path}[{i}]", p, unit="m") for i, p in enumerate(v)]
        elif key == "durations":
            if not isinstance(v, list) or len(v) != len(t["waypoints"]) - 1:
                _fail(path, v, "expected one positive duration [s] per segment (len(waypoints) − 1)")
            out[key] = [_number(f"{path}[{i}]", x, lo=0.0, lo_open=True, unit="s") for i, x in enumerate(v)]
        elif key in ("period", "t_takeoff", "t_land"):
            out[key] = _number(path, v, lo=0.0, lo_open=True, unit="s")
        elif key in ("yaw",):
            out[key] = _number(path, v, unit="rad")
        else:
            out[key] = _number(path, v, unit="m")
    if kind == "c4d_figure8" and out["t_takeoff"] + out["t_land"] > duration:
        _fail("trajectory.t_takeoff", out["t_takeoff"],
              f"take-off plus landing must fit in mission.duration = {duration} s")
    return out


def load(path) -> SweepConfig:
    """A config from a TOML file (merged over the defaults); a one-line ValueError
    ``<path>: <reason>`` when the file cannot be read as TOML."""
    try:
        with open(path, "rb") as f:
            user = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: a folder, not a TOML config file") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read the config file ({err.strerror or err})") from None
    except UnicodeDecodeError as err:  # tomllib decodes the whole file first: a binary file lands here
        raise ValueError(f"{path}: not a TOML config file (not UTF-8 text: byte {err.object[err.start]:#04x} "
                         f"at offset {err.start})") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML ({err})") from None
    try:
        return from_dict(user)
    except ValueError as err:  # a bad key or value: say which file it is in
        raise ValueError(f"{path}: {err}") from None


def parse_value(text: str):
    """A ``--set`` value: any TOML value (3, 0.1, true, [1, 2, 3], "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def overrides_to_dict(settings: dict) -> dict:
    """{"mission.duration": 5.0, …} → nested tables."""
    out: dict = {}
    for dotted, value in settings.items():
        parts = dotted.split(".")
        if not all(parts):
            raise ValueError(f"config: bad key {dotted!r}; use dotted names such as mission.duration")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"config: {dotted!r} sets inside a value, not a table")
        node[parts[-1]] = value
    return out


def to_toml(d: dict) -> str:
    """A settings table as TOML (scalars and arrays first, then sub-tables)."""
    lines: list[str] = []

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {type(v).__name__} as TOML")

    def emit(table, prefix):
        for k, v in table.items():
            if not isinstance(v, dict):
                lines.append(f"{k} = {value(v)}")
        for k, v in table.items():
            if isinstance(v, dict):
                name = f"{prefix}.{k}" if prefix else k
                lines.append("")
                lines.append(f"[{name}]")
                emit(v, name)

    emit(d, "")
    return "\n".join(lines).lstrip("\n") + "\n"
