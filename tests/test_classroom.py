"""The classroom editions and the grader: what the student gets holds no solution, and grading sample submissions
(right, wrong, blank, hanging, hostile) gives the expected scores, with no process left behind."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from course_lib.manifest import ROOT, labs
from course_tools.classroom import CHECK_ID, POINTS, SOLUTION_ID, build_instructor, build_student, source_notebook
from course_tools.grading import (
    TOKEN_ENV,
    LabGrade,
    collect,
    failure_reason,
    feedback_markdown,
    grade_all,
    graded_cell_messages,
    sweep,
)
from course_tools.grading_kernel import sandbox_works
from course_tools.grading_samples import LABS, write_samples
from course_tools.labs import _REGION, reference, skeleton

LABS_ALL = labs()


@pytest.mark.parametrize("lab", LABS_ALL, ids=lambda lab: lab.stem)
def test_the_source_notebook_holds_the_solution_and_a_graded_check(lab: object) -> None:
    notebook = source_notebook(lab)  # type: ignore[arg-type]
    marked = {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells if "nbgrader" in c.metadata}
    assert set(marked) == {SOLUTION_ID, CHECK_ID}
    solution, check = marked[SOLUTION_ID], marked[CHECK_ID]
    assert solution.metadata["nbgrader"]["solution"] and not solution.metadata["nbgrader"]["grade"]
    assert solution.source.split("\n", 1)[1] == reference(lab.stem).rstrip("\n")  # type: ignore[attr-defined]
    assert check.metadata["nbgrader"]["grade"] and check.metadata["nbgrader"]["points"] == POINTS
    assert check.metadata["nbgrader"]["locked"]
    assert f"grade_lab({lab.stem!r})" in check.source and "### BEGIN HIDDEN TESTS" in check.source  # type: ignore[attr-defined]
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")


def test_submissions_are_collected_in_either_layout(tmp_path: Path) -> None:
    (tmp_path / "ann" / "lab_11_ddp").mkdir(parents=True)
    (tmp_path / "ann" / "lab_11_ddp" / "lab_11_ddp.ipynb").write_text("{}")
    (tmp_path / "ben").mkdir()
    (tmp_path / "ben" / "lab_18_experts.ipynb").write_text("{}")
    found = collect(tmp_path, ["lab_11_ddp", "lab_18_experts"])
    assert sorted(found) == ["ann", "ben"]
    assert list(found["ann"]) == ["lab_11_ddp"] and list(found["ben"]) == ["lab_18_experts"]
    (tmp_path / "bad name").mkdir()
    with pytest.raises(ValueError, match="student folder 'bad name'"):
        collect(tmp_path, ["lab_11_ddp"])
    with pytest.raises(FileNotFoundError):
        collect(tmp_path / "none", ["lab_11_ddp"])


def test_failures_are_named_and_feedback_gathers_the_checks_messages() -> None:
    assert "kernel died" in failure_reason("... nbclient.exceptions.DeadKernelError: Kernel died")
    assert "time limit" in failure_reason("nbclient.exceptions.CellTimeoutError: A cell timed out")
    assert failure_reason("line one\nsomething else broke\n").endswith("something else broke")
    text = feedback_markdown(
        "ann", [LabGrade("ann", "lab_a", POINTS, "", ["✅ Correct"]), LabGrade("ann", "lab_b", 0, "no submission")]
    )
    assert f"Total: {POINTS} / {2 * POINTS} points" in text and "Scored 0: no submission." in text
    assert "✅ Correct" in text


def test_the_sweep_kills_what_a_run_left_behind() -> None:
    token = uuid.uuid4().hex
    env = dict(os.environ, **{TOKEN_ENV: token})
    child = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    try:
        # Popen returns after fork: until the child has exec'd `sleep`, /proc shows this process's environment
        # (without the token) and command line. In a graded run the token is inherited, so the sweep sees a child
        # from its fork on; here the test waits for the exec (it took over 0.5 s on a loaded machine once).
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
            assert time.monotonic() < deadline, "the child never exec'd sleep"
            time.sleep(0.01)
        killed = sweep(token, grace=0.5)
        assert len(killed) == 1 and f"pid {child.pid}: sleep 120" in killed[0]
        assert child.wait(timeout=10) == -9
        assert sweep(token, grace=0.1) == []
    finally:
        if child.poll() is None:
            child.kill()


def _solution_lines(stem: str) -> set[str]:
    """The lines only the solution has: inside its solution regions, not in the skeleton handed out."""
    handed_out = {line.strip() for line in skeleton(reference(stem)).splitlines()}
    lines = set()
    for region in _REGION.finditer(reference(stem)):
        for line in region.group(0).splitlines()[1:-1]:
            if line.strip() and not line.strip().startswith("#") and line.strip() not in handed_out:
                lines.add(line.strip())
    return lines


def _normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def editions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("editions")
    return build_student(root / "student"), build_instructor(root / "instructor")


@pytest.mark.slow
def test_the_student_edition_holds_no_solution(editions: tuple[Path, Path]) -> None:
    student, instructor = editions
    files = {p: p.read_text(errors="replace") for p in student.rglob("*") if p.is_file()}
    assert not any(p.name.endswith("_mutants.py") or p.parent.name in ("solutions", "tests") for p in files)
    assert not (student / "sources").exists() and not (student / "docs").exists()
    for path, text in files.items():
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "grade_lab("):
            assert marker not in text or path.name == "grading.py", f"{marker!r} in {path}"
    everything = _normalized("\n".join(files.values()))
    for lab in LABS_ALL:
        for region in _REGION.finditer(reference(lab.stem)):
            body = [line for line in region.group(0).splitlines()[1:-1] if line.strip()]
            if len(body) >= 3:  # a one- or two-line region can be an idiom the lecture notebooks teach
                text = _normalized("\n".join(body))
                assert text not in everything, f"{lab.stem}: a whole solution region is in the edition"
        released = nbformat.read(student / "notebooks" / f"{lab.stem}.ipynb", as_version=4)
        cells = [c.source for c in released.cells if c.source.startswith("%%writefile")]  # what the learner fills in
        code = {line.strip() for source in cells for line in source.splitlines()}
        leaked = [line for line in _solution_lines(lab.stem) if line in code]
        assert leaked == [], f"{lab.stem}: solution lines in the released notebook: {leaked}"
        # the released skeleton is the one the self-study notebook hands out
        committed = nbformat.read(ROOT / "notebooks" / f"{lab.stem}.ipynb", as_version=4)
        assert cells == [c.source for c in committed.cells if c.source.startswith("%%writefile")]
    # the instructor edition has what the student's lacks
    assert (instructor / "nbgrader" / "gradebook.db").is_file() and (instructor / "instructor_guide.md").is_file()
    assert sorted(p.name for p in (instructor / "solutions").glob("lab_*.py") if "mutants" not in p.name) == sorted(
        f"{lab.stem}.py" for lab in LABS_ALL
    )
    source = (instructor / "nbgrader" / "source" / "lab_11_ddp" / "lab_11_ddp.ipynb").read_text()
    assert "BEGIN SOLUTION" in source and "BEGIN HIDDEN TESTS" in source


def _marked_processes() -> list[str]:
    """Processes carrying any grading run's marker (none may survive the grader)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{TOKEN_ENV}=".encode() in (entry / "environ").read_bytes():
                    found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_grading_the_sample_submissions(editions: tuple[Path, Path], tmp_path: Path) -> None:
    student, instructor = editions
    out = tmp_path / "grades"
    secrets = [str(out / "nbgrader" / "gradebook.db"), str(instructor / "solutions" / "lab_11_ddp.py")]
    secrets.append(str(ROOT / "solutions" / "lab_11_ddp.py"))
    expected = write_samples(tmp_path / "submissions", student, secrets)
    start = time.monotonic()
    grades = grade_all(
        tmp_path / "submissions", instructor / "nbgrader", out, lab_timeout=90, cell_timeout=20, disk_mb=64
    )
    seconds = time.monotonic() - start
    print(f"graded {len(expected)} students in ~{seconds:.0f} s")
    assert _marked_processes() == []
    # the scores, in nbgrader's export and in the feedback
    with open(out / "grades.csv", newline="") as f:
        exported = {(row["student_id"], row["assignment"]): float(row["score"]) for row in csv.DictReader(f)}
    by_key = {(g.student, g.lab): g for g in grades}
    for name, per_lab in expected.items():
        feedback = (out / "feedback" / f"{name}.md").read_text()
        for lab in LABS:
            score, phrase = per_lab.get(lab, (0, "no submission"))
            assert exported[(name, lab)] == score, (name, lab, by_key[(name, lab)])
            assert by_key[(name, lab)].score == score
            section = feedback.split(f"## {lab}:")[1].split("\n## ")[0]
            assert phrase in section, (name, lab, section)
    assert sum(exported.values()) == 2 * POINTS  # the correct student's two labs, nothing else
    assert (out / "nbgrader" / "feedback" / "correct" / "lab_11_ddp" / "lab_11_ddp.html").is_file()
    # the notebook that looked for the gradebook and the solutions found none of them, where a sandbox exists
    graded = out / "nbgrader" / "autograded" / "correct" / "lab_11_ddp" / "lab_11_ddp.ipynb"
    assert any("every check passed" in line for line in graded_cell_messages(graded))
    notebook = nbformat.read(graded, as_version=4)
    said = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "snoop:" in said
    if sandbox_works():
        assert "snoop: 0 of 3 secret paths found" in said, said
