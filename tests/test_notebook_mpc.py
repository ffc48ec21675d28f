"""notebooks/03_mpc.ipynb runs top to bottom (executed with nbclient; skipped cleanly where
nbclient, nbformat or ipykernel is not installed). Its last cell asserts what it shows: three
vehicles (mass −10 %, 0, +10 % against the MPC's model) keep out of the sphere and reach the goal."""

import pytest

from tests.helpers import run_notebook

for _module in ("nbformat", "nbclient", "ipykernel"):
    pytest.importorskip(_module)


def test_mpc_notebook_executes(tmp_path):
    outputs, text = run_notebook("03_mpc.ipynb", tmp_path)
    assert "closest approach to the sphere's centre" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    assert not [o for o in outputs if o.get("output_type") == "error"]
