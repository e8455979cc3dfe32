"""What a committed notebook says the browser should show: plots, widgets, controls, maths, slides."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_lib.manifest import notebook_paths

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = notebook_paths()  # the course, in order (course.toml)

IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# Widgets a learner moves: the test drags or sets one of these and expects an output to change.
CONTROL_MODELS = {
    "IntSliderModel",
    "FloatSliderModel",
    "FloatLogSliderModel",
    "SelectionSliderModel",
    "IntRangeSliderModel",
    "FloatRangeSliderModel",
    "DropdownModel",
    "RadioButtonsModel",
    "ToggleButtonsModel",
    "CheckboxModel",
    "ToggleButtonModel",
    "TextModel",
    "IntTextModel",
    "FloatTextModel",
    "BoundedIntTextModel",
    "BoundedFloatTextModel",
}
_CODE = re.compile(r"```.*?```|~~~.*?~~~|`[^`\n]*`", re.S)  # code blocks and spans: no maths there
_MATH = re.compile(r"\$\$.+?\$\$|(?<![\\$])\$[^$\s][^$]*?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)


@dataclass(frozen=True)
class NotebookFacts:
    name: str
    code_cells: int  # non-empty code cells (each gets an execution count when run)
    images: int  # plot outputs
    widget_views: int  # widget outputs (tqdm bars, explorers)
    controls: int  # control widgets in the saved widget state (sliders, dropdowns, ...)
    progress_bars: int  # progress bars (tqdm) in the saved widget state
    has_math: bool
    slides: int  # slide + subslide cells: the deck's pages
    fragments: int


def notebook_facts(path: Path) -> NotebookFacts:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    outputs = [o for c in code for o in c.get("outputs", [])]
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    kinds = [c.metadata.get("slideshow", {}).get("slide_type", "-") for c in nb.cells]
    return NotebookFacts(
        name=path.name,
        code_cells=len(code),
        images=sum(1 for o in outputs if any(t in o.get("data", {}) for t in IMAGE_TYPES)),
        widget_views=sum(1 for o in outputs if WIDGET_VIEW in o.get("data", {})),
        controls=sum(1 for m in state.values() if m.get("model_name") in CONTROL_MODELS),
        progress_bars=sum(
            1 for m in state.values() if m.get("model_name") in ("FloatProgressModel", "IntProgressModel")
        ),
        has_math=any(c.cell_type == "markdown" and _MATH.search(_CODE.sub("", c.source)) for c in nb.cells),
        slides=sum(1 for k in kinds[1:] if k in ("slide", "subslide")) + 1,
        fragments=sum(1 for k in kinds if k == "fragment"),
    )
