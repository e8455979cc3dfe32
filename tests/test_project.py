"""The project's own files: dependency lists agree, the lock pins torch, CI runs the README's command."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_deps() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in data["project"]["dependencies"]]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def test_environment_yml_lists_the_same_packages_as_pyproject() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    reqs = [Requirement(r) for r in pip_section if not r.startswith("-e")]
    conda = {r.name.lower(): str(r.specifier) for r in reqs}
    assert conda == _pyproject_deps()
    assert "-e ." in pip_section, "environment.yml must install course_lib itself"


def test_lock_pins_every_dependency_exactly_and_torch_without_local_suffix() -> None:
    lines = [
        line for line in (ROOT / "requirements.lock").read_text().splitlines() if line and not line.startswith("#")
    ]
    pinned = {}
    for line in lines:
        req = Requirement(line)
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", line
        pinned[req.name.lower().replace("_", "-")] = next(iter(req.specifier)).version
    assert pinned["torch"] == "2.13.0"
    for name, spec in _pyproject_deps().items():
        key = name.replace("_", "-")
        assert key in pinned, f"{name} is a dependency but not pinned in requirements.lock"
        assert Requirement(f"{name}{spec}").specifier.contains(pinned[key]), (name, spec, pinned[key])


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^make test$", ci, re.M)


def test_cpu_capability_script_checks_the_simulated_cpu() -> None:
    import os
    import subprocess
    import sys

    script = str(ROOT / "scripts" / "cpu_capability.py")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    ok = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "capability: DEFAULT" in ok.stdout and "1 thread(s)" in ok.stdout
    env["ATEN_CPU_CAPABILITY"] = "no-such-cpu"
    bad = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "cannot simulate 'no-such-cpu'" in bad.stderr


def test_ci_runs_the_portability_check_after_the_readme_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test\n" in ci and "make test-portable" in ci
    assert ci.index("make test\n") < ci.index("make test-portable")


def test_every_course_lib_package_is_installed() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(data["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "course_lib").rglob("__init__.py")}
    assert found == listed, f"pyproject.toml [tool.setuptools] packages must list exactly {sorted(found)}"
