"""What nbval cannot see: every committed notebook is executed, clean, and follows the course's shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib.manifest import notebook_paths

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebook_paths()
ALLOWED_SLIDE_TYPES = {"slide", "subslide", "fragment", "skip", "notes", "-"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_notebooks_exist_and_are_numbered_in_order() -> None:
    assert NOTEBOOKS, "no notebooks found"
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(numbers))), f"notebooks must be numbered 00, 01, ... without gaps: {numbers}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_was_executed_without_unexpected_errors(path: Path) -> None:
    cells = _load(path)["cells"]
    code = [(i, c) for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    never = [i for i, c in code if c.get("execution_count") is None]
    assert not never, f"cells {never} were never executed: run `make execute NB={path.relative_to(ROOT)}`"
    counts = [c["execution_count"] for _, c in code]
    assert counts == list(range(1, len(code) + 1)), "execution counts must run 1..n (top to bottom, once)"
    errors = [i for i, c in code if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert not errors, f"cells {errors} hold an error output; demonstrate errors with course_lib.expect_error"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_metadata_is_clean_and_names_the_kernel(path: Path) -> None:
    nb = _load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert set(nb["metadata"]) <= {"kernelspec", "language_info", "widgets"}, nb["metadata"].keys()
    assert set(nb["metadata"]["language_info"]) == {"name"}
    for i, cell in enumerate(nb["cells"]):
        assert "execution" not in cell["metadata"], f"cell {i} keeps execution timestamps"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_slide_metadata(path: Path) -> None:
    cells = _load(path)["cells"]
    missing = [
        i
        for i, c in enumerate(cells)
        if c["metadata"].get("slideshow", {}).get("slide_type") not in ALLOWED_SLIDE_TYPES
    ]
    assert not missing, f"cells {missing} lack metadata.slideshow.slide_type"
    assert cells[0]["metadata"]["slideshow"]["slide_type"] == "slide"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_objectives_and_closes_with_summary_exercises_references(path: Path) -> None:
    cells = _load(path)["cells"]
    markdown = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    head = "\n".join(markdown[:2]).lower()
    assert re.search(r"you will be able to|you will learn", head), "first cells must state the objectives"
    assert re.search(r"assum|prerequisite", head), "first cells must state what the notebook assumes"
    headings = [line.strip().lower() for m in markdown for line in m.splitlines() if line.startswith("#")]
    for needed in ("summary", "exercises", "references"):
        assert any(needed in h for h in headings), f"missing a '{needed}' heading"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_prints_the_torch_build_suffix(path: Path) -> None:
    """`torch.__version__` is '2.13.0+cpu' here and '2.13.0+cu128' on a GPU machine: a printed version drops it."""
    for i, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        for m in re.finditer(r"torch\.__version__(?!\.split\(\s*['\"]\+['\"]\s*\)\[0\])", "".join(cell["source"])):
            line = "".join(cell["source"])[: m.start()].count("\n") + 1
            pytest.fail(
                f"{path.name} cell {i} line {line}: print torch.__version__.split('+')[0], not the build suffix"
            )
