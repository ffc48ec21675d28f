"""Test setup. The library never touches jax.config; the tests run with x64 enabled so
that float64 references are available, and build float32 inputs explicitly where the
float32 path is under test."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest
from hypothesis import settings

jax.config.update("jax_enable_x64", True)

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
