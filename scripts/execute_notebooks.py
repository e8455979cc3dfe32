"""Execute notebooks in place, the one way the course's committed outputs are made.

    python scripts/execute_notebooks.py notebooks/01_tensors_and_parameters.ipynb ...

Each notebook runs top to bottom in a fresh ``python3`` kernel from the course's environment,
with its working directory set to ``notebooks/``. Then it is cleaned so that re-running gives
no diff: notebook metadata is reduced to the kernel spec and the language name, per-cell
execution timestamps are dropped, split stream outputs are merged, execution counts are renumbered 1..n, and widget model ids
(random UUIDs) are replaced by stable ones, with the widget state kept so static HTML renders
widgets. Prints each notebook's wall time; exits non-zero if any cell fails.
"""
from __future__ import annotations

import argparse
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
_TQDM_TIMES = re.compile(r"\[\d{2}:\d{2}(?:(?:<|&lt;)[^\]]*)?\]")


def _coalesce_streams(outputs: list) -> list:
    """Merge consecutive stdout (or stderr) chunks: how a print is split varies from run to run."""
    merged: list = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1]["name"] == out["name"]):
            merged[-1]["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip what differs from machine to machine or run to run; keep teaching metadata."""
    widgets = nb.metadata.get("widgets")
    nb.metadata = nbformat.NotebookNode(
        kernelspec=KERNELSPEC, language_info={"name": "python"}
    )
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
    text = json.dumps(nb, sort_keys=True)
    state = (widgets or {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
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
    # Replace through a temporary token so a new id can never collide with an old one.
    for old, new in ids.items():
        text = text.replace(old, "@@" + new)
    text = text.replace("@@", "")
    text = _TQDM_TIMES.sub("[elapsed]", text)
    return nbformat.from_dict(json.loads(text))


def execute(path: Path) -> float:
    # Start from a clean scratch folder, as on a fresh clone (notebooks write their scripts there).
    shutil.rmtree(path.parent / "_runs", ignore_errors=True)
    nb = nbformat.read(path, as_version=4)
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
    nbformat.write(clean(nb), path)
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
