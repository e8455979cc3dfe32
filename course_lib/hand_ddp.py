"""DDP by hand: the canonical copy of what notebook 10 writes by hand.

:class:`HandDDP` wraps a module the way ``torch.nn.parallel.DistributedDataParallel`` does, in
plain Python over ``torch.distributed``:

* at construction it **broadcasts** rank 0's parameters and buffers (so every replica starts
  equal), and before each forward that follows a synchronising one, rank 0's buffers again (DDP's
  ``broadcast_buffers=True``);
* it skips parameters that do not require grad (no hook, no bucket, their ``.grad`` stays ``None``),
  and counts a tied parameter (one tensor used in two places) once: ``module.parameters()`` yields
  it once and autograd accumulates both uses into its one ``.grad`` before the hook fires;
* it groups the trainable parameters into **buckets** in reverse registration order (the order
  their gradients are expected to be ready), whole tensors, closing a bucket once it *reaches*
  the cap (:func:`bucket_assignment`: DDP's rule, including its 1 MiB first bucket when the cap
  is left at the default);
* a ``register_post_accumulate_grad_hook`` per parameter marks its gradient ready; when a bucket's
  last gradient is ready (and every earlier bucket has been launched: the order is the same on
  every rank), the bucket's gradients are divided by the world size, **once**, and an
  asynchronous ``all_reduce`` starts while backward goes on computing earlier layers;
* :meth:`HandDDP.finish` waits for every handle and writes the averaged gradients back into
  ``.grad``; call it after ``backward()`` and before ``optimizer.step()`` (DDP does this in a
  callback queued at the end of backward);
* :meth:`HandDDP.no_sync` skips all of it for gradient accumulation: the next synchronising
  backward all-reduces the accumulated sum.

The three stages a notebook compares are three settings of the same class:
``HandDDP(m, bucket_cap_mb=0, overlap=False)`` is one all-reduce per parameter after backward
(a cap of 0 bytes closes every bucket at its first tensor), ``HandDDP(m, bucket_cap_mb=0)`` one
asynchronous all-reduce per parameter started by its hook, ``HandDDP(m)`` buckets.

Where it differs from PyTorch's DDP (none of it changes the gradients):

* DDP's first step uses **one** bucket for every gradient, then rebuilds the buckets in the order
  the gradients really arrived; HandDDP assigns them once, in reverse registration order, which is
  the arrival order of a model whose layers run in the order they were registered. Compare bucket
  counts from the second step on.
* DDP copies gradients into persistent flat buckets (or makes ``.grad`` views of them with
  ``gradient_as_bucket_view=True``); HandDDP concatenates a bucket's gradients into a fresh tensor
  per step (a one-parameter bucket is all-reduced in place in ``.grad``).
* DDP broadcasts with ``_broadcast_coalesced`` in 250 MiB chunks; HandDDP broadcasts one
  flattened tensor per dtype.
* DDP multiplies by ``1 / world_size``; HandDDP divides by it (the same bits for a power of two).
* No ``find_unused_parameters``, no communication hooks, no sparse gradients, no ``join``.

Every collective is recorded in :attr:`HandDDP.log` (a :class:`CommLog`: kind and bytes of the
tensor handed to the backend), and with a ``timeline`` (``course_lib.simulated_compute``) as a
``"comm"`` span from launch to completion.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .comm_log import CommLog
from .ddp_buckets import DEFAULT_BUCKET_CAP_MB, FIRST_BUCKET_BYTES, bucket_assignment, ddp_bucket_caps
from .timelines import Timeline
from .validation import check_bool

__all__ = [
    "DEFAULT_BUCKET_CAP_MB",
    "FIRST_BUCKET_BYTES",
    "CommLog",
    "HandDDP",
    "bucket_assignment",
    "ddp_bucket_caps",
]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_group_ready(who: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{who} needs a process group: call dist.init_process_group first (or use run_ranks)")


def _broadcast_coalesced(tensors: Sequence[torch.Tensor], log: CommLog, group: Any, src: int = 0) -> None:
    """Overwrite ``tensors`` with rank ``src``'s values: one flattened broadcast per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_dtype.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for same in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1) for t in same])
            dist.broadcast(flat, src=src, group=group)
            log.record("broadcast", _nbytes(flat))
            offset = 0
            for t in same:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def _call_weak(method: weakref.WeakMethod[Any], param: torch.Tensor) -> None:
    """Call a weakly held bound method, if its object is still alive (a gradient hook of :class:`HandDDP`)."""
    bound = method()
    if bound is not None:
        bound(param)


class _Bucket:
    """Parameters whose gradients are all-reduced together, and the state of this step's all-reduce."""

    def __init__(self, index: int, params: list[nn.Parameter]) -> None:
        self.index = index
        self.params = params
        self.nbytes = sum(_nbytes(p) for p in params)
        self.ready = 0
        self.tensor: torch.Tensor | None = None
        self.work: Any = None


class HandDDP(nn.Module):
    """Data parallelism by hand: broadcast at construction, bucketed asynchronous all-reduce in backward.

    ``bucket_cap_mb``: ``None`` (DDP's default: 25 MiB buckets, the first one 1 MiB), a number of
    MiB (every bucket), or ``0`` (one bucket per parameter). ``overlap=False`` starts the
    all-reduces only in :meth:`finish`, after backward (the same buckets, no overlap).
    ``broadcast_buffers``: broadcast rank 0's buffers before a forward, as DDP does.
    ``init_sync=False`` skips the initial broadcast (when every rank built the same weights).
    ``group``: the process group (default: the world). ``timeline``: record comm spans there.

    After ``loss.backward()``, call :meth:`finish` before ``optimizer.step()``; a forward while
    all-reduces are still pending raises ``RuntimeError`` (the step forgot :meth:`finish`).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        bucket_cap_mb: float | None = None,
        overlap: bool = True,
        broadcast_buffers: bool = True,
        init_sync: bool = True,
        group: Any = None,
        timeline: Timeline | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if timeline is not None and not isinstance(timeline, Timeline):
            raise TypeError(f"timeline must be a Timeline or None, got {type(timeline).__name__}")
        caps = ddp_bucket_caps(bucket_cap_mb)
        overlap = check_bool("overlap", overlap)
        broadcast_buffers = check_bool("broadcast_buffers", broadcast_buffers)
        check_bool("init_sync", init_sync)
        _check_group_ready("HandDDP")
        self.module = module
        self.overlap = overlap
        self.broadcast_buffers = broadcast_buffers
        self.cap_bytes, self.first_cap_bytes = caps
        self._group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.timeline = timeline
        self.log = CommLog()
        params = list(module.parameters())  # each tensor once, tied ones included
        self._trainable = [p for p in params if p.requires_grad]
        for p in self._trainable:
            if p.is_sparse or not p.is_floating_point():
                raise ValueError("HandDDP all-reduces dense floating-point gradients only")
        if init_sync:
            _broadcast_coalesced([*params, *module.buffers()], self.log, group)
        arrival = list(reversed(self._trainable))
        groups = bucket_assignment(
            [_nbytes(p) for p in arrival], self.cap_bytes, self.first_cap_bytes, keys=[p.dtype for p in arrival]
        )
        self._buckets = [_Bucket(i, [arrival[j] for j in g]) for i, g in enumerate(groups)]
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._ready: set[int] = set()
        self._next = 0
        self._require_sync = True  # False inside no_sync()
        self._backward_sync = True  # decided by the last forward, as DDP does
        self._sync_buffers_next = True
        self.last_bucket_bytes: list[int] = []
        # The hooks reach this object through a weak reference: a bound method would make a cycle (parameter ->
        # hook -> wrapper -> module -> parameter) that only the garbage collector frees, so a model dropped at the
        # end of a job would keep the process group, and gloo's threads, alive until then (notebook 11, 10.2).
        hook = functools.partial(_call_weak, weakref.WeakMethod(self._grad_ready))
        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in self._trainable]

    # -- what a notebook inspects ----------------------------------------------------------------
    @property
    def bucket_sizes(self) -> list[int]:
        """Bytes of each bucket, in the order they are all-reduced."""
        return [b.nbytes for b in self._buckets]

    @property
    def bucket_params(self) -> list[list[nn.Parameter]]:
        """The parameters of each bucket, in the order they are all-reduced."""
        return [list(b.params) for b in self._buckets]

    @property
    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients are averaged (requires_grad, each tensor once)."""
        return list(self._trainable)

    # -- the training step -----------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._ready or any(b.work is not None for b in self._buckets):
            raise RuntimeError(
                "the previous backward's gradients were never averaged: call finish() after backward() "
                "and before optimizer.step()"
            )
        buffers = list(self.module.buffers())
        if self._sync_buffers_next and self.broadcast_buffers and buffers:
            _broadcast_coalesced(buffers, self.log, self._group)
        out = self.module(*args, **kwargs)
        syncing = torch.is_grad_enabled() and self._require_sync
        self._sync_buffers_next = syncing
        if torch.is_grad_enabled():
            self._backward_sync = self._require_sync
        return out

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, forward and backward only accumulate local gradients (put the forward inside too)."""
        previous = self._require_sync
        self._require_sync = False
        try:
            yield
        finally:
            self._require_sync = previous

    def _grad_ready(self, param: torch.Tensor) -> None:
        if not self._backward_sync:
            return
        if id(param) in self._ready:
            raise RuntimeError(
                "a gradient became ready twice in one step: two backward passes without finish() in between "
                "(accumulate inside no_sync(), or call finish() after each backward)"
            )
        self._ready.add(id(param))
        bucket = self._bucket_of[id(param)]
        bucket.ready += 1
        if self.overlap and bucket.ready == len(bucket.params):
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Start every complete bucket from the next one on, in order: the same order on every rank."""
        while self._next < len(self._buckets):
            bucket = self._buckets[self._next]
            if bucket.ready < len(bucket.params):
                break
            self._launch(bucket)
            self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        grads = [p.grad for p in bucket.params]
        if any(g is None for g in grads):
            raise RuntimeError("a parameter's hook fired but its .grad is None")
        first = grads[0]
        assert first is not None
        if len(grads) == 1 and first.is_contiguous():
            tensor = first  # in place: the gradient itself
        else:
            tensor = torch.cat([g.reshape(-1) for g in grads if g is not None])
        tensor.div_(self.world_size)  # average once: sum over ranks of g / N
        start = self.timeline.now() if self.timeline is not None else 0.0
        work = dist.all_reduce(tensor, group=self._group, async_op=True)
        self.log.record("all_reduce", _nbytes(tensor))
        if self.timeline is not None:
            timeline, label = self.timeline, f"bucket {bucket.index}"
            work.get_future().add_done_callback(lambda _f: timeline.add("comm", label, start, timeline.now()))
        bucket.tensor, bucket.work = tensor, work

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and leave the averaged gradients in ``.grad``.

        Starts the buckets not started yet (all of them with ``overlap=False``). Does nothing after
        a backward inside :meth:`no_sync`, or when no gradient arrived at all. Raises
        ``RuntimeError`` when some trainable parameters got a gradient and others did not (HandDDP,
        like DDP without ``find_unused_parameters``, needs every trainable parameter used).
        """
        if not self._ready:
            return
        missing = [p for p in self._trainable if id(p) not in self._ready]
        if missing:
            shapes = ", ".join(str(tuple(p.shape)) for p in missing[:4])
            for bucket in self._buckets:  # every rank launched the same buckets: let them finish
                if bucket.work is not None:
                    bucket.work.wait()
            self._reset_step()
            raise RuntimeError(
                f"{len(missing)} trainable parameter(s) got no gradient in this backward (shapes {shapes}): "
                "freeze what a step does not use (requires_grad_(False)), as DDP without find_unused_parameters needs"
            )
        self._launch_ready()
        sizes = []
        for bucket in self._buckets:
            bucket.work.wait()
            sizes.append(bucket.nbytes)
            tensor = bucket.tensor
            assert tensor is not None
            if tensor is not bucket.params[0].grad:  # copy the averaged values back out of the bucket
                offset = 0
                for p in bucket.params:
                    g = p.grad
                    assert g is not None
                    g.copy_(tensor[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()
        self.last_bucket_bytes = sizes
        self._reset_step()

    def _reset_step(self) -> None:
        self._ready.clear()
        self._next = 0
        for bucket in self._buckets:
            bucket.ready, bucket.tensor, bucket.work = 0, None, None
