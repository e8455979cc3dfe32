"""course_lib stays easy to change: no module over 400 lines, no function over 80 (the offenders named)."""

from __future__ import annotations

import ast
from pathlib import Path

from course_lib.manifest import ROOT

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80


def _offenders(root: Path = ROOT) -> tuple[list[str], list[str]]:
    modules, functions = [], []
    for path in sorted((root / "course_lib").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        if text.count("\n") > MAX_MODULE_LINES:
            modules.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions.append(f"{rel}:{node.lineno} {node.name}(): {length} lines")
    return modules, functions


def test_no_module_over_400_lines_and_no_function_over_80() -> None:
    modules, functions = _offenders()
    assert not modules, f"split these modules by job (at most {MAX_MODULE_LINES} lines each): {modules}"
    assert not functions, f"split these functions (at most {MAX_FUNCTION_LINES} lines each): {functions}"


def test_the_rule_names_an_offender(tmp_path: Path) -> None:
    """A module too long and a function too long are both reported, with their lengths."""
    lib = tmp_path / "course_lib"
    lib.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    (lib / "big.py").write_text(f"def long():\n{body}\n" + "\n" * 320)
    modules, functions = _offenders(tmp_path)
    assert modules == ["course_lib/big.py: 411 lines"] and functions == ["course_lib/big.py:1 long(): 91 lines"]
