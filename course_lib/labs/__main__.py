"""Run one lab's check from a shell: ``python -m course_lib.labs lab_11_ddp [--solution FILE] [--timeout S]``.

It prints the verdict and exits with 0 (correct), 1 (wrong) or 2 (not done yet). The grader runs it as
``python -I -m course_lib.labs ...`` (``-I``: no current directory on ``sys.path``, no ``PYTHON*`` variables), so
nothing a notebook's kernel did (a patched function, a file named like a module) reaches the verdict.
"""

from __future__ import annotations

import argparse
import sys

from .grading import EXIT_CODES, run_check


def main(argv: list[str] | None = None) -> int:
    from . import CHECKS

    parser = argparse.ArgumentParser(prog="python -m course_lib.labs", description=__doc__.splitlines()[0])
    parser.add_argument("lab", choices=sorted(CHECKS), help="the lab's notebook name")
    parser.add_argument("--solution", help="the file to check (default: the one the lab's notebook writes)")
    parser.add_argument("--timeout", type=float, help="seconds per launch (default: the lab's own)")
    args = parser.parse_args(argv)
    result = run_check(args.lab, args.solution, args.timeout)
    print(result, flush=True)
    return EXIT_CODES[result.status]


if __name__ == "__main__":
    sys.exit(main())
