"""Run a function in new processes with a process group ready, and return what each rank returns.

Named ``run_ranks`` (not ``spawn``) on purpose: ``torch.multiprocessing.spawn`` calls ``fn(i, *args)``
in processes it starts and leaves the process group to ``fn``; this one starts its own processes,
initialises the group for ``fn`` and returns every rank's value. On Linux, a CPU job without its own ``env``
runs its ranks as forks of the fork server (:mod:`course_lib.launch.forkserver`), which has imported torch once;
every other launch, and every launch with ``COURSE_LIB_FORKSERVER=0``, starts fresh interpreters.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .checks import check_cwd, check_device, check_positive_int, check_timeout
from .engine import run_processes
from .ports import rendezvous_port
from .results import LaunchError

__all__ = ["run_ranks"]


def _target_spec(fn: Any) -> tuple[str, str, str | None]:
    """(module name, function name, file path or None) that a fresh process can import."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(
                f"fn as a string must be 'path/to/file.py:function' or 'package.module:function', got {fn!r}"
            )
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
    source = getattr(sys.modules.get(module), "__file__", None)
    return str(module), qualname, source


def run_ranks(
    fn: Callable[..., Any] | str,
    nprocs: int = 2,
    args: Sequence[Any] = (),
    *,
    timeout: float = 60.0,
    backend: str = "gloo",
    device: str = "cpu",
    init_method: str = "env",
    master_port: int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: str = "auto",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` new processes; return their results in rank order.

    The processes are fresh interpreters, or on Linux forks of the fork server for a CPU job without ``env``
    (the module docstring says when); either way each one sees the launch's environment and working directory.

    Each process initialises the default process group before calling ``fn``
    (``init_method="env"``: ``env://`` with ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
    ``WORLD_SIZE`` set; ``"tcp"``: ``tcp://127.0.0.1:<port>``; ``"none"``: no group, ``fn``
    does it) and destroys it afterwards. ``args`` and the return values must be picklable.
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` are set in
    every process either way.

    ``device="cpu"`` (the default) hides every GPU from the processes (``CUDA_VISIBLE_DEVICES=""``),
    so a CPU job stays on the CPU on a GPU machine too. ``device="cuda"`` gives rank ``r`` the GPU
    ``r`` (``torch.cuda.set_device`` and ``init_process_group(device_id=...)``, before ``fn`` runs);
    it needs one GPU per rank and is refused otherwise. ``backend="nccl"`` needs ``device="cuda"``.
    """
    nprocs = _check_job(nprocs, backend, device, init_method, args)
    timeout = check_timeout(timeout)
    _target_spec(fn)  # refused here, in this process, if a fresh process could not import it
    master_port = rendezvous_port(master_port)
    try:
        payload = pickle.dumps(tuple(args))
    except Exception as e:  # noqa: BLE001 - say what could not be pickled
        raise TypeError(f"args must be picklable to reach the new processes: {e}") from e
    with tempfile.TemporaryDirectory(prefix="course_spawn_") as tmp:
        spec_file = _write_spec(tmp, fn, payload, backend, device, init_method, nprocs, master_port, timeout)
        boot = "from course_lib.launch.worker import worker_main; worker_main()"
        commands = [[sys.executable, "-c", boot, str(spec_file), str(rank)] for rank in range(nprocs)]
        # On Linux a CPU job's ranks are forks of the fork server, which has imported torch already
        # (forkserver.py); their sys.argv is what the fresh interpreter's would be.
        fork_argv = [["-c", str(spec_file), str(rank)] for rank in range(nprocs)]
        result = run_processes(
            commands,
            [f"rank {r}" for r in range(nprocs)],
            list(range(nprocs)),
            timeout=timeout,
            env=env,
            cwd=check_cwd(cwd),
            echo=echo,
            device=device,
            error_dir=Path(tmp),
            fork_argv=fork_argv,
        )
        results = []
        for rank in range(nprocs):
            out = Path(tmp) / f"result_{rank}.pkl"
            if not out.exists():
                raise LaunchError(f"rank {rank} exited without returning a result", rank=rank, result=result)
            results.append(pickle.loads(out.read_bytes()))
        result.results = results
        return results


def _check_job(nprocs: Any, backend: Any, device: Any, init_method: Any, args: Any) -> int:
    """run_ranks's own arguments, checked; the number of processes."""
    nprocs = check_positive_int("nprocs", nprocs)
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or 'mpi', got {backend!r}")
    device = check_device(device)
    if backend == "nccl" and device != "cuda":
        raise ValueError("backend='nccl' runs collectives between GPUs: pass device='cuda' (one GPU per rank)")
    if device == "cuda":
        from ..device import gpu_count

        have = gpu_count()
        if nprocs > have:
            raise ValueError(
                f"device='cuda' binds one GPU per rank: {nprocs} ranks need {nprocs} GPUs, this machine has {have}"
                " (two ranks on one GPU is what NCCL refuses as 'Duplicate GPU detected')"
            )
    if init_method not in ("env", "tcp", "none"):
        raise ValueError(f"init_method must be 'env', 'tcp' or 'none', got {init_method!r}")
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError("args must be a tuple or list of extra arguments for fn")
    return nprocs


def _write_spec(
    tmp: str,
    fn: Any,
    payload: bytes,
    backend: str,
    device: str,
    init_method: str,
    nprocs: int,
    port: int,
    timeout: float,
) -> Path:
    """The job's description for its workers (course_lib.launch.worker reads it), written to ``tmp/spec.pkl``."""
    module, name, path = _target_spec(fn)
    spec = {
        "module": module,
        "name": name,
        "path": path,
        "payload": payload,
        "backend": backend,
        "device": device,
        "init_method": init_method,
        "world_size": nprocs,
        "port": port,
        "dir": tmp,
        "sys_path": [str(Path.cwd()), *[p for p in sys.path if p]],
        "timeout": timeout,
    }
    spec_file = Path(tmp) / "spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    return spec_file
