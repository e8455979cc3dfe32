"""A simulated compute device: layers whose forward and backward take a known time, on a CPU.

Overlapping communication with computation (DDP's buckets, FSDP's prefetch) saves time only when
there is computation to hide the communication behind. On a laptop's CPU the "device" and the
communication share the same few cores, so a real model measures mostly the contention between
them. Here a layer does its real math (quickly: the layers are small) and then **sleeps** for the
rest of a fixed time. A sleeping thread holds no core and releases the GIL, so the backend's
communication threads (gloo's) run during it, as NCCL runs while a GPU computes. A step's compute
time is then known in advance, and the time that overlap hides can be measured against it.

* :func:`delay` is an identity on a tensor whose forward takes ``forward_ms`` and whose backward
  takes ``backward_ms`` (an ``autograd.Function``); :class:`SimulatedLayer` runs a module and then
  the delay, so the module's parameter gradients are ready at the *end* of its simulated backward;
  :func:`simulated_mlp` builds a stack of them.
* :class:`Timeline` records spans (``"compute"`` or ``"comm"``) of one rank on a clock started by
  :meth:`Timeline.reset` (call it right after a ``dist.barrier()`` on every rank: the ranks'
  clocks then start together, to within the barrier's skew). :func:`busy_seconds`,
  :func:`hidden_seconds`, :func:`exposed_seconds` and :func:`plot_timeline` read spans of any
  number of ranks.

``course_lib.hand_ddp.HandDDP`` and ``course_lib.hand_fsdp.HandFSDP`` record their collectives on a
:class:`Timeline` when given one; a comm span runs from the moment the collective is issued to the
moment the backend completes it (a callback on its future, run on the backend's thread).
:func:`record_collectives` records the collectives of code that is not the course's own (FSDP2's)
on a timeline the same way.

>>> import torch
>>> tl = Timeline()
>>> layer = SimulatedLayer(torch.nn.Linear(4, 4), forward_ms=2, backward_ms=3, timeline=tl, name="L0")
>>> layer(torch.randn(2, 4)).sum().backward()
>>> [(s.lane, s.label) for s in tl.spans]
[('compute', 'F L0'), ('compute', 'B L0')]
>>> all(s.end - s.start >= 0.002 for s in tl.spans)
True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .validation import check_int, check_number

__all__ = [
    "LANES",
    "Span",
    "Timeline",
    "SimulatedLayer",
    "busy_seconds",
    "delay",
    "exposed_seconds",
    "hidden_seconds",
    "plot_timeline",
    "record_collectives",
    "simulated_mlp",
    "RECORDED_COLLECTIVES",
]

RECORDED_COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "broadcast",
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
)

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


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class _Delay(torch.autograd.Function):
    """Identity; forward and backward each end no earlier than a fixed time after they start."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float, timeline: Timeline | None, label: str
    ) -> torch.Tensor:
        start = time.perf_counter()
        t0 = timeline.now() if timeline is not None else 0.0
        _sleep_until(start + forward_s)
        if timeline is not None:
            timeline.add("compute", f"F {label}".strip(), t0, timeline.now())
        ctx.backward_s, ctx.timeline, ctx.label = backward_s, timeline, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        start = time.perf_counter()
        timeline: Timeline | None = ctx.timeline
        t0 = timeline.now() if timeline is not None else 0.0
        _sleep_until(start + ctx.backward_s)
        if timeline is not None:
            timeline.add("compute", f"B {ctx.label}".strip(), t0, timeline.now())
        return grad, None, None, None, None


def _check_ms(name: str, value: object) -> float:
    ms = float(check_number(name, value, finite=True))
    if ms < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return ms


def delay(
    x: torch.Tensor, forward_ms: float, backward_ms: float, timeline: Timeline | None = None, label: str = ""
) -> torch.Tensor:
    """``x`` unchanged, but its forward takes ``forward_ms`` and the backward through it ``backward_ms``.

    Each waits by sleeping (no core used, GIL released) until that time has passed since it
    started. With a ``timeline``, each records a ``"compute"`` span labelled ``"F <label>"`` or
    ``"B <label>"``.

    >>> x = torch.ones(3, requires_grad=True)
    >>> delay(x, 1, 1).sum().backward()
    >>> x.grad
    tensor([1., 1., 1.])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    f, b = _check_ms("forward_ms", forward_ms), _check_ms("backward_ms", backward_ms)
    if timeline is not None and not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline or None, got {type(timeline).__name__}")
    if not isinstance(label, str):
        raise TypeError(f"label must be a string, got {type(label).__name__}")
    out = _Delay.apply(x, f / 1000, b / 1000, timeline, label)
    assert isinstance(out, torch.Tensor)
    return out


class SimulatedLayer(nn.Module):
    """``module``'s real output, then :func:`delay`: a layer with a known forward and backward time.

    In backward the delay runs first (it comes last in forward), so the module's parameter
    gradients are ready when its simulated backward time has passed, as on a device that takes
    that long to compute them.
    """

    def __init__(
        self,
        module: nn.Module,
        forward_ms: float,
        backward_ms: float,
        timeline: Timeline | None = None,
        name: str = "",
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if timeline is not None and not isinstance(timeline, Timeline):
            raise TypeError(f"timeline must be a Timeline or None, got {type(timeline).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a string, got {type(name).__name__}")
        self.module = module
        self.forward_ms = _check_ms("forward_ms", forward_ms)
        self.backward_ms = _check_ms("backward_ms", backward_ms)
        self.timeline = timeline
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return delay(self.module(x), self.forward_ms, self.backward_ms, self.timeline, self.name)


def simulated_mlp(
    width: int,
    depth: int,
    forward_ms: float,
    backward_ms: float,
    timeline: Timeline | None = None,
    *,
    seed: int = 0,
) -> nn.Sequential:
    """``depth`` simulated layers, each ``Linear(width, width)`` then ``tanh``, named ``L0``, ``L1``, ...

    The weights come from ``torch.manual_seed(seed)`` (the same on every rank). Each layer's
    gradients are ``width * (width + 1) * 4`` bytes, all-reduced by DDP while the layers before it
    compute their backward.

    >>> m = simulated_mlp(8, 3, forward_ms=1, backward_ms=2)
    >>> len(m), sum(p.numel() for p in m.parameters())
    (3, 216)
    """
    width = check_int("width", width, minimum=1)
    depth = check_int("depth", depth, minimum=1)
    seed = check_int("seed", seed)
    torch.manual_seed(seed)
    layers = [
        SimulatedLayer(nn.Sequential(nn.Linear(width, width), nn.Tanh()), forward_ms, backward_ms, timeline, f"L{i}")
        for i in range(depth)
    ]
    return nn.Sequential(*layers)


@contextmanager
def record_collectives(timeline: Timeline) -> Iterator[None]:
    """Inside the block, every call of ``torch.distributed``'s :data:`RECORDED_COLLECTIVES` adds a
    ``"comm"`` span to ``timeline``: from the call to its completion (when the call returns, or, for
    ``async_op=True``, when the backend completes the work). The label is the function's name and the
    bytes of its largest tensor argument (the whole tensor: what an all-gather fills, what a
    reduce-scatter or an all-reduce reduces).

    For code that calls these functions through the ``torch.distributed`` module (FSDP2 does:
    ``dist.all_gather_single``, ``dist.reduce_scatter_single``); DDP's reducer calls its backend from
    C++ and is not seen (a communication hook sees its buckets). The functions are restored on exit.
    """
    import torch.distributed as dist

    if not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    saved = {name: getattr(dist, name) for name in RECORDED_COLLECTIVES if hasattr(dist, name)}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            nbytes = max((t.numel() * t.element_size() for t in tensors), default=0)
            label = f"{name} {nbytes:,} B"
            start = timeline.now()
            work = fn(*args, **kwargs)
            if kwargs.get("async_op") and work is not None:
                work.get_future().add_done_callback(lambda _f: timeline.add("comm", label, start, timeline.now()))
            else:
                timeline.add("comm", label, start, timeline.now())
            return work

        return recorded

    try:
        for name, fn in saved.items():
            setattr(dist, name, wrap(name, fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


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
