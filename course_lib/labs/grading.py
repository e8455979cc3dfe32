"""A lab's check as a grade: run in a fresh interpreter, so that the notebook it is graded in cannot change the verdict.

The graded cell of a lab notebook in the classroom edition (``course_tools.classroom``) calls :func:`grade_lab`. It
starts ``python -I -m course_lib.labs <lab>`` on the file the notebook wrote, prints the verdict, and raises
``AssertionError`` unless every check passed: nbgrader gives the cell's points only when it raises nothing.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .core import LabResult, lab_timeout

__all__ = ["EXIT_CODES", "grade_lab", "run_check"]

EXIT_CODES = {"correct": 0, "wrong": 1, "not done yet": 2, "deferred": 3}
_DEFAULT_TIMEOUTS = {"lab_22_capstone": 180.0}  # seconds per launch; 120 for the others
_LAUNCHES = {"lab_22_capstone": 3}  # the capstone's check launches 3 jobs, the others 1


def _check_function(lab: str) -> Any:
    from . import CHECKS

    if not isinstance(lab, str):
        raise TypeError(f"lab must be a lab's name (str), got {type(lab).__name__}")
    if lab not in CHECKS:
        raise ValueError(f"no lab {lab!r}; the labs are {sorted(CHECKS)}")
    module, name = CHECKS[lab].split(":")
    return getattr(importlib.import_module(module), name)


def run_check(lab: str, solution: str | None = None, timeout: float | None = None) -> LabResult:
    """Run lab ``lab``'s check in this process, on ``solution`` (default: the file its notebook writes)."""
    check = _check_function(lab)
    if solution is not None and not isinstance(solution, (str, Path)):
        raise TypeError(f"solution must be a path, got {type(solution).__name__}")
    result: LabResult = check(solution, timeout=timeout) if solution is not None else check(timeout=timeout)
    return result


def grade_lab(lab: str, solution: str | None = None, timeout: float | None = None) -> LabResult:
    """Check ``lab`` in a fresh ``python -I`` process; print its verdict; raise ``AssertionError`` unless correct.

    ``timeout`` is per launch, as for the lab's check (default: ``$COURSE_LAB_TIMEOUT``, else the lab's own); the
    fresh process is given that times the number of launches, plus a minute to start. Returns the verdict's status
    as a :class:`LabResult` without checks (the printed text has them).
    """
    _check_function(lab)
    per_launch = lab_timeout(timeout, _DEFAULT_TIMEOUTS.get(lab, 120.0))
    command = [sys.executable, "-I", "-m", "course_lib.labs", lab, "--timeout", f"{per_launch:g}"]
    if solution is not None:
        command += ["--solution", str(Path(solution).resolve())]
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}  # the fresh process really checks
    limit = per_launch * _LAUNCHES.get(lab, 1) + 60.0
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"[{lab}] the check did not finish within {limit:g} s: the lab's job hung") from None
    print(done.stdout, end="", flush=True)
    status = {code: status for status, code in EXIT_CODES.items()}.get(done.returncode)
    if status is None:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise AssertionError(f"[{lab}] the check itself failed (exit code {done.returncode}):\n{tail}")
    if status != "correct":
        first = done.stdout.strip().splitlines()[0] if done.stdout.strip() else status
        raise AssertionError(f"[{lab}] not graded as correct: {first}")
    return LabResult(lab, "correct", "graded in a fresh process")
