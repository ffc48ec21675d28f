"""The ``quadjax`` command line: subcommands dispatch to their modules lazily."""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand → ("module:function", one-line help); each function takes argv (list[str]) → exit code
SUBCOMMANDS = {
    "presets": ("quadjax.cli:presets_main", "list the vehicle presets with their sources"),
    "sweep": ("quadjax.sweep.cli:sweep_main", "Monte Carlo sweep of randomised vehicles on a mission"),
    "fit": ("quadjax.sysid.cli:fit_main", "fit QuadParams leaves to flight logs (system identification)"),
    "verify": ("quadjax.verify.cli:verify_main", "run the verification scenarios and print their verdicts"),
    "sitl": ("quadjax.sitl.cli:sitl_main", "fly a vehicle with the Betaflight SITL in the loop (lockstep), write its log"),
    "view": ("quadjax.player.cli:view_main", "write the trace player's HTML page for a sweep, repro file or log"),
    "bench": ("quadjax.cli:bench_main", "throughput benchmark (benchmarks/throughput.py of a source checkout)"),
    "cache": ("quadjax.cli:cache_main", "show the native kernel cache, or prune what was not used for a while"),
}


def cache_main(argv: list[str]) -> int:
    """``quadjax cache``: the native kernel cache's folder, entries and size. ``--prune`` removes the
    libraries and generated sources not used for ``--unused-days`` and then, with ``--max-mb``, the
    least recently used until the rest fit (quadjax.native.prune_cache). Every upgrade or edit of
    quadjax, jax or the compiler builds new ones and leaves the old ones unused."""
    ap = argparse.ArgumentParser(prog="quadjax cache", description=cache_main.__doc__)
    ap.add_argument("--list", action="store_true", help="one line per entry, least recently used first")
    ap.add_argument("--prune", action="store_true", help="remove entries not used for --unused-days (and beyond --max-mb)")
    ap.add_argument("--unused-days", type=float, metavar="D", help="with --prune: unused for D days (default 30)")
    ap.add_argument("--max-mb", type=float, metavar="MB", help="with --prune: then the least recently used until MB remain")
    ap.add_argument("--dry-run", action="store_true", help="with --prune: say what would go, remove nothing")
    args = ap.parse_args(argv)
    if not args.prune and (args.max_mb is not None or args.dry_run or args.unused_days is not None):
        ap.error("--unused-days, --max-mb and --dry-run go with --prune")
    days = 30.0 if args.unused_days is None else args.unused_days
    if days < 0 or (args.max_mb is not None and args.max_mb < 0):
        ap.error("--unused-days and --max-mb must be >= 0")
    from quadjax import native

    folder = native.cache_dir()
    print(f"quadjax kernel cache: {folder}{'' if folder.is_dir() else ' (absent: nothing built yet)'}")
    gone = []
    if args.prune and folder.is_dir():
        try:
            gone = native.prune_cache(unused_days=days, dry_run=args.dry_run,
                                      max_bytes=None if args.max_mb is None else int(args.max_mb * 1e6))
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        for e in gone if args.dry_run else ():
            print(f"  would remove {_entry_line(e)}")
        print(f"  {'would remove' if args.dry_run else 'removed'} {_tally(gone)}")
    entries = native.cache_entries(folder) if folder.is_dir() else []
    if args.dry_run:  # what would remain
        entries = [e for e in entries if e.path not in {g.path for g in gone}]
    for e in entries if args.list else ():
        print(f"  {_entry_line(e)}")
    print(f"  {('would keep ' if args.dry_run else 'kept ') if args.prune else ''}{_tally(entries)}")
    if entries:
        print(f"  last used: {_when(entries[0].last_used)} (least recently) to {_when(entries[-1].last_used)}")
    return 0


def _tally(entries) -> str:
    """'2 libraries (0.8 MB), 3 generated sources (1.2 MB): 2.0 MB'."""
    parts = []
    for kind, one, many in (("library", "library", "libraries"), ("source", "generated source", "generated sources")):
        some = [e.bytes for e in entries if e.kind == kind]
        parts.append(f"{len(some)} {one if len(some) == 1 else many} ({sum(some) / 1e6:.1f} MB)")
    return f"{', '.join(parts)}: {sum(e.bytes for e in entries) / 1e6:.1f} MB"


def _when(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def _entry_line(e) -> str:
    return f"{e.kind:7s} {e.bytes / 1e6:7.2f} MB  last used {_when(e.last_used)}  {e.path.name}"


def bench_main(argv: list[str]) -> int:
    """``quadjax bench``: run benchmarks/throughput.py's ``bench_main`` from the source checkout."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput.py"
    if not script.is_file():
        print(f"quadjax bench: {script} not found; it ships with the source checkout (pip install -e .)")
        return 2
    spec = importlib.util.spec_from_file_location("quadjax_bench_throughput", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return int(module.bench_main(argv) or 0)


def presets_main(argv: list[str]) -> int:
    """``quadjax presets``: one line per preset with its source and hover figures."""
    argparse.ArgumentParser(prog="quadjax presets", description=presets_main.__doc__).parse_args(argv)
    from quadjax import hover_rotor_speed
    from quadjax.presets import PRESETS

    print(f"{'preset':24s} {'mass kg':>8s} {'hover rad/s':>12s} {'omega_max':>10s}  source")
    for name, (make, source) in PRESETS.items():
        p = make()
        w = float(hover_rotor_speed(p).mean())
        print(f"{name:24s} {float(p.mass):8.3f} {w:12.1f} {float(p.omega_max):10.1f}  {source}")
    return 0


def version() -> str:
    """The installed package's version (``quadjax.__version__``), read without importing JAX."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("quadjax")
    except PackageNotFoundError:  # a source tree that was not installed
        return "0.0.0+unknown"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``quadjax`` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-V", "--version"):
        print(f"quadjax {version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        lines = "\n".join(f"  {name:10s} {help_}" for name, (_, help_) in SUBCOMMANDS.items())
        print(f"usage: quadjax COMMAND [options]\n       quadjax --version\n\ncommands:\n{lines}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    target, _ = SUBCOMMANDS[argv[0]]
    module, func = target.split(":")
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
