"""course.toml's footprints are complete and real: every course_lib module, benchmark and test belongs to a notebook
(or to [shared]), and `make footprint` answers "what do I touch to change X?"."""

from __future__ import annotations

import subprocess
import sys

import pytest

from course_lib.manifest import ROOT, course
from course_tools import footprint


def test_every_module_benchmark_and_test_belongs_to_a_notebook_and_every_name_is_a_file() -> None:
    found = footprint.problems()
    assert not found, "course.toml's footprints need fixing:\n  " + "\n  ".join(found)


def test_every_course_lib_module_a_source_imports_is_in_its_footprint() -> None:
    shared = set(footprint.shared()["modules"])
    for n in course():
        listed = {f"exercises.{n.exercise_module}", *n.modules, *shared}
        assert footprint.source_imports(n) <= listed, n.stem


def test_the_checks_say_what_to_add() -> None:
    # a module nobody lists is reported with the notebook that imports it; a name that is no file, with its path
    units = footprint.on_disk()
    assert "collectives" in units["modules"] and "launch" in units["modules"] and "exercises.core" in units["modules"]
    assert "browser/test_jupyterlab.py" in units["tests"] and "all_reduce.py" in units["benchmarks"]
    assert footprint.Unit("modules", "launch").path == ROOT / "course_lib" / "launch"
    assert footprint.Unit("modules", "exercises.core").path == ROOT / "course_lib" / "exercises" / "core.py"


def test_problems_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = footprint.on_disk()
    monkeypatch.setattr(
        footprint,
        "on_disk",
        lambda: {**real, "modules": real["modules"] | {"ring_v2"}, "tests": real["tests"] - {"test_pipeline.py"}},
    )
    found = footprint.problems()
    assert any("course_lib/ring_v2.py belongs to no notebook: add 'ring_v2' to the modules = [...]" in p for p in found)
    assert any("tests names 'test_pipeline.py', which is no file" in p for p in found), found


def test_footprint_of_a_number_and_of_a_word() -> None:
    text = footprint.footprint("09")
    assert text.startswith("09 · ")
    for path in (
        "notebooks/09_data_parallel_and_all_reduce.ipynb",
        "sources/09_data_parallel_and_all_reduce.py",
        "course_lib/exercises/all_reduce.py",
        "course_lib/collectives.py",
        "benchmarks/all_reduce.py",
        "tests/test_exercises_all_reduce.py",
    ):
        assert path in text, path
    ring = footprint.footprint("ring")
    assert "09 · " in ring and "other files that mention 'ring':" in ring
    with pytest.raises(ValueError, match="no notebook matches"):
        footprint.footprint("no-such-topic-anywhere")
    with pytest.raises(ValueError, match="needs a notebook"):
        footprint.footprint(" ")


def test_the_command_prints_a_footprint() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "course_tools.manifest", "--footprint", "14"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "course_lib/sharding.py" in done.stdout and "benchmarks/sharding_memory.py" in done.stdout
