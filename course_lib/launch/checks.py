"""The launcher's argument checks: each says what was wrong and what is allowed.

Internal API of :mod:`course_lib.launch`: the launching modules (``jobs``, ``ranks``, ``commands``,
``engine``) validate their arguments with these; the package does not export them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..validation import check_int, is_number

__all__ = [
    "check_args",
    "check_cwd",
    "check_device",
    "check_echo",
    "check_env",
    "check_positive_int",
    "check_timeout",
]

_ECHO_MODES = ("auto", "live", "grouped", "none")
_DEVICES = ("cpu", "cuda")


def check_timeout(timeout: Any) -> float:
    """A job's timeout: positive seconds, under a day."""
    if not is_number(timeout):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not 0 < timeout < 24 * 3600:
        raise ValueError(f"timeout must be positive seconds (under a day), got {timeout}")
    return float(timeout)


def check_positive_int(name: str, value: Any) -> int:
    """A count of processes or nodes: an int >= 1."""
    return check_int(name, value, minimum=1)


def check_echo(echo: Any, name: str = "echo") -> str:
    """How the output is shown: one of ``auto``, ``live``, ``grouped``, ``none``."""
    if echo not in _ECHO_MODES:
        raise ValueError(f"{name} must be one of {_ECHO_MODES}, got {echo!r}")
    return str(echo)


def check_args(args: Any, name: str = "args") -> list[str]:
    """Command-line arguments: a list or tuple (never one string), as strings."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(f"{name} must be a list or tuple of command-line arguments, not a single string")
    return [str(a) for a in args]


def check_env(env: Any) -> dict[str, str]:
    """Extra environment variables: a mapping (or ``None``), as strings."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of strings, got {type(env).__name__}")
    return {str(k): str(v) for k, v in env.items()}


def check_cwd(cwd: Any) -> Path | None:
    """The processes' working directory: an existing directory, or ``None`` for the caller's."""
    if cwd is None:
        return None
    path = Path(cwd)
    if not path.is_dir():
        raise ValueError(f"cwd must be an existing directory, got {cwd!r}")
    return path


def check_device(device: Any) -> str:
    """The processes' device: ``cpu`` (GPUs hidden) or ``cuda``."""
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES} (the processes' device), got {device!r}")
    return str(device)
