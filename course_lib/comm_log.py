"""The log of the collectives a hand-written wrapper issued: :class:`CommLog`, kind and bytes of each call.

:class:`~course_lib.hand_ddp.HandDDP`, :class:`~course_lib.hand_fsdp.HandFSDP` and
:class:`~course_lib.sharded_optim.ShardedOptimizer` record every collective they start in one, so a notebook can
count calls and bytes per kind and compare them with PyTorch's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .validation import check_int

__all__ = ["CommLog"]


@dataclass
class CommLog:
    """The collectives a rank issued: ``(kind, bytes)`` per call, ``bytes`` being the size of the
    tensor the collective works on (the whole all-reduced or all-gathered tensor; a ring algorithm
    sends ``2(N-1)/N`` or ``(N-1)/N`` of it, notebook 09).

    >>> log = CommLog()
    >>> log.record("all_reduce", 400); log.record("all_reduce", 100); log.record("broadcast", 64)
    >>> log.calls("all_reduce"), log.bytes("all_reduce"), log.calls()
    (2, 500, 3)
    >>> log.summary()
    {'all_reduce': (2, 500), 'broadcast': (1, 64)}
    """

    entries: list[tuple[str, int]] = field(default_factory=list)

    def record(self, kind: str, nbytes: int) -> None:
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"kind must be a non-empty string, got {kind!r}")
        self.entries.append((kind, check_int("nbytes", nbytes, minimum=0)))

    def calls(self, kind: str | None = None) -> int:
        """How many collectives (of ``kind``, or of any kind)."""
        return sum(1 for k, _ in self.entries if kind is None or k == kind)

    def bytes(self, kind: str | None = None) -> int:
        """Their bytes, summed."""
        return sum(n for k, n in self.entries if kind is None or k == kind)

    def sizes(self, kind: str) -> list[int]:
        """The bytes of each collective of ``kind``, in the order they were issued."""
        return [n for k, n in self.entries if k == kind]

    def summary(self) -> dict[str, tuple[int, int]]:
        """``{kind: (calls, bytes)}``."""
        out: dict[str, tuple[int, int]] = {}
        for k, n in self.entries:
            calls, total = out.get(k, (0, 0))
            out[k] = (calls + 1, total + n)
        return out

    def reset(self) -> None:
        self.entries.clear()
