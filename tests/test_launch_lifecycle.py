"""What outlives a launcher (nothing, even when it is killed), who is blamed, and when a job counts as finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from course_lib.launch import LaunchError, run_ranks, run_script, run_torchrun
from course_lib.launch.guardian import PARENT_ENV, guard, guardian_pid, release, sweep

WORKERS = """
import os, sys, time
import torch
import torch.distributed as dist


def silent_exit_on_rank_0(rank, world_size, code):
    if rank == 0:
        time.sleep(0.2)
        os._exit(code)  # no Python error, no result: its peer then fails on the broken connection
    dist.all_reduce(torch.ones(1))


def sleeps(rank, world_size, ready_dir):
    open(os.path.join(ready_dir, f"ready_{rank}_{os.getpid()}"), "w").close()
    time.sleep(600)
"""

SCRIPTS = {
    # a rank that ends its own work but leaves a child holding the output pipe open (a forgotten background job)
    "background_child.py": """
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])  # inherits stdout
        print("work done", flush=True)
    """,
    "sleeps.py": """
        import os, sys, time
        open(os.path.join(sys.argv[1], f"ready_{os.environ.get('RANK', 'main')}_{os.getpid()}"), "w").close()
        time.sleep(600)
    """,
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lifecycle")
    (d / "lifecycle_workers.py").write_text(WORKERS)
    for name, body in SCRIPTS.items():
        (d / name).write_text(textwrap.dedent(body))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("code", [3, 0])
def test_the_rank_that_died_first_is_blamed_not_its_peer(jobs: Path, code: int) -> None:
    """Rank 0 leaves without a word (exit 3, or exit 0 without a result); rank 1 then fails on the lost connection."""
    with pytest.raises(LaunchError) as info:
        run_ranks(f"{jobs}/lifecycle_workers.py:silent_exit_on_rank_0", 2, (code,), timeout=120, echo="none")
    assert info.value.rank == 0, str(info.value)
    assert str(info.value).startswith("rank 0 failed"), str(info.value)
    assert "no Python error" in str(info.value)


@pytest.mark.slow
def test_a_job_whose_processes_all_ended_is_finished_even_if_a_child_holds_its_output(jobs: Path) -> None:
    start = time.monotonic()
    token = f"background-child-of-{os.getpid()}"  # names this test's child among every process of the machine
    result = run_script(["python", str(jobs / "background_child.py"), token], timeout=60, echo="none")
    assert result.returncode == 0 and "work done" in result.output()
    assert time.monotonic() - start < 30  # not the 60 s timeout
    left = [p for p in psutil.process_iter(["cmdline"]) if token in (p.info["cmdline"] or [])]
    assert left == [], "the background child was not killed with the launch"


def test_run_torchrun_refuses_a_missing_master_address(jobs: Path) -> None:
    for bad in (None, "", 5):
        with pytest.raises((TypeError, ValueError), match="master_addr"):
            run_torchrun(str(jobs / "sleeps.py"), master_addr=bad, timeout=5)  # type: ignore[arg-type]


def test_guard_and_sweep_check_their_arguments() -> None:
    for bad in (0, -3, True, "12"):
        with pytest.raises(ValueError, match="pgid"):
            guard(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="pgid"):
            release(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="parent"):
            sweep(bad)  # type: ignore[arg-type]
    assert sweep(2**22 + 12345) == []  # no process carries that launcher's mark


# -------------------------------------------------------------- a launcher killed with SIGKILL, on every path

# Each launcher is its own Python process: it starts a job whose processes sleep, and is killed (SIGKILL: no
# cleanup of its own, as when a kernel is restarted or crashes) once every process of the job is up.
LAUNCHERS = {
    "run_ranks, fork server": "run_ranks(f'{jobs}/lifecycle_workers.py:sleeps', 2, (ready,), timeout=600)",
    "run_ranks, fresh interpreters (env=)": (
        "run_ranks(f'{jobs}/lifecycle_workers.py:sleeps', 2, (ready,), timeout=600, env={'X': '1'})"
    ),
    "run_torchrun": "run_torchrun(f'{jobs}/sleeps.py', nproc_per_node=2, args=[ready], timeout=600)",
    "run_torchrun, device='cuda' (GPUs left visible)": (
        "run_torchrun(f'{jobs}/sleeps.py', nproc_per_node=2, args=[ready], timeout=600, device='cuda')"
    ),
    "run_script, two commands": (
        "run_script([['python', f'{jobs}/sleeps.py', ready], ['python', f'{jobs}/sleeps.py', ready]], timeout=600)"
    ),
}
EXPECTED_READY = {name: 2 for name in LAUNCHERS}


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _marked(parent: int) -> set[int]:
    found = set()
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(PARENT_ENV) == str(parent):
                found.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(pids: set[int]) -> set[int]:
    live = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                live.add(pid)
        except psutil.NoSuchProcess:
            continue
    return live


@pytest.mark.slow
@pytest.mark.parametrize("path", list(LAUNCHERS))
def test_a_killed_launcher_leaves_no_process_behind(jobs: Path, tmp_path: Path, path: str) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    code = textwrap.dedent(f"""
        from course_lib.launch import run_ranks, run_script, run_torchrun
        jobs, ready = {str(jobs)!r}, {str(ready)!r}
        {LAUNCHERS[path]}
    """)
    launcher = subprocess.Popen([sys.executable, "-c", code], cwd=jobs, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(list(ready.iterdir())) < EXPECTED_READY[path]:
            assert launcher.poll() is None, f"the launcher exited early ({launcher.returncode})"
            assert time.monotonic() < deadline, "the job did not start within 240 s"
            time.sleep(0.2)
        # what the launcher started, counted two ways: its process tree, and the launch's mark in /proc
        started = _descendants(launcher.pid) | _marked(launcher.pid)
        ranks = {int(f.name.rsplit("_", 1)[1]) for f in ready.iterdir()}
        assert ranks <= started, (ranks, started)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(started) == set(), f"{path}: {len(_alive(started))} of {len(started)} processes survived"
        assert _marked(launcher.pid) == set()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        sweep(launcher.pid)  # should find nothing; keeps a failing test from leaving sleepers


def test_the_guardian_is_one_process_per_launcher() -> None:
    before = guardian_pid()
    nobody = 2**22 + 777  # a group id no process has: registering it signals nothing, now or later
    guard(nobody)
    release(nobody)
    now = guardian_pid()
    assert now is not None and (before is None or before == now)
    assert psutil.Process(now).ppid() == os.getpid()
