"""Authoring aid: turn a "percent" draft into an (unexecuted) notebook with slide metadata.

    python scripts/percent_to_ipynb.py draft.py notebooks/NN_topic.ipynb
    make execute NB=notebooks/NN_topic.ipynb

The committed ``.ipynb`` is the source of truth; a draft is a convenient way to write a new
notebook or rewrite one in full. Format: a line ``# %% md slide`` (or ``# %% code fragment``,
``# %% md`` ...) starts a cell; ``md``/``code`` is the cell type (default ``code``), the next
word the slide type (``slide``, ``subslide``, ``fragment``, ``skip``, ``notes``; default ``-``),
and ``tags=a,b`` adds cell tags. Markdown is written as plain lines (no ``#`` prefix).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

SLIDE_TYPES = {"slide", "subslide", "fragment", "skip", "notes", "-"}
HEADER = re.compile(r"^# %%(.*)$")


def convert(text: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                   "language_info": {"name": "python"}}
    cells: list[tuple[str, str, list[str], list[str]]] = []
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            words = m.group(1).split()
            kind, slide, tags = "code", "-", []
            for w in words:
                if w in ("md", "markdown"):
                    kind = "markdown"
                elif w == "code":
                    kind = "code"
                elif w in SLIDE_TYPES:
                    slide = w
                elif w.startswith("tags="):
                    tags = [t for t in w[5:].split(",") if t]
                else:
                    raise ValueError(f"unknown word {w!r} in cell header: {line!r}")
            cells.append((kind, slide, tags, []))
        elif cells:
            cells[-1][3].append(line)
        elif line.strip():
            raise ValueError("text before the first '# %%' header")
    for kind, slide, tags, lines in cells:
        source = "\n".join(lines).strip("\n")
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell.metadata["slideshow"] = {"slide_type": slide}
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("notebook", type=Path)
    args = parser.parse_args(argv)
    nb = convert(args.draft.read_text())
    nbformat.write(nb, args.notebook)
    print(f"wrote {args.notebook} ({len(nb.cells)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
