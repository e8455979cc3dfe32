"""What a reader without a live kernel sees: the committed outputs read right on a static page.

Where widgets do not render (a text-only viewer, a page without the widget state), a widget output shows
its text/plain. That must not be a progress bar frozen at the 0 % of the moment it was displayed, nor a
Python repr such as ``VBox(children=(...`` or ``Output()``: the executor writes a readable note instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from course_lib.manifest import notebook_paths
from course_tools import execute_notebooks

REPR = re.compile(r"^[A-Z]\w*\((?:children=|outputs=|value=|\))")
BAR = re.compile(r"(\d+)%\|[^|\n]*\|\s*(\d+)/(\d+)")


def _widget_texts(nb: nbformat.NotebookNode) -> list[str]:
    return [
        "".join(out["data"]["text/plain"])
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if execute_notebooks.WIDGET_VIEW in out.get("data", {}) and "text/plain" in out["data"]
    ]


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_widget_outputs_read_right_without_widgets(path: Path) -> None:
    for text in _widget_texts(nbformat.read(path, as_version=4)):
        assert not REPR.match(text), f"{path.name}: a widget shows its Python repr: {text[:80]!r}"
        bar = BAR.search(text)
        if bar:
            assert bar.group(2) == bar.group(3) and bar.group(1) == "100", (
                f"{path.name}: a frozen progress bar: {text!r}"
            )


def test_the_executor_writes_the_notes() -> None:
    nb = nbformat.v4.new_notebook()
    state = {
        "b": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]}},
        "l": {"model_name": "HTMLModel", "state": {"value": "steps: 100%"}},
        "p": {"model_name": "FloatProgressModel", "state": {"value": 4.0, "max": 4.0}},
        "r": {"model_name": "HTMLModel", "state": {"value": " 4/4 [00:01&lt;00:00]"}},
        "o": {"model_name": "OutputModel", "state": {"outputs": []}},
        "v": {"model_name": "VBoxModel", "state": {"children": []}},
    }
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    cell = nbformat.v4.new_code_cell("show()")
    for model_id, shown in (("b", "steps:   0%|          | 0/4"), ("o", "Output()"), ("v", "VBox(children=())")):
        data = {execute_notebooks.WIDGET_VIEW: {"model_id": model_id}, "text/plain": shown}
        cell.outputs.append(nbformat.v4.new_output("display_data", data=data))
    nb.cells = [cell]
    assert execute_notebooks.static_widget_text(nb) == 3
    texts = _widget_texts(nb)
    assert texts[0] == "steps: 100%|##########| 4/4 [00:01<00:00]"
    assert texts[1] == execute_notebooks.LIVE_VIEW_TEXT and texts[2] == execute_notebooks.EXPLORER_TEXT
    assert execute_notebooks.static_widget_text(nb) == 0  # idempotent
