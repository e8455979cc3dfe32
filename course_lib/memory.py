"""Peak memory of a training step, read from the allocator, and the bytes a model's state takes.

Two questions about training memory need two different tools:

* *What is kept alive?* Parameters, their ``.grad`` buffers and the optimizer's state are plain
  tensors you can add up: :func:`state_bytes`.
* *What is the highest point the step reaches?* Activations saved for backward, recomputed
  activations (gradient checkpointing), gradient buffers and temporaries come and go during
  forward and backward. Saved-tensor hooks (:class:`course_lib.saved_tensors.SavedTensorMeter`)
  see what autograd keeps between forward and backward, but not what is allocated while the
  backward pass runs (for example the recomputation inside a non-reentrant checkpoint), and
  ``tracemalloc`` sees nothing of PyTorch's allocator. The allocator's own record does:

  - on CPU, ``torch.profiler`` with ``profile_memory=True`` logs every allocation and free of
    the step (:func:`allocation_events`, the one place that reads the profiler's private
    record); :func:`measure_peak` replays them and reports the highest running total;
  - on CUDA, ``torch.cuda.max_memory_allocated`` is that highest total, kept by the allocator.

Both report bytes *above what was allocated when the measurement started*, so numbers are
deterministic on CPU (no timing, no caching allocator) and can be asserted in a notebook.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .saved_tensors import _storage_key
from .sharding import StateBytes
from .torch_private import profiler_memory_events
from .validation import check_instance, check_int

# Kineto (the profiler's backend) prints two timestamped "USDT: profiler_start/stop" lines to
# stderr on every profile, which a notebook would capture as output. Level 6 silences them;
# it must be set before the profiler is first used, so it is set when this module is imported.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__all__ = [
    "StepMemory",
    "StateBytes",
    "allocation_events",
    "measure_peak",
    "step_peak_memory",
    "state_bytes",
    "tensor_bytes",
]


@dataclass(frozen=True)
class StepMemory:
    """What the allocator saw while a function ran, in bytes above the starting point.

    ``peak_bytes``: the highest total reached; ``retained_bytes``: what was still allocated at
    the end (e.g. new ``.grad`` buffers); ``device``: ``"cpu"`` or ``"cuda:N"``; ``result``:
    what the function returned (not part of the comparison or the repr).
    """

    peak_bytes: int
    retained_bytes: int
    device: str
    result: Any = None

    def __post_init__(self) -> None:
        check_int("peak_bytes", self.peak_bytes, minimum=0)
        check_int("retained_bytes", self.retained_bytes, what="an int (bytes; negative when memory was freed)")
        check_instance("device", self.device, str, "a device name such as 'cpu' or 'cuda:0'")

    def __repr__(self) -> str:
        return f"StepMemory(peak_bytes={self.peak_bytes}, retained_bytes={self.retained_bytes}, device={self.device!r})"


def _as_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"device {device!r} is not a valid torch device: {e}") from None
    if not isinstance(device, torch.device):
        raise TypeError(
            f"device must be a torch.device, a string such as 'cpu' or 'cuda', or None; got {type(device).__name__}"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"only 'cpu' and 'cuda' devices can be measured, got {device.type!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device is 'cuda' but no CUDA GPU is visible; measure on 'cpu' instead")
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    return device


def allocation_events(prof: Any) -> list[tuple[int, int]]:
    """``(start_ns, nbytes)`` of every CPU allocation (``nbytes > 0``) and free (``< 0``) a finished
    ``torch.profiler.profile(profile_memory=True)`` recorded, in time order.

    The idea is public and simple: the profiler logs each call to the allocator as a ``[memory]``
    event with its size, and the running sum of the sizes, in time order, is the memory in use.
    The way to read them is not: the public ``prof.events()`` has no per-allocation sizes, so
    :func:`course_lib.torch_private.profiler_memory_events` reads PyTorch's private record.
    """
    from torch.profiler import profile

    if not isinstance(prof, profile):
        raise TypeError(f"prof must be a finished torch.profiler.profile, got {type(prof).__name__}")
    if getattr(prof, "profiler", None) is None:
        raise ValueError("prof has recorded nothing yet: read it after its `with` block has ended")
    events = profiler_memory_events(prof)
    events.sort(key=lambda e: e[0])  # stable: ties keep the allocator's order
    return events


def _cpu_peak(fn: Callable[[], Any]) -> tuple[int, int, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        result = fn()
    running = peak = 0
    for _, nbytes in allocation_events(prof):
        running += nbytes  # positive for an allocation, negative for a free
        peak = max(peak, running)
    return peak, running, result


def _cuda_peak(fn: Callable[[], Any], device: torch.device) -> tuple[int, int, Any]:
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - start
    return max(peak, 0), torch.cuda.memory_allocated(device) - start, result


def measure_peak(fn: Callable[[], Any], *, device: torch.device | str | None = None) -> StepMemory:
    """Run ``fn()`` once and return the allocator's peak above the starting point.

    >>> x = torch.ones(1024)                     # allocated before: not counted
    >>> m = measure_peak(lambda: (x * 2).sum())  # x * 2 allocates 4 KiB, then is freed
    >>> m.peak_bytes >= 4096, m.retained_bytes  # retained: the returned sum, a 4-byte scalar
    (True, 4)

    ``device`` is ``"cpu"`` (the default: allocation events from ``torch.profiler``) or a CUDA
    device (``torch.cuda.max_memory_allocated``). Only that device's memory is counted.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}")
    dev = _as_device(device)
    if dev.type == "cuda":
        peak, retained, result = _cuda_peak(fn, dev)
    else:
        peak, retained, result = _cpu_peak(fn)
    return StepMemory(peak_bytes=int(peak), retained_bytes=int(retained), device=str(dev), result=result)


def step_peak_memory(
    model: torch.nn.Module,
    inputs: torch.Tensor | tuple[torch.Tensor, ...],
    *,
    forward: Callable[..., torch.Tensor] | None = None,
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepMemory:
    """Peak memory of one forward + backward step of ``model`` on ``inputs``.

    The model's gradients are set to ``None`` first, so new ``.grad`` buffers count in the
    peak and in ``retained_bytes``. ``forward(model, *inputs)`` replaces ``model(*inputs)``
    (e.g. to run it through ``checkpoint_sequential``); ``loss_fn(output)`` defaults to
    ``output.sum()``. The device is the one the model's parameters (or the input) live on.
    The returned ``result`` is the loss, detached.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    args = (inputs,) if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(args, tuple) or not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError("inputs must be a tensor or a non-empty tuple of tensors")
    for name, f in (("forward", forward), ("loss_fn", loss_fn)):
        if f is not None and not callable(f):
            raise TypeError(f"{name} must be callable or None, got {type(f).__name__}")
    param = next(model.parameters(), None)
    device = param.device if param is not None else args[0].device
    model.zero_grad(set_to_none=True)
    for a in args:
        if a.requires_grad and a.is_leaf:
            a.grad = None

    def step() -> torch.Tensor:
        out = forward(model, *args) if forward is not None else model(*args)
        loss = loss_fn(out) if loss_fn is not None else out.sum()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("the loss must be a single-element tensor")
        loss.backward()
        return loss.detach()

    return measure_peak(step, device=device)


def _unique_storages(tensors: Iterable[Any]) -> int:
    """Bytes of the storages behind the tensors among ``tensors``, each storage once (views share one)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = _storage_key(t)
        nbytes = t.untyped_storage().nbytes()
        if key in seen or nbytes == 0:
            continue
        seen.add(key)
        total += nbytes
    return total


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage counted once (views share one)."""
    if isinstance(tensors, torch.Tensor):
        raise TypeError("tensor_bytes takes an iterable of tensors (e.g. model.parameters()), not one tensor")
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Iterable):
        raise TypeError(f"tensors must be an iterable of tensors (model.parameters()), got {type(tensors).__name__}")
    items = list(tensors)
    bad = [type(t).__name__ for t in items if not isinstance(t, torch.Tensor)]
    if bad:
        raise TypeError(f"tensor_bytes takes tensors only, got {bad[0]}")
    return _unique_storages(items)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Add up what ``model`` and ``optimizer`` keep between steps, each storage once.

    Gradients count only where ``.grad`` exists (after a backward, unless set to ``None``);
    optimizer state only once the optimizer has stepped (SGD without momentum keeps none,
    SGD with momentum one buffer per parameter, Adam two plus a ``step`` counter tensor).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    state: list[Any] = []
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    return StateBytes(_unique_storages(params), _unique_storages(grads), _unique_storages(state))
