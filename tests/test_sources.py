"""Every notebook has a text source in sources/ that agrees with it; syncing keeps ids and outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_lib.manifest import ROOT, notebook_paths
from course_tools import execute_notebooks, sync_notebooks


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_notebook_and_text_source_agree(path: Path) -> None:
    text = sync_notebooks.source_path(path)
    assert text.is_file(), f"{text.relative_to(ROOT)} is missing: run `make sync FROM=ipynb`"
    diff = sync_notebooks.differences(nbformat.read(path, as_version=4), sync_notebooks.read_text(text))
    assert not diff, (
        f"{path.name} and {text.name} are out of sync ({diff[:3]}): run `make sync` or `make sync FROM=ipynb`"
    )
    assert text.read_text() == sync_notebooks.to_text(nbformat.read(path, as_version=4)), "not in canonical form"


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title\n\nOne sentence."),
        nbformat.v4.new_code_cell("print(1)"),
        nbformat.v4.new_markdown_cell("More text."),
    ]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[1].execution_count = 1
    for cell in nb.cells:
        cell.metadata["slideshow"] = {"slide_type": "-"}
    return nb


def test_a_markdown_edit_keeps_every_id_and_output_and_needs_no_execution() -> None:
    old = _notebook()
    new = nbformat.from_dict(old)
    new.cells[0].source = "# Title\n\nOne better sentence."
    new.cells[2].metadata["slideshow"] = {"slide_type": "slide"}
    merged, code_changed = sync_notebooks.merge(old, new)
    assert not code_changed
    assert [c.id for c in merged.cells] == [c.id for c in old.cells]
    assert merged.cells[0].source.endswith("better sentence.") and merged.cells[1].outputs == old.cells[1].outputs
    assert merged.cells[2].metadata["slideshow"]["slide_type"] == "slide"


def test_a_code_edit_clears_that_cell_and_asks_for_execution() -> None:
    old = _notebook()
    new = nbformat.from_dict(old)
    new.cells[1].source = "print(2)"
    new.cells.insert(2, nbformat.v4.new_code_cell("x = 3"))
    merged, code_changed = sync_notebooks.merge(old, new)
    assert code_changed and len(merged.cells) == 4
    assert merged.cells[1].id == old.cells[1].id and merged.cells[1].outputs == []
    assert merged.cells[2].id not in {c.id for c in old.cells} and merged.cells[3].id == old.cells[2].id


def test_deleting_a_code_cell_asks_for_execution() -> None:
    old = _notebook()
    new = nbformat.from_dict(old)
    del new.cells[1]
    merged, code_changed = sync_notebooks.merge(old, new)
    assert code_changed and [c.id for c in merged.cells] == [old.cells[0].id, old.cells[2].id]


def test_text_round_trip_keeps_cells_and_slide_metadata() -> None:
    nb = _notebook()
    nb.cells[1].metadata["tags"] = ["nbval-ignore-output"]
    back = nbformat.reads(nbformat.writes(nb), as_version=4)
    text_nb = sync_notebooks.read_text_from_string(sync_notebooks.to_text(back))
    assert sync_notebooks.differences(nb, text_nb) == []


def test_the_executor_keeps_outputs_that_equal_the_old_ones_after_sanitizing() -> None:
    old = _notebook()
    old.cells[1].outputs[0].text = "step ~3.1 ms\n"
    new = nbformat.from_dict(old)
    new.cells[1].outputs[0].text = "step ~4.7 ms\n"
    assert execute_notebooks.keep_unchanged_outputs(old, new) == 1
    assert new.cells[1].outputs[0].text == "step ~3.1 ms\n"
    new.cells[1].outputs[0].text = "step 4.7 ms\n"  # not a '~' number: a real change
    assert execute_notebooks.keep_unchanged_outputs(old, new) == 0
    assert new.cells[1].outputs[0].text == "step 4.7 ms\n"


def test_the_executor_rewrites_outputs_only(tmp_path: Path) -> None:
    nb = _notebook()
    nb.cells[1].source = "print('[00:01<00:02]')  # looks like a tqdm time, but it is code"
    nb.cells[1].outputs[0].text = "100%|##| 2/2 [00:01<00:02]\n"
    cleaned = execute_notebooks.clean(nb)
    assert cleaned.cells[1].source.startswith("print('[00:01<00:02]')")
    assert cleaned.cells[1].outputs[0].text == "100%|##| 2/2 [elapsed]\n"
