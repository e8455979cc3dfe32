"""Keep every notebook and its text source in step: edit the text, get a minimal notebook diff.

    python scripts/sync_notebooks.py                 # sources/*.py -> notebooks/*.ipynb (make sync)
    python scripts/sync_notebooks.py --check         # exit 1 if a pair differs (tests do this too)
    python scripts/sync_notebooks.py --from-ipynb    # notebooks/*.ipynb -> sources/*.py (after editing in Jupyter
                                                     # without jupytext)

Each notebook ``notebooks/NN_topic.ipynb`` is paired with ``sources/NN_topic.py`` (jupytext's percent
format; ``jupytext.toml`` says so, and JupyterLab with jupytext saves both). The text holds the cells,
their slide types and tags; the notebook adds the outputs. Syncing from the text:

* matches the text's cells with the notebook's (unchanged cells are found by their content, changed
  ones by position among the changes), so every matched cell keeps its id and, if its code is the
  same, its outputs;
* writes the notebook at once when only markdown or metadata changed (a one-sentence edit is a
  one-line diff), and re-executes it with ``scripts/execute_notebooks.py`` when any code changed
  (the executor keeps each output that is unchanged up to the sanitizers, so the diff shows what
  the change changed).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import jupytext
import nbformat

from course_lib.manifest import ROOT, lab_paths, notebook_paths

SOURCES = ROOT / "sources"
FORMAT = {
    "extension": ".py",
    "format_name": "percent",
    "notebook_metadata_filter": "-all",
    "cell_metadata_filter": "slideshow,tags,-all",
    "cell_markers": '"""',
}
KEPT_METADATA = ("slideshow", "tags")


def source_path(notebook: Path) -> Path:
    return SOURCES / (notebook.stem + ".py")


def to_text(nb: nbformat.NotebookNode) -> str:
    """The text source of a notebook: its cells, their slide types and tags; no outputs."""
    copy = nbformat.from_dict(nb)
    copy.metadata = nbformat.NotebookNode()
    for cell in copy.cells:
        cell.metadata = nbformat.NotebookNode({k: v for k, v in cell.metadata.items() if k in KEPT_METADATA})
    return jupytext.writes(copy, fmt=FORMAT)


def read_text(path: Path) -> nbformat.NotebookNode:
    return read_text_from_string(path.read_text(encoding="utf-8"))


def read_text_from_string(text: str) -> nbformat.NotebookNode:
    return jupytext.reads(text, fmt=FORMAT)


def _key(cell: nbformat.NotebookNode) -> tuple[str, str]:
    return cell.cell_type, cell.source


def _inputs(cell: nbformat.NotebookNode) -> tuple[str, str, dict]:
    return cell.cell_type, cell.source, {k: cell.metadata[k] for k in KEPT_METADATA if k in cell.metadata}


def differences(nb: nbformat.NotebookNode, text_nb: nbformat.NotebookNode) -> list[str]:
    """How a notebook's inputs differ from its text source (empty when they agree)."""
    a, b = [_inputs(c) for c in nb.cells], [_inputs(c) for c in text_nb.cells]
    if a == b:
        return []
    if len(a) != len(b):
        return [f"{len(a)} cells in the notebook, {len(b)} in the text source"]
    return [f"cell {i} ({x[0]}) differs" for i, (x, y) in enumerate(zip(a, b)) if x != y]


def merge(old: nbformat.NotebookNode, new: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, bool]:
    """The notebook ``old`` with the inputs of ``new``; True when code changed (it must be re-executed)."""
    merged = nbformat.from_dict(old)
    cells: list[nbformat.NotebookNode] = []
    code_changed = False
    matcher = difflib.SequenceMatcher(a=[_key(c) for c in old.cells], b=[_key(c) for c in new.cells], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        olds, news = list(old.cells[i1:i2]), list(new.cells[j1:j2])
        if op == "equal":
            pairs = list(zip(olds, news))
        else:
            pairs = []
            for cell in news:  # a changed cell keeps the id of the first removed cell of its type
                twin = next((o for o in olds if o.cell_type == cell.cell_type), None)
                if twin is not None:
                    olds.remove(twin)
                pairs.append((twin, cell))
            code_changed |= any(o.cell_type == "code" for o in olds)  # code cells deleted
        for before, after in pairs:
            if before is None:
                new_cell = nbformat.v4.new_code_cell if after.cell_type == "code" else nbformat.v4.new_markdown_cell
                cell = new_cell(after.source)
            else:
                cell = nbformat.from_dict(before)
            cell.source = after.source
            for key in KEPT_METADATA:
                if key in after.metadata:
                    cell.metadata[key] = after.metadata[key]
                else:
                    cell.metadata.pop(key, None)
            if cell.cell_type == "code" and (before is None or before.source != after.source):
                cell.outputs, cell.execution_count = [], None
                code_changed = True
            cells.append(cell)
    merged.cells = cells
    return merged, code_changed


def sync(notebook: Path) -> str:
    """Bring one notebook up to date with its text source; says what it did."""
    text = source_path(notebook)
    if not text.is_file():
        raise FileNotFoundError(f"{notebook.name} has no text source {text.relative_to(ROOT)}: run --from-ipynb")
    # a new notebook (a lab added to the manifest) starts empty and is created from its text
    old = nbformat.read(notebook, as_version=4) if notebook.is_file() else nbformat.v4.new_notebook()
    merged, code_changed = merge(old, read_text(text))
    if not differences(old, merged) and not code_changed:
        return "in sync"
    nbformat.write(merged, notebook)
    if not code_changed:
        return "updated (markdown or metadata only: not re-executed)"
    from course_tools import execute_notebooks

    try:
        seconds = execute_notebooks.execute(notebook)
    except BaseException:
        nbformat.write(old, notebook)  # a cell failed: leave the notebook as it was, outputs included
        raise
    return f"updated and re-executed in {seconds:.1f} s (code changed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook of the course")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only report pairs that differ")
    mode.add_argument("--from-ipynb", action="store_true", help="write the text sources from the notebooks")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or [*notebook_paths(), *lab_paths()]
    bad = 0
    for nb_path in paths:
        if args.from_ipynb:
            SOURCES.mkdir(exist_ok=True)
            source_path(nb_path).write_text(to_text(nbformat.read(nb_path, as_version=4)))
            print(f"{nb_path.name} -> {source_path(nb_path).relative_to(ROOT)}")
        elif args.check:
            text = source_path(nb_path)
            diff = (
                differences(nbformat.read(nb_path, as_version=4), read_text(text))
                if text.is_file()
                else ["no text source"]
            )
            if diff:
                bad += 1
                print(f"{nb_path.name}: out of sync with {text.relative_to(ROOT)}: {'; '.join(diff[:5])}")
        else:
            print(f"{nb_path.name}: {sync(nb_path)}", flush=True)
    if bad:
        print("run `make sync` (text -> notebook) or `make sync FROM=ipynb` (notebook -> text)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
