"""What belongs to a notebook, from ``course.toml``: the files to touch when changing what it teaches.

A notebook's footprint is its notebook and text source, its exercise module and that module's tests, and
the manifest's lists: ``modules`` (``course_lib`` modules), ``benchmarks`` and ``tests``. What the whole
course uses is the manifest's ``[shared]`` table. :func:`problems` is what ``tests/test_footprint.py``
asserts: every ``course_lib`` module, benchmark and test belongs to some notebook or to ``[shared]``, every
name is a real file, and every module a text source imports is listed. Its messages say what to add.

    python -m course_tools.manifest --footprint 09      # or: make footprint NB=09
    python -m course_tools.manifest --footprint ring    # every notebook whose manifest entry says "ring"

The answer to "what do I touch to change the ring?" is the second line: the notebooks that teach it, their
files, and every other file of the repository that mentions the word.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from course_lib.manifest import FOOTPRINT_FIELDS, MANIFEST, ROOT, Notebook, course

__all__ = ["KINDS", "Unit", "footprint", "matching", "on_disk", "problems", "shared", "source_imports"]

# kind -> (folder, how a name becomes a path)
KINDS = {
    "modules": "course_lib",
    "benchmarks": "benchmarks",
    "tests": "tests",
}


@dataclass(frozen=True)
class Unit:
    """One module, benchmark or test, by the name the manifest uses."""

    kind: str
    name: str

    @property
    def path(self) -> Path:
        if self.kind == "modules":
            parts = self.name.split(".")
            package = ROOT / "course_lib" / Path(*parts)
            return package if package.is_dir() else ROOT / "course_lib" / Path(*parts[:-1]) / f"{parts[-1]}.py"
        return ROOT / KINDS[self.kind] / self.name


def on_disk() -> dict[str, set[str]]:
    """Every course_lib module (a package such as ``launch`` counts as one), benchmark and test file, by kind."""
    lib = ROOT / "course_lib"
    modules = {p.stem for p in lib.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in lib.iterdir() if (p / "__init__.py").is_file() and p.name != "exercises"}
    modules |= {f"exercises.{p.stem}" for p in (lib / "exercises").glob("*.py") if p.stem != "__init__"}
    tests = {str(p.relative_to(ROOT / "tests")) for p in (ROOT / "tests").rglob("test_*.py")}
    return {"modules": modules, "benchmarks": {p.name for p in (ROOT / "benchmarks").glob("*.py")}, "tests": tests}


def shared(manifest: Path = MANIFEST) -> dict[str, tuple[str, ...]]:
    """The manifest's ``[shared]`` table: what the whole course uses, by kind."""
    table = tomllib.loads(manifest.read_text(encoding="utf-8")).get("shared", {})
    return {kind: tuple(table.get(kind, ())) for kind in FOOTPRINT_FIELDS}


def _own(n: Notebook) -> dict[str, list[str]]:
    """The notebook's own names by kind: the manifest's lists plus its exercise module and that module's tests."""
    own = {kind: list(getattr(n, kind)) for kind in FOOTPRINT_FIELDS}
    own["modules"].insert(0, f"exercises.{n.exercise_module}")
    exercise_tests = f"test_exercises_{n.exercise_module}.py"
    if (ROOT / "tests" / exercise_tests).is_file():
        own["tests"].insert(0, exercise_tests)
    return own


_IMPORT = re.compile(r"^\s*(?:from|import)\s+course_lib\.([\w.]+)", re.M)


def source_imports(n: Notebook) -> set[str]:
    """The course_lib modules the notebook's text source imports (``launch`` for ``course_lib.launch.x``)."""
    source = ROOT / "sources" / f"{n.stem}.py"
    names = set(_IMPORT.findall(source.read_text(encoding="utf-8"))) if source.is_file() else set()
    return {name if name.startswith("exercises.") else name.split(".")[0] for name in names}


def problems() -> list[str]:
    """What is wrong with the footprints, each message saying what to add or fix (empty: all is well)."""
    notebooks = course()
    found = on_disk()
    common = shared()
    owners: dict[tuple[str, str], list[str]] = {}
    out = []
    for n in notebooks:
        for kind, names in _own(n).items():
            for name in names:
                owners.setdefault((kind, name), []).append(n.stem)
                if name not in found[kind]:
                    out.append(
                        f"course.toml, {n.stem}: {kind} names {name!r}, which is no file ({Unit(kind, name).path})"
                    )
        missing = sorted(source_imports(n) - set(_own(n)["modules"]) - set(common["modules"]))
        if missing:
            out.append(
                f"course.toml, {n.stem}: its text source imports course_lib modules it does not list: add them to its "
                f"modules = [...]: {', '.join(repr(m) for m in missing)}"
            )
    for kind, names in common.items():
        for name in names:
            owners.setdefault((kind, name), []).append("[shared]")
            if name not in found[kind]:
                out.append(f"course.toml, [shared]: {kind} names {name!r}, which is no file ({Unit(kind, name).path})")
    for kind in KINDS:
        for name in sorted(found[kind]):
            if (kind, name) not in owners:
                users = [n.stem for n in notebooks if kind == "modules" and name in source_imports(n)]
                where = f"the notebook(s) {', '.join(users)}" if users else "the notebook it belongs to, or to [shared]"
                out.append(
                    f"{Unit(kind, name).path.relative_to(ROOT)} belongs to no notebook: add {name!r} to the "
                    f"{kind} = [...] of {where} in course.toml"
                )
    return out


def matching(query: str) -> list[Notebook]:
    """The notebooks a query names: a number (``9``, ``09``), a stem, or a word in the manifest entry."""
    notebooks = course()
    q = Path(query.strip()).name.removesuffix(".ipynb").removesuffix(".py").lower()  # a path names its notebook
    if q.isdigit():
        return [n for n in notebooks if int(n.number) == int(q)]
    exact = [n for n in notebooks if n.stem == q]
    if exact:
        return exact
    word = re.compile(rf"\b{re.escape(q)}", re.I)
    return [n for n in notebooks if any(word.search(text) for text in (n.stem, n.title, n.summary, n.live, n.teach))]


def _mentions(word: str, exclude: set[Path]) -> list[str]:
    """Tracked files (notebooks' .ipynb left out: their sources stand for them) that mention ``word``."""
    try:
        done = subprocess.run(
            ["git", "grep", "-l", "-i", "-w", "-e", word, "--", ".", ":!notebooks/*.ipynb", ":!*.lock", ":!*.json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in done.stdout.splitlines() if (ROOT / line) not in exclude]


def footprint(query: str) -> str:
    """The footprint of the notebooks a query names, as text; with a word, the other files that mention it."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError("footprint needs a notebook number, a stem or a word (such as 'ring')")
    found = matching(query)
    if not found:
        raise ValueError(
            f"no notebook matches {query!r}: give a number (09), a stem, or a word from its title or summary"
        )
    users: dict[tuple[str, str], list[str]] = {}
    for n in course():
        for kind, names in _own(n).items():
            for name in names:
                users.setdefault((kind, name), []).append(n.number)
    lines: list[str] = []
    listed: set[Path] = set()
    for n in found:
        lines += [
            f"{n.number} · {n.title}",
            f"  notebook   notebooks/{n.stem}.ipynb",
            f"  source     sources/{n.stem}.py",
        ]
        listed |= {ROOT / "notebooks" / f"{n.stem}.ipynb", ROOT / "sources" / f"{n.stem}.py"}
        for kind, names in _own(n).items():
            for name in names:
                path = Unit(kind, name).path
                listed.add(path)
                others = [u for u in users[(kind, name)] if u != n.number]
                also = f"   (also {', '.join(others)})" if others else ""
                lines.append(f"  {kind[:-1]:<10} {path.relative_to(ROOT)}{'/' if path.is_dir() else ''}{also}")
        lines.append("")
    if not query.strip().isdigit() and not any(n.stem == query.strip() for n in found):
        mentions = _mentions(query.strip(), listed)
        if mentions:
            lines.append(f"other files that mention {query.strip()!r}:")
            lines += [f"  {m}" for m in mentions]
    return "\n".join(lines).rstrip() + "\n"
