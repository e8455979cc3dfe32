"""The engine under every launch: start the processes, stream and label their lines, enforce the
timeout, kill every process it started, and turn a failure into a :class:`LaunchError`."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .checks import check_device, check_echo, check_env, check_timeout
from .diagnosis import PORT_BUSY, failing_rank, rank_number
from .echo import Echo
from .forkserver import get_forkserver
from .guardian import PARENT_ENV, guard, release
from .results import LaunchError, LaunchResult

__all__ = ["launched_processes", "run_processes"]

_MARKER = "COURSE_LIB_LAUNCH_ID"
_OWNER = "COURSE_LIB_LAUNCH_OWNER"  # the pid of the process that launched the job

# What hides GPUs from a process: CUDA's variable (ROCm honours it too) and ROCm's own.
_HIDE_GPUS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


_GRACE_S = 3.0  # after a first process fails, how long the others get to report before being killed
_DRAIN_S = 2.0  # after every process exited, how long their output may stay open (a background child holds it)


_TEE_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]\w*?)(?P<local>\d+)\]:(?P<text>.*)$")


_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?(?P<text>.*)$")

# The ranks this process had forked by its fork server (pid -> launch id). A forked rank's /proc environ is
# the server's, without the launch's marker, so the sweep below finds it, and every process of its session,
# by this record instead.
_FORKED: dict[int, str] = {}


def _session(stat: str) -> int | None:
    """The session id in a /proc/PID/stat line (the comm field may hold spaces and parentheses)."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[3]) if len(fields) > 3 and fields[3].lstrip("-").isdigit() else None


def launched_processes(launch_id: str | None = None, *, owner: int | None = None) -> list[int]:
    """PIDs of live processes started by this module, from ``/proc``: by one launch (``launch_id``), by
    the launches of one process (``owner``, a pid: ``os.getpid()`` for this one's), or by any.

    Empty where ``/proc`` does not exist. Tests use it to prove no process is left behind; on a machine
    where other jobs launch too (a learner's notebook, a second test run), ``owner=os.getpid()`` sees
    only this process's own.
    """
    if owner is not None and (not isinstance(owner, int) or isinstance(owner, bool) or owner < 1):
        raise ValueError(f"owner must be a process id (a positive int), got {owner!r}")
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    needle = f"{_MARKER}={launch_id}".encode() if launch_id else f"{_MARKER}=".encode()
    mine = f"{_OWNER}={owner}\0".encode() if owner is not None else b""
    me = os.getpid()
    # forked ranks are this process's own: they count for owner=None and owner=os.getpid()
    sessions = {pid for pid, lid in _FORKED.items() if launch_id in (None, lid)} if owner in (None, me) else set()
    found = []
    live_sessions = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if ") Z " in stat:  # zombies are already dead
            continue
        sid = _session(stat) if sessions else None
        if sid in sessions:
            live_sessions.add(sid)
        if (needle in environ and mine in environ + b"\0") or sid in sessions:
            found.append(int(entry.name))
    for pid in sessions - live_sessions:  # nothing of that rank's session is left
        _FORKED.pop(pid, None)
    return found


def _reader(idx: int, stream: Any, q: queue.Queue[tuple[int, str | None]]) -> None:
    for raw in iter(stream.readline, b""):
        q.put((idx, raw.decode("utf-8", "replace").rstrip("\r\n")))
    q.put((idx, None))


def _label(line: str, default: str, offset: int) -> tuple[str, str]:
    r = _RANK_PREFIX.match(line)  # "[rank3]: ..." (torch's own prefix, or a script's): the global rank
    if r:
        return f"rank {r.group('rank')}", r.group("text")
    m = _TEE_PREFIX.match(line)  # "[default1]: ..." from torchrun --tee: the local rank on this node
    if m:
        text = m.group("text")
        r = _RANK_PREFIX.match(text)
        if r:
            return f"rank {r.group('rank')}", r.group("text")
        return f"rank {offset + int(m.group('local'))}", text
    return default, line


def _kill(procs: Sequence[Any], launch_id: str) -> None:
    """SIGTERM each process group, wait briefly, then SIGKILL groups and any marked straggler."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and (any(p.poll() is None for p in procs) or launched_processes(launch_id)):
        time.sleep(0.05)
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for _ in range(3):
        stragglers = launched_processes(launch_id)
        if not stragglers:
            break
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=2.0)


def run_processes(
    commands: list[list[str]],
    labels: list[str],
    rank_offsets: list[int],
    *,
    timeout: float,
    env: Mapping[str, str] | None,
    cwd: Path | None,
    echo: str,
    device: str = "cpu",
    error_dir: Path | None = None,
    fork_argv: list[list[str]] | None = None,
) -> LaunchResult:
    """Run ``commands`` at once and return their :class:`LaunchResult`; raise :class:`LaunchError` on failure.

    Internal: every launcher (``run_torchrun``, ``run_script``, ``run_ranks``) ends here. ``labels`` name each
    command's lines; ``rank_offsets`` number the ranks of a launcher's tee-prefixed lines; ``error_dir`` is where
    ``run_ranks`` children write their tracebacks and results; ``fork_argv`` (``run_ranks``) is each command's
    ``sys.argv`` for a rank forked by the fork server (:mod:`.forkserver`), used for a CPU job without its own
    ``env``. The other arguments are those of the public launchers.

    Every process is registered with this process's guardian (:mod:`.guardian`), which kills it if this process
    dies first. A job whose processes have all exited is finished, even if a background child of one still holds
    its output open: that child is killed with the rest of the launch after ``_DRAIN_S`` seconds.
    """
    timeout = check_timeout(timeout)
    echo_mode = check_echo(echo)
    launch_id = uuid.uuid4().hex
    child_env = _child_environment(env, device, launch_id)
    q: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[Any] = []  # subprocess.Popen, or forkserver.ForkedProcess (the same interface, as used here)
    server = None
    if fork_argv is not None and device == "cpu" and not env:
        server = get_forkserver({k: v for k, v in child_env.items() if k != _MARKER})
    lines: list[tuple[str, str]] = []
    printer = Echo(echo_mode)
    start = time.monotonic()
    reason = ""
    exited: list[int] = []  # indices of the processes in the order they were seen to exit, before any kill
    try:
        for i, cmd in enumerate(commands):
            proc = _start_one(i, cmd, server, fork_argv, child_env, cwd, launch_id)
            if proc is None:  # the fork server failed: fresh interpreters from here on
                server = None
                proc = _start_one(i, cmd, None, None, child_env, cwd, launch_id)
            assert proc is not None
            procs.append(proc)
            guard(proc.pid)  # each process leads its own group (its own session)
            threading.Thread(target=_reader, args=(i, proc.stdout, q), daemon=True).start()
        reason = _watch(procs, q, labels, rank_offsets, lines, printer, exited, start, timeout)
    finally:
        _kill(procs, launch_id)
        for p in procs:
            release(p.pid)
    # drain what the readers still hold
    with contextlib.suppress(queue.Empty):
        while True:
            idx, text = q.get_nowait()
            if text is not None:
                label, body = _label(text, labels[idx], rank_offsets[idx])
                lines.append((label, body))
                printer.line(label, body)
    wall = time.monotonic() - start
    codes = [p.returncode for p in procs]
    returncode = next((codes[i] for i in exited if codes[i] not in (0, None)), 0)
    result = LaunchResult(returncode=returncode, wall_time=wall, lines=lines, commands=commands)
    printer.finish(result)
    exits = {labels[i]: codes[i] for i in exited}  # the processes that ended on their own, in that order
    if reason == "timeout":
        raise _timeout_error(timeout, labels, lines, result, error_dir, exits)
    if reason == "failed" or returncode != 0:
        raise _failure_error(labels, lines, result, error_dir, exits)
    return result


def _child_environment(env: Mapping[str, str] | None, device: str, launch_id: str) -> dict[str, str]:
    """The environment of every process of a launch: this one's, the job's ``env``, and the launch's markers."""
    child_env = dict(os.environ)
    child_env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set (and warn about) anyway
    if check_device(device) == "cpu":
        # A CPU job stays on the CPU on a GPU machine too: code that picks CUDA when it sees a GPU
        # (FSDP2's default mesh, init_process_group() without a backend) sees none.
        child_env.update({v: "" for v in _HIDE_GPUS})
    child_env.update(check_env(env))
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env[_MARKER] = launch_id
    child_env.setdefault(_OWNER, str(os.getpid()))  # a launch inside a launched process keeps the first owner
    child_env[PARENT_ENV] = str(os.getpid())  # this process's guardian kills what carries it (guardian.py)
    return child_env


def _start_one(
    i: int,
    cmd: list[str],
    server: Any,
    fork_argv: list[list[str]] | None,
    child_env: dict[str, str],
    cwd: Path | None,
    launch_id: str,
) -> Any:
    """Start command ``i``: a fork of the fork server when there is one (None if it failed), else a new process."""
    if server is not None and fork_argv is not None:
        try:
            forked = server.spawn(fork_argv[i], child_env, str(cwd) if cwd is not None else os.getcwd())
        except Exception:  # noqa: BLE001 - the server is broken: the caller starts fresh interpreters
            return None
        _FORKED[forked.pid] = launch_id
        return forked
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=child_env,
        cwd=cwd,
        start_new_session=True,
    )


def _timeout_error(
    timeout: float,
    labels: list[str],
    lines: list[tuple[str, str]],
    result: LaunchResult,
    error_dir: Path | None,
    exits: Mapping[str, int | None],
) -> LaunchError:
    culprit, tb = failing_rank(lines, error_dir, exits)
    tails = []
    known = dict.fromkeys([*(lab for lab in labels if not lab.startswith("agent")), *result.ranks])
    for lab in known:
        if lab.startswith("agent") or lab == "main" and len(known) > 1:
            continue
        own = [t for l2, t in lines if l2 == lab]
        # what the rank printed before any traceback (a rank that gave up waiting may have raised: its traceback is
        # reported below, and its last lines would hide where it was waiting)
        cut = next((i for i, t in enumerate(own) if t.lstrip().startswith("Traceback (most recent call last)")), None)
        last = own[:cut][-3:]
        state = f" (exited, code {exits[lab]})" if lab in exits else ""
        tails.append(f"  [{lab}]{state} last output: " + (" | ".join(last) if last else "(nothing)"))
    msg = (
        f"the job did not finish within the timeout of {timeout:g} s and was killed (all its processes).\n"
        "A rank that waits in a collective another rank never calls hangs like this.\n" + "\n".join(tails)
    )
    if tb:
        msg += f"\nFirst traceback ({culprit}):\n{tb}"
    return LaunchError(msg, reason="timeout", rank=rank_number(culprit), traceback=tb, result=result)


def _failure_error(
    labels: list[str],
    lines: list[tuple[str, str]],
    result: LaunchResult,
    error_dir: Path | None,
    exits: Mapping[str, int | None],
) -> LaunchError:
    culprit, tb = failing_rank(lines, error_dir, exits)
    text = "\n".join(t for _, t in lines)
    failed = [lab for lab, c in exits.items() if c not in (0, None)]
    who = culprit or (failed[0] if failed else "a process")
    code = exits.get(who, result.returncode)
    msg = f"{who} failed (exit code {code})."
    if PORT_BUSY.search(text):
        msg += " The port it tried to use is already in use: use a free port (course_lib.launch.free_port)."
    if tb:
        msg += f" Its traceback:\n{tb}"
    else:
        tail = "\n".join(f"[{lab}] {t}" for lab, t in lines[-10:])
        msg += f" Last output:\n{tail}"
    return LaunchError(msg, reason="failed", rank=rank_number(culprit), traceback=tb, result=result)


def _watch(
    procs: list[Any],
    q: queue.Queue[tuple[int, str | None]],
    labels: list[str],
    rank_offsets: list[int],
    lines: list[tuple[str, str]],
    printer: Echo,
    exited: list[int],
    start: float,
    timeout: float,
) -> str:
    """Read and print the processes' lines until the job ends; "" (finished), "failed" or "timeout".

    ``lines`` and ``exited`` (indices, in the order the processes were seen to exit) are filled in place.
    """
    open_streams = len(procs)
    first_failure: float | None = None
    all_exited: float | None = None
    reason = ""
    while True:
        try:
            idx, text = q.get(timeout=0.05)
            if text is None:
                open_streams -= 1
            else:
                label, body = _label(text, labels[idx], rank_offsets[idx])
                lines.append((label, body))
                printer.line(label, body)
        except queue.Empty:
            pass
        now = time.monotonic()
        codes = [p.poll() for p in procs]
        exited.extend(i for i, c in enumerate(codes) if c is not None and i not in exited)
        if first_failure is None and any(c not in (None, 0) for c in codes):
            first_failure = now
        if all(c is not None for c in codes):
            all_exited = all_exited if all_exited is not None else now
            if open_streams == 0 or now - all_exited > _DRAIN_S:
                break
        if first_failure is not None and now - first_failure > _GRACE_S:
            reason = "failed"
            break
        if now - start > timeout:
            reason = "timeout"
            break
    return reason
