"""The course manifest (``course.toml``): the one list of notebooks, and what is generated from it.

The manifest gives each notebook's stem, title, one-line summary, lecture and exercise minutes, its
exercise-check module and what is worth running live. Everything that lists the notebooks reads it:
the Makefile (``python -m course_lib.manifest``), the scripts, the tests, notebook 00's course map,
README's table, the instructor guide's lecture plan and the site's index.

``python -m course_lib.manifest`` prints the notebook paths, one per line;
``python -m course_lib.manifest --write`` rewrites the generated blocks of README.md and
docs/instructor_guide.md (between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated -->``).
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Notebook",
    "ROOT",
    "course",
    "notebook_paths",
    "written_file",
    "readme_table",
    "lecture_plan",
    "course_map",
    "teaching_notes",
    "generated_blocks",
    "write_generated",
]

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
        extra = sorted(set(entry) - set(_FIELDS))
        if missing or extra:
            raise ValueError(f"{path.name}, notebook {i}: missing fields {missing}, unknown fields {extra}")
        for name, kind in _FIELDS.items():
            if not isinstance(entry[name], kind) or isinstance(entry[name], bool):
                raise ValueError(f"{path.name}, notebook {i}: {name} must be a {kind.__name__}, got {entry[name]!r}")
        number = re.fullmatch(r"(\d\d)_[a-z0-9_]+", entry["stem"])
        previous = int(notebooks[-1].stem[:2]) if notebooks else -1
        if not number or (int(number[1]) != 0 if i == 0 else int(number[1]) <= previous):
            wanted = "00_topic" if i == 0 else f"NN_topic with NN > {previous:02d}"
            raise ValueError(
                f"{path.name}, notebook {i}: stem must be '{wanted}' (numbered in order), got {entry['stem']!r}"
            )
        notebooks.append(Notebook(**entry))
    return notebooks


def notebook_paths(manifest: str | Path | None = None) -> list[Path]:
    """The notebooks' paths, in course order (what the Makefile, scripts and tests iterate over)."""
    return [n.path for n in course(manifest)]


def written_file(stem: str, filename: str) -> str:
    """The text a notebook writes with ``%%writefile FILENAME``, read from its text source ``sources/STEM.py``.

    A benchmark runs a notebook's own script this way, instead of keeping a copy that could drift.

    >>> "init_process_group" in written_file("10_ddp_in_practice", "_runs/ddp_train.py")
    True
    """
    import jupytext

    if stem not in {n.stem for n in course()}:
        raise ValueError(f"{stem!r} is not a notebook of the course (course.toml)")
    nb = jupytext.read(ROOT / "sources" / f"{stem}.py", fmt="py:percent")
    for cell in nb.cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type == "code" and first.split() == ["%%writefile", filename]:
            return body + "\n"
    raise ValueError(f"{stem} writes no file {filename!r} with %%writefile")


def readme_table(notebooks: list[Notebook] | None = None) -> str:
    """README's table of notebooks."""
    rows = ["| # | Notebook | What you will learn |", "|---|----------|---------------------|"]
    rows += [f"| {n.number} | `{n.stem}` | {n.summary} |" for n in notebooks or course()]
    return "\n".join(rows)


def lecture_plan(notebooks: list[Notebook] | None = None) -> str:
    """The instructor guide's lecture plan, with the totals."""
    notebooks = notebooks or course()
    rows = ["| # | Notebook | Lecture | Exercises | Worth running live |", "|---|---|---|---|---|"]
    rows += [f"| {n.number} | {n.title} | {n.lecture} min | {n.exercises} min | {n.live} |" for n in notebooks]
    lecture = sum(n.lecture for n in notebooks) / 60
    exercises = sum(n.exercises for n in notebooks) / 60
    rows += ["", f"About **{lecture:.1f} hours** of lecture plus about **{exercises:.1f} hours** of exercises."]
    return "\n".join(rows)


def teaching_notes(notebooks: list[Notebook] | None = None) -> str:
    """The instructor guide's notes, one per notebook: how its session is cut and taught."""
    return "\n\n".join(f"### {n.number} · {n.title}\n\n{n.teach}" for n in notebooks or course())


def course_map(notebooks: list[Notebook] | None = None) -> str:
    """Notebook 00's map of the course: one line per notebook, stem and summary (backticks dropped)."""
    return "\n".join(f"{n.stem:<34} {n.summary.replace('`', '')}" for n in notebooks or course())


_BLOCK = re.compile(r"(<!-- BEGIN generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n<!-- END generated -->)", re.S)


def generated_blocks() -> dict[Path, dict[str, str]]:
    """For each file with generated blocks: the block names and what they must contain.

    Besides README's and the guide's, the text sources' ``facts-NAME`` blocks: the comparison tables of
    :mod:`course_lib.facts` (after rewriting one, ``make sync`` brings its notebook along).
    """
    from course_lib import facts

    blocks = {
        ROOT / "README.md": {"notebooks": readme_table()},
        ROOT / "docs" / "instructor_guide.md": {"lecture-plan": lecture_plan(), "teaching-notes": teaching_notes()},
    }
    for n in course():
        source = ROOT / "sources" / f"{n.stem}.py"
        names = (
            {m.group("name") for m in _BLOCK.finditer(source.read_text(encoding="utf-8"))}
            if source.is_file()
            else set()
        )
        for name in sorted(names):
            if not name.startswith("facts-") or name.removeprefix("facts-") not in facts.TABLES:
                raise ValueError(
                    f"{source.name}: unknown generated block {name!r}; known: facts-{sorted(facts.TABLES)}"
                )
        if names:
            blocks[source] = {name: facts.table(name.removeprefix("facts-")) for name in names}
    return blocks


def write_generated(check: bool = False) -> list[str]:
    """Rewrite the generated blocks (or, with ``check=True``, only list the stale ones)."""
    stale = []
    for path, blocks in generated_blocks().items():
        text = path.read_text(encoding="utf-8")
        found = {m.group("name") for m in _BLOCK.finditer(text)}
        for name in set(blocks) - found:
            stale.append(f"{path.name}: no generated block '{name}'")
        new = _BLOCK.sub(lambda m: m.group(1) + blocks.get(m.group("name"), m.group("body")) + m.group(4), text)  # noqa: B023 (runs within this iteration)
        if new != text:
            hint = f" (then `make sync NB=notebooks/{path.stem}.ipynb`)" if path.parent.name == "sources" else ""
            stale.append(f"{path.name}: generated blocks are stale{hint}")
            if not check:
                path.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        for line in write_generated() or ["generated blocks are up to date"]:
            print(line)
        return 0
    if args:
        print("usage: python -m course_lib.manifest [--write]", file=sys.stderr)
        return 2
    print("\n".join(str(p.relative_to(ROOT)) for p in notebook_paths()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
