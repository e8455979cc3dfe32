"""The labs' reference solutions, skeletons and mutants: one source (``solutions/lab_*.py``), everything else derived.

A reference solution marks the code the learner writes with nbgrader's markers::

    ### BEGIN SOLUTION
    ...the lines the learner writes...
    ### END SOLUTION

:func:`skeleton` replaces each marked region by nbgrader's code stub (``# YOUR CODE HERE`` and ``raise
NotImplementedError()``, indented like the markers): exactly what ``nbgrader generate_assignment`` writes into the
student's notebook, so the lab notebook committed for self-study and the classroom edition agree. The lab notebook's
skeleton cell (``%%writefile _runs/lab_X.py``) must equal ``skeleton(reference)``: ``tests/test_labs.py`` checks it,
and ``python -m course_tools.labs --write`` rewrites those cells.

:func:`mutate` applies one entry of a lab's mutant catalogue (``solutions/mutants.py``): a small patch of the
reference that plants one typical bug.
"""

from __future__ import annotations

import argparse
import re
import sys

from course_lib.manifest import ROOT

SOLUTIONS = ROOT / "solutions"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
_REGION = re.compile(rf"^(?P<indent>[ \t]*){re.escape(BEGIN)}[ \t]*\n.*?^[ \t]*{re.escape(END)}[ \t]*\n", re.S | re.M)


def skeleton(text: str) -> str:
    """``text`` with every solution region replaced by nbgrader's stub, indented like its markers.

    >>> print(skeleton("def f():\\n    ### BEGIN SOLUTION\\n    return 1\\n    ### END SOLUTION\\n"), end="")
    def f():
        # YOUR CODE HERE
        raise NotImplementedError()
    """
    if text.count(BEGIN) != text.count(END):
        raise ValueError(f"unbalanced markers: {text.count(BEGIN)} BEGIN, {text.count(END)} END")
    out = _REGION.sub(lambda m: "".join(f"{m['indent']}{line}\n" for line in STUB), text)
    if BEGIN in out or END in out:
        raise ValueError("a solution marker is left after stripping: nested or malformed regions")
    return out


def solution_lines(text: str) -> int:
    """How many non-blank, non-comment lines the learner writes (inside the solution regions)."""
    count = 0
    for m in _REGION.finditer(text):
        body = m.group(0).splitlines()[1:-1]
        count += sum(1 for line in body if line.strip() and not line.strip().startswith("#"))
    return count


def without_markers(text: str) -> str:
    """The reference solution as plain code: the marker lines removed."""
    return "".join(line for line in text.splitlines(keepends=True) if line.strip() not in (BEGIN, END))


def mutate(text: str, old: str, new: str) -> str:
    """The reference with one patch: ``old`` (which must occur exactly once) replaced by ``new``."""
    count = text.count(old)
    if count != 1:
        raise ValueError(f"a mutant's patch must match the reference once, found {count} times: {old[:60]!r}")
    return text.replace(old, new)


def reference(stem: str) -> str:
    """The reference solution of lab ``stem`` (``lab_11_ddp``), markers included."""
    path = SOLUTIONS / f"{stem}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no reference solution {path.relative_to(ROOT)}")
    return path.read_text(encoding="utf-8")


def lab_stems() -> list[str]:
    """Every lab that has a reference solution, in order."""
    return sorted(p.stem for p in SOLUTIONS.glob("lab_*.py"))


def write_skeleton_cells() -> list[str]:
    """Rewrite the ``%%writefile`` skeleton cell of each lab's text source from its reference; the stems changed."""
    changed = []
    for stem in lab_stems():
        source = ROOT / "sources" / f"{stem}.py"
        if not source.is_file():
            continue
        text = source.read_text(encoding="utf-8")
        m = re.search(r"^# %%writefile (\S+)\n(.*?)(?=^# %%|\Z)", text, re.S | re.M)
        if m is None:
            raise ValueError(f"{source.name} has no %%writefile cell for the skeleton")
        new = f"# %%writefile {m.group(1)}\n{skeleton(reference(stem))}\n"
        updated = text[: m.start()] + new + text[m.end() :]
        if updated != text:
            source.write_text(updated, encoding="utf-8")
            changed.append(stem)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the labs' skeleton cells in sources/")
    args = parser.parse_args(argv)
    if args.write:
        for stem in write_skeleton_cells():
            print(f"sources/{stem}.py: skeleton rewritten from solutions/{stem}.py (then `make sync`)")
        return 0
    for stem in lab_stems():
        print(f"{stem}: {solution_lines(reference(stem))} lines to write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
