"""What a launch returns or raises: :class:`LaunchResult` and :class:`LaunchError`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LaunchError", "LaunchResult"]


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

    def grouped(self) -> str:
        """All the ranks' output, rank by rank in rank order (the same whatever order the processes
        printed in); launcher agents' own lines are left out. What a notebook cell shows at the end."""

        def key(label: str) -> tuple[int, int, str]:
            m = re.fullmatch(r"rank (\d+)", label)
            return (0, int(m.group(1)), "") if m else (1, 0, label)

        labels = sorted({lab for lab, _ in self.lines if not lab.startswith("agent")}, key=key)
        return "\n".join(f"[{lab}] {text}" for lab in labels for l2, text in self.lines if l2 == lab)
