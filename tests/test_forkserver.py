"""The fork server behind run_ranks: ranks are forks of one preloaded process, and see what a fresh one sees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from course_lib.launch import LaunchError, launched_processes, run_ranks
from course_lib.launch.forkserver import (
    forkserver_enabled,
    forkserver_pid,
    get_forkserver,
    stop_forkserver,
)
from course_lib.launch.guardian import guardian_pid

pytestmark = [
    pytest.mark.slow,  # each test starts a server that imports torch: seconds
    pytest.mark.skipif(not forkserver_enabled(), reason="the fork server is Linux-only (COURSE_LIB_FORKSERVER != 0)"),
]

WORKERS = """
import os, sys
import numpy as np
import torch
import torch.distributed as dist


def who(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(f"rank {rank} here")
    return {
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "pid": os.getpid(),
        "argv0": sys.argv[0],
        "cwd": os.getcwd(),
        "rank_env": os.environ["RANK"],
        "extra": os.environ.get("FORKSERVER_TEST_VAR"),
        "sum": t.item(),
        "numpy": float(np.random.rand()),
        "torch": float(torch.rand(1)),
    }


def hang(rank, world_size):
    if rank == 0:
        dist.barrier()  # rank 1 never comes
    import time
    time.sleep(600)
"""


@pytest.fixture
def workers(tmp_path: Path) -> str:
    (tmp_path / "fs_workers.py").write_text(WORKERS)
    return str(tmp_path / "fs_workers.py")


def _nothing_left() -> None:
    server = forkserver_pid()
    assert launched_processes(owner=os.getpid()) == []
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in (server, guardian_pid())] == []


def test_cpu_ranks_are_forks_of_the_server_and_see_what_a_fresh_process_sees(workers: str, tmp_path: Path) -> None:
    values = run_ranks(workers + ":who", nprocs=3, echo="none", cwd=tmp_path)
    server = forkserver_pid()
    assert server is not None
    assert [v["ppid"] for v in values] == [server] * 3  # forked by the server
    assert all(v["sid"] == v["pid"] for v in values)  # each in its own session: the launcher kills it as a group
    assert [v["rank_env"] for v in values] == ["0", "1", "2"] and values[0]["sum"] == 3.0
    assert all(v["argv0"] == "-c" and v["cwd"] == str(tmp_path) for v in values)
    assert len({v["numpy"] for v in values}) == 3  # NumPy reseeded per rank, as in fresh interpreters
    assert len({v["torch"] for v in values}) == 1  # torch's default generator: the same fixed seed everywhere
    again = run_ranks(workers + ":who", nprocs=2, echo="none")
    assert forkserver_pid() == server and again[0]["ppid"] == server  # one server serves every launch
    _nothing_left()


def test_launches_that_differ_from_the_server_start_fresh_interpreters(
    workers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_ranks(workers + ":who", nprocs=2, echo="none")
    server = forkserver_pid()
    own_env = run_ranks(workers + ":who", nprocs=2, echo="none", env={"FORKSERVER_TEST_VAR": "x"})
    assert own_env[0]["extra"] == "x" and own_env[0]["ppid"] == os.getpid()  # a child of this process
    assert forkserver_pid() == server  # the server was left alone
    monkeypatch.setenv("FORKSERVER_TEST_VAR", "y")  # this process's environment changed: a new server has it
    changed = run_ranks(workers + ":who", nprocs=2, echo="none")
    assert changed[0]["extra"] == "y" and forkserver_pid() not in (None, server)
    assert changed[0]["ppid"] == forkserver_pid() and not psutil.pid_exists(server)
    monkeypatch.setenv("COURSE_LIB_FORKSERVER", "0")
    off = run_ranks(workers + ":who", nprocs=2, echo="none")
    assert off[0]["ppid"] == os.getpid()
    _nothing_left()


def test_a_forked_rank_that_hangs_is_killed_with_its_session(workers: str) -> None:
    with pytest.raises(LaunchError) as e:
        run_ranks(workers + ":hang", nprocs=2, timeout=4, echo="none")
    assert e.value.reason == "timeout"
    _nothing_left()
    assert forkserver_pid() is not None  # the server survives a killed job


def test_the_server_stops_when_idle_and_is_replaced_and_stop_forkserver_stops_it() -> None:
    env = {**os.environ, "COURSE_LIB_FORKSERVER_IDLE_S": "1"}
    first = get_forkserver(env)
    assert first is not None and first.running()
    deadline = time.monotonic() + 30
    while first.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not first.running()  # idle for a second: gone
    second = get_forkserver(env)
    assert second is not None and second is not first and second.running()
    assert forkserver_pid() == second.proc.pid and stop_forkserver() is True
    assert not second.running() and forkserver_pid() is None and stop_forkserver() is False


def test_the_server_does_not_outlive_its_launcher(workers: str, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os
        from course_lib.launch import run_ranks
        from course_lib.launch.forkserver import forkserver_pid
        run_ranks({workers!r} + ":who", nprocs=2, echo="none")
        print(forkserver_pid(), flush=True)
        os._exit(0)  # no clean-up at all
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    server = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while psutil.pid_exists(server) and psutil.Process(server).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the fork server outlived its launcher"
        time.sleep(0.2)


def test_forkserver_checks_its_inputs() -> None:
    assert forkserver_enabled({"COURSE_LIB_FORKSERVER": "0"}) is False
    assert forkserver_enabled({}) is sys.platform.startswith("linux")
    with pytest.raises(TypeError, match="mapping"):
        get_forkserver(["not", "a", "mapping"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping"):
        forkserver_enabled("COURSE_LIB_FORKSERVER=0")  # type: ignore[arg-type]
