"""Test setup. The library never touches jax.config; the tests run with x64 enabled so
that float64 references are available, and build float32 inputs explicitly where the
float32 path is under test."""

import os
from pathlib import Path

import jax
import pytest
from hypothesis import settings

jax.config.update("jax_enable_x64", True)

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
