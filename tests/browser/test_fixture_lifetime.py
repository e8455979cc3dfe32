"""The JupyterLab server a test run starts dies with that run, even when the run is killed (SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent


def _marked(parent: int) -> set[int]:
    found = set()
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get("COURSE_LIB_LAUNCH_PARENT") == str(parent):
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


def test_a_killed_run_leaves_no_jupyterlab_behind(tmp_path: Path) -> None:
    """A stand-in for a test run: it starts the server as the `lab` fixture does, opens a kernel, then is killed."""
    ready = tmp_path / "ready"
    code = textwrap.dedent(f"""
        import importlib.util, sys, time
        from pathlib import Path
        spec = importlib.util.spec_from_file_location("browser_conftest", {str(HERE / "conftest.py")!r})
        conftest = sys.modules["browser_conftest"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(conftest)
        start_jupyterlab = conftest.start_jupyterlab
        proc, server = start_jupyterlab(Path({str(tmp_path)!r}), Path({str(tmp_path / "lab.log")!r}))
        server.api("/api/kernels", method="POST")  # a kernel too: it must die as well
        Path({str(ready)!r}).write_text(str(proc.pid))
        time.sleep(600)
    """)
    run = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert run.poll() is None, f"the stand-in run exited early ({run.returncode})"
            assert time.monotonic() < deadline, "JupyterLab did not start within 120 s"
            time.sleep(0.2)
        time.sleep(1.0)  # the kernel's process is up by now
        started = {p.pid for p in psutil.Process(run.pid).children(recursive=True)} | _marked(run.pid)
        server = int(ready.read_text())
        assert server in started and len(started) >= 3, started  # the guardian, the server, its kernel
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(started) == set(), f"{len(_alive(started))} of {len(started)} processes outlived the killed run"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in _marked(run.pid):
            os.kill(pid, signal.SIGKILL)
