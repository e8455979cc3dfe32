"""The learner's package stays a library: course_lib writes no repository file and imports none of the tooling;
its docstring lists every public module; launch/'s modules share no private names; no sys.path edits anywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import course_lib
from course_lib.manifest import ROOT

LIB = ROOT / "course_lib"
WRITES = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wax]b?\+?['\"]")


def _modules() -> list[Path]:
    return sorted(LIB.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_course_lib_imports_no_tooling() -> None:
    for path in _modules():
        tooling = {n for n in _imports(path) if n.split(".")[0] in {"course_tools", "scripts", "nbformat", "nbclient"}}
        assert not tooling, f"{path.relative_to(ROOT)} imports repository tooling: {tooling}"


def test_course_lib_writes_no_repository_file() -> None:
    """Every write in course_lib goes to a temporary folder or a file the caller names, never to ROOT."""
    allowed = {
        # run_ranks: its spec, results and error files live in the job's temporary folder
        "launch/ranks.py",
        "launch/worker.py",
    }
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(LIB))
        if WRITES.search(text):
            assert rel in allowed, f"course_lib/{rel} writes a file: writing belongs to course_tools (scripts/)"
            assert "ROOT" not in text, f"course_lib/{rel} writes files and knows the repository root"
    from course_lib import manifest

    # the manifest module reads course.toml; rendering and writing what is generated from it is course_tools'
    assert set(manifest.__all__) == {
        "Lab",
        "Notebook",
        "ROOT",
        "course",
        "course_map",
        "lab_paths",
        "labs",
        "notebook_paths",
        "written_file",
    }
    assert not hasattr(manifest, "main") and not hasattr(manifest, "write_generated")


def test_the_package_docstring_lists_every_public_module() -> None:
    doc = course_lib.__doc__ or ""
    listed = set(re.findall(r":mod:`course_lib\.(\w+)`", doc))
    public = {p.stem for p in LIB.glob("*.py") if not p.stem.startswith("_")}
    public |= {p.name for p in LIB.iterdir() if (p / "__init__.py").is_file()}
    assert listed == public, (
        f"course_lib/__init__.py's docstring: add {sorted(public - listed)}, remove {sorted(listed - public)}"
    )


def test_launch_modules_share_no_private_names() -> None:
    for path in sorted((LIB / "launch").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports private names {private} from .{node.module}"
    boot = (LIB / "launch" / "ranks.py").read_text(encoding="utf-8")
    assert "import _" not in boot


def test_no_sys_path_edits_in_scripts_tests_and_benchmarks() -> None:
    """Tools import as course_tools (scripts/ is installed under that name), the library as course_lib."""
    edits = re.compile(r"sys\.path\.(insert|append)|sys\.path\s*=")
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("scripts", "tests", "benchmarks")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p != Path(__file__) and edits.search(p.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"sys.path edits: {offenders}; import course_tools.<tool> or course_lib instead"
