"""The course manifest (course.toml) is the one list of notebooks; what is generated from it is current."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.manifest import ROOT, course, course_map, lab_paths, notebook_paths
from course_tools import generated
from course_tools.generated import lecture_plan, readme_table


def test_the_manifest_lists_exactly_the_notebooks_in_the_folder() -> None:
    listed = notebook_paths()
    on_disk = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert listed == on_disk, "course.toml and notebooks/ disagree: add or remove the manifest entry"
    for entry in course():
        assert (ROOT / "course_lib" / "exercises" / f"{entry.exercise_module}.py").is_file(), entry.stem


def test_each_title_is_the_notebook_heading() -> None:
    for entry in course():
        first = json.loads(entry.path.read_text())["cells"][0]["source"][0].strip()
        assert first == f"# {entry.number} · {entry.title}", f"{entry.stem}: heading {first!r}"


def test_each_notebook_uses_its_exercise_module() -> None:
    for entry in course():
        text = entry.path.read_text()
        assert f"course_lib.exercises.{entry.exercise_module} import" in text, entry.stem


MAX_LECTURE_MINUTES, MAX_SOURCE_LINES = 90, 1100  # CONTRIBUTING.md, "Lecture-sized"


def test_every_notebook_is_lecture_sized() -> None:
    """A notebook is one lecture: at most 90 minutes in course.toml and 1,100 lines of text source."""
    too_long = [f"{e.stem}: {e.lecture} min" for e in course() if e.lecture > MAX_LECTURE_MINUTES]
    too_big = []
    for e in course():
        lines = len((ROOT / "sources" / f"{e.stem}.py").read_text(encoding="utf-8").splitlines())
        if lines > MAX_SOURCE_LINES:
            too_big.append(f"{e.stem}: {lines} lines")
    assert not too_long, f"longer than {MAX_LECTURE_MINUTES} minutes of lecture (split the notebook): {too_long}"
    assert not too_big, f"more than {MAX_SOURCE_LINES} source lines (split or tighten the notebook): {too_big}"


def test_generated_blocks_of_readme_and_guide_are_current() -> None:
    stale = generated.write_generated(check=True)
    assert not stale, f"{stale}: run `make generated` (python -m course_tools.manifest --write)"


def test_renderers() -> None:
    entries = course()
    table = readme_table(entries)
    assert table.count("\n") == len(entries) + 1 and "`00_start_here`" in table
    plan = lecture_plan(entries)
    total = sum(e.lecture for e in entries) / 60
    assert f"About **{total:.1f} hours** of lecture" in plan
    assert course_map(entries).splitlines()[0].startswith("00_start_here ")
    notes = generated.teaching_notes(entries)
    assert notes.count("### ") == len(entries) and all(e.teach in notes for e in entries)
    assert "`" not in course_map(entries)


def test_notebook_00_prints_the_map_from_the_manifest() -> None:
    nb = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text())
    printed = [
        "".join(o.get("text", ""))
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if "course_map()" in "".join(c["source"])
    ]
    assert printed and printed[0].strip() == course_map().strip()


def test_cli_prints_the_paths_and_checks_the_generated_blocks() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "course_tools.manifest"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == [str(p.relative_to(ROOT)) for p in [*notebook_paths(), *lab_paths()]]
    check = subprocess.run(
        [sys.executable, "-m", "course_tools.manifest", "--check"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and "up to date" in check.stdout, check.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "course_tools.manifest", "--nope"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "usage" in bad.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "must hold a list"),
        ('[[notebook]]\nstem = "00_a"\n', "missing fields"),
        (
            '[[notebook]]\nstem = "01_a"\ntitle = "t"\nsummary = "s"\nlecture = 1\nexercises = 1\n'
            'exercise_module = "m"\nlive = "l"\nteach = "h"\n',
            "numbered in order",
        ),
        (
            '[[notebook]]\nstem = "00_a"\ntitle = "t"\nsummary = "s"\nlecture = "1"\nexercises = 1\n'
            'exercise_module = "m"\nlive = "l"\nteach = "h"\n',
            "lecture must be a int",
        ),
        (
            '[[notebook]]\nstem = "00_a"\ntitle = "t"\nsummary = "s"\nlecture = 1\nexercises = 1\n'
            'exercise_module = "m"\nlive = "l"\nteach = "h"\nmodules = "memory"\n',
            "modules must be a list of strings",
        ),
    ],
)
def test_a_broken_manifest_is_refused_clearly(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "course.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        course(path)
    with pytest.raises(FileNotFoundError):
        course(tmp_path / "missing.toml")


def test_written_file_reads_a_script_from_a_notebook_text_source() -> None:
    from course_lib.manifest import written_file

    script = written_file("11_ddp_in_practice", "_runs/ddp_train.py")
    assert script.startswith('"""Train a small MLP') and "destroy_process_group()" in script
    with pytest.raises(ValueError, match="writes no file"):
        written_file("11_ddp_in_practice", "_runs/none.py")
    with pytest.raises(ValueError, match="not a notebook of the course"):
        written_file("99_nothing", "_runs/ddp_train.py")
