"""The course manifest (``course.toml``), read: the one list of notebooks, in order, and what belongs to each.

The manifest gives each notebook's stem, title, one-line summary, lecture and exercise minutes, its
exercise-check module, what is worth running live and how it is taught, and its footprint: the
``course_lib`` modules, benchmarks and tests that belong to it. Everything that lists the notebooks
reads it through :func:`course` and :func:`notebook_paths`: the scripts, the tests, notebook 00's
course map (:func:`course_map`). A benchmark or test reads a notebook's own script with
:func:`written_file`.

This module only reads. What is generated from the manifest (README's table, the instructor guide,
the comparison tables in the text sources) is written by the repository's tooling:
``python -m course_tools.manifest --write`` (``make generated``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .validation import check_instance

__all__ = ["Lab", "Notebook", "ROOT", "course", "course_map", "lab_paths", "labs", "notebook_paths", "written_file"]

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "course.toml"
_FIELDS = {
    "stem": str,
    "title": str,
    "summary": str,
    "lecture": int,
    "exercises": int,
    "exercise_module": str,
    "live": str,
    "teach": str,
}
# The footprint: optional lists of names, checked by tests/test_footprint.py (complete, and naming real files).
# modules: course_lib modules besides the exercise module ("sharding", "launch", "exercises.core");
# benchmarks: files in benchmarks/ ("all_reduce.py"); tests: files in tests/ ("test_sharding.py").
FOOTPRINT_FIELDS = ("modules", "benchmarks", "tests")


@dataclass(frozen=True)
class Notebook:
    """One entry of the manifest."""

    stem: str
    title: str
    summary: str
    lecture: int
    exercises: int
    exercise_module: str
    live: str
    teach: str
    modules: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()

    @property
    def number(self) -> str:
        """The two digits the stem starts with (``"04"``)."""
        return self.stem[:2]

    @property
    def path(self) -> Path:
        return ROOT / "notebooks" / f"{self.stem}.ipynb"


def course(manifest: str | Path | None = None) -> list[Notebook]:
    """The notebooks of the course, in order, checked: numbered from 00 upwards, in order, and every field present.

    >>> [n.number for n in course()][:3]
    ['00', '01', '02']
    """
    path = Path(manifest) if manifest is not None else MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"the course manifest {path} does not exist")
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("notebook")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path.name} must hold a list of [[notebook]] tables")
    notebooks: list[Notebook] = []
    for i, entry in enumerate(entries):
        missing = sorted(set(_FIELDS) - set(entry))
        extra = sorted(set(entry) - set(_FIELDS) - set(FOOTPRINT_FIELDS))
        if missing or extra:
            raise ValueError(f"{path.name}, notebook {i}: missing fields {missing}, unknown fields {extra}")
        for name, kind in _FIELDS.items():
            if not isinstance(entry[name], kind) or isinstance(entry[name], bool):
                raise ValueError(f"{path.name}, notebook {i}: {name} must be a {kind.__name__}, got {entry[name]!r}")
        for name in FOOTPRINT_FIELDS:
            names = entry.get(name, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{path.name}, notebook {i}: {name} must be a list of strings, got {names!r}")
            entry = {**entry, name: tuple(names)}
        number = re.fullmatch(r"(\d\d)_[a-z0-9_]+", entry["stem"])
        previous = int(notebooks[-1].stem[:2]) if notebooks else -1
        if not number or (int(number[1]) != 0 if i == 0 else int(number[1]) <= previous):
            wanted = "00_topic" if i == 0 else f"NN_topic with NN > {previous:02d}"
            raise ValueError(
                f"{path.name}, notebook {i}: stem must be '{wanted}' (numbered in order), got {entry['stem']!r}"
            )
        notebooks.append(Notebook(**entry))
    return notebooks


_LAB_FIELDS = {"stem": str, "title": str, "summary": str, "after": str, "minutes": int, "check": str}


@dataclass(frozen=True)
class Lab:
    """One ``[[lab]]`` entry: a notebook where the learner writes a distributed mechanism, after notebook ``after``."""

    stem: str
    title: str
    summary: str
    after: str  # the stem of the notebook it follows
    minutes: int  # expected time for a learner who has done the notebook
    check: str  # "course_lib.labs.<module>:<function>": the check the lab notebook calls

    @property
    def path(self) -> Path:
        return ROOT / "notebooks" / f"{self.stem}.ipynb"

    @property
    def module(self) -> str:
        """The lab's module in ``course_lib`` (``labs.ddp``)."""
        return self.check.split(":")[0].removeprefix("course_lib.")


def labs(manifest: str | Path | None = None) -> list[Lab]:
    """The labs, in course order, checked: ``lab_NN_topic`` after notebook NN, which exists, every field present.

    >>> labs()[0].after[:2] == labs()[0].stem[4:6]
    True
    """
    path = Path(manifest) if manifest is not None else MANIFEST
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("lab", [])
    if not isinstance(entries, list):
        raise ValueError(f"{path.name}: [[lab]] must be a list of tables")
    stems = {n.stem for n in course(path)}
    found: list[Lab] = []
    for i, entry in enumerate(entries):
        missing, extra = sorted(set(_LAB_FIELDS) - set(entry)), sorted(set(entry) - set(_LAB_FIELDS))
        if missing or extra:
            raise ValueError(f"{path.name}, lab {i}: missing fields {missing}, unknown fields {extra}")
        for name, kind in _LAB_FIELDS.items():
            if not isinstance(entry[name], kind) or isinstance(entry[name], bool):
                raise ValueError(f"{path.name}, lab {i}: {name} must be a {kind.__name__}, got {entry[name]!r}")
        number = re.fullmatch(r"lab_(\d\d)_[a-z0-9_]+", entry["stem"])
        if not number or entry["after"] not in stems or entry["after"][:2] != number[1]:
            raise ValueError(
                f"{path.name}, lab {i}: stem must be 'lab_NN_topic' and after the notebook NN_..., got "
                f"{entry['stem']!r} after {entry['after']!r}"
            )
        if not re.fullmatch(r"course_lib\.labs\.\w+:check_\w+", entry["check"]):
            raise ValueError(f"{path.name}, lab {i}: check must be 'course_lib.labs.<module>:check_<name>'")
        found.append(Lab(**entry))
    if [lab.stem for lab in found] != sorted(lab.stem for lab in found):
        raise ValueError(f"{path.name}: list the labs in course order (by the notebook they follow)")
    return found


def lab_paths(manifest: str | Path | None = None) -> list[Path]:
    """The lab notebooks' paths, in course order."""
    return [lab.path for lab in labs(manifest)]


def notebook_paths(manifest: str | Path | None = None) -> list[Path]:
    """The notebooks' paths, in course order (what the Makefile, scripts and tests iterate over)."""
    return [n.path for n in course(manifest)]


def written_file(stem: str, filename: str) -> str:
    """The text a notebook writes with ``%%writefile FILENAME``, read from its text source ``sources/STEM.py``.

    A benchmark runs a notebook's own script this way, instead of keeping a copy that could drift.

    >>> "init_process_group" in written_file("11_ddp_in_practice", "_runs/ddp_train.py")
    True
    """
    import jupytext

    check_instance("stem", stem, str, "a notebook's name, such as '11_ddp_in_practice'")
    check_instance("filename", filename, str, "a path a %%writefile cell writes, such as '_runs/ddp_train.py'")
    if stem not in {n.stem for n in course()}:
        raise ValueError(f"stem {stem!r} is not a notebook of the course (course.toml)")
    nb = jupytext.read(ROOT / "sources" / f"{stem}.py", fmt="py:percent")
    for cell in nb.cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type == "code" and first.split() == ["%%writefile", filename]:
            return body + "\n"
    raise ValueError(f"{stem} writes no file {filename!r} with %%writefile")


def course_map(notebooks: list[Notebook] | None = None) -> str:
    """Notebook 00's map of the course: one line per notebook, stem and title (backticks dropped).

    Titles, not the longer summaries: the whole map stays under 4,000 characters, which some notebook viewers cut
    a cell's output at (README's table carries the summaries).
    """
    return "\n".join(f"{n.stem:<34} {n.title.replace('`', '')}" for n in notebooks or course())
