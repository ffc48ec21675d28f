"""``quadjax verify``: run the verification scenarios, print their verdicts, write the report."""

from __future__ import annotations

import argparse
import datetime
import sys


def verify_main(argv: list[str]) -> int:
    """Exit code 0 when every check passed (skips allowed), 1 when one failed, 2 on bad usage."""
    from quadjax.verify.scenarios import SCENARIOS

    ap = argparse.ArgumentParser(
        prog="quadjax verify",
        description="Run the verification scenarios (a fast subset by default) and print a verdict per check: "
                    "each threshold names its source (a seed, a paper, an analytic result, a documented spec).",
        epilog="scenarios: " + ", ".join(f"{s.name}{'' if s.fast else ' (--all)'}" for s in SCENARIOS))
    ap.add_argument("names", nargs="*", help="scenarios to run (default: the fast subset)")
    ap.add_argument("--all", action="store_true", help="every scenario, the slow ones too")
    ap.add_argument("--out", default="results/verify", help="report folder (verify.json, VERIFY.md, plots/)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--backend", default="xla", choices=("xla", "auto", "native"),
                    help="xla: the JAX model (default); auto/native: the generated kernel where it applies")
    ap.add_argument("--list", action="store_true", help="list the scenarios and their checks, run nothing")
    args = ap.parse_args(argv)

    from quadjax import __version__
    from quadjax.verify import harness
    from quadjax.verify.scenarios import select

    try:
        chosen = select(args.names, args.all)
    except ValueError as err:
        print(f"quadjax verify: {err}", file=sys.stderr)
        return 2
    if args.list:
        for s in chosen:
            print(f"{s.name}{'' if s.fast else ' (slow)'}: {s.title}")
            for c in s.checks:
                print(f"    {c.label or c.metric} {c.op} {c.threshold:g} {c.unit}  [{c.source}]")
        return 0

    def progress(result):
        for v in result.verdicts:
            print(v.line(), flush=True)

    results = harness.run(chosen, args.backend, progress)
    command = "quadjax verify " + " ".join(argv)
    meta = {"version": __version__, "backend": args.backend, "command": command.strip(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    written = harness.write_report(args.out, results, meta, plots=not args.no_plots)
    print(f"\n{harness.summary_line(results)}")
    print(f"report: {written['markdown']}, {written['json']}" + (f", {len(written['plots'])} plots" if written["plots"] else ""))
    return 0 if all(r.status != "fail" for r in results) else 1
