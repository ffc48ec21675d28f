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
}


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
