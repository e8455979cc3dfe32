"""Collectives that count their bytes: the textbook traffic of each call, recorded by :class:`CommCounter`.

:func:`all_reduce`, :func:`all_gather`, :func:`reduce_scatter`, :func:`all_to_all` and :func:`ring_exchange` run the
``torch.distributed`` collective and report the bytes this rank sends to every active :class:`CommCounter`, by the
textbook algorithm: ``2 (n-1)/n`` of the tensor for a ring all-reduce, ``(n-1)/n`` of the full tensor for an
all-gather or a reduce-scatter (:func:`collective_bytes`), the bytes addressed to other ranks for an all-to-all, the
message for a point-to-point send. A counter labels each record with its group's name (``CommCounter(tp=tp_group,
dp=dp_group)``), so a multi-dimensional mesh shows which collective ran where. :mod:`course_lib.tensor_parallel`,
:mod:`course_lib.context_parallel` and :mod:`course_lib.moe` communicate through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .validation import check_int, check_items

__all__ = [
    "OPS",
    "CommCounter",
    "CommRecord",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "check_dim",
    "check_tensor",
    "collective_bytes",
    "record",
    "ring_exchange",
]

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")


# ---------------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------------


def collective_bytes(op: str, nbytes: int, n: int) -> int:
    """Bytes one of ``n`` ranks sends in ``op`` on a tensor of ``nbytes``, by the ring algorithms.

    ``nbytes`` is the *full* tensor: the all-reduced tensor, the gathered output of an all-gather,
    the input of a reduce-scatter. A ring all-reduce sends ``2 (n-1)/n`` of it (a reduce-scatter,
    then an all-gather), each half ``(n-1)/n``; for ``all_to_all`` and ``send`` ``nbytes`` is
    already what leaves the rank. Exact when ``n`` divides ``nbytes`` (the course's shapes); rounded
    down otherwise.

    >>> collective_bytes("all_reduce", 1024, 4), collective_bytes("all_gather", 1024, 4)
    (1536, 768)
    >>> collective_bytes("all_reduce", 1024, 4) == 2 * collective_bytes("reduce_scatter", 1024, 4)
    True
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    nbytes = check_int("nbytes", nbytes, minimum=0)
    n = check_int("n", n, minimum=1)
    if op == "all_reduce":
        return 2 * (n - 1) * nbytes // n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) * nbytes // n
    return nbytes


@dataclass(frozen=True)
class CommRecord:
    """One collective as a :class:`CommCounter` saw it: the operation, the group's label, the bytes this rank sent."""

    op: str
    group: str
    sent: int
    shape: tuple[int, ...]


_ACTIVE: list[CommCounter] = []


class CommCounter:
    """Context manager that records every collective of this module run inside it, with the bytes this rank sends.

    Label groups by keyword: ``CommCounter(tp=tp_group)``; others are labelled by their ranks
    (``"ranks 0,2"``), the default group ``"world"``.

    >>> c = CommCounter()
    >>> c.add("all_reduce", None, 1024, (256,), n=4)
    >>> c.sent(), c.table()
    (1536, {('all_reduce', 'world'): (1, 1536)})
    """

    def __init__(self, **labels: Any) -> None:
        self.labels: dict[str, Any] = dict(labels)
        self.records: list[CommRecord] = []

    def __enter__(self) -> CommCounter:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)

    def label(self, group: Any) -> str:
        """The name of ``group``: its keyword, ``"world"`` for the default group, else its ranks."""
        for name, g in self.labels.items():
            if g is group:
                return name
        if group is None or group is dist.group.WORLD:
            return "world"
        if dist.is_initialized():
            ranks = dist.get_process_group_ranks(group)
            for name, g in self.labels.items():
                if g is not None and dist.get_process_group_ranks(g) == ranks:
                    return name
            return "ranks " + ",".join(map(str, ranks))
        return "group"

    def add(self, op: str, group: Any, nbytes: int, shape: Sequence[int], *, n: int) -> None:
        """Record ``op`` on a tensor of ``nbytes`` (as :func:`collective_bytes` reads it) among ``n`` ranks."""
        self.records.append(CommRecord(op, self.label(group), collective_bytes(op, nbytes, n), tuple(shape)))

    def sent(self, op: str | None = None, group: str | None = None) -> int:
        """Bytes this rank sent, for one operation and/or one group label, or in all."""
        return sum(r.sent for r in self.records if op in (None, r.op) and group in (None, r.group))

    def table(self) -> dict[tuple[str, str], tuple[int, int]]:
        """``{(op, group): (calls, bytes sent)}``, in the order first seen."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for r in self.records:
            calls, sent = out.get((r.op, r.group), (0, 0))
            out[(r.op, r.group)] = (calls + 1, sent + r.sent)
        return out

    def reset(self) -> None:
        """Forget what was recorded."""
        self.records.clear()


def record(op: str, group: Any, t: torch.Tensor, nbytes: int | None = None) -> None:
    if not _ACTIVE:
        return
    n = dist.get_world_size(group)
    size = t.numel() * t.element_size() if nbytes is None else nbytes
    for counter in _ACTIVE:
        counter.add(op, group, size, t.shape, n=n)


def check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_dim(t: torch.Tensor, dim: int) -> int:
    """``dim`` as a non-negative index of one of ``t``'s dimensions (a negative ``dim`` counts from the end)."""
    check_tensor("t", t)
    check_int("dim", dim, minimum=-t.dim(), what=f"an int in [-{t.dim()}, {t.dim() - 1}]")
    if dim >= t.dim():
        raise ValueError(f"dim {dim} is out of range for a tensor of {t.dim()} dimensions")
    return dim % t.dim()


def all_reduce(t: torch.Tensor, group: Any = None, *, op: Any = None) -> torch.Tensor:
    """Sum (or ``op``, e.g. ``dist.ReduceOp.MAX``) ``t`` over ``group``, in place; counted. Returns ``t``."""
    check_tensor("t", t)
    record("all_reduce", group, t)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return t


def all_gather(t: torch.Tensor, dim: int = 0, group: Any = None) -> torch.Tensor:
    """Every rank's ``t`` concatenated along ``dim``, in rank order (a new tensor); counted."""
    check_tensor("t", t)
    dim = check_dim(t, dim)
    n = dist.get_world_size(group)
    front = t.movedim(dim, 0).contiguous()
    out = torch.empty((n * front.shape[0], *front.shape[1:]), dtype=t.dtype, device=t.device)
    record("all_gather", group, out)
    dist.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def reduce_scatter(t: torch.Tensor, dim: int = 0, group: Any = None) -> torch.Tensor:
    """This rank's ``1/n`` slice along ``dim`` of the sum of every rank's ``t`` (a new tensor); counted."""
    check_tensor("t", t)
    dim = check_dim(t, dim)
    n = dist.get_world_size(group)
    if t.shape[dim] % n:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split into {n} equal slices")
    front = t.movedim(dim, 0).contiguous()
    out = torch.empty((front.shape[0] // n, *front.shape[1:]), dtype=t.dtype, device=t.device)
    record("reduce_scatter", group, front)
    dist.reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def all_to_all(
    t: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], group: Any = None
) -> torch.Tensor:
    """Rows of ``t`` (dimension 0) sent ``send_counts[r]`` to rank ``r``; returns the rows received, by source.

    ``all_to_all_single`` with split sizes; counted as the bytes addressed to *other* ranks.
    """
    check_tensor("t", t)
    n = dist.get_world_size(group)
    for name, counts in (("send_counts", send_counts), ("recv_counts", recv_counts)):
        if len(counts) != n or any(not isinstance(c, int) or c < 0 for c in counts):
            raise ValueError(f"{name} must be {n} non-negative ints (one per rank), got {list(counts)}")
    if sum(send_counts) != t.shape[0]:
        raise ValueError(f"send_counts add up to {sum(send_counts)}, but t has {t.shape[0]} rows")
    me = dist.get_rank(group)
    row = t[0].numel() * t.element_size() if t.shape[0] else 0
    record("all_to_all", group, t, (sum(send_counts) - send_counts[me]) * row)
    out = torch.empty((sum(recv_counts), *t.shape[1:]), dtype=t.dtype, device=t.device)
    dist.all_to_all_single(
        out, t.contiguous(), output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts), group=group
    )
    return out


def ring_exchange(tensors: Sequence[torch.Tensor], group: Any = None) -> list[torch.Tensor]:
    """Send ``tensors`` to the next rank of ``group`` and receive the previous rank's (same shapes); counted.

    One ``batch_isend_irecv`` (every send and receive posted together, so no rank waits on another's
    order). In a group of one, returns the tensors themselves.
    """
    tensors = check_items("tensors", tensors, torch.Tensor, "a sequence of torch.Tensor")
    n = dist.get_world_size(group)
    if n == 1:
        return list(tensors)
    me = dist.get_rank(group)
    right = dist.get_global_rank(group, (me + 1) % n) if group is not None else (me + 1) % n
    left = dist.get_global_rank(group, (me - 1) % n) if group is not None else (me - 1) % n
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = []
    for t, r in zip(tensors, received):
        record("send", group, t)
        ops.append(dist.P2POp(dist.isend, t.contiguous(), right, group))
        ops.append(dist.P2POp(dist.irecv, r, left, group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received
