"""A scripted RC sequence: timed stick and switch inputs, held until the next step (TOML).

```toml
duration = 8.0          # s: how long the flight lasts

[[step]]                # from t = 0: disarmed, throttle down, angle mode
t = 0.0
[[step]]
t = 0.5
arm = true
[[step]]
t = 1.0
throttle = 0.45         # [0, 1]: 1000–2000 µs
[[step]]
t = 4.0
roll = 0.3              # [-1, 1]: right, forward (pitch), right (yaw) are positive
angle = false           # rate (acro) mode; true (the default): angle mode
```

Each step sets what it names and keeps the rest from the step before; the first step starts from
disarmed, throttle 0, sticks centred, angle mode on.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

FIELDS = {"roll": float, "pitch": float, "yaw": float, "throttle": float, "arm": bool, "angle": bool}
START = {"roll": 0.0, "pitch": 0.0, "yaw": 0.0, "throttle": 0.0, "arm": False, "angle": True}
RANGES = {"roll": (-1.0, 1.0), "pitch": (-1.0, 1.0), "yaw": (-1.0, 1.0), "throttle": (0.0, 1.0)}


@dataclasses.dataclass(frozen=True)
class RcScript:
    """``steps``: (t [s], {field: value}) in time order; ``duration`` [s]."""

    steps: tuple
    duration: float

    @classmethod
    def create(cls, steps, duration: float) -> "RcScript":
        """Checked: times ascending within [0, duration), fields from :data:`FIELDS` in range."""
        if not duration > 0:
            raise ValueError(f"RcScript: duration = {duration!r}: must be > 0 s")
        out, last = [], -1.0
        for i, (t, values) in enumerate(steps):
            t = float(t)
            if not (0.0 <= t < duration) or t < last:
                raise ValueError(f"RcScript step {i}: t = {t} s: steps must be in time order within [0, {duration})")
            for name, value in values.items():
                if name not in FIELDS:
                    raise ValueError(f"RcScript step {i}: unknown input {name!r}; known: {sorted(FIELDS)}")
                if FIELDS[name] is bool and not isinstance(value, bool):
                    raise ValueError(f"RcScript step {i}: {name} = {value!r}: must be true or false")
                if name in RANGES:
                    lo, hi = RANGES[name]
                    if not (isinstance(value, (int, float)) and lo <= value <= hi):
                        raise ValueError(f"RcScript step {i}: {name} = {value!r}: must be in [{lo}, {hi}]")
            out.append((t, dict(values)))
            last = t
        return cls(tuple(out), float(duration))

    @classmethod
    def from_toml(cls, path) -> "RcScript":
        """A script from a TOML file (the module doc's format)."""
        text = Path(path).read_text()
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: not TOML: {err}") from None
        unknown = set(doc) - {"duration", "step"}
        if unknown or "duration" not in doc:
            raise ValueError(f"{path}: expected 'duration' and [[step]] tables (got {sorted(doc)})")
        steps = []
        for i, step in enumerate(doc.get("step", [])):
            if "t" not in step:
                raise ValueError(f"{path}: step {i} has no t")
            steps.append((step["t"], {k: v for k, v in step.items() if k != "t"}))
        return cls.create(steps, doc["duration"])

    def at(self, t: float) -> dict:
        """Every input at time ``t`` [s]."""
        now = dict(START)
        for start, values in self.steps:
            if start > t:
                break
            now.update(values)
        return now


def takeoff_script(throttle: float, *, hold_s: float = 5.0, arm_at: float = 0.5, up_at: float = 1.0,
                   land_s: float = 1.0) -> RcScript:
    """Arm on the ground, raise the throttle to ``throttle`` (angle mode, sticks centred), hold
    ``hold_s`` s, throttle down, disarm; the flight's duration covers a second after the disarm."""
    down = up_at + hold_s
    return RcScript.create([(0.0, {}), (arm_at, {"arm": True}), (up_at, {"throttle": throttle}),
                            (down, {"throttle": 0.0}), (down + land_s, {"arm": False})], down + land_s + 1.0)
