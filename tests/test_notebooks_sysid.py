"""notebooks/02_sysid.ipynb runs top to bottom (executed with nbclient; skipped cleanly where
nbclient, nbformat or ipykernel is not installed). Its cells assert the recovery they show; the
real-flight part runs where ../shared/data/nanodrone exists and says it skipped otherwise."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]


def test_sysid_notebook_executes():
    nb = nbformat.read(REPO / "notebooks" / "02_sysid.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO / "notebooks")}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert text.count("± std") >= 2 and "relative error" in text and "(estimate − truth) / std" in text
    assert "nano-drone data:" in text
    if "skipping the real-flight part" not in text:
        assert "| fitted |" in text and "| naive |" in text
