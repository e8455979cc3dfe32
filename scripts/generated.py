"""What is generated from the manifest and the facts: README's table, the instructor guide, the comparison tables.

Generated text lives in files between ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated -->``:

* README.md: ``notebooks`` (:func:`readme_table`);
* docs/instructor_guide.md: ``lecture-plan`` (:func:`lecture_plan`) and ``teaching-notes`` (:func:`teaching_notes`);
* a text source ``sources/NN_topic.py``: ``facts-NAME``, the comparison table ``NAME`` of :data:`TABLES`, rendered
  from :mod:`course_lib.facts` by :func:`table` (after rewriting one, ``make sync`` brings its notebook along).

:func:`write_generated` rewrites them (``python -m course_tools.manifest --write``, ``make generated``);
``tests/test_manifest.py`` fails when one is stale. This is repository tooling: ``course_lib`` reads the manifest
and holds the facts, and writes no file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from course_lib.facts import fact
from course_lib.manifest import ROOT, Notebook, course, labs

__all__ = [
    "TABLES",
    "TableSpec",
    "generated_blocks",
    "lecture_plan",
    "readme_table",
    "table",
    "teaching_notes",
    "write_generated",
]


@dataclass(frozen=True)
class TableSpec:
    """A view of :data:`FACTS`: ``by_row=False`` puts techniques in columns and fields in rows."""

    techniques: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]  # (field in FACTS, its heading in the table)
    corner: str = ""
    by_row: bool = False
    headings: tuple[str, ...] = ()  # column headings instead of the techniques' names


TABLES: dict[str, TableSpec] = {
    "dp-vs-ddp": TableSpec(
        ("dp", "ddp"),
        tuple(
            (f, f.replace("batchnorm", "BatchNorm"))
            for f in (
                "processes",
                "machines",
                "per step",
                "gradient sync",
                "optimizer",
                "data",
                "batchnorm",
                "mixed precision",
                "launch",
                "status",
            )
        ),
    ),
    "parallelism": TableSpec(
        ("ddp", "sharded", "pipeline", "tensor"),
        (
            ("split", "what is split"),
            ("communicated", "communicated"),
            ("idle", "idle time"),
            ("needs", "needs"),
            ("use when", "use when"),
        ),
        headings=("data parallel (DDP)", "sharded data parallel (ZeRO, FSDP)", "pipeline parallel", "tensor parallel"),
    ),
    "transformer-parallelism": TableSpec(
        ("tensor", "sequence", "context", "expert"),
        (
            ("split", "what is split"),
            ("communicated", "communicated"),
            ("idle", "idle time"),
            ("needs", "needs"),
            ("use when", "use when"),
            ("shown", "shown"),
        ),
        headings=("tensor parallel", "sequence parallel", "context parallel", "expert parallel"),
    ),
    "remedies": TableSpec(
        ("checkpointing", "accumulation", "mixed precision", "ddp", "sharded", "pipeline"),
        (("bottleneck", "bottleneck"), ("remedy", "first remedy"), ("cost", "what it costs"), ("shown", "shown")),
        by_row=True,
    ),
}


def table(name: str) -> str:
    """The markdown table ``name`` (one of :data:`TABLES`), built from :data:`FACTS`."""
    if not isinstance(name, str):
        raise TypeError(f"table name must be a string, got {type(name).__name__}")
    if name not in TABLES:
        raise ValueError(f"no table {name!r}; known: {sorted(TABLES)}")
    spec = TABLES[name]
    if spec.by_row:
        rows = [[heading for _, heading in spec.fields]]
        rows += [[fact(t, f) for f, _ in spec.fields] for t in spec.techniques]
    else:
        rows = [[spec.corner, *(spec.headings or [fact(t, "name") for t in spec.techniques])]]
        rows += [[heading] + [fact(t, f) for t in spec.techniques] for f, heading in spec.fields]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines).replace("|  |", "| |")


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


def labs_table() -> str:
    """The labs, in course order: where each belongs, its time, what the learner writes and against what."""
    rows = ["| Lab | After | Time | What you write, and what it is checked against |", "|---|---|---|---|"]
    rows += [f"| `{lab.stem}` | {lab.after[:2]} | {lab.minutes} min | {lab.summary} |" for lab in labs()]
    hours = sum(lab.minutes for lab in labs()) / 60
    rows += ["", f"About **{hours:.1f} hours** of labs in all."]
    return "\n".join(rows)


def teaching_notes(notebooks: list[Notebook] | None = None) -> str:
    """The instructor guide's notes, one per notebook: how its session is cut and taught."""
    return "\n\n".join(f"### {n.number} · {n.title}\n\n{n.teach}" for n in notebooks or course())


_BLOCK = re.compile(r"(<!-- BEGIN generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n<!-- END generated -->)", re.S)


def generated_blocks() -> dict[Path, dict[str, str]]:
    """For each file with generated blocks: the block names and what they must contain."""
    blocks = {
        ROOT / "README.md": {"notebooks": readme_table(), "labs": labs_table()},
        ROOT / "docs" / "instructor_guide.md": {
            "lecture-plan": lecture_plan(),
            "labs": labs_table(),
            "teaching-notes": teaching_notes(),
        },
    }
    for n in course():
        source = ROOT / "sources" / f"{n.stem}.py"
        names = (
            {m.group("name") for m in _BLOCK.finditer(source.read_text(encoding="utf-8"))}
            if source.is_file()
            else set()
        )
        for name in sorted(names):
            if not name.startswith("facts-") or name.removeprefix("facts-") not in TABLES:
                raise ValueError(f"{source.name}: unknown generated block {name!r}; known: facts-{sorted(TABLES)}")
        if names:
            blocks[source] = {name: table(name.removeprefix("facts-")) for name in names}
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
