"""notebooks/02_sysid.ipynb runs top to bottom (executed with nbclient; skipped cleanly where
nbclient, nbformat or ipykernel is not installed). Its cells assert the recovery they show; the
real-flight part runs where ../shared/data/nanodrone exists and says it skipped otherwise."""

import os

import pytest

from tests.helpers import NOTEBOOKS, run_notebook

for _module in ("nbformat", "nbclient", "ipykernel"):
    pytest.importorskip(_module)


def test_sysid_notebook_executes(monkeypatch):
    # the kernel inherits it: the real-flight part fits a subset of its windows and validates on
    # every 50th start index (a smoke run; the synthetic recovery and its assertions are unchanged)
    monkeypatch.setenv("QUADJAX_NOTEBOOK_QUICK", "1")
    # and this run's compilation cache (tests/conftest.py): its synthetic fit is the program that
    # tests/test_sysid.py's recovery tests compile, so only one of them compiles it
    if os.environ.get("QUADJAX_TEST_XLA_CACHE"):
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", os.environ["QUADJAX_TEST_XLA_CACHE"])
    # run from notebooks/, where a reader runs it
    outputs, text = run_notebook("02_sysid.ipynb", NOTEBOOKS)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert text.count("± std") >= 2 and "relative error" in text and "(estimate − truth) / std" in text
    assert "nano-drone data:" in text
    if "skipping the real-flight part" not in text:
        assert "| fitted |" in text and "| naive |" in text
