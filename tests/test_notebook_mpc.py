"""notebooks/03_mpc.ipynb runs top to bottom (its last cell asserts what it shows)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]


def test_mpc_notebook_executes():
    nb = nbformat.read(REPO / "notebooks" / "03_mpc.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()
    streams = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "closest approach" in streams
