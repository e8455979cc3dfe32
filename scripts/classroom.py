"""The classroom editions of the course, derived with nbgrader from the same files as the self-study course.

    python -m course_tools.classroom student    [--out _editions/student]      # make student-edition
    python -m course_tools.classroom instructor [--out _editions/instructor]   # make instructor-edition

**The nbgrader course.** Each lab is an nbgrader assignment of one notebook. Its *source* notebook is the lab's
committed notebook with the reference solution (``solutions/<lab>.py``, markers included) in its ``%%writefile`` cell,
marked as nbgrader's solution cell, and its check cell made a graded cell (:data:`POINTS` points) whose hidden part
grades the lab in a fresh process (:func:`course_lib.labs.grading.grade_lab`). ``nbgrader generate_assignment``
turns it into the *release* notebook: the solution regions replaced by nbgrader's stub, the hidden part removed.
Because ``course_tools.labs.skeleton`` follows nbgrader's rule, the released cell equals the committed notebook's
skeleton (``tests/test_classroom.py`` checks it).

**The student edition**: ``course_lib``, the lecture notebooks as committed (their exercises are blanks; their checks
live in ``course_lib``), the released labs, the manifest, the pinned requirements and a README. No solution, mutant,
test, text source or instructor's guide.

**The instructor edition**: the nbgrader course folder (``nbgrader/``: configuration, sources with solutions and
hidden tests, releases, gradebook), the reference solutions and their mutant catalogues (``solutions/``), the
instructor guide, and a README with the workflow (release, collect, grade, return feedback).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat

from course_lib.manifest import ROOT, Lab, labs
from course_tools.labs import reference

POINTS = 10  # each lab's points in the gradebook: all or nothing, the lab's check decides
COURSE_ID = "pytorch-training-internals"
EDITIONS = ROOT / "_editions"
SOLUTION_ID, CHECK_ID = "solution", "check"

CONFIG = f'''"""nbgrader's configuration for the course's labs (written by course_tools.classroom)."""
c = get_config()  # noqa: F821 (nbgrader's config loader defines it)
c.CourseDirectory.course_id = "{COURSE_ID}"
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.enforce_metadata = True
'''

GRADE_CELL_HIDDEN = """
### BEGIN HIDDEN TESTS
from course_lib.labs.grading import grade_lab

grade_lab({stem!r})
### END HIDDEN TESTS"""


def _nbgrader_metadata(cell_id: str, *, solution: bool, grade: bool) -> dict[str, object]:
    meta: dict[str, object] = {"grade": grade, "grade_id": cell_id, "locked": not solution, "schema_version": 3}
    meta["solution"] = solution
    if grade:
        meta["points"] = POINTS
    return meta


def source_notebook(lab: Lab) -> nbformat.NotebookNode:
    """Lab ``lab``'s nbgrader source notebook: its committed notebook, the reference in the solution cell, the check
    cell graded, outputs cleared."""
    notebook = nbformat.read(ROOT / "notebooks" / f"{lab.stem}.ipynb", as_version=4)
    check_name = lab.check.split(":")[1]
    solution_cells = [c for c in notebook.cells if c.cell_type == "code" and c.source.startswith("%%writefile")]
    check_cells = [c for c in notebook.cells if c.cell_type == "code" and f"{check_name}(" in c.source]
    if len(solution_cells) != 1 or len(check_cells) != 1:
        raise ValueError(f"{lab.stem}: expected one %%writefile cell and one cell calling {check_name}()")
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    solution = solution_cells[0]
    first_line = solution.source.split("\n", 1)[0]
    solution.source = first_line + "\n" + reference(lab.stem).rstrip("\n")
    solution.metadata["nbgrader"] = _nbgrader_metadata(SOLUTION_ID, solution=True, grade=False)
    check = check_cells[0]
    check.source = check.source.rstrip("\n") + "\n" + GRADE_CELL_HIDDEN.format(stem=lab.stem)
    check.metadata["nbgrader"] = _nbgrader_metadata(CHECK_ID, solution=False, grade=True)
    return notebook


def tool_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for nbgrader: this interpreter's scripts first on PATH (nbgrader runs ``alembic`` by name)."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def nbgrader(course: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``nbgrader <args>`` in the course folder ``course``; raise with its log if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args, "--log-level=WARN"],
        cwd=course,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def build_course(course: Path) -> list[str]:
    """The nbgrader course folder for every lab: configuration, sources, releases, gradebook. Returns the labs."""
    if course.exists():
        shutil.rmtree(course)
    course.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG, encoding="utf-8")
    stems = []
    for lab in labs():
        folder = course / "source" / lab.stem
        folder.mkdir(parents=True)
        nbformat.write(source_notebook(lab), folder / f"{lab.stem}.ipynb")
        nbgrader(course, "generate_assignment", lab.stem, "--force")
        stems.append(lab.stem)
    return stems


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))


def student_pyproject() -> str:
    """The student edition's pyproject.toml: the learner's dependencies, ``course_lib`` only (no repository tooling)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    deps = "\n".join(f'    "{d}",' for d in project["dependencies"])
    return (
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "course_lib"\nversion = "{project["version"]}"\n'
        f'requires-python = "{project["requires-python"]}"\ndependencies = [\n{deps}\n]\n\n'
        '[tool.setuptools]\npackages = ["course_lib", "course_lib.exercises", "course_lib.labs", "course_lib.launch"]\n'
    )


STUDENT_README = """# PyTorch training internals: student edition

The lecture notebooks (`notebooks/00_*` to `23_*`), with their exercises, and the labs (`notebooks/lab_*`), where you
write a distributed mechanism yourself and run it as real processes. Each lab's check tells you what passes and what
does not; your instructor grades the lab notebooks you hand in with the same checks.

Set up once, then open the course (Python 3.11 or later):

    python3 -m venv .venv
    .venv/bin/pip install -r requirements.lock
    .venv/bin/pip install --no-deps -e .
    .venv/bin/jupyter lab notebooks/

In a lab, fill in the places marked `YOUR CODE HERE` in the cell that writes your file, run that cell, then the check
after it. Hand in the lab's notebook as it is (keep its cells; add your own if you like).
"""


def build_student(out: Path) -> Path:
    """The student edition in ``out``: see the module's docstring."""
    if out.exists():
        shutil.rmtree(out)
    (out / "notebooks").mkdir(parents=True)
    course = out.parent / f".{out.name}-nbgrader"
    stems = build_course(course)
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        shutil.copy2(path, out / "notebooks" / path.name)
    for stem in stems:
        shutil.copy2(course / "release" / stem / f"{stem}.ipynb", out / "notebooks" / f"{stem}.ipynb")
    shutil.rmtree(course)
    _copy_tree(ROOT / "course_lib", out / "course_lib")
    for name in ("course.toml", "requirements.lock", "requirements-linux-cuda.lock", "LICENSE"):
        shutil.copy2(ROOT / name, out / name)
    (out / "pyproject.toml").write_text(student_pyproject(), encoding="utf-8")
    (out / "README.md").write_text(STUDENT_README, encoding="utf-8")
    return out


def build_instructor(out: Path) -> Path:
    """The instructor edition in ``out``: see the module's docstring."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    build_course(out / "nbgrader")
    (out / "solutions").mkdir()
    for path in sorted((ROOT / "solutions").glob("*.py")):
        shutil.copy2(path, out / "solutions" / path.name)
    shutil.copy2(ROOT / "docs" / "instructor_guide.md", out / "instructor_guide.md")
    readme = (ROOT / "docs" / "classroom.md").read_text(encoding="utf-8")
    (out / "README.md").write_text(readme, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("edition", choices=["student", "instructor"])
    parser.add_argument("--out", type=Path, help="the folder to write (replaced); default _editions/<edition>")
    args = parser.parse_args(argv)
    out = (args.out or EDITIONS / args.edition).resolve()
    built = build_student(out) if args.edition == "student" else build_instructor(out)
    print(f"{args.edition} edition: {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
