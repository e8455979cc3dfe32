"""The private PyTorch APIs the course uses are all in course_lib.torch_private, and the installed torch has them."""

from __future__ import annotations

import ast
import re

import pytest

import course_lib.torch_private as tp
from course_lib.manifest import ROOT

# A private name of torch: an attribute path under torch with a component that starts with one underscore.
PRIVATE = re.compile(r"\btorch(?:\.\w+)*\.(_[a-zA-Z]\w*)")


def test_every_private_api_is_in_the_installed_torch() -> None:
    missing = tp.missing_private_apis()
    assert missing == [], (
        "the installed torch lacks private APIs the course uses; fix the function in course_lib/torch_private.py "
        f"that uses each: {missing}"
    )


def test_a_missing_api_is_named_with_the_function_that_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tp, "PRIVATE_APIS", (*tp.PRIVATE_APIS, ("torch", "_no_such_thing", "clear_dtensor_caches")))
    assert tp.missing_private_apis() == ["torch._no_such_thing (used by course_lib.torch_private.clear_dtensor_caches)"]


def test_every_listed_api_names_a_function_of_the_module() -> None:
    for _, _, user in tp.PRIVATE_APIS:
        assert user in tp.__all__ and callable(getattr(tp, user)), user


def test_the_rest_of_the_library_reaches_no_private_torch_name() -> None:
    """Outside torch_private.py, course_lib names no private torch attribute (strings and comments aside)."""
    offenders = []
    for path in sorted((ROOT / "course_lib").rglob("*.py")):
        if path.name == "torch_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = ast.unparse(node.value)
                if base == "torch" or base.startswith("torch."):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {base}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
                if any(part.startswith("_") for part in node.module.split(".")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert offenders == [], offenders


def test_clearing_the_caches_is_safe_without_any_dtensor() -> None:
    tp.clear_dtensor_caches()
    tp.clear_dtensor_caches()
    assert tp.live_process_groups() == []
