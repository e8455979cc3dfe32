"""The student edition in JupyterLab, as a student uses it: open a lab as handed out, paste a solution into the cell
that writes it, run the notebook, and see the lab's check pass (real processes, launched from the page's kernel)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import ARTIFACTS, Lab, start_jupyterlab, stop_jupyterlab
from test_jupyterlab import OUTPUT, menu_command, open_notebook

from course_tools.classroom import build_student
from course_tools.labs import reference, without_markers

pytestmark = pytest.mark.slow  # builds the edition and drives a browser: `make test-browser`

LAB = "lab_18_experts"
EDITOR = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell"


@pytest.fixture(scope="module")
def student_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on the student edition's notebooks, its kernels importing the edition's own course_lib."""
    ARTIFACTS.mkdir(exist_ok=True)
    edition = build_student(tmp_path_factory.mktemp("edition") / "student")
    env = {"PYTHONPATH": os.pathsep.join([str(edition), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc, server = start_jupyterlab(
        tmp_path_factory.mktemp("student-lab"), ARTIFACTS / "student-edition-server.log", edition / "notebooks", env
    )
    try:
        yield server
    finally:
        stop_jupyterlab(proc, server)


def test_a_student_pastes_a_solution_into_a_lab_and_its_check_passes(student_lab: Lab, offline_page) -> None:
    page = offline_page.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=student_lab.base)
    open_notebook(page, student_lab, f"{LAB}.ipynb", "student")
    cell = page.locator(EDITOR).filter(has_text="%%writefile").first
    editor = cell.locator(".cm-content")
    assert "YOUR CODE HERE" in editor.inner_text(), "the lab is handed out with its skeleton"
    first_line = editor.inner_text().split("\n", 1)[0]
    solution = f"{first_line}\n{without_markers(reference(LAB))}"
    page.evaluate("text => navigator.clipboard.writeText(text)", solution)
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Control+V")
    pasted = editor.inner_text()
    assert "YOUR CODE HERE" not in pasted and "all_to_all_single" in pasted
    menu_command(page, "Run", "runmenu:run-all")
    page.wait_for_function(
        "sel => [...document.querySelectorAll(sel)].some(o => /Correct|Not quite|Not done yet|Error/.test(o.innerText))"
        " && document.querySelector(\".jp-Notebook-ExecutionIndicator[data-status='idle']\")",
        arg=OUTPUT,
        timeout=240_000,
        polling=500,
    )
    said = "\n".join(page.locator(OUTPUT).all_inner_texts())
    assert "✅ Correct" in said and "every check passed" in said, said[-3000:]
    offline_page.assert_offline(complete=False)
