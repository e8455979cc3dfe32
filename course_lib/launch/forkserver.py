"""The fork server: one process per launcher that has imported PyTorch once, and forks :func:`run_ranks`' ranks.

A rank that starts as a fresh interpreter spends ~3 s of CPU before it does any work: ``import torch``
(~1.5 s), then ``torch._dynamo``, which ``DistributedDataParallel(...)`` imports whatever you compile
(~1.5 s; DTensor and FSDP2 import it too). Notebooks 09-22 start ~130 ranks, so on 2 cores that was about
half of their time. On Linux, :func:`~course_lib.launch.run_ranks` therefore starts its ranks as forks
of a *fork server*: a process started on the first launch that imports those modules once, and then
forks one child per rank on request. What each rank sees is what a fresh interpreter sees:

* the launch's environment, replacing the server's before any of the job's code runs (the server was
  started with the same environment, so what PyTorch read at import is what the rank would have read);
* its own session (the launcher kills it and its children as a process group), stdin from
  ``/dev/null``, stdout and stderr into one pipe that the launcher reads, the launch's working directory;
* the same ``sys.path`` and ``sys.argv`` (``-c``, the job's files), NumPy and ``random`` reseeded (a fork
  would otherwise share the server's streams), and its own exit code, which the server reports.

It is used only where nothing about the launch differs from the server: CPU jobs (``device="cpu"``)
without their own ``env=``, from a process whose environment has not changed since the server started
(if it has, the server is replaced). Everything else, and every launch on macOS or Windows or with
``COURSE_LIB_FORKSERVER=0`` in the environment, starts fresh interpreters as before. The server never
outlives its launcher: it exits when the launcher's end of its socket closes (the launcher exited or
called :func:`stop_forkserver`), after ``COURSE_LIB_FORKSERVER_IDLE_S`` seconds without a launch
(default 600), and it kills any rank still running when it goes.

One difference remains, and no course code depends on it: the forks share the server's string-hash seed, so
every rank iterates a ``set`` of strings in the same order (fresh interpreters each draw their own seed unless
``PYTHONHASHSEED`` is set; code whose collectives follow such an order can hang under ``torchrun`` and not here).

The protocol is one ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair: the launcher sends a pickled request
with the rank's output pipe attached (``SCM_RIGHTS``); the server answers ``("spawned", pid)`` and,
when the rank ends, ``("exit", pid, returncode)`` (a negative code: killed by that signal, as in
:mod:`subprocess`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ForkServer",
    "ForkedProcess",
    "forkserver_enabled",
    "forkserver_pid",
    "get_forkserver",
    "serve",
    "stop_forkserver",
]

# What a rank of the course imports before its first line of work (torch._dynamo: DDP's constructor,
# DTensor and FSDP2 import it). Importing more than a job needs changes nothing it computes.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.nn",
    "torch.distributed.optim",
    "torch._dynamo",
    "torch.distributed.tensor",
    "torch.nn.parallel",
    "course_lib.launch.worker",
    "course_lib.teardown",
)
_BOOT = "from course_lib.launch.forkserver import serve; serve()"
_START_TIMEOUT_S = 180.0  # the server's imports: ~4 s idle, a minute on a loaded 2-core machine
_MAX_MESSAGE = 1 << 20


def forkserver_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether launches may use the fork server here: Linux, and ``COURSE_LIB_FORKSERVER`` is not ``0``."""
    env = os.environ if environ is None else environ
    if not isinstance(env, Mapping):
        raise TypeError(f"environ must be a mapping of environment variables, got {type(env).__name__}")
    return sys.platform.startswith("linux") and env.get("COURSE_LIB_FORKSERVER", "1") != "0"


# --------------------------------------------------------------------------------------------- server side


def _reseed_after_fork() -> None:
    """What a fresh interpreter would have: NumPy's global stream seeded from the OS (``random`` reseeds
    itself in a forked child; torch's default generator was never used by the server)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _child(request: dict[str, Any], out_fd: int, ready_w: int) -> None:
    """In the forked child: become the rank, run the worker, exit. Never returns."""
    code = 1
    try:
        os.setsid()
        os.write(ready_w, b"1")
        os.close(ready_w)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        _reseed_after_fork()
        from course_lib.launch.worker import worker_main

        worker_main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - shown on the rank's stderr, like an uncaught exception
        import traceback

        traceback.print_exc()
    finally:
        # Like a fresh interpreter's end, minus its shutdown: the worker has torn its group down already,
        # and a gloo thread alive at interpreter shutdown is what aborts a process (see worker.py).
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(fd: int | None = None, idle_s: float | None = None) -> None:
    """The fork server's main loop (``python -c '...serve()' FD``): preload, then fork a rank per request.

    Internal: started by :class:`ForkServer`. ``fd`` is its end of the socket pair (default: ``sys.argv[1]``).
    """
    if fd is None:
        fd = int(sys.argv[1])
    if idle_s is None:
        idle_s = float(os.environ.get("COURSE_LIB_FORKSERVER_IDLE_S", "600"))
    sock = socket.socket(fileno=fd)
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sock.send(pickle.dumps(("ready", os.getpid())))
    children: set[int] = set()
    last = time.monotonic()
    try:
        while True:
            readable, _, _ = select.select([sock], [], [], 0.05 if children else 1.0)
            while children:  # report every rank that ended
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))
                last = time.monotonic()
            if not readable:
                if not children and time.monotonic() - last > idle_s:
                    return
                continue
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
            if not msg:  # the launcher is gone
                return
            request = pickle.loads(msg)
            if request == "stop" or not fds:
                for f in fds:
                    os.close(f)
                return
            out_fd = fds[0]
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.close(ready_r)
                _child(request, out_fd, ready_w)
            os.close(ready_w)
            os.close(out_fd)
            os.read(ready_r, 1)  # the child has its own session: killpg(pid) reaches it from now on
            os.close(ready_r)
            children.add(pid)
            last = time.monotonic()
            sock.send(pickle.dumps(("spawned", pid)))
    finally:
        for pid in children:  # never leave a rank behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------- launcher side


class ForkedProcess:
    """A rank forked by the :class:`ForkServer`, with the part of :class:`subprocess.Popen`'s interface
    that the launch engine uses: ``pid``, ``stdout`` (its output, stderr included), ``returncode``,
    ``poll()`` and ``wait()``."""

    def __init__(self, server: ForkServer, pid: int, stdout: Any) -> None:
        self.server = server
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The launcher's handle on one fork server process, started with environment ``env``."""

    def __init__(self, env: Mapping[str, str]) -> None:
        if not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping of strings (the ranks' environment), got {type(env).__name__}")
        self.env = dict(env)
        self.owner = os.getpid()  # a process forked from the launcher (a DataLoader worker) must not use it
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno())],
                env=self.env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        try:
            kind, self.pid = self._receive(_START_TIMEOUT_S)
        except Exception:
            self.close()
            raise
        if kind != "ready":
            self.close()
            raise RuntimeError(f"the fork server answered {kind!r} instead of 'ready'")

    def _receive(self, timeout: float | None) -> Any:
        """The next message that is not an exit report (those are recorded); None if none came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                if left == 0.0 or (deadline is not None and time.monotonic() >= deadline):
                    raise TimeoutError("the fork server did not answer")
                continue
            msg = self.sock.recv(_MAX_MESSAGE)
            if not msg:
                raise ConnectionError("the fork server has exited")
            message = pickle.loads(msg)
            if message[0] == "exit":
                self.exits[message[1]] = message[2]
                continue
            return message

    def running(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, argv: list[str], env: Mapping[str, str], cwd: str) -> ForkedProcess:
        """Fork one rank that runs ``argv`` (the worker's ``-c`` arguments) with ``env`` in ``cwd``."""
        read_fd, write_fd = os.pipe()
        with self.lock:
            try:
                request = pickle.dumps({"argv": argv, "env": dict(env), "cwd": cwd})
                socket.send_fds(self.sock, [request], [write_fd])
                kind, pid = self._receive(30.0)
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
            if kind != "spawned":
                os.close(read_fd)
                raise RuntimeError(f"the fork server answered {kind!r} instead of 'spawned'")
        return ForkedProcess(self, pid, os.fdopen(read_fd, "rb"))  # buffered, as Popen's stdout

    def returncode(self, pid: int) -> int | None:
        """``pid``'s exit code if the server has reported it (reading what it has sent), else None."""
        with self.lock:
            if pid not in self.exits:
                with contextlib.suppress(TimeoutError, ConnectionError):
                    while True:
                        self._receive(0.0)  # records exit reports; returns only on an unexpected answer
            if pid not in self.exits and not self.running() and not os.path.exists(f"/proc/{pid}"):
                self.exits[pid] = 1  # the server died before it could report: the rank is gone, cause unknown
            return self.exits.get(pid)

    def close(self) -> None:
        """Stop the server (it kills any rank still running) and wait for it."""
        with contextlib.suppress(OSError):
            self.sock.send(pickle.dumps("stop"))
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


_SERVER: ForkServer | None = None
_SERVER_LOCK = threading.Lock()
_FAILED: list[dict[str, str]] = []  # environments a server could not start in (not tried again)


def get_forkserver(env: Mapping[str, str]) -> ForkServer | None:
    """This process's fork server for child environment ``env`` (started, or replaced if ``env`` changed);
    None where it cannot be used or started (the caller then starts fresh interpreters)."""
    global _SERVER
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of environment variables, got {type(env).__name__}")
    if not forkserver_enabled(env):
        return None
    with _SERVER_LOCK:
        if _SERVER is not None and _SERVER.owner != os.getpid():
            _SERVER = None  # inherited through a fork: the launcher it belongs to still uses it
        if _SERVER is not None and (_SERVER.env != dict(env) or not _SERVER.running()):
            _SERVER.close()
            _SERVER = None
        if _SERVER is None:
            if dict(env) in _FAILED:
                return None
            try:
                _SERVER = ForkServer(env)
            except Exception:  # noqa: BLE001 - no server: fresh interpreters show any real error themselves
                _FAILED.append(dict(env))
                return None
        return _SERVER


def stop_forkserver() -> bool:
    """Stop this process's fork server, if one runs (it also stops by itself when this process exits).
    Returns whether one was running."""
    global _SERVER
    with _SERVER_LOCK:
        server, _SERVER = _SERVER, None
    if server is None:
        return False
    server.close()
    return True


def forkserver_pid() -> int | None:
    """The pid of this process's fork server, or None."""
    server = _SERVER
    return server.proc.pid if server is not None and server.running() else None
