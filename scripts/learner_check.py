"""Check a learner's environment (``make test-learner-install``): everything the course imports, and no dev tools.

    build/learner-venv/bin/python -m course_tools.learner_check

Run with the interpreter of an environment made from ``requirements.lock`` alone (what ``make lab`` installs).
It imports every third-party module that a notebook's text source or ``course_lib`` imports (read from their
code: the modules a notebook writes with ``%%writefile`` and ``apex``, which notebook 23 shows missing, left
out), every ``course_lib`` module, and what JupyterLab needs for the course (RISE, jupytext, the kernel,
widgets), and reads the course's data (the digits ship inside scikit-learn's wheel, which nothing imports);
then it checks that none of the developer tools (pytest, nbval, ruff, mypy, playwright, pre-commit) is
installed. Exit status 1, with the list, if anything is wrong.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path

__all__ = ["course_imports", "main"]

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = ("jupyterlab", "jupyterlab_rise", "jupytext", "ipykernel", "ipywidgets", "notebook_shim")
DEV_TOOLS = ("pytest", "nbval", "ruff", "mypy", "playwright", "pre_commit")
NOT_INSTALLED = {"apex"}  # notebook 23 demonstrates that Apex is not part of PyTorch and not installed
# GPU tools a GPU cell imports when they are installed (pyproject's gpu-tools extra): never on a CPU machine
GPU_TOOLS = {"hta"}  # Holistic Trace Analysis, notebook 19 §6
WRITTEN = re.compile(r"^# %%writefile _runs/(?:[\w-]+/)*(\w+)\.py", re.M)  # _runs/x.py and _runs/n17/x.py


def course_imports() -> set[str]:
    """Top-level names of the third-party modules imported by the text sources and course_lib."""
    files = sorted((ROOT / "sources").glob("*.py")) + sorted((ROOT / "course_lib").rglob("*.py"))
    written = {m for f in files for m in WRITTEN.findall(f.read_text(encoding="utf-8"))}
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    third_party = {n for n in names if n not in sys.stdlib_module_names}
    return third_party - written - NOT_INSTALLED - GPU_TOOLS - {"course_lib", "__future__"}


def main() -> int:
    wanted = sorted(course_imports() | set(JUPYTER))
    failed = []
    for name in wanted:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - report every failure, then fail
            failed.append(f"import {name}: {type(e).__name__}: {e}")
    import course_lib

    modules = sorted(m.name for m in pkgutil.walk_packages(course_lib.__path__, "course_lib."))
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001
            failed.append(f"import {name}: {type(e).__name__}: {e}")
    try:  # the data ship inside installed packages (scikit-learn's wheel, Python's pydoc_data): read them once
        from course_lib.data import digits, text_corpus

        digits(), text_corpus()
    except Exception as e:  # noqa: BLE001
        failed.append(f"course data: {type(e).__name__}: {e}")
    present = [tool for tool in DEV_TOOLS if importlib.util.find_spec(tool) is not None]
    if present:
        failed.append(f"developer tools in the learner's environment: {present} (they belong to the dev extra)")
    print(f"imported {len(wanted)} third-party modules ({', '.join(wanted)}) and {len(modules)} course_lib modules")
    for line in failed:
        print("FAILED:", line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
