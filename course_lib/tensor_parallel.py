"""Tensor and sequence parallelism by hand: counted collectives, Megatron's conjugate operators, sharded blocks.

Notebook 15 writes each piece by hand in its worker scripts and checks it against this canonical copy;
notebooks 16 and 17 reuse this copy. Everything runs on any process group (gloo on CPU processes in the
course) and on the course's :class:`~course_lib.transformer.Transformer`.

* **Counted collectives.** :func:`all_reduce`, :func:`all_gather`, :func:`reduce_scatter`,
  :func:`all_to_all` and :func:`ring_exchange` run the ``torch.distributed`` collective and report
  the bytes this rank sends to every active :class:`CommCounter`, by the textbook algorithm:
  ``2 (n-1)/n`` of the tensor for a ring all-reduce, ``(n-1)/n`` of the full tensor for an all-gather
  or a reduce-scatter (:func:`collective_bytes`), the bytes addressed to other ranks for an
  all-to-all, the message for a point-to-point send. A counter labels each record with its group's
  name (``CommCounter(tp=tp_group, dp=dp_group)``), so a multi-dimensional mesh shows which
  collective ran where.
* **The conjugate operators** of Megatron-LM (Shoeybi et al., 2019) as autograd functions:
  :func:`copy_to_tp` (``f``: identity forward, all-reduce backward) goes before a column-parallel
  layer, :func:`reduce_from_tp` (``g``: all-reduce forward, identity backward) after a row-parallel
  one. Sequence parallelism (Korthikanti et al., 2022) splits ``g`` and ``f`` into their halves:
  :func:`reduce_scatter_to_sp` (reduce-scatter forward, all-gather backward) and
  :func:`gather_from_sp` (all-gather forward, reduce-scatter backward); :func:`split_to_sp` enters the
  sequence-sharded region without communication (its backward is an all-gather).
* **A block and a model, sharded.** :func:`shard_block_` slices a :class:`~course_lib.transformer.Block`'s
  weights in place (q, k, v, gate and up by output rows, i.e. heads and MLP columns; o and down by
  input columns); :func:`parallelize_block_` also installs ``f``/``g`` (or the sequence-parallel
  pair) around its attention and MLP; :func:`parallelize_transformer_` does the whole untied model,
  the embedding and head split over the vocabulary; :func:`tensor_parallel_loss` runs it:
  :func:`vocab_parallel_embedding` and :func:`vocab_parallel_cross_entropy` never gather a full row
  of logits.
* **The formulas:** :func:`tp_bytes_per_step` (bytes one rank sends per training step, by part) and
  :func:`tp_saved_bytes` (what one block keeps for backward per rank, with and without sequence
  parallelism), which notebook 15 checks against :class:`CommCounter` and
  :class:`~course_lib.saved_tensors.SavedTensorMeter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .transformer import Block, Transformer, TransformerConfig, block_saved_terms
from .validation import check_bool, check_int

__all__ = [
    "COLUMN_PARALLEL",
    "ROW_PARALLEL",
    "CommCounter",
    "CommRecord",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "collective_bytes",
    "copy_to_tp",
    "gather_from_sp",
    "parallelize_block_",
    "parallelize_transformer_",
    "reduce_from_tp",
    "reduce_scatter",
    "reduce_scatter_to_sp",
    "ring_exchange",
    "shard_block_",
    "shard_of",
    "split_to_sp",
    "sync_sequence_parallel_grads",
    "tensor_parallel_loss",
    "tp_bytes_per_step",
    "tp_saved_bytes",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_embedding",
]

# Which linear layers of a Block are split by their outputs (column-parallel) and by their inputs (row-parallel).
COLUMN_PARALLEL: tuple[str, ...] = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_PARALLEL: tuple[str, ...] = ("attn.o_proj", "mlp.down_proj")

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


def _record(op: str, group: Any, t: torch.Tensor, nbytes: int | None = None) -> None:
    if not _ACTIVE:
        return
    n = dist.get_world_size(group)
    size = t.numel() * t.element_size() if nbytes is None else nbytes
    for counter in _ACTIVE:
        counter.add(op, group, size, t.shape, n=n)


def _check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _check_dim(t: torch.Tensor, dim: int) -> int:
    check_int("dim", dim, minimum=-t.dim(), what=f"an int in [-{t.dim()}, {t.dim() - 1}]")
    if dim >= t.dim():
        raise ValueError(f"dim {dim} is out of range for a tensor of {t.dim()} dimensions")
    return dim % t.dim()


def all_reduce(t: torch.Tensor, group: Any = None, *, op: Any = None) -> torch.Tensor:
    """Sum (or ``op``, e.g. ``dist.ReduceOp.MAX``) ``t`` over ``group``, in place; counted. Returns ``t``."""
    _check_tensor("t", t)
    _record("all_reduce", group, t)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return t


def all_gather(t: torch.Tensor, dim: int = 0, group: Any = None) -> torch.Tensor:
    """Every rank's ``t`` concatenated along ``dim``, in rank order (a new tensor); counted."""
    _check_tensor("t", t)
    dim = _check_dim(t, dim)
    n = dist.get_world_size(group)
    front = t.movedim(dim, 0).contiguous()
    out = torch.empty((n * front.shape[0], *front.shape[1:]), dtype=t.dtype, device=t.device)
    _record("all_gather", group, out)
    dist.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def reduce_scatter(t: torch.Tensor, dim: int = 0, group: Any = None) -> torch.Tensor:
    """This rank's ``1/n`` slice along ``dim`` of the sum of every rank's ``t`` (a new tensor); counted."""
    _check_tensor("t", t)
    dim = _check_dim(t, dim)
    n = dist.get_world_size(group)
    if t.shape[dim] % n:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split into {n} equal slices")
    front = t.movedim(dim, 0).contiguous()
    out = torch.empty((front.shape[0] // n, *front.shape[1:]), dtype=t.dtype, device=t.device)
    _record("reduce_scatter", group, front)
    dist.reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def all_to_all(
    t: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], group: Any = None
) -> torch.Tensor:
    """Rows of ``t`` (dimension 0) sent ``send_counts[r]`` to rank ``r``; returns the rows received, by source.

    ``all_to_all_single`` with split sizes; counted as the bytes addressed to *other* ranks.
    """
    _check_tensor("t", t)
    n = dist.get_world_size(group)
    for name, counts in (("send_counts", send_counts), ("recv_counts", recv_counts)):
        if len(counts) != n or any(not isinstance(c, int) or c < 0 for c in counts):
            raise ValueError(f"{name} must be {n} non-negative ints (one per rank), got {list(counts)}")
    if sum(send_counts) != t.shape[0]:
        raise ValueError(f"send_counts add up to {sum(send_counts)}, but t has {t.shape[0]} rows")
    me = dist.get_rank(group)
    row = t[0].numel() * t.element_size() if t.shape[0] else 0
    _record("all_to_all", group, t, (sum(send_counts) - send_counts[me]) * row)
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
    if isinstance(tensors, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("tensors must be a sequence of torch.Tensor")
    n = dist.get_world_size(group)
    if n == 1:
        return list(tensors)
    me = dist.get_rank(group)
    right = dist.get_global_rank(group, (me + 1) % n) if group is not None else (me + 1) % n
    left = dist.get_global_rank(group, (me - 1) % n) if group is not None else (me - 1) % n
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = []
    for t, r in zip(tensors, received):
        _record("send", group, t)
        ops.append(dist.P2POp(dist.isend, t.contiguous(), right, group))
        ops.append(dist.P2POp(dist.irecv, r, left, group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


# ---------------------------------------------------------------------------------------------
# The conjugate operators
# ---------------------------------------------------------------------------------------------


class _CopyToTP(torch.autograd.Function):
    """``f``: identity forward; backward, the sum of every rank's input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_reduce(grad.clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """``g``: forward, the sum of every rank's partial output; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    """All-gather along ``dim`` forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return all_gather(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    """Reduce-scatter along ``dim`` forward; all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_gather(grad, ctx.dim, ctx.group), None, None


class _SplitToSP(torch.autograd.Function):
    """This rank's slice along ``dim`` forward (no communication); all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        n, me = dist.get_world_size(group), dist.get_rank(group)
        return x.chunk(n, dim)[me].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_gather(grad.contiguous(), ctx.dim, ctx.group), None, None


def copy_to_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Megatron's ``f``: ``x`` unchanged; in backward the gradient is all-reduced over ``group``.

    Put it before column-parallel layers: each rank's layers contribute only part of ``x``'s gradient.
    """
    return _CopyToTP.apply(_check_tensor("x", x), group)


def reduce_from_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Megatron's ``g``: the sum of ``x`` over ``group``; the gradient passes unchanged.

    Put it after a row-parallel layer: each rank holds a partial sum of the output.
    """
    return _ReduceFromTP.apply(_check_tensor("x", x), group)


def gather_from_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Leave the sequence-parallel region: all-gather ``x``'s slices along ``dim``; reduce-scatter backward."""
    x = _check_tensor("x", x)
    return _GatherFromSP.apply(x, group, _check_dim(x, dim))


def reduce_scatter_to_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Enter the sequence-parallel region from partial sums: reduce-scatter along ``dim``; all-gather backward."""
    x = _check_tensor("x", x)
    return _ReduceScatterToSP.apply(x, group, _check_dim(x, dim))


def split_to_sp(x: torch.Tensor, group: Any = None, dim: int = 1) -> torch.Tensor:
    """Enter the sequence-parallel region from a replicated ``x``: keep this rank's slice; all-gather backward."""
    x = _check_tensor("x", x)
    dim = _check_dim(x, dim)
    if x.shape[dim] % dist.get_world_size(group):
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} does not split into equal slices")
    return _SplitToSP.apply(x, group, dim)


# ---------------------------------------------------------------------------------------------
# Sharded blocks and models
# ---------------------------------------------------------------------------------------------


def _group_rank(group: Any) -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs a process group: call dist.init_process_group first")
    return dist.get_rank(group), dist.get_world_size(group)


def _slice_param(linear: nn.Linear, dim: int, rank: int, n: int) -> None:
    w = linear.weight
    if w.shape[dim] % n:
        raise ValueError(f"a weight of shape {tuple(w.shape)} does not split into {n} equal parts along {dim}")
    linear.weight = nn.Parameter(w.detach().chunk(n, dim)[rank].clone(), requires_grad=w.requires_grad)


def shard_block_(block: Block, rank: int, n: int) -> Block:
    """Keep rank ``rank``'s part of ``block``'s weights, in place, for ``n``-way tensor parallelism; returns it.

    Column-parallel (:data:`COLUMN_PARALLEL`): ``q_proj``, ``k_proj``, ``v_proj`` keep the rows of
    this rank's heads (``n_heads / n`` query heads and ``n_kv_heads / n`` key/value heads), the MLP's
    ``gate_proj`` and ``up_proj`` their slice of ``d_ff`` rows. Row-parallel (:data:`ROW_PARALLEL`):
    ``o_proj`` and ``down_proj`` keep the matching columns. The norms stay whole.
    """
    if not isinstance(block, Block):
        raise TypeError(f"block must be a course_lib.transformer.Block, got {type(block).__name__}")
    n = check_int("n", n, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= n:
        raise ValueError(f"rank must be < n ({n}), got {rank}")
    c = block.attn.config
    if c.n_heads % n or c.kv_heads % n:
        raise ValueError(
            f"{n}-way tensor parallelism needs n_heads ({c.n_heads}) and kv heads ({c.kv_heads}) divisible by {n}"
        )
    for name in COLUMN_PARALLEL:
        module = block.get_submodule(name) if _has(block, name) else None
        if isinstance(module, nn.Linear):
            _slice_param(module, 0, rank, n)
    for name in ROW_PARALLEL:
        module = block.get_submodule(name)
        assert isinstance(module, nn.Linear)
        _slice_param(module, 1, rank, n)
    return block


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


def parallelize_block_(block: Block, group: Any = None, *, sequence_parallel: bool = False) -> Block:
    """Shard ``block`` for this rank of ``group`` (:func:`shard_block_`) and install the communication.

    Tensor parallelism: ``f`` (:func:`copy_to_tp`) on the input of attention and of the MLP, ``g``
    (:func:`reduce_from_tp`) on their outputs: two all-reduces forward, two backward. With
    ``sequence_parallel=True`` the block's input and output are slices of the sequence (dimension 1):
    the norms run on this rank's tokens only, :func:`gather_from_sp` replaces ``f`` and
    :func:`reduce_scatter_to_sp` replaces ``g`` (the same bytes: an all-reduce is a reduce-scatter
    plus an all-gather).
    """
    check_bool("sequence_parallel", sequence_parallel)
    rank, n = _group_rank(group)
    shard_block_(block, rank, n)
    enter = (lambda x: gather_from_sp(x, group, 1)) if sequence_parallel else (lambda x: copy_to_tp(x, group))
    leave = (lambda x: reduce_scatter_to_sp(x, group, 1)) if sequence_parallel else (lambda x: reduce_from_tp(x, group))

    def pre(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (enter(args[0]), *args[1:])

    def post(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return leave(out)

    for part in (block.attn, block.mlp):
        part.register_forward_pre_hook(pre)
        part.register_forward_hook(post)
    return block


def parallelize_transformer_(model: Transformer, group: Any = None, *, sequence_parallel: bool = False) -> Transformer:
    """Tensor-parallel ``model`` in place, for this rank of ``group``: every block, the embedding and the head.

    The embedding and the head keep this rank's ``vocab_size / n`` rows (vocabulary-parallel); run
    the result with :func:`tensor_parallel_loss`. Needs an untied head (a tied one is one matrix
    used twice: shard it once and use it in both places, as Megatron does; left out here).
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a course_lib.transformer.Transformer, got {type(model).__name__}")
    c = model.config
    if c.tie_embeddings:
        raise ValueError("parallelize_transformer_ needs an untied head: build the model with tie_embeddings=False")
    if c.positions != "rope":
        raise ValueError("parallelize_transformer_ supports rotary positions only")
    rank, n = _group_rank(group)
    if c.vocab_size % n:
        raise ValueError(f"vocab_size ({c.vocab_size}) must be divisible by the group size ({n})")
    for layer in model.layers:
        assert isinstance(layer, Block)
        parallelize_block_(layer, group, sequence_parallel=sequence_parallel)
    rows = c.vocab_size // n
    model.embed.weight = nn.Parameter(model.embed.weight.detach()[rank * rows : (rank + 1) * rows].clone())
    _slice_param(model.head, 0, rank, n)
    model.tp_group = group
    model.sequence_parallel = sequence_parallel  # type: ignore[assignment]
    return model


def shard_of(name: str, full: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    """This rank's part of the full tensor ``full`` of parameter ``name`` (a :class:`Transformer` name).

    What :func:`parallelize_transformer_` keeps of it: rows for the column-parallel layers, the
    embedding and the head; columns for the row-parallel layers; everything for the norms. Use it to
    compare a sharded parameter (or gradient) with the one-process model's.

    >>> shard_of("layers.0.attn.o_proj.weight", torch.arange(8.0).view(2, 4), 1, 2).tolist()
    [[2.0, 3.0], [6.0, 7.0]]
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a parameter name (str), got {type(name).__name__}")
    _check_tensor("full", full)
    n = check_int("n", n, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= n:
        raise ValueError(f"rank must be < n ({n}), got {rank}")
    stem = name.removesuffix(".weight")
    if any(stem.endswith(r) for r in ROW_PARALLEL):
        return full.chunk(n, 1)[rank]
    if any(stem.endswith(c) for c in COLUMN_PARALLEL) or stem in ("embed", "head"):
        return full.chunk(n, 0)[rank]
    if stem.endswith("norm"):
        return full
    raise ValueError(f"{name!r} is not a parameter of the course's Transformer")


def vocab_parallel_embedding(
    ids: torch.Tensor, weight: torch.Tensor, group: Any = None, *, sequence_parallel: bool = False
) -> torch.Tensor:
    """Look ``ids`` up in a table split by rows over ``group`` (this rank holds ``weight``, its rows).

    Each rank embeds the ids that fall in its rows and writes zeros elsewhere; the sum over ranks
    (:func:`reduce_from_tp`, or :func:`reduce_scatter_to_sp` along the sequence) is the full lookup.
    """
    ids, weight = _check_tensor("ids", ids), _check_tensor("weight", weight)
    if ids.dtype != torch.int64:
        raise TypeError(f"ids must be int64, got {ids.dtype}")
    rank, _ = _group_rank(group)
    rows = weight.shape[0]
    start = rank * rows
    mine = (ids >= start) & (ids < start + rows)
    local = F.embedding(torch.where(mine, ids - start, torch.zeros_like(ids)), weight)
    local = local * mine.unsqueeze(-1).to(local.dtype)
    return reduce_scatter_to_sp(local, group, 1) if sequence_parallel else reduce_from_tp(local, group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, group: Any) -> torch.Tensor:
        rank = dist.get_rank(group)
        rows = logits.shape[-1]
        start = rank * rows
        x = logits if logits.dtype == torch.float64 else logits.float()
        m = all_reduce(x.max(-1).values, group, op=dist.ReduceOp.MAX)  # the global max, for a stable exp
        e = torch.exp(x - m.unsqueeze(-1))
        total = all_reduce(e.sum(-1), group)  # the softmax denominator
        mine = (targets >= start) & (targets < start + rows)
        local_t = torch.where(mine, targets - start, torch.zeros_like(targets))
        picked = torch.gather(x, -1, local_t.unsqueeze(-1)).squeeze(-1) - m
        target_logit = all_reduce(torch.where(mine, picked, torch.zeros_like(picked)), group)
        loss = (torch.log(total) - target_logit).mean()
        ctx.save_for_backward(e / total.unsqueeze(-1), mine, local_t)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        probs, mine, local_t = ctx.saved_tensors
        g = probs.clone()
        g.scatter_add_(-1, local_t.unsqueeze(-1), -mine.to(g.dtype).unsqueeze(-1))
        return (g * (grad / mine.numel())).to(ctx.dtype), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Mean cross-entropy of ``targets`` when each rank of ``group`` holds a slice of the vocabulary's logits.

    ``logits`` is ``(..., vocab_size / n)``: this rank's columns. Three all-reduces of one number per
    token (the max, the softmax denominator, the target's logit) replace gathering ``vocab_size``
    logits per token. Equal to ``F.cross_entropy`` on the gathered logits.
    """
    logits, targets = _check_tensor("logits", logits), _check_tensor("targets", targets)
    if targets.shape != logits.shape[:-1] or targets.dtype != torch.int64:
        raise ValueError("targets must be int64 with logits' shape less its last dimension")
    return _VocabParallelCrossEntropy.apply(logits, targets, group)


def tensor_parallel_loss(
    model: Transformer, ids: torch.Tensor, targets: torch.Tensor, *, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """The loss of a :func:`parallelize_transformer_` model: equal to ``Transformer.loss`` of the whole model.

    ``positions`` (int64, one per token of ``ids``' sequence) gives the tokens' places in the full
    sequence when ``ids`` is a slice of it (context parallelism); default ``0, 1, ...``.
    """
    if not hasattr(model, "tp_group"):
        raise ValueError("model was not prepared with parallelize_transformer_")
    group, sp = model.tp_group, bool(model.sequence_parallel)
    x = vocab_parallel_embedding(ids, model.embed.weight, group, sequence_parallel=sp)
    cos, sin = model.get_buffer("rope_cos"), model.get_buffer("rope_sin")
    if positions is not None:
        if (
            not isinstance(positions, torch.Tensor)
            or positions.dtype != torch.int64
            or positions.shape != ids.shape[1:]
        ):
            raise ValueError("positions must be an int64 tensor with one position per token of the sequence")
        cos, sin = cos[positions], sin[positions]
    rope = (cos, sin)
    for layer in model.layers:
        x = layer(x, rope)
    x = model.norm(x)
    x = gather_from_sp(x, group, 1) if sp else copy_to_tp(x, group)
    return vocab_parallel_cross_entropy(model.head(x), targets, group)


def sync_sequence_parallel_grads(model: Transformer) -> int:
    """All-reduce the norms' weight gradients of a sequence-parallel model; returns how many tensors.

    With sequence parallelism each rank's norms saw only its slice of the tokens, so their weight
    gradients are partial sums (without it, every rank computed the same, whole gradient). Call it
    after ``backward()``; a model prepared without sequence parallelism needs nothing.
    """
    if not hasattr(model, "tp_group"):
        raise ValueError("model was not prepared with parallelize_transformer_")
    if not model.sequence_parallel:
        return 0
    done = 0
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") and p.grad is not None:
            all_reduce(p.grad, model.tp_group)
            done += 1
    return done


# ---------------------------------------------------------------------------------------------
# The formulas
# ---------------------------------------------------------------------------------------------


def tp_bytes_per_step(
    config: TransformerConfig, tokens: int, n: int, *, bytes_per_element: int = 4, sequence_parallel: bool = False
) -> dict[str, int]:
    """Bytes one of ``n`` tensor-parallel ranks sends in one training step of :func:`tensor_parallel_loss`.

    ``tokens`` is batch x sequence length, ``h`` the width, ``p`` the bytes per element. Per block,
    ``g`` after attention and after the MLP (forward) and ``f`` before them (backward): 4 all-reduces
    of ``tokens x h``; the embedding's ``g`` and the head's ``f`` add 2; the cross-entropy 3
    all-reduces of one float32 per token (float64 for a float64 model). With sequence parallelism each
    all-reduce of activations becomes a reduce-scatter and an all-gather, the same bytes, and the
    norms' weight gradients need an all-reduce (:func:`sync_sequence_parallel_grads`).

    >>> from course_lib.transformer import PRESETS
    >>> parts = tp_bytes_per_step(PRESETS["tiny"], 256, 2)
    >>> parts["blocks"] == 2 * 4 * 256 * 64 * 4     # 2 layers x 4 all-reduces x 2(n-1)/n x T h p with n = 2
    True
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    tokens = check_int("tokens", tokens, minimum=1)
    n = check_int("n", n, minimum=1)
    p = check_int("bytes_per_element", bytes_per_element, minimum=1)
    check_bool("sequence_parallel", sequence_parallel)
    act = tokens * config.d_model * p
    if sequence_parallel:
        one = collective_bytes("reduce_scatter", act, n) + collective_bytes("all_gather", act, n)
    else:
        one = collective_bytes("all_reduce", act, n)
    parts = {
        "blocks": 4 * config.n_layers * one,
        "embedding and head": 2 * one,
        "cross-entropy": 3 * collective_bytes("all_reduce", max(4, p) * tokens, n),
    }
    if sequence_parallel:
        parts["norm weight gradients"] = (2 * config.n_layers + 1) * collective_bytes(
            "all_reduce", config.d_model * p, n
        )
    return parts


_SHARDED_BY_TP = (
    "attention: q",
    "attention: k",
    "attention: v",
    "attention: log-sum-exp",
    "attention probabilities",
    "attention output (o_proj input)",
    "MLP: gate, silu(gate), up, product",
    "MLP: up, gelu(up)",
)
_SHARDED_BY_SP = ("attention norm: input", "attention norm: 1/rms", "MLP norm: input", "MLP norm: 1/rms")


def tp_saved_bytes(
    config: TransformerConfig,
    seq_len: int,
    n: int,
    *,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    sequence_parallel: bool = False,
) -> dict[str, int]:
    """What one block keeps for backward on each of ``n`` tensor-parallel ranks, term by term (bytes).

    Notebook 14's :func:`~course_lib.transformer.block_saved_terms`, with the heads' and the MLP's
    terms divided by ``n``. Without sequence parallelism the norms' inputs and statistics and the
    projections' inputs stay whole on every rank (replicated); with it the norms' terms are divided
    by ``n`` too. The projections' inputs stay whole either way here: they are the all-gathered
    tensors, which the linear layers keep (Megatron-LM instead keeps the slice and gathers it again
    in backward, one more all-gather per block, to divide that term too).

    >>> from course_lib.transformer import PRESETS, block_saved_bytes
    >>> c = PRESETS["tiny"]
    >>> sum(tp_saved_bytes(c, 128, 1).values()) == block_saved_bytes(c, 128)
    True
    """
    n = check_int("n", n, minimum=1)
    check_bool("sequence_parallel", sequence_parallel)
    terms = block_saved_terms(config, seq_len, batch=batch, dtype=dtype)
    divided = _SHARDED_BY_TP + (_SHARDED_BY_SP if sequence_parallel else ())
    out = {}
    for name, value in terms.items():
        if name in divided:
            if value % n:
                raise ValueError(f"{name} ({value} bytes) does not divide into {n} ranks")
            value //= n
        out[name] = value
    return out
