"""Simulated ranks for checking a learner's distributed code inside one notebook kernel.

A check cannot start processes for every attempt, so it runs the learner's code once per simulated
rank, one rank after the other, with ``torch.distributed``'s functions replaced (for the duration of
the check only) by stand-ins that record each call and compute what the real collective would
have computed over all simulated ranks:

* :class:`AsyncAllReduce`: ``dist.all_reduce`` (asynchronous or not). Every rank runs first; then
  :meth:`AsyncAllReduce.resolve` sums the tensors each rank handed over (as they were *when the
  call was made*, as a backend reads them) and writes the result into every rank's tensor; a handle's
  ``wait()`` before that is noted as "waited too early".
* :class:`ReplayedReduceScatter`: ``dist.reduce_scatter_single`` and its relatives, which return
  their result at once. The learner's function runs twice for every rank: a first pass records
  each rank's inputs, a second pass gives each call the reduction of those recorded inputs.
  (The learner's function must therefore be deterministic; the replay checks it is.)

:func:`patched_dist` installs the stand-ins.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AsyncAllReduce", "ReplayedReduceScatter", "SimulatedRankError", "patched_dist"]


class SimulatedRankError(Exception):
    """The learner's code used the simulated collectives in a way no real job could run."""


@contextmanager
def patched_dist(rank_of: Any, world_size: int, **functions: Any) -> Iterator[None]:
    """Replace ``torch.distributed`` functions by ``functions`` (and ``get_rank``/``get_world_size``/
    ``is_initialized`` by the simulation's) for the duration of the block."""
    replacements = {
        "get_rank": lambda group=None: rank_of(),
        "get_world_size": lambda group=None: world_size,
        "is_initialized": lambda: True,
        "get_backend": lambda group=None: "gloo",  # what the real ranks of these checks would run
        **functions,
    }
    saved = {name: getattr(dist, name) for name in replacements}
    try:
        for name, fn in replacements.items():
            setattr(dist, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _is_op(op: Any, name: str) -> bool:
    return op == getattr(dist.ReduceOp, name)


class _Work:
    """What ``all_reduce(..., async_op=True)`` returns: ``wait()`` is honest only after resolve(); ``get_future()``
    completes then too (with the reduced tensor, as a real handle's future does)."""

    def __init__(self, sim: AsyncAllReduce, tensor: torch.Tensor) -> None:
        self.sim, self.tensor = sim, tensor
        self.future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

    def wait(self, timeout: Any = None) -> bool:
        if not self.sim.resolved:
            self.sim.waited_early = True
        return True

    def is_completed(self) -> bool:
        return self.sim.resolved

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self.future


class AsyncAllReduce:
    """``dist.all_reduce`` over ``world_size`` simulated ranks run one after the other."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.rank = 0
        self.calls: list[list[tuple[torch.Tensor, torch.Tensor, Any]]] = [[] for _ in range(world_size)]
        self.blocking = False
        self.waited_early = False
        self.modified_after_launch = False
        self.resolved = False
        self.works: list[_Work] = []
        self.ready: list[int] = []  # the check appends a parameter's index when its gradient is ready
        self.launch_points: list[int] = []

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> _Work | None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce expects a tensor, got {type(tensor).__name__}")
        op = dist.ReduceOp.SUM if op is None else op
        self.calls[self.rank].append((tensor, tensor.detach().clone(), op))
        if not async_op:
            self.blocking = True
            return None
        work = _Work(self, tensor)
        self.works.append(work)
        self.launch_points.append(len(self.ready))  # how many gradients were ready when it started
        return work

    def patch(self) -> Any:
        return patched_dist(lambda: self.rank, self.world_size, all_reduce=self.all_reduce)

    def resolve(self) -> None:
        """Complete every call: write the reduction of the handed-over values into each rank's tensor."""
        counts = {len(c) for c in self.calls}
        if len(counts) > 1:
            raise SimulatedRankError("the ranks started different numbers of all-reduces: a real job would hang")
        for k in range(counts.pop()):
            entries = [self.calls[r][k] for r in range(self.world_size)]
            if len({tuple(t.shape) for t, _, _ in entries}) > 1:
                raise SimulatedRankError("the ranks all-reduced tensors of different shapes in the same call")
            ops = [op for _, _, op in entries]
            if not all(_is_op(op, "SUM") for op in ops) and not all(_is_op(op, "AVG") for op in ops):
                raise SimulatedRankError("use ReduceOp.SUM (then divide) or ReduceOp.AVG, the same on every rank")
            if any(not torch.equal(t, snap) for t, snap, _ in entries):
                self.modified_after_launch = True
            total = torch.stack([snap.double() for _, snap, _ in entries]).sum(0)
            if _is_op(ops[0], "AVG"):
                total /= self.world_size
            for t, _, _ in entries:
                with torch.no_grad():
                    t.copy_(total.to(t.dtype))
        self.resolved = True
        for work in self.works:
            work.future.set_result([work.tensor])


_SCATTER_NAMES = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter")


class ReplayedReduceScatter:
    """Reduce-scatter (and, to be noticed, all-reduce) over simulated ranks, by record and replay."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.rank = 0
        self.recording = True
        self.inputs: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
        self.call_index = 0
        self.used: set[str] = set()
        self.async_call = False
        self.pending: _PendingWork | None = None
        self.works: list[Any] = []

    def start_rank(self, rank: int) -> None:
        self.rank, self.call_index = rank, 0

    def _reduce(self, name: str, output: torch.Tensor, flat_input: torch.Tensor, op: Any) -> None:
        self.used.add(name)
        op = dist.ReduceOp.SUM if op is None else op
        if not (_is_op(op, "SUM") or _is_op(op, "AVG")):
            raise SimulatedRankError("reduce with ReduceOp.SUM (then divide) or ReduceOp.AVG")
        k = self.call_index
        self.call_index += 1
        if self.recording:
            self.inputs[self.rank].append(flat_input.detach().clone())
            return
        if k >= len(self.inputs[self.rank]) or not torch.equal(self.inputs[self.rank][k], flat_input):
            raise SimulatedRankError("a call gave different inputs when run again: is the function deterministic?")
        stacked = torch.stack([self.inputs[r][k] for r in range(self.world_size)])
        # summed in the input's dtype, one rank after the other, as a ring adds the chunks it receives
        total = stacked[0].clone()
        for r in range(1, self.world_size):
            total += stacked[r]
        if _is_op(op, "AVG"):
            total /= self.world_size
        if name == "all_reduce":
            with torch.no_grad():
                output.copy_(total)
            return
        if output.dtype != flat_input.dtype:
            raise SimulatedRankError(
                f"the output is {output.dtype} and the input {flat_input.dtype}: a real backend refuses tensors of two "
                "dtypes in one collective (gloo aborts on it); reduce-scatter into an output of the input's dtype, "
                "then cast"
            )
        if flat_input.numel() != output.numel() * self.world_size:
            raise SimulatedRankError(
                f"reduce-scatter's input must have world_size x the output's elements: got {flat_input.numel()} "
                f"and {output.numel()}"
            )
        value = total.view(self.world_size, -1)[self.rank].view_as(output)
        if self.async_call:  # written when the handle is waited for, as a real backend completes it
            self.pending = _PendingWork(self, output, value)
            return
        with torch.no_grad():
            output.copy_(value)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
    ) -> _DoneWork | None:
        return self._call("reduce_scatter_single", output, input.reshape(-1), op, async_op)

    def reduce_scatter_tensor(
        self, output: torch.Tensor, input: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
    ) -> _DoneWork | None:
        return self._call("reduce_scatter_tensor", output, input.reshape(-1), op, async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: Any = None,
        group: Any = None,
        async_op: bool = False,
    ) -> _DoneWork | None:
        return self._call("reduce_scatter", output, torch.cat([t.reshape(-1) for t in input_list]), op, async_op)

    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        self._reduce("all_reduce", tensor, tensor.reshape(-1).clone(), op)
        return _DoneWork() if async_op else None

    def _call(self, name: str, output: torch.Tensor, flat: torch.Tensor, op: Any, async_op: bool) -> Any:
        self.async_call, self.pending = async_op, None
        self._reduce(name, output, flat, op)
        if not async_op:
            return None
        work = self.pending if self.pending is not None else _DoneWork()
        self.works.append(work)
        return work

    def never_waited(self) -> int:
        """How many asynchronous reduce-scatters of the replay were never waited for (their output never written)."""
        return sum(1 for w in self.works if isinstance(w, _PendingWork) and not w.done)

    def patch(self) -> Any:
        fns = {name: getattr(self, name) for name in (*_SCATTER_NAMES, "all_reduce")}
        return patched_dist(lambda: self.rank, self.world_size, **fns)


class _PendingWork:
    """An asynchronous reduce-scatter of the replay: its output is written only when ``wait()`` is called."""

    def __init__(self, sim: ReplayedReduceScatter, output: torch.Tensor, value: torch.Tensor) -> None:
        self.output, self.value, self.done = output, value.detach().clone(), False

    def wait(self, timeout: Any = None) -> bool:
        if not self.done:
            with torch.no_grad():
                self.output.copy_(self.value)
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


class _DoneWork:
    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True
