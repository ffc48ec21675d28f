"""notebooks/01_monte_carlo.ipynb runs top to bottom (executed with nbclient; skipped
cleanly where nbclient, nbformat or ipykernel is not installed)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_monte_carlo.ipynb"


def test_monte_carlo_notebook_executes_and_shows_its_figures(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert text.count("RMS tracking error [m]") == 2  # both sweeps printed their table
    assert "correlation of RMS tracking error with mass" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # the second sweep differed only in numbers: it reused the compiled program
    assert "compile 0.00 s" in text
