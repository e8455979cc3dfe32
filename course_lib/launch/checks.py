"""The launcher's argument checks: each says what was wrong and what is allowed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..validation import check_int, is_number

_ECHO_MODES = ("auto", "live", "grouped", "none")
_DEVICES = ("cpu", "cuda")


def _check_timeout(timeout: Any) -> float:
    if not is_number(timeout):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not 0 < timeout < 24 * 3600:
        raise ValueError(f"timeout must be positive seconds (under a day), got {timeout}")
    return float(timeout)


def _check_positive_int(name: str, value: Any) -> int:
    return check_int(name, value, minimum=1)


def _check_echo(echo: Any) -> str:
    if echo not in _ECHO_MODES:
        raise ValueError(f"echo must be one of {_ECHO_MODES}, got {echo!r}")
    return str(echo)


def _check_args(args: Any, name: str = "args") -> list[str]:
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(f"{name} must be a list or tuple of command-line arguments, not a single string")
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


def _check_device(device: Any) -> str:
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES} (the processes' device), got {device!r}")
    return str(device)
