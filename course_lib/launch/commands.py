"""Launcher command lines: ``torchrun`` and the legacy ``python -m torch.distributed.launch``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..validation import check_instance, check_items, is_int
from .checks import check_args, check_positive_int
from .ports import check_port

__all__ = ["check_master_addr", "is_launcher", "rank_offset", "torchrun_command"]


def check_master_addr(master_addr: Any) -> str:
    """The rendezvous host: a non-empty string (a name or an address), never ``None``."""
    if not isinstance(master_addr, str):
        raise TypeError(f"master_addr must be a host name or address (a str), got {type(master_addr).__name__}")
    if not master_addr.strip():
        raise ValueError("master_addr must be a host name or address, got an empty string")
    return master_addr


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
    launcher_args: Sequence[Any] = (),
) -> list[str]:
    """The command line that runs ``script`` under ``torchrun`` (or the legacy launcher).

    ``rdzv="static"`` uses ``--master_addr/--master_port`` and fixed ``--node_rank``s (what
    the source posts and most cluster scripts do); ``rdzv="c10d"`` uses the elastic rendezvous
    (``--rdzv-backend=c10d --rdzv-endpoint=addr:port``). ``tee=True`` adds ``--tee 3``, which
    prefixes each line with the local rank so the launcher can label it. ``launcher_args`` are
    more options for the launcher itself, placed before the script (``["--max-restarts=1"]``).
    """
    check_instance("script", script, (str, os.PathLike), "a path (a str or os.PathLike)")
    check_positive_int("nproc_per_node", nproc_per_node)
    check_positive_int("nnodes", nnodes)
    check_master_addr(master_addr)
    if not is_int(node_rank) or not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be an int in 0..nnodes-1 = 0..{nnodes - 1}, got {node_rank!r}")
    check_port(master_port, "master_port")
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
    extra = check_args(launcher_args, "launcher_args")
    if extra and not extra[0].startswith("-"):
        raise ValueError(f"launcher_args must start with an option (such as '--max-restarts=1'), got {extra!r}")
    return cmd + extra + [str(script), *check_args(args)]


def is_launcher(cmd: Sequence[str]) -> bool:
    """A torchrun agent or the legacy launcher: its own lines are the agent's, its workers' are tee-prefixed.

    Internal: :func:`~course_lib.launch.run_script` labels a command's lines by it.
    """
    cmd = _check_cmd(cmd)
    if not cmd:
        raise ValueError("cmd must be a command line, got an empty list")
    return Path(cmd[0]).name == "torchrun" or any(
        m in cmd[:3] for m in ("torch.distributed.run", "torch.distributed.launch")
    )


def rank_offset(cmd: Sequence[str]) -> int:
    """node_rank * nproc_per_node from a launcher command line (0 when not given).

    Internal: :func:`~course_lib.launch.run_script` numbers a launcher's ranks from it.
    """
    cmd = _check_cmd(cmd)

    def value(name: str) -> int:
        for i, arg in enumerate(cmd):
            for spelling in (f"--{name}", f"--{name.replace('_', '-')}"):
                if arg.startswith(spelling + "="):
                    return int(arg.split("=", 1)[1]) if arg.split("=", 1)[1].isdigit() else 0
                if arg == spelling and i + 1 < len(cmd):
                    return int(cmd[i + 1]) if cmd[i + 1].isdigit() else 0
        return 0

    return value("node_rank") * max(value("nproc_per_node"), 1)


def _check_cmd(cmd: object) -> list[str]:
    """A command line as a list of strings (paths converted), or a ``TypeError`` naming ``cmd``."""
    return [str(arg) for arg in check_items("cmd", cmd, (str, os.PathLike), "a command line (a list of strings)")]
