"""The command behind ``course.toml``: the notebooks' paths, the generated blocks, a notebook's footprint.

    python -m course_tools.manifest                      # the notebook paths, then the labs' (the Makefile's NB)
    python -m course_tools.manifest --write              # rewrite the generated blocks (make generated)
    python -m course_tools.manifest --check              # list the stale generated blocks; exit 1 if any
    python -m course_tools.manifest --footprint 09       # what belongs to notebook 09 (make footprint NB=09)
    python -m course_tools.manifest --footprint ring     # ... to every notebook about the ring, and what mentions it

Reading the manifest is :mod:`course_lib.manifest`; what is generated from it is :mod:`course_tools.generated`;
a notebook's footprint is :mod:`course_tools.footprint`.
"""

from __future__ import annotations

import argparse
import sys

from course_lib.manifest import ROOT, lab_paths, notebook_paths
from course_tools.footprint import footprint
from course_tools.generated import write_generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_tools.manifest", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks of README, guide and sources")
    mode.add_argument("--check", action="store_true", help="list the stale generated blocks (exit 1 if any)")
    mode.add_argument("--footprint", metavar="NB_OR_WORD", help="a notebook number, stem, or a word such as 'ring'")
    args = parser.parse_args(argv)
    if args.write or args.check:
        stale = write_generated(check=args.check)
        for line in stale or ["generated blocks are up to date"]:
            print(line)
        return 1 if args.check and stale else 0
    if args.footprint is not None:
        try:  # several words or paths (make footprint with the default NB): one footprint each
            print("\n".join(footprint(q) for q in args.footprint.split() or [""]), end="")
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        return 0
    print("\n".join(str(p.relative_to(ROOT)) for p in [*notebook_paths(), *lab_paths()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
