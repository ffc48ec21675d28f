"""Firmware in the loop: the Betaflight 4.6 SITL flying one quadjax vehicle, in lockstep.

``quadjax.sitl.run(params, script)`` builds the SITL on first use (:mod:`quadjax.sitl.firmware`:
the GPL-3.0 firmware is downloaded from PyPI and compiled here, never vendored), boots it with
its cached configuration, and flies the :class:`RcScript` (timed sticks and switches) with the
physics stepping once per FC PID loop (:mod:`quadjax.sitl.bridge`). ``quadjax sitl`` is the
command. The result, a :class:`Flight`, becomes a :class:`quadjax.logs.FlightLog` for the trace
player and ``quadjax fit``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from quadjax.sitl.bridge import DT, THROTTLE_A, Flight, Link, fly, hover_throttle, motors_to_rotor_speeds
from quadjax.sitl.firmware import (BINARY, SitlError, SitlProcess, SitlUnavailable, build, eeprom_name, machine_lock,
                                   toolchain)
from quadjax.sitl.script import RcScript, takeoff_script

__all__ = ["DT", "THROTTLE_A", "Flight", "RcScript", "SitlError", "SitlUnavailable", "build", "fly",
           "hover_throttle", "motors_to_rotor_speeds", "run", "takeoff_script", "toolchain"]


def run(params, script: RcScript, *, state0=None, a: float = THROTTLE_A, workdir=None, log=print,
        progress=None) -> Flight:
    """Fly ``script`` with the vehicle ``params`` (any 4-rotor preset) against a fresh SITL process
    (built and configured on first use), which is stopped by its pid whatever happens. The
    SITL's output is kept in ``workdir/sitl.log`` when a ``workdir`` is given."""
    folder = build(log)
    with machine_lock(), tempfile.TemporaryDirectory(prefix="quadjax-sitl-") as tmp:
        where = Path(workdir) if workdir is not None else Path(tmp)
        with SitlProcess(folder / BINARY, where, eeprom=folder / eeprom_name()) as fc, Link() as link:
            try:
                return fly(params, script, fc, link, state0=state0, a=a, progress=progress)
            except SitlError as err:
                raise SitlError(f"{err}\nthe SITL's log (last lines):\n{fc.log_tail()}") from None
