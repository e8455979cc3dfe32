"""Write the lock files from fresh installs of pyproject.toml: ``make lock``.

    python3 scripts/lock.py [--python python3.11]      # make lock

Three files, each closed (every package an install puts in the environment is pinned):

* ``requirements.lock``: the learner set (``[project] dependencies``: the notebooks, course_lib, JupyterLab),
  what ``make lab`` installs, with torch pinned without its local ``+cpu`` suffix so that the file installs
  anywhere;
* ``requirements-dev.lock``: ``-r requirements.lock`` plus the ``dev`` extra (tests, nbval, lint, types, the
  browser tests, pre-commit), what ``make test`` and ``make check`` install; resolved with the learner pins as
  constraints, so the two never disagree;
* ``requirements-linux-cuda.lock``: what PyPI's torch pulls on Linux (the CUDA runtime, cuDNN, NCCL, triton),
  as *constraints* that ``requirements.lock`` names: pinned when pulled, never installed when not, so a CPU
  build of torch (PyTorch's CPU index; this machine's local wheel) installs none of it. It is read from pip's
  own resolution of ``torch`` for Linux x86_64 (the manylinux tags) against PyPI alone (``--isolated``, metadata only,
  no wheel downloaded), so it is what a default Linux install pulls.

The lock has no hashes: see README, "Dependencies and the lock", for what ``--require-hashes`` does here.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["freeze", "main", "normalize"]

# Runs before any environment exists (python3 scripts/lock.py): no course_lib import.
ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "lock"
LEARNER = ROOT / "requirements.lock"
DEV = ROOT / "requirements-dev.lock"
CUDA = ROOT / "requirements-linux-cuda.lock"
# A default Linux x86_64 machine: every manylinux tag a recent glibc accepts (pip does not widen --platform itself).
_TAGS = [f"manylinux_2_{v}_x86_64" for v in range(40, 4, -1)]
_TAGS += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
LINUX = [arg for tag in _TAGS for arg in ("--platform", tag)] + ["--implementation", "cp", "--only-binary=:all:"]

LEARNER_HEAD = """\
# The learner's environment, exactly: what `make lab` installs (Python 3.11; the versions behind the committed
# notebook outputs). Written by `make lock` (scripts/lock.py); requirements-dev.lock adds the developer extras.
# torch is pinned without the local '+cpu' suffix, so this file installs anywhere: pip takes the build the index
# offers (PyPI: a CUDA build on Linux, a CPU build elsewhere). Without a GPU on Linux, install the CPU build first
# (README, "Without a GPU"): the CUDA packages PyPI's torch pulls are pinned in requirements-linux-cuda.lock, as
# constraints, so they are installed only when a CUDA build of torch asks for them.
-c requirements-linux-cuda.lock
"""
DEV_HEAD = """\
# The developer's environment: the learner's (requirements.lock) plus pyproject.toml's `dev` extra (tests, nbval,
# lint, types, browser tests, pre-commit): what `make test` and `make check` install. Written by `make lock`.
-r requirements.lock
"""
CUDA_HEAD = """\
# Constraints, not requirements: what PyPI's torch pulls on Linux (CUDA runtime, cuDNN, NCCL, triton), pinned so
# that a default Linux install is reproducible; a CPU build of torch pulls none of it, so none of it is installed.
# Written by `make lock` from pip's resolution of torch for Linux x86_64 (manylinux) against PyPI alone.
"""


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(cmd: list[str]) -> str:
    print("+", " ".join(cmd if len(cmd) < 20 else [*cmd[:12], "...", *cmd[-4:]]), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def freeze(python: Path) -> dict[str, str]:
    """``name -> version`` of everything in an environment but pip itself and course_lib, ``+cpu`` dropped."""
    out = _run([str(python), "-m", "pip", "freeze", "--all", "--exclude", "pip", "--exclude", "course_lib"])
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"pip freeze gave a line that is not a pin: {line!r}")
        pins[name] = version.removesuffix("+cpu")
    return pins


def _write(path: Path, head: str, pins: dict[str, str]) -> None:
    body = "".join(f"{name}=={pins[name]}\n" for name in sorted(pins, key=normalize))
    path.write_text(head + body, encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}: {len(pins)} pins")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to build the environments with")
    args = parser.parse_args(argv)
    shutil.rmtree(BUILD, ignore_errors=True)
    BUILD.mkdir(parents=True)
    venv = BUILD / "venv"
    _run([args.python, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "--quiet"]
    _run([*pip, "--upgrade", "pip"])
    torch = next(line for line in LEARNER.read_text().splitlines() if line.startswith("torch=="))
    # 1. the learner set: course_lib's dependencies and the locked torch version
    _run([*pip, torch, str(ROOT)])
    learner = freeze(venv / "bin" / "python")
    pins_file = BUILD / "learner-pins.txt"
    pins_file.write_text("".join(f"{n}=={v}\n" for n, v in learner.items()))
    # 2. the developer extras on top, constrained to the learner's versions
    _run([*pip, "-c", str(pins_file), f"{ROOT}[dev]"])
    full = freeze(venv / "bin" / "python")
    changed = {n: (learner[n], full[n]) for n in learner if full.get(n) != learner[n]}
    if changed:
        raise SystemExit(f"the dev extra changed learner pins (it must not): {changed}")
    dev = {n: v for n, v in full.items() if n not in learner}
    # 3. what PyPI's torch pulls on Linux, resolved by pip against PyPI alone (metadata only: --dry-run)
    report = BUILD / "linux-torch.json"
    version = _run([str(py), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).strip()
    _run(
        [str(py), "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet"]
        + ["--target", str(BUILD / "target"), "--report", str(report), "--python-version", version, *LINUX]
        + ["-c", str(pins_file), torch]
    )
    resolved = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    known = {normalize(n) for n in learner}
    cuda = {n: v for n, v in resolved.items() if normalize(n) not in known}
    _write(LEARNER, LEARNER_HEAD, learner)
    _write(DEV, DEV_HEAD, dev)
    _write(CUDA, CUDA_HEAD, cuda)
    shutil.rmtree(BUILD, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
