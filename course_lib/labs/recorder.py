"""Record the collectives a learner's code issues in a lab's rank: which, how big, when, and when it waited.

The harness installs :class:`CollectiveRecorder` before it imports the learner's file. It wraps the functions of
``torch.distributed`` a lab uses, so that every call still runs for real (on gloo, between real processes) and is
also noted: the operation, the bytes, whether it was asynchronous, and whether it was issued (and later waited for)
while autograd's backward was running. That is what tells overlap from none, a wait inside a hook, a bucket launched
out of order, or communication inside ``no_sync``. PyTorch's own implementations (DDP's reducer, FSDP2) call C++
directly and are not recorded.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..torch_private import in_backward

__all__ = ["Call", "CollectiveRecorder"]

# The functions a lab may call, and the argument that holds the tensor whose bytes are counted.
_RECORDED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)


@dataclass
class Call:
    """One recorded collective."""

    op: str
    nbytes: int  # the tensor handed in: what an all-to-all sends (its input), the buffer of other collectives
    async_op: bool
    in_backward: bool  # issued while backward ran (from a hook)
    step: int  # the harness's step counter when it was issued
    waited_in_backward: bool = False  # its handle's wait() was called while backward ran


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class _RecordedWork:
    """A handle whose ``wait()`` is noted; everything else is the real handle's."""

    def __init__(self, work: Any, call: Call) -> None:
        self._work, self._call = work, call

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if in_backward():
            self._call.waited_in_backward = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CollectiveRecorder:
    """Wraps ``torch.distributed``'s collectives for the life of :meth:`installed`; :attr:`calls` is the record."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.step = 0
        self._depth = threading.local()  # > 0 inside a recorded call, on this thread
        self._depth.value = 0

    def _wrap(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "value", 0)
            if depth:  # called by another recorded function (send calls isend): counted once, there
                return fn(*args, **kwargs)
            async_op = bool(kwargs.get("async_op", False)) or name in ("isend", "irecv")
            sent = args[1] if name in ("all_to_all", "all_to_all_single") and len(args) > 1 else (args or [None])[0]
            call = Call(name, _nbytes(sent), async_op, in_backward(), self.step)
            self.calls.append(call)
            self._depth.value = depth + 1
            try:
                work = fn(*args, **kwargs)
            finally:
                self._depth.value = depth
            return _RecordedWork(work, call) if work is not None and async_op else work

        return recorded

    @contextmanager
    def installed(self) -> Iterator[CollectiveRecorder]:
        """Wrap the functions in ``torch.distributed`` and in ``distributed_c10d`` alike: ``P2POp`` accepts only the
        module's own ``isend``/``irecv``, so both names must hold the same wrapper for ``batch_isend_irecv``."""
        import torch.distributed.distributed_c10d as c10d

        modules = (dist, c10d)
        saved = {(m, name): getattr(m, name) for m in modules for name in _RECORDED if hasattr(m, name)}
        try:
            for name in _RECORDED:
                if hasattr(dist, name):
                    wrapped = self._wrap(name, getattr(dist, name))
                    for m in modules:
                        if hasattr(m, name):
                            setattr(m, name, wrapped)
            yield self
        finally:
            for (m, name), fn in saved.items():
                setattr(m, name, fn)

    def of(self, op: str, step: int | None = None) -> list[Call]:
        """The recorded calls of one operation (of one step, if given)."""
        return [c for c in self.calls if c.op == op and (step is None or c.step == step)]

    def reset(self) -> None:
        self.calls.clear()
