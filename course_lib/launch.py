"""Launch multi-process PyTorch jobs from a notebook: never hang, never orphan, always show the error.

A distributed job started from a notebook cell has four ways to go wrong that a terminal hides:
the output of the child processes goes nowhere, a rank that hangs in a collective hangs the
cell forever, a crash leaves processes behind holding the port, and the one traceback that
matters is buried in the noise of the others. Every function here:

* picks a **free port** unless told one (and says clearly when a port given is busy),
* **streams** each rank's output into the cell as it comes, each line prefixed ``[rank N]``;
  in a Jupyter kernel the live view is finally rewritten grouped by rank, so that a committed
  notebook's output does not depend on which process printed first,
* enforces a **timeout** (seconds of wall time for the whole job),
* on error or timeout **kills every process it started**, the children of ``torchrun`` included
  (each child runs in its own session and carries a marker in its environment, so a final sweep
  of ``/proc`` finds any that escaped their process group), and
* raises :class:`LaunchError` (a ``RuntimeError``) naming the failing rank and quoting its
  traceback.

The API (stable; later notebooks rely on it):

``free_port(host="127.0.0.1") -> int``
    A TCP port nobody listens on right now.
``torchrun_command(script, *, nproc_per_node=2, args=(), nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500, rdzv="static", module="torchrun") -> list[str]``
    The exact ``torchrun`` command line (``module="launch"`` gives the legacy
    ``python -m torch.distributed.launch``), for printing and for :func:`run_script`.
``run_torchrun(script, *, nproc_per_node=2, args=(), nnodes=1, node_rank=None, master_addr="127.0.0.1", master_port=None, rdzv="static", timeout=60.0, env=None, cwd=None, echo="auto") -> LaunchResult``
    Run a script under ``torchrun``. With ``nnodes > 1`` and ``node_rank=None`` it starts one
    agent per node on this machine (``--node_rank 0 .. nnodes-1``, same master address and
    port): multi-node, for real, on one host.
``run_script(argv, *, timeout=60.0, env=None, cwd=None, echo="auto", labels=None) -> LaunchResult``
    Run one command (a list of strings) or several at once (a list of such lists, e.g. two
    ``torchrun`` agents, or the legacy launcher) with the same guarantees.
``spawn(fn, nprocs=2, args=(), *, timeout=60.0, backend="gloo", init_method="env", master_port=None, env=None, cwd=None, echo="auto") -> list``
    Run ``fn(rank, world_size, *args)`` in ``nprocs`` fresh processes with a process group
    already initialised (``env://`` or ``tcp://`` on a free port) and return each rank's
    (picklable) return value, in rank order. ``fn`` must be importable: a function of a module
    file (``"path/to/file.py:fn"``, ``"package.module:fn"``, or the function object itself if
    it was imported from a file). A function defined in a notebook cell lives in
    ``__main__`` and cannot be imported by a fresh process; write it to a file with
    ``%%writefile`` (notebooks use ``notebooks/_runs/``, which git ignores) and import it.
``child_stderr()``
    A context manager collecting what child processes write to the inherited file descriptor 2
    (where ``torch.multiprocessing`` children's tracebacks go), to show it in a cell.
``LaunchResult``
    ``returncode``, ``wall_time`` (seconds), ``lines`` (``(label, text)`` pairs in arrival
    order), ``output(rank=None)`` (text of one rank or all), ``ranks`` (labels seen),
    ``results`` (the return values, for :func:`spawn`), ``commands``.
``LaunchError(RuntimeError)``
    ``.reason`` (``"failed"`` / ``"timeout"`` / ``"port in use"``), ``.rank`` (the failing
    rank or None), ``.traceback`` (its traceback text), ``.result`` (what was collected).

``echo``: ``"auto"`` (live in a terminal; live then regrouped by rank in a notebook),
``"live"`` (print each line as it arrives), ``"grouped"`` (print once at the end, by rank),
``"none"``.

Processes are Linux/macOS processes; the ``/proc`` sweep is Linux-only (elsewhere process
groups alone do the cleanup).
"""
from __future__ import annotations

import contextlib
import errno
import os
import pickle
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LaunchError",
    "LaunchResult",
    "free_port",
    "port_in_use",
    "run_script",
    "run_torchrun",
    "spawn",
    "torchrun_command",
    "launched_processes",
    "child_stderr",
]

_MARKER = "COURSE_LIB_LAUNCH_ID"
_ECHO_MODES = ("auto", "live", "grouped", "none")
_GRACE_S = 3.0  # after a first process fails, how long the others get to report before being killed
_TEE_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]\w*?)(?P<local>\d+)\]:(?P<text>.*)$")
_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d+)\]:\s?(?P<text>.*)$")
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.S)
_COLLATERAL = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|SIGTERM|Signal 15", re.I)
_PORT_BUSY = re.compile(r"address already in use|EADDRINUSE|errno: 98|Errno 98", re.I)


class LaunchError(RuntimeError):
    """A launched job failed or timed out. The message names the rank and quotes its traceback."""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "failed",
        rank: int | None = None,
        traceback: str = "",
        result: LaunchResult | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.rank = rank
        self.traceback = traceback
        self.result = result


@dataclass
class LaunchResult:
    """What a finished job left: exit code, wall time, and every line each process printed."""

    returncode: int
    wall_time: float
    lines: list[tuple[str, str]] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    results: list[Any] | None = None

    @property
    def ranks(self) -> list[str]:
        """The labels that printed something, in first-seen order (``"rank 0"``, ``"agent"``...)."""
        seen: dict[str, None] = {}
        for label, _ in self.lines:
            seen.setdefault(label, None)
        return list(seen)

    def output(self, rank: int | str | None = None) -> str:
        """The text printed by one rank (an int, or a label such as ``"agent"``), or all of it."""
        if rank is None:
            return "\n".join(f"[{label}] {text}" for label, text in self.lines)
        if isinstance(rank, bool) or not isinstance(rank, (int, str)):
            raise TypeError(f"rank must be an int, a label string or None, got {type(rank).__name__}")
        label = f"rank {rank}" if isinstance(rank, int) else rank
        return "\n".join(text for lab, text in self.lines if lab == label)

    def grouped(self, include_agents: bool = False) -> str:
        """All output, rank by rank in rank order (deterministic whatever order processes printed in)."""
        return _grouped_text(self.lines, include_agents)


# ----------------------------------------------------------------------------- ports


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` on ``host`` cannot be bound now (someone listens there)."""
    _check_port(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it; a race is possible but rare)."""
    if not isinstance(host, str) or not host:
        raise TypeError(f"host must be a non-empty string, got {host!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int, got {type(port).__name__}")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return port


# ----------------------------------------------------------------------------- validation


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not 0 < timeout < 24 * 3600:
        raise ValueError(f"timeout must be positive seconds (under a day), got {timeout}")
    return float(timeout)


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _check_echo(echo: Any) -> str:
    if echo not in _ECHO_MODES:
        raise ValueError(f"echo must be one of {_ECHO_MODES}, got {echo!r}")
    return str(echo)


def _check_args(args: Any) -> list[str]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError("args must be a list or tuple of command-line arguments, not a single string")
    return [str(a) for a in args]


def _check_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of strings, got {type(env).__name__}")
    return {str(k): str(v) for k, v in env.items()}


def _check_cwd(cwd: Any) -> Path | None:
    if cwd is None:
        return None
    path = Path(cwd)
    if not path.is_dir():
        raise ValueError(f"cwd must be an existing directory, got {cwd!r}")
    return path


# ----------------------------------------------------------------------------- commands


def _torchrun_base(module: str) -> list[str]:
    if module == "torchrun":
        exe = Path(sys.executable).with_name("torchrun")
        return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
    if module == "launch":
        return [sys.executable, "-m", "torch.distributed.launch"]
    raise ValueError(f"module must be 'torchrun' or 'launch' (the legacy torch.distributed.launch), got {module!r}")


def torchrun_command(
    script: str | os.PathLike[str],
    *,
    nproc_per_node: int = 2,
    args: Sequence[Any] = (),
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    rdzv: str = "static",
    module: str = "torchrun",
    tee: bool = True,
) -> list[str]:
    """The command line that runs ``script`` under ``torchrun`` (or the legacy launcher).

    ``rdzv="static"`` uses ``--master_addr/--master_port`` and fixed ``--node_rank``s (what
    the seeds and most cluster scripts do); ``rdzv="c10d"`` uses the elastic rendezvous
    (``--rdzv-backend=c10d --rdzv-endpoint=addr:port``). ``tee=True`` adds ``--tee 3``, which
    prefixes each line with the local rank so the launcher can label it.
    """
    _check_positive_int("nproc_per_node", nproc_per_node)
    _check_positive_int("nnodes", nnodes)
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be an int in 0..nnodes-1 = 0..{nnodes - 1}, got {node_rank!r}")
    _check_port(master_port)
    if rdzv not in ("static", "c10d"):
        raise ValueError(f"rdzv must be 'static' or 'c10d', got {rdzv!r}")
    cmd = _torchrun_base(module)
    cmd += [f"--nnodes={nnodes}", f"--nproc_per_node={nproc_per_node}"]
    if rdzv == "static":
        cmd += [f"--node_rank={node_rank}", f"--master_addr={master_addr}", f"--master_port={master_port}"]
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{master_port}", "--rdzv-id=course"]
    if tee:
        cmd += ["--tee", "3"]
    return cmd + [str(script), *_check_args(args)]


def run_torchrun(
    script: str | os.PathLike[str],
    *,
    nproc_per_node: int = 2,
    args: Sequence[Any] = (),
    nnodes: int = 1,
    node_rank: int | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    rdzv: str = "static",
    module: str = "torchrun",
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: str = "auto",
) -> LaunchResult:
    """Run ``script`` under ``torchrun`` and return its :class:`LaunchResult`; raise :class:`LaunchError` on failure.

    ``nnodes > 1`` with ``node_rank=None`` starts all ``nnodes`` agents here, one per node rank,
    with the same master address and port, exactly as one would on ``nnodes`` machines.
    ``master_port=None`` picks a free port; a port given that is already in use is reported
    at once (``reason="port in use"``).
    """
    workdir = _check_cwd(cwd)
    path = Path(script)
    full = path if path.is_absolute() or workdir is None else workdir / path
    if not full.is_file():
        raise FileNotFoundError(f"script not found: {str(full)!r} (cwd={str(workdir or Path.cwd())!r})")
    _check_positive_int("nnodes", nnodes)
    if master_port is None:
        master_port = free_port()
    elif port_in_use(_check_port(master_port), master_addr if master_addr != "localhost" else "127.0.0.1"):
        raise LaunchError(
            f"master port {master_port} on {master_addr} is already in use (another job, or one that "
            "did not exit); pass master_port=None to use a free port",
            reason="port in use",
        )
    node_ranks = range(nnodes) if node_rank is None else [node_rank]
    commands = [
        torchrun_command(
            script, nproc_per_node=nproc_per_node, args=args, nnodes=nnodes, node_rank=r,
            master_addr=master_addr, master_port=master_port, rdzv=rdzv, module=module,
        )
        for r in node_ranks
    ]
    labels = [f"agent{r}" if nnodes > 1 else "agent" for r in node_ranks]
    rank_offsets = [r * nproc_per_node for r in node_ranks]
    return _run(commands, labels, rank_offsets, timeout=timeout, env=env, cwd=workdir, echo=echo)


def run_script(
    argv: Sequence[str] | Sequence[Sequence[str]],
    *,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: str = "auto",
    labels: Sequence[str] | None = None,
) -> LaunchResult:
    """Run one command, or several concurrently, with the launcher's guarantees.

    ``argv`` is a list of strings (one command) or a list of lists (several, e.g. two
    ``torchrun`` agents). ``"python"`` as a program means this interpreter. A command that is
    a launcher run with ``--tee 3`` gets its lines labelled by rank; otherwise each command's
    lines are labelled by ``labels`` (default ``"rank 0"``, ``"rank 1"``... for plain scripts
    started several at once, ``"main"`` for a single one).
    """
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
        raise TypeError("argv must be a non-empty list of strings, or a list of such lists")
    several = all(isinstance(a, Sequence) and not isinstance(a, str) for a in argv)
    if not several and not all(isinstance(a, (str, os.PathLike)) for a in argv):
        raise TypeError("argv must be a list of strings, or a list of lists of strings")
    commands = [[str(x) for x in a] for a in argv] if several else [[str(x) for x in argv]]
    if any(not c for c in commands):
        raise ValueError("every command must have at least a program name")
    for c in commands:
        if c[0] == "python":
            c[0] = sys.executable
        elif shutil.which(c[0]) is None and not Path(c[0]).exists():
            raise FileNotFoundError(f"program not found: {c[0]!r}")
    launchers = [_is_launcher(c) for c in commands]
    if labels is None:
        if any(launchers):
            labels = ["agent" if len(commands) == 1 else f"agent{i}" for i in range(len(commands))]
        else:
            labels = [f"rank {i}" for i in range(len(commands))] if len(commands) > 1 else ["main"]
    if len(labels) != len(commands) or not all(isinstance(lab, str) for lab in labels):
        raise ValueError(f"labels must be {len(commands)} strings, one per command, got {labels!r}")
    offsets = [_rank_offset(c) if is_l else 0 for c, is_l in zip(commands, launchers)]
    return _run(commands, list(labels), offsets, timeout=timeout, env=env, cwd=_check_cwd(cwd), echo=echo)


def _is_launcher(cmd: Sequence[str]) -> bool:
    """A torchrun agent or the legacy launcher: its own lines are the agent's, its workers' are tee-prefixed."""
    return Path(cmd[0]).name == "torchrun" or any(m in cmd[:3] for m in ("torch.distributed.run", "torch.distributed.launch"))


def _rank_offset(cmd: Sequence[str]) -> int:
    """node_rank * nproc_per_node from a launcher command line (0 when not given)."""
    def value(name: str) -> int:
        for i, arg in enumerate(cmd):
            for spelling in (f"--{name}", f"--{name.replace('_', '-')}"):
                if arg.startswith(spelling + "="):
                    return int(arg.split("=", 1)[1]) if arg.split("=", 1)[1].isdigit() else 0
                if arg == spelling and i + 1 < len(cmd):
                    return int(cmd[i + 1]) if cmd[i + 1].isdigit() else 0
        return 0

    return value("node_rank") * max(value("nproc_per_node"), 1)


# ----------------------------------------------------------------------------- spawn


def _target_spec(fn: Any) -> tuple[str, str, str | None]:
    """(module name, function name, file path or None) that a fresh process can import."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"fn as a string must be 'path/to/file.py:function' or 'package.module:function', got {fn!r}")
        where, name = fn.rsplit(":", 1)
        if not name.isidentifier():
            raise ValueError(f"{name!r} is not a function name")
        if where.endswith(".py"):
            path = Path(where).resolve()
            if not path.is_file():
                raise FileNotFoundError(f"worker file not found: {where!r}")
            return path.stem, name, str(path)
        return where, name, None
    if not callable(fn):
        raise TypeError(f"fn must be a function or a 'file.py:function' string, got {type(fn).__name__}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if module in (None, "__main__", "__mp_main__") or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"{qualname or fn!r} is defined in {module or 'no module'} (a notebook cell or a local scope): a "
            "freshly started process cannot import it. Write the worker to a file (e.g. %%writefile "
            "_runs/worker.py), import it from there, and pass that function or 'file.py:function'."
        )
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    return module, qualname, path


def spawn(
    fn: Callable[..., Any] | str,
    nprocs: int = 2,
    args: Sequence[Any] = (),
    *,
    timeout: float = 60.0,
    backend: str = "gloo",
    init_method: str = "env",
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: str = "auto",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` new processes; return their results in rank order.

    Each process initialises the default process group before calling ``fn``
    (``init_method="env"``: ``env://`` with ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
    ``WORLD_SIZE`` set; ``"tcp"``: ``tcp://127.0.0.1:<port>``; ``"none"``: no group, ``fn``
    does it) and destroys it afterwards. ``args`` and the return values must be picklable.
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` are set in
    every process either way.
    """
    nprocs = _check_positive_int("nprocs", nprocs)
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or 'mpi', got {backend!r}")
    if init_method not in ("env", "tcp", "none"):
        raise ValueError(f"init_method must be 'env', 'tcp' or 'none', got {init_method!r}")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError("args must be a tuple or list of extra arguments for fn")
    timeout = _check_timeout(timeout)
    module, name, path = _target_spec(fn)
    if master_port is None:
        master_port = free_port()
    elif port_in_use(_check_port(master_port)):
        raise LaunchError(
            f"master port {master_port} is already in use; pass master_port=None to use a free port",
            reason="port in use",
        )
    try:
        payload = pickle.dumps(tuple(args))
    except Exception as e:  # noqa: BLE001 - say what could not be pickled
        raise TypeError(f"args must be picklable to reach the new processes: {e}") from e
    with tempfile.TemporaryDirectory(prefix="course_spawn_") as tmp:
        spec = {
            "module": module, "name": name, "path": path, "payload": payload, "backend": backend,
            "init_method": init_method, "world_size": nprocs, "port": master_port, "dir": tmp,
            "sys_path": [str(Path.cwd()), *[p for p in sys.path if p]],
            "timeout": timeout,
        }
        spec_file = Path(tmp) / "spec.pkl"
        spec_file.write_bytes(pickle.dumps(spec))
        boot = "from course_lib.launch import _spawn_worker_main; _spawn_worker_main()"
        commands = [[sys.executable, "-c", boot, str(spec_file), str(rank)] for rank in range(nprocs)]
        result = _run(commands, [f"rank {r}" for r in range(nprocs)], list(range(nprocs)),
                      timeout=timeout, env=env, cwd=_check_cwd(cwd), echo=echo, error_dir=Path(tmp))
        results = []
        for rank in range(nprocs):
            out = Path(tmp) / f"result_{rank}.pkl"
            if not out.exists():
                raise LaunchError(f"rank {rank} exited without returning a result", rank=rank, result=result)
            results.append(pickle.loads(out.read_bytes()))
        result.results = results
        return results


def _spawn_worker_main() -> None:
    """Entry point of a :func:`spawn` child: ``python -c ... spec.pkl rank``."""
    import gc
    import importlib
    import importlib.util
    import traceback
    import weakref
    from datetime import timedelta

    spec_file, rank_s = sys.argv[1], sys.argv[2]
    rank = int(rank_s)
    spec = pickle.loads(Path(spec_file).read_bytes())
    ws = spec["world_size"]
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ws),
                      LOCAL_WORLD_SIZE=str(ws), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
    for p in reversed(spec["sys_path"]):
        if p not in sys.path:
            sys.path.append(p)
    try:
        if spec["path"] is not None:
            mod = sys.modules.get(spec["module"])
            if mod is None or getattr(mod, "__file__", None) != spec["path"]:
                ispec = importlib.util.spec_from_file_location(spec["module"], spec["path"])
                assert ispec is not None and ispec.loader is not None
                mod = importlib.util.module_from_spec(ispec)
                sys.modules[spec["module"]] = mod
                ispec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(spec["module"])
        fn: Any = mod
        for part in spec["name"].split("."):
            fn = getattr(fn, part)
        args = pickle.loads(spec["payload"])
        import torch.distributed as dist

        # Before the group exists: functions of torch.distributed.nn.functional take
        # ``group=group.WORLD`` as a default argument, evaluated at import. DDP imports that module
        # lazily (through torch._dynamo); imported after init_process_group, it would hold the
        # default group for good, and destroy_process_group() below could not free it.
        import torch.distributed.nn  # noqa: F401

        group = spec["init_method"] != "none"
        if group:
            url = "env://" if spec["init_method"] == "env" else f"tcp://127.0.0.1:{spec['port']}"
            dist.init_process_group(spec["backend"], init_method=url, rank=rank, world_size=ws,
                                    timeout=timedelta(seconds=max(spec["timeout"], 1.0)))
        try:
            value = fn(rank, ws, *args)
        except BaseException:
            # record before destroy_process_group(): destroying closes the connections, and the
            # other ranks then fail too; the time stamp lets the launcher tell cause from effect
            Path(spec["dir"], f"error_{rank}.txt").write_text(f"{time.time():.6f}\n{traceback.format_exc()}")
            if group and dist.is_initialized():
                dist.destroy_process_group()
            raise
        Path(spec["dir"], f"result_{rank}.pkl").write_bytes(pickle.dumps(value))
        del value, fn, args  # fn's module may hold the job's objects; the result is on disk
        if group and dist.is_initialized():
            # Tear down together, then free the group while Python is fully alive: the last
            # reference going joins gloo's worker threads. A gloo thread still alive at interpreter
            # shutdown that drops a finished collective holding Python tensors needs the GIL, is
            # ended by Python instead, and the process aborts: "terminate called without an active
            # exception", SIGABRT, after all the work is done.
            dist.barrier()
            world = weakref.ref(dist.group.WORLD)
            dist.destroy_process_group()
            gc.collect()
            if world() is not None:
                sys.stderr.write(
                    f"warning: rank {rank}: the process group outlived destroy_process_group() (something "
                    "still holds it: a DDP model or a Work kept in a global?); its gloo threads may abort "
                    "the process at exit\n"
                )
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        text = traceback.format_exc()
        err = Path(spec["dir"], f"error_{rank}.txt")
        if not err.exists():
            err.write_text(f"{time.time():.6f}\n{text}")
        sys.stderr.write(text)
        sys.stderr.flush()
        # After a failure, skip interpreter teardown: a peer may be gone and a gloo thread stuck in
        # its collective; the error is recorded and the exit code says the rest.
        os._exit(1)


# ----------------------------------------------------------------------------- child stderr


@contextlib.contextmanager
def child_stderr() -> Iterator[list[str]]:
    """Collect what child processes write to their inherited stderr (file descriptor 2).

    ``torch.multiprocessing`` children write their dying words to the parent's file
    descriptor 2, which in a notebook is the kernel's log, not the cell. Inside this block
    descriptor 2 points to a temporary file; on exit it is restored and the list yielded
    receives the collected text (one string)::

        with child_stderr() as err:
            ...  # start processes
        print(err[0])
    """
    collected: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield collected
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            collected.append(tmp.read().decode("utf-8", "replace"))


# ----------------------------------------------------------------------------- the engine


def launched_processes(launch_id: str | None = None) -> list[int]:
    """PIDs of live processes started by this module (optionally by one launch), from ``/proc``.

    Empty where ``/proc`` does not exist. Tests use it to prove no process is left behind.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    needle = f"{_MARKER}={launch_id}".encode() if launch_id else f"{_MARKER}=".encode()
    found = []
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in environ and ") Z " not in stat:  # zombies are already dead
            found.append(int(entry.name))
    return found


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _grouped_text(lines: Sequence[tuple[str, str]], include_agents: bool = False) -> str:
    def key(label: str) -> tuple[int, int, str]:
        m = re.fullmatch(r"rank (\d+)", label)
        return (0, int(m.group(1)), "") if m else (1, 0, label)

    labels = sorted({lab for lab, _ in lines if include_agents or not lab.startswith("agent")}, key=key)
    return "\n".join(f"[{lab}] {text}" for lab in labels for l2, text in lines if l2 == lab)


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

    def finish(self, lines: Sequence[tuple[str, str]]) -> None:
        if self.mode not in ("grouped", "kernel"):
            return
        if self.view is not None:  # the live view has served; the grouped text replaces it
            self.view.outputs = ()
            self.view.layout.display = "none"
        text = _grouped_text(lines)
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


def _kill(procs: Sequence[subprocess.Popen[bytes]], launch_id: str) -> None:
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


def _last_traceback(text: str) -> str:
    idx = text.rfind("Traceback (most recent call last)")
    if idx < 0:
        tail = text.strip().splitlines()[-15:]
        return "\n".join(tail)
    return text[idx:].strip()


def _failing_rank(lines: Sequence[tuple[str, str]], error_dir: Path | None) -> tuple[str | None, str]:
    """The label of the root-cause rank and its traceback."""
    if error_dir is not None:
        found = []
        for path in error_dir.glob("error_*.txt"):
            stamp, _, tb = path.read_text().partition("\n")
            # a rank whose peer died fails with a connection error: an effect, not the cause
            found.append((_COLLATERAL.search(tb) is not None, float(stamp), path.stem.split("_")[1], tb.strip()))
        if found:
            _, _, rank, tb = min(found)
            return f"rank {rank}", tb
    agent_text = "\n".join(t for lab, t in lines if lab.startswith("agent"))
    m = _ROOT_CAUSE.search(agent_text)
    if m:
        label = f"rank {m.group(1)}"
        return label, _last_traceback("\n".join(t for lab, t in lines if lab == label))
    candidates = []
    for i, (label, text) in enumerate(lines):  # first rank to print a traceback, causes before effects
        if text.startswith("Traceback (most recent call last)") and not label.startswith("agent"):
            tb = _last_traceback("\n".join(t for lab, t in lines if lab == label))
            candidates.append((_COLLATERAL.search(tb) is not None, i, label, tb))
    if candidates:
        _, _, label, tb = min(candidates)
        return label, tb
    return None, ""


def _run(
    commands: list[list[str]],
    labels: list[str],
    rank_offsets: list[int],
    *,
    timeout: float,
    env: Mapping[str, str] | None,
    cwd: Path | None,
    echo: str,
    error_dir: Path | None = None,
) -> LaunchResult:
    timeout = _check_timeout(timeout)
    echo_mode = _check_echo(echo)
    launch_id = uuid.uuid4().hex
    child_env = dict(os.environ)
    child_env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set (and warn about) anyway
    child_env.update(_check_env(env))
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env[_MARKER] = launch_id
    q: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[subprocess.Popen[bytes]] = []
    lines: list[tuple[str, str]] = []
    printer = _Echo(echo_mode)
    start = time.monotonic()
    reason = ""
    try:
        for i, cmd in enumerate(commands):
            p = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=child_env, cwd=cwd, start_new_session=True,
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
    printer.finish(lines)
    if reason == "timeout":
        label, tb = _failing_rank(lines, error_dir)
        tails = []
        known = dict.fromkeys([*(lab for lab in labels if not lab.startswith("agent")), *result.ranks])
        for lab in known:
            if lab.startswith("agent") or lab == "main" and len(known) > 1:
                continue
            last = [t for l2, t in lines if l2 == lab][-3:]
            tails.append(f"  [{lab}] last output: " + (" | ".join(last) if last else "(nothing)"))
        msg = (f"the job did not finish within the timeout of {timeout:g} s and was killed (all its processes).\n"
               "A rank that waits in a collective another rank never calls hangs like this.\n" + "\n".join(tails))
        if tb:
            msg += f"\nFirst traceback ({label}):\n{tb}"
        raise LaunchError(msg, reason="timeout", rank=_rank_number(label), traceback=tb, result=result)
    if reason == "failed" or returncode != 0:
        label, tb = _failing_rank(lines, error_dir)
        text = "\n".join(t for _, t in lines)
        failed = [labels[i] for i, c in enumerate(codes) if c not in (0, None)]
        who = label or (failed[0] if failed else "a process")
        msg = f"{who} failed (exit code {returncode})."
        if _PORT_BUSY.search(text):
            msg += " The port it tried to use is already in use: use a free port (course_lib.launch.free_port)."
        if tb:
            msg += f" Its traceback:\n{tb}"
        else:
            tail = "\n".join(f"[{lab}] {t}" for lab, t in lines[-10:])
            msg += f" Last output:\n{tail}"
        raise LaunchError(msg, reason="failed", rank=_rank_number(label), traceback=tb, result=result)
    return result


def _rank_number(label: str | None) -> int | None:
    if label is None:
        return None
    m = re.fullmatch(r"rank (\d+)", label)
    return int(m.group(1)) if m else None
