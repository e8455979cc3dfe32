"""Execute notebooks in place, the one way the course's committed outputs are made.

    python scripts/execute_notebooks.py notebooks/01_tensors_and_parameters.ipynb ...

Each notebook runs top to bottom in a fresh ``python3`` kernel from the course's environment,
with its working directory set to ``notebooks/``. Then it is cleaned so that re-running gives
no diff: notebook metadata is reduced to the kernel spec and the language name, per-cell
execution timestamps are dropped, split stream outputs are merged, execution counts are renumbered
1..n, and widget model ids (random UUIDs) are replaced by stable ones, with the widget state kept so
static HTML renders widgets; these rewrites touch outputs and widget state only, never a cell's
source. A cell whose new output equals its old one up to nbval's sanitizers (tests/sanitize.cfg:
timings after '~', ...) keeps the old one, so a re-execution's diff shows only what changed. Prints
each notebook's wall time; exits non-zero if any cell fails.
"""

from __future__ import annotations

import argparse
import copy
import html
import json
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
CELL_TIMEOUT_S = 300
SANITIZE_CFG = Path(__file__).resolve().parents[1] / "tests" / "sanitize.cfg"
_TQDM_TIMES = re.compile(r"\[\d{2}:\d{2}(?:(?:<|&lt;)[^\]]*)?\]")


def _coalesce_streams(outputs: list) -> list:
    """Merge consecutive stdout (or stderr) chunks: how a print is split varies from run to run."""
    merged: list = []
    for out in outputs:
        if (
            out.get("output_type") == "stream"
            and merged
            and merged[-1].get("output_type") == "stream"
            and merged[-1]["name"] == out["name"]
        ):
            merged[-1]["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip what differs from machine to machine or run to run; keep teaching metadata."""
    widgets = nb.metadata.get("widgets")
    nb.metadata = nbformat.NotebookNode(kernelspec=KERNELSPEC, language_info={"name": "python"})
    count = 0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
        if cell.cell_type != "code":
            continue
        if not cell.source.strip():
            cell.execution_count = None
            cell.outputs = []
            continue
        count += 1
        cell.execution_count = count
        cell.outputs = _coalesce_streams(cell.outputs)
        for out in cell.outputs:
            if "execution_count" in out:
                out["execution_count"] = count
            out.get("metadata", {}).pop("transient", None)
    if widgets:
        nb.metadata["widgets"] = widgets
    # Stable widget ids: number the models in a deterministic order (the views shown in the cells,
    # in cell order, then the models each one references, depth first), replacing random UUIDs.
    state = widget_state(nb) if widgets else {}
    ids: dict[str, str] = {}

    def visit(model_id: str) -> None:
        if model_id in ids:
            return
        ids[model_id] = f"{len(ids) + 1:032x}"
        refs = re.findall(r"IPY_MODEL_([0-9a-f]{32})", json.dumps(state.get(model_id, {}), sort_keys=True))
        for ref in refs:
            visit(ref)

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view:
                visit(view["model_id"])
    for key in sorted(state, key=lambda k: json.dumps(state[k], sort_keys=True)):
        visit(key)

    # Rewrite the outputs and the widget state only, never a cell's source or metadata: replace each
    # id through a temporary token (a new id can never collide with an old one), and tqdm's timings.
    def rewrite(value: object) -> object:
        text = json.dumps(value, sort_keys=True)
        for old, new in ids.items():
            text = text.replace(old, "@@" + new)
        return json.loads(_TQDM_TIMES.sub("[elapsed]", text.replace("@@", "")))

    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(rewrite(out)) for out in cell.outputs]
    if widgets:
        nb.metadata["widgets"] = nbformat.from_dict(rewrite(widgets))
    return nb


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LIVE_VIEW_TEXT = "[live output of the launched processes while they ran; their output, grouped by rank, follows]"
EXPLORER_TEXT = "[interactive widget: run this notebook in Jupyter to use it]"


def widget_state(nb: nbformat.NotebookNode) -> dict:
    """The widget models saved in a notebook's metadata, by model id (empty when it has none)."""
    return nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})


def static_widget_text(nb: nbformat.NotebookNode) -> int:
    """Give every widget output a text/plain that reads right where widgets do not render (a static page, a
    text-only viewer): a progress bar as it ended (``100%|##########| 100/100``, from the saved widget state,
    not the ``0%`` of the moment it was displayed), the launcher's live view as what it was, and any other
    widget as a note instead of its Python repr (``VBox(children=(...``). tests/sanitize.cfg maps both forms
    to the same text for nbval. Returns how many outputs it rewrote."""
    state = widget_state(nb)
    rewritten = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if not view or "text/plain" not in out["data"]:
                continue
            text = _widget_text(view["model_id"], state)
            if text != out["data"]["text/plain"]:
                out["data"]["text/plain"] = text
                rewritten += 1
    return rewritten


def _widget_text(model_id: str, state: dict) -> str:
    model = state.get(model_id, {})
    name, fields = model.get("model_name"), model.get("state", {})
    if name == "OutputModel":
        return LIVE_VIEW_TEXT
    children = [state.get(ref.removeprefix("IPY_MODEL_"), {}) for ref in fields.get("children", [])]
    kinds = [c.get("model_name") for c in children]
    if name == "HBoxModel" and kinds == ["HTMLModel", "FloatProgressModel", "HTMLModel"]:  # a tqdm bar
        left, bar, right = (c.get("state", {}) for c in children)
        filled = round(10 * bar.get("value", 0) / bar.get("max", 1)) if bar.get("max") else 0
        text = f"{left.get('value', '')}|{'#' * filled}{' ' * (10 - filled)}|{right.get('value', '')}"
        return html.unescape(text).replace("\u2007", " ")
    return EXPLORER_TEXT


def _sanitizers() -> list[tuple[re.Pattern[str], str]]:
    """nbval's sanitizers (tests/sanitize.cfg), parsed by nbval itself: what two runs may differ in and still
    print the same."""
    from nbval.plugin import get_sanitize_patterns

    text = SANITIZE_CFG.read_text(encoding="utf-8")
    return [(re.compile(regex), replace) for regex, replace in get_sanitize_patterns(text)]


def _comparable(outputs: list, sanitizers: list[tuple[re.Pattern[str], str]]) -> str:
    text = json.dumps(outputs, sort_keys=True)
    for pattern, replace in sanitizers:
        text = pattern.sub(replace, text)
    return text


def keep_unchanged_outputs(old: nbformat.NotebookNode, new: nbformat.NotebookNode) -> int:
    """Where a cell (same id, same source) printed what it printed before, up to the sanitizers (the
    timings after '~', addresses...), keep the old outputs, so that re-executing a notebook changes only
    what really changed. Returns how many cells kept theirs."""
    sanitizers = _sanitizers()
    before = {c.get("id"): c for c in old.cells if c.cell_type == "code"}
    kept = 0
    for cell in new.cells:
        was = before.get(cell.get("id")) if cell.cell_type == "code" else None
        if was is None or was.source != cell.source or not was.outputs:
            continue
        if _comparable(was.outputs, sanitizers) == _comparable(cell.outputs, sanitizers):
            cell.outputs = copy.deepcopy(was.outputs)
            kept += 1
    return kept


def execute(path: Path) -> float:
    # Start from a clean scratch folder, as on a fresh clone (notebooks write their scripts there).
    shutil.rmtree(path.parent / "_runs", ignore_errors=True)
    nb = nbformat.read(path, as_version=4)
    previous = copy.deepcopy(nb)
    nb.metadata["kernelspec"] = KERNELSPEC
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent.resolve())}},
        record_timing=False,
        store_widget_state=True,
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    cleaned = clean(nb)
    keep_unchanged_outputs(previous, cleaned)
    static_widget_text(cleaned)  # after keeping old outputs: their text/plain may predate it
    nbformat.write(cleaned, path)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    failed = []
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"not a notebook file: {path}")
        try:
            seconds = execute(path)
            print(f"{seconds:7.1f} s  {path}", flush=True)
        except CellExecutionError as e:
            failed.append(path)
            print(f"FAILED   {path}\n{e}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
