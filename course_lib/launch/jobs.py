"""Run scripts under ``torchrun`` (one node or several) or as plain commands, with the engine's guarantees."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..validation import check_instance
from .checks import check_cwd, check_positive_int
from .commands import check_master_addr, is_launcher, rank_offset, torchrun_command
from .engine import run_processes
from .ports import rendezvous_port
from .results import LaunchResult

__all__ = ["run_script", "run_torchrun"]


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
    launcher_args: Sequence[Any] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: str = "auto",
    device: str = "cpu",
) -> LaunchResult:
    """Run ``script`` under ``torchrun`` and return its :class:`LaunchResult`; raise :class:`LaunchError` on failure.

    ``nnodes > 1`` with ``node_rank=None`` starts all ``nnodes`` agents here, one per node rank,
    with the same master address and port, exactly as one would on ``nnodes`` machines.
    ``master_port=None`` picks a free port; a port given that is already in use is reported
    at once (``reason="port in use"``). ``launcher_args`` go to ``torchrun`` itself, before the
    script: ``launcher_args=["--max-restarts=1"]`` lets the agent restart the workers once.
    ``device="cpu"`` (the default) hides every GPU from the job (``CUDA_VISIBLE_DEVICES=""``);
    ``device="cuda"`` leaves them visible, for a script that binds ``LOCAL_RANK`` to its GPU.
    """
    workdir = check_cwd(cwd)
    path = Path(check_instance("script", script, (str, os.PathLike), "a path (a str or os.PathLike)"))  # type: ignore[arg-type]
    full = path if path.is_absolute() or workdir is None else workdir / path
    if not full.is_file():
        raise FileNotFoundError(f"script not found: {str(full)!r} (cwd={str(workdir or Path.cwd())!r})")
    check_positive_int("nnodes", nnodes)
    check_master_addr(master_addr)
    master_port = rendezvous_port(master_port, master_addr)
    node_ranks = range(nnodes) if node_rank is None else [node_rank]
    commands = [
        torchrun_command(
            script,
            nproc_per_node=nproc_per_node,
            args=args,
            nnodes=nnodes,
            node_rank=r,
            master_addr=master_addr,
            master_port=master_port,
            rdzv=rdzv,
            module=module,
            launcher_args=launcher_args,
        )
        for r in node_ranks
    ]
    labels = [f"agent{r}" if nnodes > 1 else "agent" for r in node_ranks]
    rank_offsets = [r * nproc_per_node for r in node_ranks]
    return run_processes(
        commands, labels, rank_offsets, timeout=timeout, env=env, cwd=workdir, echo=echo, device=device
    )


def run_script(
    argv: Sequence[str] | Sequence[Sequence[str]],
    *,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    echo: str = "auto",
    labels: Sequence[str] | None = None,
    device: str = "cpu",
) -> LaunchResult:
    """Run one command, or several concurrently, with the launcher's guarantees.

    ``argv`` is a list of strings (one command) or a list of lists (several, e.g. two
    ``torchrun`` agents). ``"python"`` as a program means this interpreter. A command that is
    a launcher run with ``--tee 3`` gets its lines labelled by rank; otherwise each command's
    lines are labelled by ``labels`` (default ``"rank 0"``, ``"rank 1"``... for plain scripts
    started several at once, ``"main"`` for a single one). ``device`` as for :func:`run_torchrun`:
    ``"cpu"`` hides the GPUs from the commands, ``"cuda"`` leaves them visible.
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
    launchers = [is_launcher(c) for c in commands]
    if labels is None:
        if any(launchers):
            labels = ["agent" if len(commands) == 1 else f"agent{i}" for i in range(len(commands))]
        else:
            labels = [f"rank {i}" for i in range(len(commands))] if len(commands) > 1 else ["main"]
    if len(labels) != len(commands) or not all(isinstance(lab, str) for lab in labels):
        raise ValueError(f"labels must be {len(commands)} strings, one per command, got {labels!r}")
    offsets = [rank_offset(c) if is_l else 0 for c, is_l in zip(commands, launchers)]
    return run_processes(
        commands, list(labels), offsets, timeout=timeout, env=env, cwd=check_cwd(cwd), echo=echo, device=device
    )
