"""Every lab: its notebook hands out exactly the reference with the solution removed, the reference passes its check,
the skeleton is "not done yet", and every mutant in the catalogue (a typical bug) is rejected with a pointed message."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jupytext
import pytest

from course_lib.labs.core import LabResult
from course_lib.manifest import ROOT, Lab, labs
from course_tools.labs import mutate, reference, skeleton, solution_lines, without_markers

LABS = labs()


def _catalogue() -> dict[str, list[Any]]:
    spec = importlib.util.spec_from_file_location("lab_mutants", ROOT / "solutions" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lab_mutants"] = module
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = _catalogue()
CASES = [(lab, m) for lab in LABS for m in MUTANTS.get(lab.stem, [])]


def _check(lab: Lab) -> Callable[..., LabResult]:
    module, name = lab.check.split(":")
    return getattr(importlib.import_module(module), name)


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "solution.py"
    path.write_text(text)
    return path


def test_there_are_at_least_eight_labs_and_each_has_five_mutants() -> None:
    assert len(LABS) >= 8, "one lab per mechanism the course builds by hand"
    for lab in LABS:
        assert (ROOT / "solutions" / f"{lab.stem}.py").is_file(), lab.stem
        assert len(MUTANTS.get(lab.stem, [])) >= 5, f"{lab.stem}: at least 5 mutants"
        assert solution_lines(reference(lab.stem)) >= 20, f"{lab.stem}: the learner writes at least ~20 lines"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.stem)
def test_the_notebook_hands_out_the_reference_without_its_solution(lab: Lab) -> None:
    notebook = jupytext.read(ROOT / "sources" / f"{lab.stem}.py", fmt="py:percent")
    cells = [c.source for c in notebook.cells if c.cell_type == "code" and c.source.startswith("%%writefile")]
    assert len(cells) == 1, f"{lab.stem}: one %%writefile cell, the skeleton"
    handed_out = cells[0].split("\n", 1)[1] + "\n"
    assert handed_out == skeleton(reference(lab.stem)), (
        f"{lab.stem}: the skeleton cell differs from solutions/{lab.stem}.py without its solution: run "
        "`python -m course_tools.labs --write`, then `make sync`"
    )
    assert "YOUR CODE HERE" in handed_out and "BEGIN SOLUTION" not in handed_out
    assert lab.check.split(":")[1] in "".join(c.source for c in notebook.cells), "the notebook calls its check"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.stem)
def test_the_reference_passes_and_the_skeleton_is_not_done_yet(lab: Lab, tmp_path: Path) -> None:
    check = _check(lab)
    passed = check(_written(tmp_path, without_markers(reference(lab.stem))))
    assert passed.status == "correct", str(passed)
    blank = check(_written(tmp_path, skeleton(reference(lab.stem))))
    assert blank.status == "not done yet", str(blank)
    assert check(tmp_path / "missing.py").status == "not done yet"


@pytest.mark.slow
@pytest.mark.parametrize(("lab", "mutant"), CASES, ids=[f"{lab.stem}: {m.name}" for lab, m in CASES])
def test_every_mutant_is_rejected_with_a_message_that_points_at_it(lab: Lab, mutant: Any, tmp_path: Path) -> None:
    text = mutate(without_markers(reference(lab.stem)), mutant.old, mutant.new)
    result = _check(lab)(_written(tmp_path, text), timeout=mutant.timeout)
    assert result.status == "wrong", f"{mutant.name}: not rejected\n{result}"
    for expected in mutant.expect:
        assert expected in str(result), f"{mutant.name}: the verdict does not say {expected!r}\n{result}"
