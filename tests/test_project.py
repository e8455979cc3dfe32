"""The project's own files: dependency lists agree, the lock pins torch, CI runs the README's command."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_deps() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in data["project"]["dependencies"]]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def _conda_pip_section() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def _conda_deps() -> dict[str, str]:
    reqs = [Requirement(r) for r in _conda_pip_section() if not r.startswith("-e")]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def test_environment_yml_lists_the_same_packages_as_pyproject() -> None:
    assert _conda_deps() == _pyproject_deps()
    assert "-e ." in _conda_pip_section(), "environment.yml must install course_lib itself"


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


def test_the_declared_minimum_torch_is_the_version_ci_tests() -> None:
    """The notebooks are only ever run on the locked torch, so that is the true minimum: a notebook that
    starts using a newer API (with a newer lock) fails here until every declared minimum moves too."""
    from packaging.version import Version

    from course_lib.device import MIN_TORCH, require_torch

    locked = next(
        Requirement(line)
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.startswith("torch==")
    )
    locked_version = Version(next(iter(locked.specifier)).version)
    assert f"{locked_version.major}.{locked_version.minor}" == MIN_TORCH, (
        f"requirements.lock tests torch {locked_version}, but course_lib.device.MIN_TORCH says {MIN_TORCH}"
    )
    for place, spec in [("pyproject.toml", _pyproject_deps()["torch"]), ("environment.yml", _conda_deps()["torch"])]:
        lower = [s.version for s in Requirement(f"torch{spec}").specifier if s.operator == ">="]
        assert lower == [MIN_TORCH], f"{place} declares torch{spec}; the tested minimum is >={MIN_TORCH}"
    assert f"PyTorch {MIN_TORCH} or newer" in (ROOT / "README.md").read_text()
    require_torch(str(locked_version))
    with pytest.raises(RuntimeError, match=rf"needs PyTorch >= {MIN_TORCH}.*found 2\.6\.0"):
        require_torch("2.6.0")
    with pytest.raises(TypeError, match="version must be a string"):
        require_torch(2.13)  # type: ignore[arg-type]
