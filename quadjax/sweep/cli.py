"""``quadjax sweep``: a Monte Carlo sweep from one command.

With no options: 4 096 vehicles of the RP-1 preset fly a figure-8 under the cascaded PID,
with mass, inertia, k_f and motor τ each ±10 %, small initial errors and
Ornstein–Uhlenbeck gusts; prints a table and writes ``results/sweep``. Every setting can
come from a TOML file (``--config``), a named option, or ``--set key=value``
(``--print-config`` shows them all). Rerunning the same sweep resumes it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time

_EPILOG = """examples:
  quadjax sweep                                   # the defaults
  quadjax sweep --vehicles 100000 --chunk-size 16384 --duration 10
  quadjax sweep --preset iris --set randomise.mass.spread=0.2 --set gusts.sigma=[2,2,1]
  quadjax sweep --print-config > my.toml          # edit, then: quadjax sweep --config my.toml
  quadjax sweep --out /shared/a --coordinator host0:12345 --num-processes 2 --process-id 0   # on host0
  quadjax sweep --out /shared/a --coordinator host0:12345 --num-processes 2 --process-id 1   # on host1

XLA's compiled programs are kept across runs in $QUADJAX_CACHE_DIR/xla (default ~/.cache/quadjax/xla;
JAX_COMPILATION_CACHE_DIR chooses another folder).
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quadjax sweep", description="Monte Carlo sweep: randomised vehicles fly a "
                                "mission in closed loop; prints a summary table and writes a results folder.",
                                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="TOML file with settings (merged over the defaults)")
    p.add_argument("--preset", help="vehicle preset (quadjax presets lists them)")
    p.add_argument("--vehicles", type=int, metavar="N", help="number of vehicles (default 4096)")
    p.add_argument("--chunk-size", type=int, metavar="N", help="vehicles per results file: progress and resume unit")
    p.add_argument("--block-size", type=int, metavar="N", help="vehicles per device per compiled call (bounds memory)")
    p.add_argument("--duration", type=float, metavar="S", help="mission length [s] (default 20)")
    p.add_argument("--control-dt", type=float, metavar="S", help="controller tick [s] (default 0.008)")
    p.add_argument("--substeps", type=int, metavar="K", help="physics steps per controller tick (default 2)")
    p.add_argument("--trajectory", help="figure8, circle, hover, c4d_figure8 or minimum_snap")
    p.add_argument("--controller", help="pid or geometric")
    p.add_argument("--seed", type=int, help="PRNG seed (default 0)")
    p.add_argument("--dtype", help="float32 (default) or float64 (needs JAX_ENABLE_X64=1)")
    p.add_argument("--no-gusts", action="store_true", help="turn the gusts off")
    p.add_argument("--keep", type=int, metavar="K", help="full trajectories kept for plots (default 16)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any setting by its dotted name, e.g. mission.duration=5 (repeatable)")
    p.add_argument("--out", default="results/sweep", metavar="DIR", help="results folder (default results/sweep)")
    p.add_argument("--overwrite", action="store_true", help="replace a different sweep already in --out "
                   "(only the sweep's own files are deleted)")
    p.add_argument("--force", action="store_true", help="run even past the size budget (vehicle-ticks, memory, disk)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings as TOML and exit")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--cpu-devices", type=int, metavar="N", help="CPU devices to fly on, each from its own thread "
                   "(default: 1 where the flight runs whole in the native loop, which threads itself; else one "
                   "per usable core from 4e7 vehicle-ticks, where its extra compilation pays, else 1; ignored "
                   "when XLA_FLAGS sets --xla_force_host_platform_device_count)")
    d = p.add_argument_group("several processes (jax.distributed; README: \"Sweeps over several processes\")")
    d.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address; default $JAX_COORDINATOR_ADDRESS")
    d.add_argument("--num-processes", type=int, metavar="N", help="processes in the job; default $JAX_NUM_PROCESSES")
    d.add_argument("--process-id", type=int, metavar="I", help="this process, 0…N−1; default $JAX_PROCESS_ID")
    d.add_argument("--distributed", action="store_true", help="join a job whose settings JAX detects "
                   "(SLURM, Open MPI, Kubernetes), for what the three above leave unset")
    d.add_argument("--heartbeat-timeout", type=int, metavar="S", help="stop the job when a process is silent "
                   "this long (JAX's default 100 s)")
    d.add_argument("--join-timeout", type=int, default=300, metavar="S", help="give up when the job is not "
                   "complete this long after start (default 300 s)")
    return p


_OPTIONS = {
    "preset": "vehicle.preset", "vehicles": "vehicles", "chunk_size": "chunk_size", "block_size": "block_size",
    "duration": "mission.duration",
    "control_dt": "mission.control_dt", "substeps": "mission.substeps", "trajectory": "trajectory.kind",
    "controller": "controller.kind", "seed": "seed", "dtype": "dtype", "keep": "keep_trajectories",
}


def build_config(args):
    """The config from --config, then the named options, then --set (later wins)."""
    from quadjax.sweep import config as cfg

    base = cfg.load(args.config).resolved if args.config else {}
    settings = {dotted: getattr(args, name) for name, dotted in _OPTIONS.items() if getattr(args, name) is not None}
    if args.no_gusts:
        settings["gusts.enabled"] = False
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set mission.duration=5")
        settings[key.strip()] = cfg.parse_value(value.strip())
    return cfg.from_dict(cfg.merge(base, cfg.overrides_to_dict(settings)))


def _describe(config) -> str:
    r = config.random
    varied = []
    for p in r.perturbations:
        if p.dist == "uniform" and p.mode == "scale" and abs((p.a + p.b) / 2 - 1) < 1e-12:
            varied.append(f"{p.field} ±{100 * (p.b - 1):g} %")
        else:
            varied.append(f"{p.field} {p.dist}({p.a:g}, {p.b:g}, {p.mode})")
    hz = 1.0 / config.control_dt
    g = config.gusts
    lines = [
        f"{config.vehicles} × {config.preset} on {config.trajectory['kind']}, {config.duration:g} s; "
        f"{config.controller} at {hz:g} Hz, {config.stepper} {config.substeps} × "
        f"{1e3 * config.control_dt / config.substeps:g} ms; "
        f"{config.dtype}, seed {config.seed}",
        "randomised: " + (", ".join(varied) or "nothing")
        + ("; inertia ∝ mass" if r.inertia_with_mass else "")
        + ("; thrust/weight kept" if r.keep_thrust_to_weight else ""),
        "gusts: " + (f"Ornstein–Uhlenbeck σ {g['sigma']} m/s, τ {g['tau']} s" if g else "off")
        + ("; sensor noise on" if config.sensor_noise else "")
        + (f"; flying on an EKF ({config.estimator['fix']}, IMU, baro, mag)" if config.estimator else ""),
    ]
    return "\n".join(lines)


class _Stopped(BaseException):
    """SIGTERM, raised in the main thread like SIGINT's KeyboardInterrupt (not an Exception:
    nothing on the way may swallow it; the store's finally-blocks remove temporaries and
    release the lock on the way out)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise _Stopped(signum)


def _progress(args, state: dict):
    """The progress printer; it also keeps in ``state`` what the stop message needs."""

    who = _prefix(state)

    def progress(e):
        state.update(chunks=e["chunks"], done=e.get("chunks_done", state.get("done", 0)))
        if e["phase"] == "repair":  # shown even with --quiet: a file was removed
            print(f"  {who}{e['note']}", file=sys.stderr, flush=True)
        if args.quiet or e["phase"] == "repair":
            return
        if e["phase"] == "compiled":
            resumed = f", resuming with {e['vehicles_done']} done" if e["vehicles_done"] else ""
            share = f", {e['share']} chunk(s) of {e['chunks']} to fly here" if e["processes"] > 1 else ""
            print(f"  {who}compiled in {e['compile_s']:.1f} s on {e['devices']} device(s){resumed}{share}",
                  file=sys.stderr, flush=True)
        elif e["processes"] > 1:  # a process knows only its own share of the job's progress
            print(f"  {who}chunk {e['chunk']}/{e['chunks']} ({e['flown']}/{e['share']} of this process's share), "
                  f"{e['elapsed_s']:.1f} s", file=sys.stderr, flush=True)
        else:
            print(f"  {who}chunk {e['chunk']}/{e['chunks']}: {e['vehicles_done']}/{e['vehicles']} vehicles, "
                  f"{e['elapsed_s']:.1f} s", file=sys.stderr, flush=True)

    return progress


def _stop_message(out: str, state: dict) -> str:
    """The line printed on SIGINT/SIGTERM. The chunk files on disk are what a rerun finds: a
    signal between a chunk's rename and its progress report must not make the count lag."""
    from pathlib import Path

    done, chunks = state.get("done"), state.get("chunks")
    folder = Path(out) if out else None
    if folder is not None and (folder / "chunks").is_dir():
        done = len(list((folder / "chunks").glob("chunk_*.npz")))
        if chunks is None:
            try:
                chunks = json.loads((folder / "manifest.json").read_text())["num_chunks"]
            except (OSError, ValueError, KeyError, TypeError):
                pass
    if chunks is None:
        return "quadjax sweep: stopped before the first chunk; rerun the same command to resume"
    return f"quadjax sweep: stopped after chunk {done or 0} of {chunks}; rerun the same command to resume"


def _error(err: BaseException) -> int:
    """One line, ``quadjax sweep: error: <path>: <reason>``, and exit code 2."""
    if isinstance(err, OSError) and err.filename is not None:
        text = f"{err.filename}: {err.strerror or err}"
    else:
        text = str(err)
    print(f"quadjax sweep: error: {text}", file=sys.stderr)
    return 2


def _join(args) -> tuple[int, int]:
    """(this process, processes): join the job if one is asked for (flags, environment or
    --distributed), else (0, 1)."""
    from quadjax import distributed

    if not (args.distributed or distributed.requested(args.coordinator, args.num_processes, args.process_id)):
        return 0, 1
    # said first: JAX aborts the process (no exception) when the job is not complete in time
    print(f"quadjax sweep: joining the job (waiting up to {args.join_timeout} s for every process)",
          file=sys.stderr, flush=True)
    return distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                                  heartbeat_timeout_s=args.heartbeat_timeout, timeout_s=args.join_timeout)


def _stopped(args, state: dict, signum: int) -> int:
    """The stop message and exit code. In a job of several processes this one leaves at once
    (no shutdown handshake: the others are waiting in a collective for it and would wait for
    the handshake's timeout too); the runtime sees it gone and stops the rest."""
    print(_prefix(state) + _stop_message(args.out, state), file=sys.stderr, flush=True)
    if state["processes"][1] > 1:
        sys.stdout.flush()
        os._exit(128 + signum)
    return 128 + signum


def _prefix(state: dict) -> str:
    index, count = state.get("processes", (0, 1))
    return f"[process {index}/{count}] " if count > 1 else ""


def sweep_main(argv: list[str]) -> int:
    """Entry point of ``quadjax sweep``; returns the exit code (2 for an error, 128 + the
    signal number after SIGINT or SIGTERM: 130, 143)."""
    args = _parser().parse_args(argv)
    try:
        config = build_config(args)  # touches no JAX device: the device count can still be chosen
        devices = cpu_devices(config, args.cpu_devices)
    except ValueError as err:
        return _error(err)
    with _cpu_devices(devices):
        return _sweep(args, config)


#: the XLA flag that splits the host CPU into devices (read once, when JAX starts its CPU backend)
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
#: from this size on, a sweep flies on one CPU device per core by default. Each device compiles
#: its own copy of the program (about 7 s more on a cold start here, the copies compiling side by
#: side) and halves the flight (0.6 → 0.3 µs per vehicle-tick on 2 cores): it pays from ~2·10⁷
#: vehicle-ticks (benchmarks/DISTRIBUTED_RESULTS.md); the default sweep is 1·10⁷
MANY_DEVICES_FROM = 4e7


def cpu_devices(config, requested: int | None = None) -> int:
    """The CPU devices ``quadjax sweep`` flies ``config`` on: ``requested``; else 1 where the
    flight runs whole in the native loop (it threads itself over every core: two devices flew
    the default sweep no faster, 1.3–1.5 s against 1.1–1.4 s, and compiled twice); else one per
    usable core for a sweep of at least :data:`MANY_DEVICES_FROM` vehicle-ticks, else 1."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--cpu-devices {requested}: needs at least 1")
        return requested
    if whole_native_flight(config):
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if config.vehicles * config.num_ticks >= MANY_DEVICES_FROM else 1


def whole_native_flight(config) -> bool:
    """Whether the sweep's flight will run whole in the native loop, judged from the config
    alone (JAX's devices must not start before their count is set): RK4, a C++ compiler, the
    kernel not switched off, and no per-tick PRNG draws in the tick (sensor noise, the
    estimator)."""
    from quadjax import native

    return (config.stepper == "rk4" and config.sensor_noise is None and config.estimator is None
            and os.environ.get("QUADJAX_NATIVE", "1") != "0" and native.compiler() is not None)


@contextlib.contextmanager
def _cpu_devices(count: int):
    """``count`` CPU devices for this sweep, through XLA_FLAGS, unless XLA_FLAGS already sets a
    count (or JAX has started here already: then this changes nothing). The sweep flies every
    device from its own thread; one device keeps only about one core busy. The environment is
    restored afterwards: JAX has read it by then, and nothing started later inherits it."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_COUNT_FLAG in flags:
        yield
        return
    os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_COUNT_FLAG}={count}".strip()
    try:
        yield
    finally:
        if flags:
            os.environ["XLA_FLAGS"] = flags
        else:
            del os.environ["XLA_FLAGS"]


def _compilation_cache() -> None:
    """The command keeps XLA's compiled programs across runs, beside the native kernels
    (``$QUADJAX_CACHE_DIR/xla``, default ``~/.cache/quadjax/xla``): a rerun of a sweep skips
    XLA's compile (5–10 s of the default sweep here). This is the command's choice for its own
    process, as an application's; the library never sets ``jax.config``. A cache the caller
    chose (``JAX_COMPILATION_CACHE_DIR``, or ``jax.config`` in a calling program) is kept."""
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        from quadjax.native import cache_dir

        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "xla"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)  # the outputs' small programs too


def _sweep(args, config) -> int:
    if args.print_config:
        from quadjax.sweep.config import to_toml

        print(to_toml(config.resolved), end="")
        return 0
    try:
        processes = _join(args)
    except (ValueError, RuntimeError) as err:
        return _error(err)
    state: dict = {"processes": processes}
    _compilation_cache()
    try:
        previous = signal.signal(signal.SIGTERM, _raise_stopped)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return _run(args, config, state)
    except KeyboardInterrupt:
        return _stopped(args, state, signal.SIGINT)
    except _Stopped as stop:
        return _stopped(args, state, stop.signum)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args, config, state: dict) -> int:
    from quadjax.sweep.runner import run_sweep
    from quadjax.sweep.stats import format_table

    started = time.perf_counter()
    index, count = state["processes"]
    if index == 0:
        print(_describe(config) + (f"\n{count} processes" if count > 1 else ""), flush=True)
    try:
        result = run_sweep(config, args.out, overwrite=args.overwrite, progress=_progress(args, state),
                           plots=not args.no_plots, force=args.force)
    except (ValueError, OSError) as err:
        return _error(err)
    t = result.summary["timings_s"]
    if index > 0:  # process 0 prints the table and writes the results
        mine = t["processes"][index]
        print(f"{_prefix(state)}flew {mine['chunks']} chunk(s), {mine['vehicles']} vehicles, in {mine['flight_s']:.1f} s; "
              f"process 0 wrote the results in {result.out_dir}/", flush=True)
        return 0
    n, ticks = config.vehicles, config.num_ticks
    print()
    print(format_table(result.summary))
    print()
    if t["flight_s"] > 0:
        print(f"time: {time.perf_counter() - started:.1f} s (compile {t['compile_s']:.1f} s, "
              f"flight {t['flight_s']:.1f} s"
              f" = {n * ticks / t['flight_s'] / 1e6:.2f} M vehicle-ticks/s)")
    else:
        print(f"every chunk was already in {result.out_dir}; nothing flown (pass --overwrite to fly again)")
    outputs = "summary.json, vehicles.npz, trajectories.npz" + ("" if args.no_plots else ", plots/*.png, plots/player.html")
    print(f"results: {result.out_dir}/ ({outputs})")
    return 0
