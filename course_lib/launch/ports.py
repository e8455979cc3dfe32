"""Ports for the rendezvous: a free one, or whether one is taken."""

from __future__ import annotations

import errno
import socket
from typing import Any

from ..validation import is_int
from .results import LaunchError

__all__ = ["check_port", "free_port", "port_in_use", "rendezvous_port"]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` on ``host`` cannot be bound now (someone listens there)."""
    check_port(port)
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


def check_port(port: Any, name: str = "port") -> int:
    """A TCP port number: an int in 1..65535 (internal: the launchers check ports with it)."""
    if not is_int(port):
        raise TypeError(f"{name} must be an int, got {type(port).__name__}")
    if not 1 <= port <= 65535:
        raise ValueError(f"{name} must be in 1..65535, got {port}")
    return port


def rendezvous_port(master_port: int | None, host: str = "127.0.0.1") -> int:
    """The rendezvous port of a job: a free one when ``None``; a port given must be free now.

    Internal: :func:`~course_lib.launch.run_torchrun` and :func:`~course_lib.launch.run_ranks` call it.
    """
    if master_port is None:
        return free_port()
    if port_in_use(check_port(master_port, "master_port"), host if host != "localhost" else "127.0.0.1"):
        raise LaunchError(
            f"master port {master_port} on {host} is already in use (another job, or one that did not exit); "
            "pass master_port=None to use a free port",
            reason="port in use",
        )
    return master_port
