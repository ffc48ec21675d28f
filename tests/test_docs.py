"""Every python snippet of README.md and of the docs pages runs, and prints what the page shows.

The rules (docs/index.md, "Snippets are tested", says the same to a reader):

* Every ```python block runs. The blocks of one page run in order in one fresh interpreter
  (a subprocess with JAX's defaults, no x64; its working folder a temporary one), so a later
  block may use the names of an earlier one, as a reader running the page would.
* A ```text block (or a bare ``` block) right after a python block, with at most one line of
  prose ending in ":" between them, is that block's output. What the block prints must match
  it: the text exactly (whitespace aside), each number within 1 % or one unit of its last
  printed decimal (numbers below 1e-6 in magnitude count as equal). So a page's numbers were
  captured by running it, and cannot drift from what the code does.
* A block whose first line is ``# illustrative: <why>`` does not run: kept for code that needs
  what a test machine does not have (several hosts). Such blocks are rare and say why.

Shell blocks (```bash) are not run here; ``.ci/run`` runs the README's commands.

``python tests/test_docs.py docs/getting-started/one-flight.md`` reruns a page and rewrites its
output blocks with what it printed, and copies back the PNG files the page shows (``![..](x.png)``)
that its blocks wrote: the way to capture a page's output and figures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ILLUSTRATIVE = "# illustrative:"
FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,})(?P<info>[^`\n]*)$")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b")
REL_TOL = 1e-2
TINY = 1e-6
MARK = "@@quadjax-docs-block@@"


@dataclass
class Block:
    """One fenced block of a page: its info string's language, text and line span (0-based)."""

    lang: str
    text: str
    start: int  # line of the opening fence
    end: int  # line of the closing fence
    output: "Block | None" = None  # for python blocks: the expected-output block, if any


def parse_blocks(markdown: str) -> list[Block]:
    """The fenced blocks of ``markdown`` in order; python blocks get their output block."""
    lines = markdown.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        lang = m["info"].strip().split(" ")[0].lower() if m["info"].strip() else ""
        j = i + 1
        while j < len(lines) and not re.match(rf"^[ ]{{0,{indent + 3}}}{fence}\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"line {i + 1}: fence {fence} never closed")
        body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1:j]]
        blocks.append(Block(lang, "\n".join(body), i, j))
        i = j + 1
    for a, b in zip(blocks, blocks[1:]):
        if a.lang in ("python", "py") and b.lang in ("text", ""):
            between = [line for line in lines[a.end + 1:b.start] if line.strip()]
            if not between or (len(between) == 1 and between[0].rstrip().endswith(":")):
                a.output = b
    return blocks


def runnable(blocks: list[Block]) -> list[Block]:
    """The python blocks that run (all but the ``# illustrative:`` ones)."""
    return [b for b in blocks if b.lang in ("python", "py") and not b.text.lstrip().startswith(ILLUSTRATIVE)]


_RUNNER = f"""
import json, sys, time
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
ns = {{"__name__": "__main__"}}
for name, src in blocks:
    print({MARK!r}, flush=True)
    t0 = time.perf_counter()
    exec(compile(src, name, "exec"), ns)
    sys.stdout.flush()
    print(f"{{name}}: {{time.perf_counter() - t0:.1f}} s", file=sys.stderr, flush=True)
"""


def run_page(path: Path, cwd: Path, timeout: float = 600) -> list[str]:
    """Run the page's python blocks in one fresh interpreter in ``cwd``; returns what each printed."""
    blocks = runnable(parse_blocks(path.read_text(encoding="utf-8")))
    if not blocks:
        return []
    rel = path.relative_to(REPO)
    spec = cwd / "_blocks.json"
    spec.write_text(json.dumps([(f"{rel}:{b.start + 2}", b.text) for b in blocks]), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "JAX_COMPILATION_CACHE_DIR")}
    env.update(MPLBACKEND="Agg", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(spec)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    spec.unlink()
    if proc.returncode != 0:
        raise AssertionError(f"{rel}: a snippet failed (exit {proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-6000:]}")
    printed = proc.stdout.split(MARK + "\n")
    return [p.rstrip("\n") for p in printed[1:]]


def _last_digit(token: str) -> float:
    """One unit of the last printed decimal of a number token (0 for an integer)."""
    mantissa, _, exponent = token.lower().partition("e")
    if "." not in mantissa:
        return 0.0
    decimals = len(mantissa.split(".")[1])
    return 10.0 ** (int(exponent or 0) - decimals)


def mismatch(expected: str, actual: str) -> str | None:
    """None if ``actual`` prints what ``expected`` shows (text exact up to whitespace, numbers
    within tolerance); else a sentence saying where they differ."""
    exp_nums, act_nums = NUMBER.findall(expected), NUMBER.findall(actual)
    exp_text = re.sub(r"\s+", "", NUMBER.sub("#", expected))
    act_text = re.sub(r"\s+", "", NUMBER.sub("#", actual))
    if exp_text != act_text or len(exp_nums) != len(act_nums):
        return f"the text differs:\n--- page\n{expected}\n--- printed\n{actual}"
    for e, a in zip(exp_nums, act_nums):
        x, y = float(e), float(a)
        if x != x or y != y:  # nan
            if not (x != x and y != y):
                return f"{a} printed where the page shows {e}"
            continue
        if abs(x) <= TINY and abs(y) <= TINY:
            continue
        if abs(x - y) > max(REL_TOL * abs(x), _last_digit(e) * 1.0001):
            return f"{a} printed where the page shows {e}:\n--- page\n{expected}\n--- printed\n{actual}"
    return None


def pages() -> list[Path]:
    """README.md and every docs page with a python block."""
    found = [REPO / "README.md"] + sorted(DOCS.rglob("*.md"))
    return [p for p in found if any(b.lang in ("python", "py") for b in parse_blocks(p.read_text(encoding="utf-8")))]


def _id(path: Path) -> str:
    return str(path.relative_to(REPO))


# --------------------------------------------------------------------------- tests

if "pytest" in sys.modules:
    import pytest

    @pytest.mark.parametrize("page", pages(), ids=_id)
    def test_page_snippets_run_and_print_what_the_page_shows(page, tmp_path):
        blocks = runnable(parse_blocks(page.read_text(encoding="utf-8")))
        printed = run_page(page, tmp_path)
        assert len(printed) == len(blocks), f"{_id(page)}: {len(printed)} of {len(blocks)} blocks ran"
        for block, out in zip(blocks, printed):
            if block.output is not None:
                why = mismatch(block.output.text, out)
                assert why is None, f"{_id(page)}, block at line {block.start + 1}: {why}"


def test_the_readme_and_the_getting_started_pages_have_tested_snippets():
    """The collection is not vacuous: the README's examples and each getting-started page run,
    and the README's first example and every getting-started page check their output."""
    found = {_id(p) for p in pages()}
    assert "README.md" in found
    readme = parse_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(runnable(readme)) >= 4
    assert runnable(readme)[0].output is not None  # "Its output:" under the Example
    for page in sorted((DOCS / "getting-started").glob("*.md")):
        if page.name == "index.md":
            continue
        blocks = runnable(parse_blocks(page.read_text(encoding="utf-8")))
        assert blocks, f"{_id(page)} has no snippet"
        assert any(b.output is not None for b in blocks), f"{_id(page)} shows no output"


def test_illustrative_blocks_are_rare_and_say_why():
    skipped = []
    for page in [REPO / "README.md"] + sorted(DOCS.rglob("*.md")):
        for b in parse_blocks(page.read_text(encoding="utf-8")):
            if b.lang in ("python", "py") and b.text.lstrip().startswith(ILLUSTRATIVE):
                reason = b.text.lstrip().splitlines()[0][len(ILLUSTRATIVE):].strip()
                assert len(reason) > 10, f"{_id(page)}:{b.start + 1}: say why the block does not run"
                skipped.append(f"{_id(page)}:{b.start + 1}")
    assert len(skipped) <= 3, skipped


def test_the_output_rule_catches_a_changed_number_and_changed_text():
    page = "text\n\n```python\nprint(1)\n```\n\nIts output:\n\n```text\nerror 0.0445 m, 12 of 4096 [1.7302533 0.4386366]\n```\n"
    (block,) = runnable(parse_blocks(page))
    shown = block.output.text
    assert mismatch(shown, "error 0.0446 m, 12 of 4096 [1.7302533 0.4386366]") is None  # last digit
    assert mismatch(shown, "error  0.04451 m, 12 of 4096 [ 1.7302533  0.4386366 ]") is None  # spacing, 1 %
    assert mismatch(shown, "error 0.0500 m, 12 of 4096 [1.7302533 0.4386366]") is not None  # number
    assert mismatch(shown, "error 0.0445 m, 13 of 4096 [1.7302533 0.4386366]") is not None  # an integer
    assert mismatch(shown, "error 0.0445 m, 12 of 4096 [1.7302533 0.4386366] 0") is not None  # one more
    assert mismatch(shown, "error 0.0445 km, 12 of 4096 [1.7302533 0.4386366]") is not None  # text
    # a block separated from the next fence by a paragraph that is not a one-line lead-in has no output
    assert runnable(parse_blocks("```python\nx = 1\n```\n\nSome prose.\nMore prose.\n\n```text\n1\n```\n"))[0].output is None
    assert runnable(parse_blocks("```python\n# illustrative: needs two hosts and a coordinator\n```\n")) == []


# --------------------------------------------------------------------------- capturing a page


def capture(path: Path) -> None:
    """Run ``path``'s blocks, rewrite its output blocks with what they printed, and copy back the
    PNG files the page shows that the blocks wrote."""
    text = path.read_text(encoding="utf-8")
    blocks = runnable(parse_blocks(text))
    with tempfile.TemporaryDirectory() as tmp:
        printed = run_page(path, Path(tmp))
        lines = text.split("\n")
        for block, out in sorted(zip(blocks, printed), key=lambda bo: -bo[0].start):
            if block.output is not None:
                o = block.output
                lines[o.start + 1:o.end] = out.split("\n")
        path.write_text("\n".join(lines), encoding="utf-8")
        for name in re.findall(r"!\[[^\]]*\]\(([^)/]+\.png)\)", text):
            if (Path(tmp) / name).is_file():
                shutil.copy2(Path(tmp) / name, path.parent / name)
                print(f"{path.parent / name}")
    print(f"{path}: {len(blocks)} blocks, {sum(b.output is not None for b in blocks)} outputs captured")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        capture(Path(arg).resolve())
