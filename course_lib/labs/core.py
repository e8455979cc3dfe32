"""What every lab shares: run the learner's file as real processes, collect what each rank measured, give a verdict.

A lab's check is one call in the notebook (``print(check_ddp_lab())``). It starts ``nprocs`` processes with
:func:`course_lib.launch.run_ranks`; each runs the lab's *harness* (a function of the lab's module), which imports
the learner's file, runs it beside PyTorch's own implementation on the same model and data, and returns what it
measured. The lab's ``evaluate`` turns those measurements into :class:`LabCheck` s, each with what was expected and
the mistake that usually causes a failure. The launch is real: a missing ``wait()``, a dtype mismatch or a rank that
never arrives fails as it would in a job (a hang ends at the timeout, which names the ranks' last lines).

:class:`LabResult` prints as the exercises' checks do (``✅ Correct``, ``⏳ Not done yet``, ``❌ Not quite``),
followed by one line per check.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from ..launch import LaunchError, run_ranks
from ..validation import check_int

__all__ = ["TIMEOUT_ENV", "LabCheck", "LabResult", "NotDoneInRank", "deferred_to_grader", "import_solution"]
__all__ += ["lab_timeout", "run_lab"]

Status = Literal["correct", "not done yet", "wrong", "deferred"]
_ICONS = {
    "correct": "✅ Correct",
    "not done yet": "⏳ Not done yet",
    "wrong": "❌ Not quite",
    "deferred": "↪ Checked by the grader",
}
# The environment variable that sets every lab check's timeout when its call gives none (the grader sets it).
TIMEOUT_ENV = "COURSE_LAB_TIMEOUT"


def lab_timeout(timeout: float | None, default: float) -> float:
    """The timeout a lab check runs under: ``timeout`` if given, else ``$COURSE_LAB_TIMEOUT``, else ``default``.

    >>> lab_timeout(30, 120.0), lab_timeout(None, 120.0) if "COURSE_LAB_TIMEOUT" not in os.environ else 120.0
    (30.0, 120.0)
    """
    source = "timeout"
    if timeout is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        if not text:
            return float(default)
        source = f"${TIMEOUT_ENV}"
        try:
            timeout = float(text)
        except ValueError:
            raise ValueError(f"{source} must be a number of seconds, got {text!r}") from None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{source} must be a number of seconds, got {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def deferred_to_grader(lab: str) -> LabResult | None:
    """Under nbgrader's autograde (``NBGRADER_EXECUTION=autograde``), the verdict of the check in the notebook's kernel
    is not the grade: the graded cell runs the lab again in a fresh process (:func:`course_lib.labs.grading.grade_lab`),
    which nothing in the notebook can patch. The kernel's own run is skipped then; ``None`` otherwise."""
    if os.environ.get("NBGRADER_EXECUTION") != "autograde":
        return None
    return LabResult(lab, "deferred", "the grader runs this lab in a fresh process: its verdict follows")


@dataclass(frozen=True)
class LabCheck:
    """One thing a lab checks: whether it held, what was measured against what was expected, and a hint."""

    name: str
    passed: bool
    detail: str
    hint: str = ""  # the mistake that usually causes this failure (shown only when it fails)

    def lines(self) -> list[str]:
        out = [f"  {'✓' if self.passed else '✗'} {self.name}: {self.detail}"]
        if not self.passed and self.hint:
            out.append(f"      usually: {self.hint}")
        return out


@dataclass(frozen=True)
class LabResult:
    """A lab's verdict. Truthy only when every check passed."""

    lab: str
    status: Status
    message: str
    checks: tuple[LabCheck, ...] = field(default_factory=tuple)
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.status == "correct"

    @property
    def failed(self) -> list[LabCheck]:
        return [c for c in self.checks if not c.passed]

    def __str__(self) -> str:
        lines = [f"{_ICONS[self.status]} [{self.lab}]: {self.message}"]
        for check in self.checks:
            lines += check.lines()
        return "\n".join(lines)

    __repr__ = __str__


class NotDoneInRank(Exception):
    """Raised by a harness when the learner's code still raises ``NotImplementedError`` (the handed-out blank)."""


def import_solution(path: str | Path, name: str = "lab_solution") -> ModuleType:
    """Import the learner's file as a fresh module (in a rank of the lab's job)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _learner_lines(traceback: str, solution: Path) -> str:
    """The traceback's frames in the learner's file, and its last line: where it failed, and why."""
    lines = traceback.strip().splitlines()
    keep = [ln.strip() for i, ln in enumerate(lines) if solution.name in ln]
    last = lines[-1] if lines else ""
    return "; ".join([*keep[-2:], last])


def run_lab(
    lab: str,
    solution: str | Path,
    harness: str,
    evaluate: Callable[[Sequence[dict[str, Any]]], list[LabCheck]],
    *,
    nprocs: int,
    args: Sequence[Any] = (),
    timeout: float | None = None,
    todo: str = "",
) -> LabResult:
    """Run ``harness(rank, world_size, solution, *args)`` on ``nprocs`` real processes and judge what they measured.

    ``harness`` is ``"package.module:function"`` (the lab's module). ``evaluate`` gets the ranks' results (a list of
    dicts, rank order) and returns the checks. A rank whose harness raised :class:`NotDoneInRank`, or whose code
    raised ``NotImplementedError``, makes the result "not done yet"; a failure or a hang makes it wrong, with the
    learner's lines of the traceback, or the ranks' last lines. ``timeout``: see :func:`lab_timeout` (default 120 s).
    """
    if not isinstance(lab, str) or not lab.strip():
        raise ValueError("lab must be a non-empty name")
    check_int("nprocs", nprocs, minimum=1)
    if not isinstance(solution, (str, Path)):
        raise TypeError(f"solution must be the path of the file to check, got {type(solution).__name__}")
    timeout = lab_timeout(timeout, 120.0)
    deferred = deferred_to_grader(lab)
    if deferred is not None:
        return deferred
    path = Path(solution)
    todo = todo or f"write the code marked YOUR CODE HERE, run the cell that writes {path.name}, then this check"
    if not path.is_file():
        return LabResult(lab, "not done yet", f"{path} does not exist yet: {todo}")
    start = time.monotonic()
    try:
        results = run_ranks(harness, nprocs, (str(path.resolve()), *args), timeout=timeout, echo="none")
    except LaunchError as error:
        seconds = time.monotonic() - start
        text = error.traceback or str(error)
        if "NotImplementedError" in text or "NotDoneInRank" in text:
            return LabResult(lab, "not done yet", todo, seconds=seconds)
        if error.reason == "timeout":
            tails = [ln.strip() for ln in str(error).splitlines() if "last output" in ln]
            check = LabCheck(
                "the job finishes",
                False,
                f"it did not finish within {timeout:g} s: {' '.join(tails)}",
                "a rank waits in a collective that another rank never calls, or calls it in another order (every "
                "rank must issue the same collectives, in the same order; a receive must meet a send)",
            )
            return LabResult(lab, "wrong", "the job hung and was stopped", (check,), seconds)
        where = f"rank {error.rank}" if error.rank is not None else "a process"
        check = LabCheck("the job runs", False, f"{where} failed: {_learner_lines(text, path)}")
        return LabResult(lab, "wrong", f"{where} raised an error", (check,), seconds)
    seconds = time.monotonic() - start
    if any(r.get("not_done") for r in results):
        return LabResult(lab, "not done yet", todo, seconds=seconds)
    checks = tuple(evaluate(results))
    failed = [c for c in checks if not c.passed]
    if failed:
        message = f"{len(failed)} of {len(checks)} checks failed ({nprocs} processes, ~{seconds:.0f} s)"
        return LabResult(lab, "wrong", message, checks, seconds)
    return LabResult(lab, "correct", f"every check passed ({nprocs} processes, ~{seconds:.0f} s)", checks, seconds)


def first_line(text: str) -> str:
    """The first line of an error message, without the noise of a long tensor repr."""
    return re.sub(r"\s+", " ", text.strip().splitlines()[0])[:200] if text.strip() else ""
