"""Timelines of one or more ranks: spans of compute and communication, and how much communication compute hid.

:class:`Timeline` records spans (``"compute"`` or ``"comm"``) of one rank on a clock started by
:meth:`Timeline.reset` (call it right after a ``dist.barrier()`` on every rank: the ranks' clocks then start together,
to within the barrier's skew). :func:`busy_seconds`, :func:`hidden_seconds`, :func:`exposed_seconds` and
:func:`plot_timeline` read spans of any number of ranks. :mod:`course_lib.simulated_compute` records on them, and so
do :class:`~course_lib.hand_ddp.HandDDP` and :class:`~course_lib.hand_fsdp.HandFSDP` when given one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .validation import check_int, check_number

__all__ = ["LANES", "Span", "Timeline", "busy_seconds", "exposed_seconds", "hidden_seconds", "plot_timeline"]

LANES: tuple[str, ...] = ("compute", "comm")


@dataclass(frozen=True)
class Span:
    """One interval of work of one rank: ``lane`` is ``"compute"`` or ``"comm"``; times in seconds."""

    rank: int
    lane: str
    label: str
    start: float
    end: float

    def __post_init__(self) -> None:
        check_int("rank", self.rank, minimum=0)
        if self.lane not in LANES:
            raise ValueError(f"lane must be one of {', '.join(LANES)}, got {self.lane!r}")
        if not self.end >= self.start:
            raise ValueError(f"a span cannot end ({self.end}) before it starts ({self.start})")

    @property
    def duration(self) -> float:
        return self.end - self.start


class Timeline:
    """Spans of work of one rank, on a clock that starts at :meth:`reset` (``time.perf_counter``).

    Thread-safe: a communication backend's thread may add a span while the main thread computes.

    >>> tl = Timeline(rank=1)
    >>> with tl.span("comm", "all_reduce 0"):
    ...     pass
    >>> tl.spans[0].rank, tl.spans[0].lane, tl.spans[0].label
    (1, 'comm', 'all_reduce 0')
    """

    def __init__(self, rank: int = 0) -> None:
        self.rank = check_int("rank", rank, minimum=0)
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self._origin = time.perf_counter()

    def reset(self) -> None:
        """Forget every span and start the clock at 0 now."""
        with self._lock:
            self._spans = []
            self._origin = time.perf_counter()

    def now(self) -> float:
        """Seconds since the last :meth:`reset` (or since the timeline was made)."""
        return time.perf_counter() - self._origin

    def add(self, lane: str, label: str, start: float, end: float) -> None:
        """Record a span; ``start``/``end`` are :meth:`now` readings."""
        if not isinstance(label, str):
            raise TypeError(f"label must be a string, got {type(label).__name__}")
        span = Span(self.rank, lane, label, float(start), float(end))
        with self._lock:
            self._spans.append(span)

    @contextmanager
    def span(self, lane: str, label: str) -> Iterator[None]:
        """Record the time the ``with`` block takes as one span."""
        start = self.now()
        try:
            yield
        finally:
            self.add(lane, label, start, self.now())

    @property
    def spans(self) -> list[Span]:
        """The recorded spans, ordered by start time (a copy: picklable, safe to return from a rank)."""
        with self._lock:
            return sorted(self._spans, key=lambda s: (s.start, s.end))


def _spans(spans: Iterable[Span]) -> list[Span]:
    if isinstance(spans, (str, bytes)) or not isinstance(spans, Iterable):
        raise TypeError(f"spans must be an iterable of Span, got {type(spans).__name__}")
    out = list(spans)
    if not all(isinstance(s, Span) for s in out):
        raise TypeError("every item of spans must be a course_lib.simulated_compute.Span")
    return out


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def busy_seconds(spans: Iterable[Span], lane: str, rank: int | None = None) -> float:
    """Seconds in which at least one span of ``lane`` runs (on ``rank``, or summed over ranks).

    >>> busy_seconds([Span(0, "comm", "a", 0.0, 2.0), Span(0, "comm", "b", 1.0, 3.0)], "comm")
    3.0
    """
    ss = _spans(spans)
    if lane not in LANES:
        raise ValueError(f"lane must be one of {', '.join(LANES)}, got {lane!r}")
    ranks = sorted({s.rank for s in ss}) if rank is None else [check_int("rank", rank, minimum=0)]
    total = 0.0
    for r in ranks:
        total += sum(b - a for a, b in _union((s.start, s.end) for s in ss if s.rank == r and s.lane == lane))
    return total


def hidden_seconds(spans: Iterable[Span], rank: int | None = None) -> float:
    """Seconds of communication that ran while the same rank computed: the time overlap hid.

    Summed over ranks unless ``rank`` is given.

    >>> spans = [Span(0, "compute", "B L1", 0.0, 1.0), Span(0, "comm", "bucket 0", 0.5, 1.5)]
    >>> hidden_seconds(spans)
    0.5
    """
    ss = _spans(spans)
    ranks = sorted({s.rank for s in ss}) if rank is None else [check_int("rank", rank, minimum=0)]
    total = 0.0
    for r in ranks:
        compute = _union((s.start, s.end) for s in ss if s.rank == r and s.lane == "compute")
        comm = _union((s.start, s.end) for s in ss if s.rank == r and s.lane == "comm")
        for a, b in comm:
            for c, d in compute:
                total += max(0.0, min(b, d) - max(a, c))
    return total


def exposed_seconds(spans: Iterable[Span], end: float, rank: int = 0) -> float:
    """Seconds from the end of ``rank``'s last compute span to ``end`` (a :meth:`Timeline.now` reading
    taken when the step finished): how long the rank waited for communication after computing.

    >>> exposed_seconds([Span(0, "compute", "B L0", 0.0, 1.0), Span(0, "comm", "bucket 3", 0.9, 1.25)], end=1.25)
    0.25
    """
    ss = [s for s in _spans(spans) if s.rank == check_int("rank", rank, minimum=0) and s.lane == "compute"]
    if not ss:
        raise ValueError(f"no compute span of rank {rank}: nothing to measure from")
    end = float(check_number("end", end, finite=True))
    return max(0.0, end - max(s.end for s in ss))


def plot_timeline(
    spans: Iterable[Span],
    ax: Any = None,
    *,
    title: str | None = None,
    time_unit: str = "ms",
    label: Callable[[Span], str] | None = None,
) -> Any:
    """A Gantt chart of spans: per rank, a compute row (forward blue, backward orange) and a comm row (green).

    The colours are those of ``course_lib.pipeline.plot_gantt``. ``time_unit`` is ``"ms"`` or
    ``"s"``; ``label(span)`` gives the text written in a bar (default: the span's label, on bars
    wide enough for it). Returns the matplotlib ``Axes``; the title defaults to the hidden
    communication time.
    """
    import matplotlib.pyplot as plt

    ss = _spans(spans)
    if not ss:
        raise ValueError("spans is empty: nothing to draw")
    if time_unit not in ("ms", "s"):
        raise ValueError(f"time_unit must be 'ms' or 's', got {time_unit!r}")
    scale = 1000.0 if time_unit == "ms" else 1.0
    ranks = sorted({s.rank for s in ss})
    rows = [(r, lane) for r in ranks for lane in LANES]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 + 0.45 * len(rows)))
    t0 = min(s.start for s in ss)
    span_total = (max(s.end for s in ss) - t0) * scale
    for s in ss:
        row = len(rows) - 1 - rows.index((s.rank, s.lane))
        if s.lane == "comm":
            color = "tab:green"
        else:
            color = "tab:orange" if s.label.startswith("B") else "tab:blue"
        x0, width = (s.start - t0) * scale, s.duration * scale
        ax.broken_barh([(x0, width)], (row - 0.4, 0.8), facecolors=color, edgecolor="white")
        text = label(s) if label is not None else s.label
        if text and width > 0.06 * span_total:
            ax.text(x0 + width / 2, row, text, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r} {lane}" for r, lane in reversed(rows)])
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_xlim(0, span_total)
    if title is None:
        hidden = hidden_seconds(ss) * scale / len(ranks)
        title = f"communication hidden behind compute: {hidden:.1f} {time_unit} per rank"
    ax.set_title(title)
    return ax
