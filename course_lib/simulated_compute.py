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
* :class:`Timeline` (:mod:`course_lib.timelines`, re-exported here with what reads it) records
  spans (``"compute"`` or ``"comm"``) of one rank on a clock started by
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

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn

from .timelines import LANES, Span, Timeline, busy_seconds, exposed_seconds, hidden_seconds, plot_timeline
from .validation import check_instance, check_int, check_number

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
    width = check_int("width", width, minimum=1, maximum=2**16)
    depth = check_int("depth", depth, minimum=1, maximum=10_000)
    seed = check_int("seed", seed)
    if width * (width + 1) * 4 * depth > 2**32:
        raise ValueError(
            f"width {width} and depth {depth} make {width * (width + 1) * 4 * depth:,} bytes of weights: "
            "more than the 4 GiB a simulated model may take"
        )
    torch.manual_seed(seed)
    layers = [
        SimulatedLayer(nn.Sequential(nn.Linear(width, width), nn.Tanh()), forward_ms, backward_ms, timeline, f"L{i}")
        for i in range(depth)
    ]
    return nn.Sequential(*layers)


def record_collectives(timeline: Timeline) -> AbstractContextManager[None]:
    """Inside the block, every call of ``torch.distributed``'s :data:`RECORDED_COLLECTIVES` adds a
    ``"comm"`` span to ``timeline``: from the call to its completion (when the call returns, or, for
    ``async_op=True``, when the backend completes the work). The label is the function's name and the
    bytes of its largest tensor argument (the whole tensor: what an all-gather fills, what a
    reduce-scatter or an all-reduce reduces).

    For code that calls these functions through the ``torch.distributed`` module (FSDP2 does:
    ``dist.all_gather_single``, ``dist.reduce_scatter_single``); DDP's reducer calls its backend from
    C++ and is not seen (a communication hook sees its buckets). The functions are restored on exit.
    """
    check_instance("timeline", timeline, Timeline)  # now, not when the block is entered
    return _recording(timeline)


@contextmanager
def _recording(timeline: Timeline) -> Iterator[None]:
    import torch.distributed as dist

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
