"""Test setup. The library never touches jax.config; the tests run with x64 enabled so
that float64 references are available, and build float32 inputs explicitly where the
float32 path is under test."""

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest
from hypothesis import settings

jax.config.update("jax_enable_x64", True)

from quadjax.native import BUILD_EVENT  # noqa: E402 — quadjax is first imported with x64 on

# One persistent XLA compilation cache per test run, shared by the pytest-xdist workers: a program
# that both workers compile (a module fixture or a cached jit that each worker builds for its share
# of a file's tests) is compiled once and loaded by the other. JAX keys an entry by the program, the
# XLA flags, the devices and the JAX/jaxlib versions, so a hit is the same executable. The first
# process of the run (the xdist controller, or the only one) creates the folder and removes it when
# it exits; the workers find it through QUADJAX_TEST_XLA_CACHE. Child processes do not use it
# unless a test passes it on (JAX_COMPILATION_CACHE_DIR is left as it is).
XLA_CACHE_VAR = "QUADJAX_TEST_XLA_CACHE"
if not os.environ.get(XLA_CACHE_VAR):
    os.environ[XLA_CACHE_VAR] = tempfile.mkdtemp(prefix="quadjax-test-xla-cache-")
    atexit.register(shutil.rmtree, os.environ[XLA_CACHE_VAR], ignore_errors=True)
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # a cache the caller chose is kept
    jax.config.update("jax_compilation_cache_dir", os.environ[XLA_CACHE_VAR])
    # Every program is kept, not only those over JAX's default 1 s: of the suite's ~5 600 backend
    # compiles, 5 100 took under 0.2 s, and many are the same program again (both workers compile
    # the same small programs; tests build the same jit of a new closure). 2026-12-05, -n 2, warm
    # kernel cache, before un-jitted model calls stopped compiling (quadjax.integrators.runge_kutta4):
    # files that run the model op by op gained most (test_effects 65 -> 37 test-seconds, test_sysid
    # 66 -> 43); the whole suite 981 s against 1 004 s, one run each (within this machine's noise).
    # The cache reached ~90 MB.
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
NANODRONE = Path(os.environ.get("QUADJAX_NANODRONE_DIR", REPO.parent / "shared" / "data" / "nanodrone"))


@pytest.fixture
def nanodrone_dir():
    """The real-flight folder, or a clean skip where it is absent."""
    if not NANODRONE.is_dir() or not any(NANODRONE.glob("*.parquet")):
        pytest.skip(f"flight data not found at {NANODRONE}")
    return NANODRONE


# --- where the suite's time goes (opt-in) ---------------------------------------------------------
# Most of the suite's time is JAX compiling, not running: a run with QUADJAX_TEST_COMPILE_REPORT=<new folder>
# sums JAX's own compile events (tracing, lowering to MLIR, XLA's backend compile) and quadjax's C++
# builds of generated kernels per test, each pytest-xdist worker into <folder>/<worker>.json, and the
# first process prints them per file at the end. A kernel is generated and built while JAX traces the
# program that calls it, so "trace" includes "c++". --durations gives the wall time beside it.
COMPILE_REPORT = os.environ.get("QUADJAX_TEST_COMPILE_REPORT")
COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                  "/jax/core/compile/backend_compile_duration": "compile",
                  BUILD_EVENT: "c++"}
_compile_seconds: dict = {}  # {test node id: {"trace": s, "lower": s, "compile": s, "c++": s}}
_current_test = None

if COMPILE_REPORT:
    def _on_duration(event, duration, **_):
        if _current_test is not None and event in COMPILE_EVENTS:
            per = _compile_seconds.setdefault(_current_test, dict.fromkeys(COMPILE_EVENTS.values(), 0.0))
            per[COMPILE_EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(_on_duration)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        global _current_test
        _current_test = item.nodeid
        yield
        _current_test = None

    def pytest_sessionfinish(session):
        Path(COMPILE_REPORT).mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(COMPILE_REPORT) / f"{name}.json").write_text(json.dumps(_compile_seconds))

    def pytest_terminal_summary(terminalreporter):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return
        per_file: dict = {}
        for report in Path(COMPILE_REPORT).glob("*.json"):
            for node, seconds in json.loads(report.read_text()).items():
                row = per_file.setdefault(node.split("::")[0], dict.fromkeys(COMPILE_EVENTS.values(), 0.0))
                for k, v in seconds.items():
                    row[k] += v
        total = {k: sum(r[k] for r in per_file.values()) for k in COMPILE_EVENTS.values()}
        terminalreporter.write_sep("=", "JAX compile seconds (trace / lower / compile) and native C++ builds (c++), "
                                        "summed over the workers")
        terminalreporter.write_line(" / ".join(f"{total[k]:.0f}" for k in total) + "  all tests")
        for file, row in sorted(per_file.items(), key=lambda kv: -sum(kv[1].values()))[:20]:
            terminalreporter.write_line(" / ".join(f"{row[k]:.1f}" for k in row) + f"  {file}")
