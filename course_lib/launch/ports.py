"""Ports for the rendezvous: a free one, or whether one is taken."""

from __future__ import annotations

import errno
import socket
from typing import Any

from ..validation import is_int

__all__ = ["free_port", "port_in_use"]


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
    if not is_int(port):
        raise TypeError(f"port must be an int, got {type(port).__name__}")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return port
