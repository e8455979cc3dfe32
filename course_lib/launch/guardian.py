"""The guardian: what a launcher started dies with it, even when the launcher itself is killed.

A job's processes run in sessions of their own (so a timeout can kill each whole group), which also means they do
not die with the process that launched them. A notebook's kernel that is restarted, crashes or gets ``SIGKILL``
runs no cleanup of its own, and its jobs would run on, holding ports and cores. So the first launch of a process
starts one small *guardian* process for it: a plain Python script, no torch, in a session of its own, whose
standard input is a pipe from the launcher. The launcher tells it each process group it starts (``add PGID``) and
ends (``del PGID``). When the pipe reaches end of file (the launcher exited, normally or killed, and the kernel
closed every file it had), the guardian

1. sends ``SIGTERM`` to every group still registered, then ``SIGKILL`` two seconds later;
2. on Linux, kills every process whose environment holds ``COURSE_LIB_LAUNCH_PARENT=<launcher pid>``: every
   process a launch starts gets that variable, and what they start inherits it (torchrun's workers, a script's
   children, the fork server's ranks), so this finds the ones that left their group;
3. exits.

Internal API of :mod:`course_lib.launch` (the engine calls :func:`guard` and :func:`release`); tests and fixtures
that start servers of their own use :func:`guard` and :data:`PARENT_ENV` the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

__all__ = ["PARENT_ENV", "guard", "guardian_pid", "release", "sweep"]

PARENT_ENV = "COURSE_LIB_LAUNCH_PARENT"  # the pid of the launcher whose guardian kills the process
_lock = threading.Lock()
_pipe: IO[bytes] | None = None
_proc: subprocess.Popen[bytes] | None = None
_owner_pid: int | None = None  # the process the guardian was started for (a fork of it needs its own)


def _start() -> IO[bytes]:
    global _pipe, _proc, _owner_pid
    if _pipe is not None and _owner_pid == os.getpid() and _proc is not None and _proc.poll() is None:
        return _pipe
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_LIB_LAUNCH")}
    _proc = subprocess.Popen(
        [sys.executable, "-S", str(Path(__file__).resolve()), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # not in the launcher's group: a signal to that group leaves it to clean up
    )
    assert _proc.stdin is not None
    _pipe, _owner_pid = _proc.stdin, os.getpid()
    return _pipe


def _send(line: str) -> None:
    with _lock:
        pipe = _start()
        try:
            pipe.write(line.encode() + b"\n")
            pipe.flush()
        except (BrokenPipeError, OSError):  # the guardian died: start a new one and say it again
            global _pipe
            _pipe = None
            pipe = _start()
            pipe.write(line.encode() + b"\n")
            pipe.flush()


def guard(pgid: int) -> None:
    """Have this process's guardian kill process group ``pgid`` if this process dies before :func:`release`."""
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid < 1:
        raise ValueError(f"pgid must be a process group id (a positive int), got {pgid!r}")
    _send(f"add {pgid}")


def release(pgid: int) -> None:
    """The group ``pgid`` has ended (or been killed): the guardian forgets it."""
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid < 1:
        raise ValueError(f"pgid must be a process group id (a positive int), got {pgid!r}")
    if _pipe is not None and _owner_pid == os.getpid():
        _send(f"del {pgid}")


def guardian_pid() -> int | None:
    """The pid of this process's guardian, or None before the first launch."""
    if _proc is None or _owner_pid != os.getpid() or _proc.poll() is not None:
        return None
    return _proc.pid


def sweep(parent: int, sig: int = signal.SIGKILL) -> list[int]:
    """Signal every process (Linux: read from ``/proc``) whose environment says launcher ``parent`` started it.

    Returns the pids signalled. Empty where ``/proc`` does not exist.
    """
    if not isinstance(parent, int) or isinstance(parent, bool) or parent < 1:
        raise ValueError(f"parent must be a process id (a positive int), got {parent!r}")
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    needle = f"{PARENT_ENV}={parent}\0".encode()
    me, hit = os.getpid(), []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if needle in (entry / "environ").read_bytes() + b"\0":
                os.kill(int(entry.name), sig)
                hit.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return hit


def _serve(parent: int) -> None:
    """The guardian's loop: keep the set of live groups until end of file, then kill what is left."""
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        verb, _, arg = raw.decode(errors="replace").strip().partition(" ")
        if arg.isdigit():
            (groups.add if verb == "add" else groups.discard)(int(arg))
    for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
            time.sleep(0.05)
    for _ in range(5):  # processes may fork while they are being killed: sweep until none is left
        if not sweep(parent):
            break
        time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


if __name__ == "__main__":  # python -S guardian.py LAUNCHER_PID (started by _start; reads its stdin)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the launcher's terminal is not ours to obey
    _serve(int(sys.argv[1]))
