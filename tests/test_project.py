"""The project's own files: dependency lists agree, the locks pin and close them, CI runs the README's command."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from course_lib.manifest import notebook_paths

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_deps(extra: str | None = None) -> dict[str, str]:
    """The learner set (``[project] dependencies``), or an extra's (``dev``)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = data["project"]["optional-dependencies"][extra] if extra else data["project"]["dependencies"]
    reqs = [Requirement(r) for r in listed]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def _pins(lock: str, constraints: bool = False) -> dict[str, str]:
    """``name -> version`` a lock file installs (its -r lines followed; its -c constraints too if asked)."""
    pinned = {}
    for line in (ROOT / lock).read_text().splitlines():
        if line.startswith("-r ") or (constraints and line.startswith("-c ")):
            pinned |= _pins(line.split(maxsplit=1)[1], constraints)
            continue
        if line.startswith("-c "):
            continue
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", f"{lock}: {line}"
        pinned[re.sub(r"[-_.]+", "-", req.name).lower()] = next(iter(req.specifier)).version
    return pinned


def _conda_pip_section() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def _conda_deps() -> dict[str, str]:
    reqs = [Requirement(r) for r in _conda_pip_section() if not r.startswith("-e")]
    return {r.name.lower(): str(r.specifier) for r in reqs}


def test_environment_yml_lists_the_learner_set_of_pyproject() -> None:
    assert _conda_deps() == _pyproject_deps()
    assert "-e ." in _conda_pip_section(), "environment.yml must install course_lib itself"


def test_learner_and_developer_sets_are_apart() -> None:
    learner, dev = _pyproject_deps(), _pyproject_deps("dev")
    assert not set(learner) & set(dev)
    for tool in ("pytest", "nbval", "playwright", "ruff", "mypy", "pre-commit"):
        assert tool in dev and tool not in learner, tool
    for need in ("torch", "jupyterlab", "jupyterlab-rise", "ipykernel", "ipywidgets", "jupytext", "matplotlib"):
        assert need in learner, need


def test_each_lock_pins_its_set_exactly_and_torch_without_local_suffix() -> None:
    learner, dev = _pins("requirements.lock"), _pins("requirements-dev.lock")
    assert learner["torch"] == "2.13.0"
    assert "pytest" not in learner and "ruff" not in learner and "playwright" not in learner
    assert "pytest-xdist" in dev and "pytest-xdist" not in learner  # nbval's workers (NBVAL_WORKERS)
    assert "--dist loadfile" in (ROOT / "Makefile").read_text(), "a notebook's cells must stay on one xdist worker"
    for pins, wanted in ((learner, _pyproject_deps()), (dev, {**_pyproject_deps(), **_pyproject_deps("dev")})):
        for name, spec in wanted.items():
            key = re.sub(r"[-_.]+", "-", name).lower()
            assert key in pins, f"{name} is a dependency but not pinned"
            assert Requirement(f"{name}{spec}").specifier.contains(pins[key]), (name, spec, pins[key])
    cuda = _pins("requirements-linux-cuda.lock")
    assert {"triton", "nvidia-nccl-cu13"} <= set(cuda), "the packages PyPI's torch pulls on Linux are pinned"
    assert not set(cuda) & set(dev), "a CPU build of torch installs none of the CUDA constraints"
    assert "-c requirements-linux-cuda.lock" in (ROOT / "requirements.lock").read_text().splitlines()


def test_the_lock_is_closed_over_this_environment() -> None:
    """Every requirement of a pinned package (as installed here: make venv installs the dev lock) is pinned too, and
    installed at the pinned version: `make lock` wrote the locks from fresh installs. (A package installed here by
    hand and pinned nowhere is the owner's business, not the lock's.)"""
    import importlib.metadata as md

    from packaging.markers import default_environment

    pins = _pins("requirements-dev.lock", constraints=True)
    env = default_environment()
    installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d for d in md.distributions()}
    for name, dist in installed.items():
        if name not in pins:
            continue
        assert dist.version.removesuffix("+cpu") == pins[name], f"{name} {dist.version} installed, {pins[name]} pinned"
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                key = re.sub(r"[-_.]+", "-", req.name).lower()
                assert key in pins, f"{name} requires {req.name}, which no lock pins: run `make lock`"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^make test( TEST_CPU=avx2)?$", ci, re.M)  # the README's command (on a simulated CPU)


@pytest.mark.slow  # two fresh interpreters importing torch: half a minute on a loaded machine
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


def test_ci_runs_the_extra_passes_after_the_readme_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test TEST_CPU=avx2\n" in ci and "make test-extra" in ci and "make test-slurm" in ci
    assert ci.index("make test TEST_CPU=avx2\n") < ci.index("make test-extra")
    # The browser tests and the learner's install run beside the extra pass, each in its own process group, and a
    # failure of either fails the run.
    for side in ("test-browser", "test-learner-install"):
        assert f"setsid make {side} >" in ci and 'side_job "$' in ci and f" {side} build/" in ci, side
    assert ci.index("setsid make test-browser") < ci.index("make test-extra ||")
    # Between them, CI's two nbval runs cover every condition of test-portable, test-gpu-visible and test-load:
    # the main pass on the AVX2 CPU, the extra pass on the portable CPU with GPUs visible and every core busy.
    make = (ROOT / "Makefile").read_text()
    extra = make[make.index("\ntest-extra:") :].split("\n\n")[0]
    assert "env $(CPU_PORTABLE) $(MAKE) --no-print-directory test-gpu-visible UNDER_LOAD=1" in extra
    assert extra.count("$(MAKE)") == 1  # one nbval pass
    visible = make[make.index("\ntest-gpu-visible:") :].split("\n\n")[0]
    assert "$(GPU_VISIBLE_ENV) $(if $(UNDER_LOAD),$(BIN)/python scripts/cpu_hog.py --)" in visible
    for target, condition in (("test-gpu-visible", "$(GPU_VISIBLE_ENV)"), ("test-load", "cpu_hog.py")):
        body = make[make.index(f"\n{target}:") :].split("\n\n")[0]
        assert body.count("$(PYTEST_NBVAL)") == 1 and condition in body, target
    test = make[make.index("\ntest:") :].split("\n\n")[0]
    assert "$(if $(TEST_CPU),env $(TEST_CPU_ENV)) $(BIN)/python -m pytest" in test
    assert "$(MAKE)" not in test.replace("$(MAKE) --no-print-directory lint", "")  # no browser pass inside make test
    assert "TEST_CPU_ENV = $(if $(filter avx2,$(TEST_CPU)),$(CPU_AVX2)," in make
    assert '"$(CPU_PORTABLE)" "$(CPU_AVX2)"' in make  # test-portable's CPUs are the same two


def test_make_test_refuses_an_unknown_simulated_cpu() -> None:
    import subprocess

    done = subprocess.run(["make", "-n", "test", "TEST_CPU=arm"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "TEST_CPU='arm': use avx2, portable, or leave it empty" in done.stderr
    dry = subprocess.run(["make", "-n", "test", "TEST_CPU=avx2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2" in dry.stdout
    # every notebook, the last in the course first (the long ones), then the unit tests
    line = next(x for x in dry.stdout.splitlines() if "--nbval" in x)
    stems = [n.stem for n in notebook_paths()]
    order = [line.index(f"notebooks/{stem}.ipynb") for stem in stems]
    assert order == sorted(order, reverse=True) and line.endswith(f"notebooks/{stems[0]}.ipynb tests")


def test_every_course_lib_package_and_the_tooling_are_installed() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(data["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "course_lib").rglob("__init__.py")}
    assert found | {"course_tools"} == listed, f"[tool.setuptools] packages must list exactly {sorted(found)}"
    assert data["tool"]["setuptools"]["package-dir"] == {"course_tools": "scripts"}
    import course_tools.gpu_cells

    assert Path(course_tools.gpu_cells.__file__).resolve() == ROOT / "scripts" / "gpu_cells.py"


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


def test_the_learner_check_asks_only_for_installable_modules() -> None:
    """What ``make test-learner-install`` imports must exist here too (the dev set contains the learner set).

    A module a notebook writes into ``_runs/`` (any depth, e.g. ``_runs/n17/tp_api.py``) is the notebook's own
    file, not a dependency; this failed CI once when 17's files moved into a subfolder."""
    import importlib.util

    from course_tools.learner_check import WRITTEN, course_imports

    assert WRITTEN.findall("# %%writefile _runs/n17/tp_api.py\n# %%writefile _runs/model.py") == ["tp_api", "model"]
    missing = sorted(n for n in course_imports() if importlib.util.find_spec(n) is None)
    assert not missing, f"the learner check would try to import {missing}, which nothing installs"
