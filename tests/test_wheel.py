"""The built wheel works without the source tree.

``python -m build`` makes an sdist and a wheel; the wheel goes into a fresh virtual environment
in a temporary folder, and from there (the working folder outside the checkout, so nothing can be
imported from it) ``quadjax --version`` and a small ``quadjax sweep`` run. Also checked: the
package data the installed package reads at run time (the native kernel's C++ harness, the
trace player's script and style sheet), the console entry point, and the metadata (Python
floor, extras). Slow (a venv and an install, about a minute); it needs pip to reach its index
or cache for the wheel's dependencies, as the README's install does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]

pytest.importorskip("build", reason="the 'build' package (pip install -e '.[test]') makes the wheel")
pytestmark = pytest.mark.slow

#: files the installed package reads at run time (quadjax.native.HARNESS; quadjax.player.page's assets)
RUNTIME_DATA = ["quadjax/native/rollout.cc", "quadjax/native/loop.cc", "quadjax/player/assets/player.js", "quadjax/player/assets/player.css"]


def _run(cmd, cwd, env=None, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    # built from a snapshot of the tree: building in the checkout writes its egg-info and build/
    # under the editable install, and other test workers' files come and go there meanwhile
    src = tmp_path_factory.mktemp("src") / "quadjax"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "results", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis"))
    _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(src)], cwd=out)
    wheels, sdists = sorted(out.glob("quadjax-*.whl")), sorted(out.glob("quadjax-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0], sdists[0]


def test_the_wheel_holds_the_package_its_data_entry_point_and_metadata(dist):
    wheel, sdist = dist
    assert wheel.name.startswith(f"quadjax-{VERSION}-py3-none-any")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"quadjax-{VERSION}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    for path in RUNTIME_DATA + ["quadjax/__init__.py", "quadjax/cli.py", "quadjax/native/generate.py"]:
        assert path in names, f"{path} is missing from {wheel.name}"
    assert not any(n.startswith(("tests/", "docs/", "benchmarks/", "notebooks/")) for n in names)
    assert "quadjax = quadjax.cli:main" in entry_points
    assert "Requires-Python: >=3.11" in metadata
    for extra in ("logs", "docs", "test", "player"):
        assert f"Provides-Extra: {extra}" in metadata
    # a plain install stays light: no test, docs, browser or dataframe packages
    plain = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert plain and not any(p in line for line in plain
                             for p in ("pytest", "mkdocs", "playwright", "pandas", "pyarrow", "c4dynamics"))
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    for path in RUNTIME_DATA + ["pyproject.toml", "README.md", "tests/conftest.py", "tests/helpers.py"]:
        assert path in members, f"{path} is missing from {sdist.name}"


def test_the_wheel_installs_and_runs_outside_the_source_tree(dist, tmp_path):
    wheel, _ = dist
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JAX_ENABLE_X64")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], cwd=work, env=env)

    where = _run([str(py), "-c", "import quadjax, quadjax.native; print(quadjax.__file__); "
                                 "print(quadjax.native.HARNESS.is_file())"], cwd=work, env=env).split()
    assert Path(where[0]).is_relative_to(venv) and where[1] == "True"  # the installed copy, not the checkout

    assert _run([str(venv / "bin" / "quadjax"), "--version"], cwd=work, env=env).strip() == f"quadjax {VERSION}"

    out = _run([str(venv / "bin" / "quadjax"), "sweep", "--vehicles", "16", "--duration", "1", "--keep", "2",
                "--no-plots", "--quiet", "--out", "small"], cwd=work, env=env)
    assert "crashed" in out and "RMS tracking error [m]" in out, out
    summary = json.loads((work / "small" / "summary.json").read_text())
    assert summary["vehicles"] == 16 and summary["crashed"] == 0, summary

    # the trace player's page from the installed assets
    _run([str(venv / "bin" / "quadjax"), "view", "small", "--out", "small.html"], cwd=work, env=env)
    page = (work / "small.html").read_text()
    assert "<script>" in page and len(page) > 10_000
