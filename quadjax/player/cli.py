"""``quadjax view RUN``: write the trace player's page for a run (and print where)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quadjax view",
        description="Write one self-contained HTML page (no server, no network) that replays RUN: a sweep's "
                    "results folder (its kept vehicles), a monitor repro file (.npz), or a flight log "
                    "(.parquet, .csv); with --fit, the fitted model's predictions against the log.",
        epilog="Keys, with the player focused: Space play/pause, Left/Right one sample (Shift: ten), Home/End, "
               "[ ] speed. Example: quadjax view results/sweep --out sweep.html")
    p.add_argument("run", metavar="RUN", help="sweep folder, repro .npz, or flight log .parquet/.csv")
    p.add_argument("--out", metavar="FILE", help="the page to write (default: RUN's name + .html here; "
                                                 "a sweep: RUN/plots/player.html)")
    p.add_argument("--fit", metavar="FIT", help="a fit file of 'quadjax fit': replay its predictions on the log")
    p.add_argument("--preset", metavar="NAME", help="a log's vehicle, for its rotor layout and thrust arrows")
    p.add_argument("--horizon", type=int, default=50, help="samples per prediction with --fit (default 50)")
    p.add_argument("--max-rate", type=float, default=100.0, metavar="HZ", help="decimate to at most this rate")
    p.add_argument("--max-mb", type=float, default=12.0, metavar="MB", help="bound on the page's trace data")
    p.add_argument("--title", help="the page's title")
    return p


def view_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from quadjax import presets
    from quadjax.player import view

    run = Path(args.run)
    if not run.exists():
        print(f"quadjax view: {run}: no such file or folder")
        return 2
    if args.out:
        out = Path(args.out)
    elif run.is_dir():
        out = run / "plots" / "player.html"
        out.parent.mkdir(exist_ok=True)
    else:
        out = Path(run.stem + ".html")
    options = {"title": args.title} if args.title else {}
    if args.fit:
        options["horizon"] = args.horizon
    try:
        params = presets.get(args.preset) if args.preset else None
        page = view(run, params, fit=args.fit, path=out, max_rate=args.max_rate, max_bytes=args.max_mb * 1e6,
                    **options)
    except (ValueError, KeyError) as err:
        print(f"quadjax view: {err}")
        return 2
    print(f"wrote {page.path} ({page.path.stat().st_size / 1e6:.2f} MB); open it in a browser")
    return 0
