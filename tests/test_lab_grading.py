"""course_lib.labs' grading side: the timeout rule, the check deferred under nbgrader, the check in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.labs import CHECKS
from course_lib.labs.core import TIMEOUT_ENV, deferred_to_grader, lab_timeout, run_lab
from course_lib.labs.grading import EXIT_CODES, grade_lab, run_check
from course_lib.manifest import labs


def test_every_lab_of_the_manifest_has_its_check_registered() -> None:
    assert CHECKS == {lab.stem: lab.check for lab in labs()}


def test_the_timeout_is_the_argument_then_the_environment_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert lab_timeout(None, 120.0) == 120.0 and lab_timeout(30, 120.0) == 30.0
    monkeypatch.setenv(TIMEOUT_ENV, "45")
    assert lab_timeout(None, 120.0) == 45.0 and lab_timeout(30, 120.0) == 30.0
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=r"\$COURSE_LAB_TIMEOUT must be a number"):
        lab_timeout(None, 120.0)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
            lab_timeout(bad, 120.0)
    with pytest.raises(TypeError, match="timeout must be a number"):
        lab_timeout(True, 120.0)  # type: ignore[arg-type]


def test_under_nbgrader_autograde_the_kernel_leaves_the_verdict_to_the_grader(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert deferred_to_grader("lab") is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    deferred = deferred_to_grader("lab")
    assert deferred is not None and deferred.status == "deferred" and not deferred
    assert "fresh process" in str(deferred)

    def never(results: object) -> list[object]:
        raise AssertionError("nothing is launched")

    result = run_lab("lab", tmp_path / "x.py", "nowhere:harness", never, nprocs=2)  # type: ignore[arg-type]
    assert result.status == "deferred"


def test_run_lab_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="solution must be the path"):
        run_lab("lab", 3, "m:f", lambda r: [], nprocs=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lab must be a non-empty name"):
        run_lab(" ", "x.py", "m:f", lambda r: [], nprocs=2)


def test_an_unknown_lab_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no lab 'lab_99'"):
        grade_lab("lab_99")
    with pytest.raises(TypeError, match="lab must be a lab's name"):
        run_check(10)  # type: ignore[arg-type]


def test_a_missing_file_is_not_done_yet_in_a_fresh_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match=r"\[lab_11_ddp\] not graded as correct: ⏳ Not done yet"):
        grade_lab("lab_11_ddp", timeout=30)
    done = subprocess.run(
        [sys.executable, "-I", "-m", "course_lib.labs", "lab_18_experts", "--solution", str(tmp_path / "none.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_CODES["not done yet"], done.stderr
    assert "Not done yet" in done.stdout
