"""Griffe extension for the API reference: quadjax's docstrings, written for ``help()``, as Markdown.

* Units and vectors in brackets, ``[δ_roll, δ_pitch, δ_yaw] [rad]``: Markdown reads two bracket
  groups side by side as a reference-style link, and mkdocs-autorefs then warns of an unknown
  target ``rad`` (a strict build fails). The second bracket is escaped, so the text renders as
  written.
* Sphinx roles, ``:func:`simulate```, ``:class:`~quadjax.QuadParams```: shown as code
  (``simulate``, ``QuadParams``) instead of the literal role.
* Field lists, ``name: meaning [unit]`` lines (two or more in a row, at the margin or indented
  under a line that ends with ":"), with their indented continuation lines: a bulleted list
  (``- `name`: meaning``), where Markdown would run them together into one paragraph.

Outside fenced and indented code only. Loaded by mkdocstrings (``mkdocs.yml``: ``extensions``).
"""

from __future__ import annotations

import re

import griffe

PAIR = re.compile(r"\](\s?)\[(?=[^\]\n]*\](?!\())")
CODE_SPAN = re.compile(r"(``.*?``|`[^`]*`)")
ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc|const):`(~?)([^`]+)`")


def _role(m: re.Match) -> str:
    name = m[2].rsplit(".", 1)[-1] if m[1] else m[2]
    return f"`{name}`"


FIELD = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_]\w*(?:, [A-Za-z_]\w*)*): (?P<text>\S.*)$")


def field_lists(text: str) -> str:
    """Runs of two or more ``name: text`` lines (same indent; deeper-indented lines continue the
    previous field) as a Markdown list. An indented run must follow a line ending in ":"."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FIELD.match(lines[i])
        lead_in = i > 0 and lines[i - 1].rstrip().endswith(":")
        if m and (not m["indent"] or lead_in):
            indent, items, j = len(m["indent"]), [], i
            while j < len(lines):
                f = FIELD.match(lines[j])
                if f and len(f["indent"]) == indent:
                    items.append([f"- `{f['name']}`: {f['text']}"])
                    j += 1
                elif items and lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) > indent:
                    items[-1].append("  " + lines[j].strip())
                    j += 1
                else:
                    break
            if len(items) >= 2:
                if out and out[-1].strip():
                    out.append("")
                out.extend(line for item in items for line in item)
                if j < len(lines) and lines[j].strip():
                    out.append("")
                i = j
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def escape_reference_pairs(text: str) -> str:
    """``] [x]`` → ``] \\[x]`` (a literal pair, not a link) and roles → code, outside code."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            parts = CODE_SPAN.split(ROLE.sub(_role, line))  # odd items: inline code, left alone
            line = "".join(p if i % 2 else PAIR.sub(lambda m: "]" + m[1] + "\\[", p) for i, p in enumerate(parts))
        out.append(line)
    return "\n".join(out)


class EscapeReferencePairs(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape_reference_pairs(field_lists(obj.docstring.value))
