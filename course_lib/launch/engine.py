"""The engine under every launch: start the processes, stream and label their lines, enforce the
timeout, kill every process it started, and turn a failure into a :class:`LaunchError`."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .checks import check_device, check_echo, check_env, check_timeout
from .diagnosis import PORT_BUSY, failing_rank, rank_number
from .forkserver import get_forkserver
from .results import LaunchError, LaunchResult

__all__ = ["launched_processes", "run_processes"]

_MARKER = "COURSE_LIB_LAUNCH_ID"
_OWNER = "COURSE_LIB_LAUNCH_OWNER"  # the pid of the process that launched the job

# What hides GPUs from a process: CUDA's variable (ROCm honours it too) and ROCm's own.
_HIDE_GPUS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


_GRACE_S = 3.0  # after a first process fails, how long the others get to report before being killed


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


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


class _Echo:
    """Prints lines as they come; in a notebook, a live view that is replaced by the output grouped by rank.

    The live view is an ``ipywidgets.Output`` fed through the widget's comm channel, so what a
    notebook stores (and what nbval compares) is only the final, rank-ordered text printed to
    stdout when the job ends, whatever order the processes printed in.
    """

    def __init__(self, mode: str) -> None:
        self.mode = "kernel" if mode == "auto" and _in_kernel() else ("live" if mode == "auto" else mode)
        self.pending: list[str] = []
        self.view: Any = None
        self.last = 0.0
        if self.mode == "kernel":
            try:
                import ipywidgets  # noqa: F401
            except ImportError:  # pragma: no cover - ipywidgets is a course dependency
                self.mode = "grouped"

    def line(self, label: str, text: str) -> None:
        if label.startswith("agent"):
            return  # launcher agents' own logs are kept in the result, not echoed
        if self.mode == "live":
            print(f"[{label}] {text}", flush=True)
        elif self.mode == "kernel":
            self.pending.append(f"[{label}] {text}")
            now = time.monotonic()
            if now - self.last > 0.25:
                self._flush()
                self.last = now

    def _flush(self) -> None:
        if not self.pending:
            return
        if self.view is None:
            import ipywidgets
            from IPython.display import display

            self.view = ipywidgets.Output()
            display(self.view)
        self.view.append_stdout("\n".join(self.pending) + "\n")
        self.pending = []

    def finish(self, result: LaunchResult) -> None:
        if self.mode not in ("grouped", "kernel"):
            return
        if self.view is not None:  # the live view has served; the grouped text replaces it
            self.view.outputs = ()
            self.view.layout.display = "none"
        text = result.grouped()
        if text:
            print(text, flush=True)


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
    ``run_ranks`` children write their tracebacks; ``fork_argv`` (``run_ranks``) is each command's ``sys.argv``
    for a rank forked by the fork server (:mod:`.forkserver`), used for a CPU job without its own ``env``.
    The other arguments are those of the public launchers.
    """
    timeout = check_timeout(timeout)
    echo_mode = check_echo(echo)
    launch_id = uuid.uuid4().hex
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
    q: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[Any] = []  # subprocess.Popen, or forkserver.ForkedProcess (the same interface, as used here)
    server = None
    if fork_argv is not None and device == "cpu" and not env:
        server = get_forkserver({k: v for k, v in child_env.items() if k != _MARKER})
    lines: list[tuple[str, str]] = []
    printer = _Echo(echo_mode)
    start = time.monotonic()
    reason = ""
    try:
        for i, cmd in enumerate(commands):
            if server is not None and fork_argv is not None:
                try:
                    forked = server.spawn(fork_argv[i], child_env, str(cwd) if cwd is not None else os.getcwd())
                    _FORKED[forked.pid] = launch_id
                    procs.append(forked)
                    threading.Thread(target=_reader, args=(i, forked.stdout, q), daemon=True).start()
                    continue
                except Exception:  # noqa: BLE001 - the server is broken: fresh interpreters from here on
                    server = None
            p = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
            )
            procs.append(p)
            threading.Thread(target=_reader, args=(i, p.stdout, q), daemon=True).start()
        open_streams = len(procs)
        first_failure: float | None = None
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
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
            if all(c is not None for c in codes) and open_streams == 0:
                break
            if first_failure is not None and now - first_failure > _GRACE_S:
                reason = "failed"
                break
            if now - start > timeout:
                reason = "timeout"
                break
    finally:
        _kill(procs, launch_id)
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
    returncode = next((c for c in codes if c not in (0, None)), 0)
    result = LaunchResult(returncode=returncode, wall_time=wall, lines=lines, commands=commands)
    printer.finish(result)
    if reason == "timeout":
        culprit, tb = failing_rank(lines, error_dir)
        tails = []
        known = dict.fromkeys([*(lab for lab in labels if not lab.startswith("agent")), *result.ranks])
        for lab in known:
            if lab.startswith("agent") or lab == "main" and len(known) > 1:
                continue
            last = [t for l2, t in lines if l2 == lab][-3:]
            tails.append(f"  [{lab}] last output: " + (" | ".join(last) if last else "(nothing)"))
        msg = (
            f"the job did not finish within the timeout of {timeout:g} s and was killed (all its processes).\n"
            "A rank that waits in a collective another rank never calls hangs like this.\n" + "\n".join(tails)
        )
        if tb:
            msg += f"\nFirst traceback ({culprit}):\n{tb}"
        raise LaunchError(msg, reason="timeout", rank=rank_number(culprit), traceback=tb, result=result)
    if reason == "failed" or returncode != 0:
        culprit, tb = failing_rank(lines, error_dir)
        text = "\n".join(t for _, t in lines)
        failed = [labels[i] for i, c in enumerate(codes) if c not in (0, None)]
        who = culprit or (failed[0] if failed else "a process")
        msg = f"{who} failed (exit code {returncode})."
        if PORT_BUSY.search(text):
            msg += " The port it tried to use is already in use: use a free port (course_lib.launch.free_port)."
        if tb:
            msg += f" Its traceback:\n{tb}"
        else:
            tail = "\n".join(f"[{lab}] {t}" for lab, t in lines[-10:])
            msg += f" Last output:\n{tail}"
        raise LaunchError(msg, reason="failed", rank=rank_number(culprit), traceback=tb, result=result)
    return result
