"""MkDocs hook: puts the files that live outside ``docs/`` into the site.

* ``notebooks/*.ipynb``: executed top to bottom (two at a time) into ``build/docs-notebooks/``,
  with that folder as their working directory (what they write, e.g. a player page, lands
  under ``build/``, not in the source tree), and served from there; mkdocs-jupyter renders the
  executed copies. A cell that raises fails the build. ``QUADJAX_DOCS_EXECUTE=0`` copies them
  unexecuted instead (a quick preview). The sysid notebook runs its quick real-flight smoke test
  where the data is found (``QUADJAX_NOTEBOOK_QUICK=1``, unless the caller set it).
* ``benchmarks/*.png``: the committed benchmark figures, at ``benchmarks/<name>.png``.
* ``benchmarks/throughput.png``: drawn at build time from the quadjax table of
  ``benchmarks/RESULTS.md`` (so the plot and the table on the benchmarks page never disagree).
* ``<!-- include benchmarks/X.md -->``: that file's text in a page (the benchmarks page).
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import os
import re
import shutil
import time
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_COPIES = ROOT / "build" / "docs-notebooks"
log = logging.getLogger("mkdocs.hooks.quadjax")


@event_priority(100)  # before mkdocs-jupyter's on_files, which must see the notebooks
def on_files(files: Files, config) -> Files:
    target = NOTEBOOK_COPIES / "notebooks"
    shutil.rmtree(NOTEBOOK_COPIES, ignore_errors=True)
    target.mkdir(parents=True)
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if os.environ.get("QUADJAX_DOCS_EXECUTE", "1") != "0":
        execute_notebooks(notebooks, target)
    else:
        for nb in notebooks:
            shutil.copy2(nb, target / nb.name)
    for nb in notebooks:
        files.append(File(f"notebooks/{nb.name}", src_dir=str(NOTEBOOK_COPIES), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    for png in sorted((ROOT / "benchmarks").glob("*.png")):
        files.append(File(f"benchmarks/{png.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    files.append(File.generated(config, "benchmarks/throughput.png",
                                content=throughput_plot((ROOT / "benchmarks" / "RESULTS.md").read_text())))
    return files


def execute_notebooks(notebooks: list[Path], target: Path, workers: int = 2) -> None:
    """Run each notebook top to bottom in its own kernel, ``workers`` at a time, with ``target`` as
    the working folder; write the executed copies there. The first failure raises (PluginError)."""
    import nbclient
    import nbformat

    os.environ.setdefault("QUADJAX_NOTEBOOK_QUICK", "1")

    def run(path: Path) -> tuple[str, float]:
        t0 = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        try:
            nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                    resources={"metadata": {"path": str(target)}}).execute()
        except Exception as err:  # CellExecutionError, DeadKernelError, timeouts: the build fails
            raise PluginError(f"notebooks/{path.name} failed when executed for the docs: {err}") from None
        nbformat.write(nb, target / path.name)
        return path.name, time.perf_counter() - t0

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for name, seconds in pool.map(run, notebooks):
            log.info("executed notebooks/%s in %.1f s", name, seconds)
    log.info("executed %d notebooks in %.1f s", len(notebooks), time.perf_counter() - t0)


def throughput_rows(markdown: str) -> list[dict]:
    """The rows of RESULTS.md's first table (quadjax: ns per vehicle-step): backend, N, dtype,
    motor lag, wall ns."""
    rows = []
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[0] in ("native", "xla") and re.fullmatch(r"\d+", cells[1]):
            rows.append({"backend": cells[0], "N": int(cells[1]), "dtype": cells[3], "lag": cells[4],
                         "wall_ns": float(cells[5])})
    if not rows:
        raise ValueError("benchmarks/RESULTS.md: no quadjax throughput rows found (backend | N | T | dtype | ...)")
    return rows


def throughput_plot(markdown: str) -> bytes:
    """A log-log plot of wall ns per vehicle-step against N, one line per backend and dtype
    (with motor lag), as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = throughput_rows(markdown)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    for backend, dtype in sorted({(r["backend"], r["dtype"]) for r in rows}):
        pts = sorted((r["N"], r["wall_ns"]) for r in rows
                     if r["backend"] == backend and r["dtype"] == dtype and r["lag"] == "yes")
        if pts:
            ax.loglog(*zip(*pts), marker="o", label=f"{backend}, {dtype}")
    ax.set(xlabel="vehicles N", ylabel="wall ns per vehicle-step",
           title="RK4 rollout, dt = 1 ms, RP-1 with motor lag (benchmarks/RESULTS.md)")
    ax.title.set_fontsize(9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


INCLUDE = re.compile(r"^<!-- include (?P<path>[\w./-]+\.md) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """``<!-- include benchmarks/RESULTS.md -->`` on a line of its own: that file of the repository,
    its headings moved two levels down (its ``#`` title becomes a ``###`` section). A missing
    file fails the build."""
    def include(m: re.Match) -> str:
        path = (ROOT / m["path"]).resolve()
        if ROOT not in path.parents or not path.is_file():
            raise PluginError(f"{page.file.src_uri}: include {m['path']}: no such file in the repository")
        lines, fenced = [], False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,4} ", line):
                line = "##" + line
            lines.append(line)
        return "\n".join(lines)

    return INCLUDE.sub(include, markdown)
