"""Sample submissions for trying the grader, with the scores they must get: the right, the wrong and the hostile.

    python -m course_tools.grading_samples OUT [--student-edition _editions/student]    # make grade-demo

Six students hand in two labs (:data:`LABS`), made from the student edition's released notebooks:

* ``correct``: the reference solutions; its first notebook also tries to read the gradebook, the instructor's
  solutions and the repository's tests (it must find none of them in the sandbox), and prints what it found;
* ``buggy``: a typical bug from each lab's mutant catalogue (the sum where a mean belongs; swapped split sizes);
* ``blank``: the released notebooks, untouched;
* ``hangs``: a job where rank 0 waits for a message that never comes; a cell that sleeps forever;
* ``vandal``: correct code, then a cell that kills its own kernel; correct code, then a cell that leaves a process
  running in the background;
* ``disk``: correct code, then a cell that writes until the disk is full; the second lab never handed in.

Every lab but the two correct ones must score 0, each for its own reason: :data:`EXPECTED` gives the score and a
phrase of the feedback for each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from course_lib.manifest import ROOT
from course_tools.classroom import EDITIONS, POINTS
from course_tools.labs import mutate, reference, without_markers

LABS = ("lab_11_ddp", "lab_18_experts")
_MUTANTS = {"lab_11_ddp": "sums instead of averaging", "lab_18_experts": "input and output split sizes swapped"}
_HANG = (  # rank 0 waits at construction for a message rank 1 never sends; rank 1 then waits for rank 0
    "        with torch.no_grad():\n            for t in [*module.parameters(), *module.buffers()]:",
    "        if dist.get_rank() == 0:\n            dist.recv(torch.empty(1), src=1)\n"
    "        with torch.no_grad():\n            for t in [*module.parameters(), *module.buffers()]:",
)
SLEEP = "import time\n\ntime.sleep(10**6)  # a cell that never ends"
KILL = "import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)  # the kernel kills itself"
BACKGROUND = 'import subprocess\n\nsubprocess.Popen(["sleep", "600"], start_new_session=True)  # left running'
FILL = """written = 0
try:
    for i in range(4096):  # up to 4 GiB, 1 MiB at a time, until the disk refuses
        with open(f"fill_{i}.bin", "wb") as f:
            f.write(b"x" * 2**20)
        written += 1
except OSError as error:
    print(f"stopped after {written} MiB: {error}")"""
SNOOP = """import os

secrets = {secrets!r}
found = [p for p in secrets if os.path.exists(p)]
print(f"snoop: {{len(found)}} of {{len(secrets)}} secret paths found: {{found}}")"""

# student -> lab -> (score, a phrase its feedback must contain)
EXPECTED: dict[str, dict[str, tuple[float, str]]] = {
    "correct": {"lab_11_ddp": (POINTS, "every check passed"), "lab_18_experts": (POINTS, "every check passed")},
    "buggy": {"lab_11_ddp": (0, "summed over the ranks"), "lab_18_experts": (0, "split_sizes add up to")},
    "blank": {"lab_11_ddp": (0, "Not done yet"), "lab_18_experts": (0, "Not done yet")},
    "hangs": {"lab_11_ddp": (0, "the job hung"), "lab_18_experts": (0, "a cell ran past its time limit")},
    "vandal": {"lab_11_ddp": (0, "kernel died"), "lab_18_experts": (0, "left running after the notebook ended")},
    "disk": {"lab_11_ddp": (0, "wrote more than"), "lab_18_experts": (0, "no submission")},
}


def _notebook(student_edition: Path, lab: str, code: str | None, extra: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """The released notebook of ``lab`` with ``code`` in its solution cell (None: untouched) and ``extra`` cells
    inserted: ("before", source) before the solution cell, ("after", source) after it."""
    notebook = nbformat.read(student_edition / "notebooks" / f"{lab}.ipynb", as_version=4)
    at = next(i for i, c in enumerate(notebook.cells) if c.source.startswith("%%writefile"))
    if code is not None:
        first = notebook.cells[at].source.split("\n", 1)[0]
        notebook.cells[at].source = first + "\n" + code
    for where, source in reversed(extra):
        notebook.cells.insert(at + (1 if where == "after" else 0), nbformat.v4.new_code_cell(source))
    return notebook


def _catalogue_patch(lab: str, name: str) -> tuple[str, str]:
    """The (old, new) patch of the mutant ``name`` in ``solutions/<lab>_mutants.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_mutants", ROOT / "solutions" / "mutants.py")
    if spec is None or spec.loader is None:
        raise ImportError("solutions/mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["lab_mutants"] = module
    spec.loader.exec_module(module)
    mutant = next(m for m in module.MUTANTS[lab] if m.name == name)
    return mutant.old, mutant.new


def write_samples(out: Path, student_edition: Path, secrets: list[str]) -> dict[str, dict[str, tuple[float, str]]]:
    """The six students' submissions in ``out/<student>/<lab>.ipynb``; returns :data:`EXPECTED`."""
    right = {lab: without_markers(reference(lab)) for lab in LABS}
    wrong = {lab: mutate(right[lab], *_catalogue_patch(lab, _MUTANTS[lab])) for lab in LABS}
    ddp, experts = LABS
    plan: dict[str, dict[str, tuple[str | None, list[tuple[str, str]]]]] = {
        "correct": {ddp: (right[ddp], [("after", SNOOP.format(secrets=secrets))]), experts: (right[experts], [])},
        "buggy": {ddp: (wrong[ddp], []), experts: (wrong[experts], [])},
        "blank": {ddp: (None, []), experts: (None, [])},
        "hangs": {ddp: (mutate(right[ddp], *_HANG), []), experts: (right[experts], [("before", SLEEP)])},
        "vandal": {ddp: (right[ddp], [("after", KILL)]), experts: (right[experts], [("after", BACKGROUND)])},
        "disk": {ddp: (right[ddp], [("after", FILL)])},
    }
    for student, labs in plan.items():
        (out / student).mkdir(parents=True, exist_ok=True)
        for lab, (code, extra) in labs.items():
            nbformat.write(_notebook(student_edition, lab, code, extra), out / student / f"{lab}.ipynb")
    return EXPECTED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--student-edition", type=Path, default=EDITIONS / "student")
    parser.add_argument("--secret", action="append", default=[], help="a path the correct notebook tries to read")
    args = parser.parse_args(argv)
    write_samples(args.out, args.student_edition, args.secret)
    print(f"sample submissions in {args.out}: {', '.join(EXPECTED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
