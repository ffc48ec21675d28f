"""notebooks/01_monte_carlo.ipynb runs top to bottom (executed with nbclient; skipped
cleanly where nbclient, nbformat or ipykernel is not installed)."""

import re

import pytest

from tests.helpers import run_notebook

for _module in ("nbformat", "nbclient", "ipykernel"):
    pytest.importorskip(_module)


def test_monte_carlo_notebook_executes_and_shows_its_figures(tmp_path):
    outputs, text = run_notebook("01_monte_carlo.ipynb", tmp_path)
    assert text.count("RMS tracking error [m]") == 2  # both sweeps printed their table
    assert "correlation of RMS tracking error with mass" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    # the trace player's page, shown inline (an iframe of the self-contained page) and written
    assert sum("<iframe srcdoc=" in o.get("data", {}).get("text/html", "") for o in outputs) == 1
    assert (tmp_path / "sweep_player.html").is_file()
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # the second sweep differed only in numbers: it reused the compiled program (a cache
    # lookup, milliseconds even on a loaded machine, against ~10 s for the first compile)
    second = re.search(r", compile (\d+\.\d+) s", text)
    assert second is not None and float(second.group(1)) < 0.5, text[:400]
