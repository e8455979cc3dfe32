"""Tensor and sequence parallelism by hand: counted collectives, Megatron's conjugate operators, sharded blocks.

Notebook 17 writes each piece by hand in its worker scripts and checks it against this canonical copy;
notebook 18's 3-D mesh and notebook 21's planner reuse this copy. Everything runs on any process group (gloo on
CPU processes in the course) and on the course's :class:`~course_lib.transformer.Transformer`.

* **Counted collectives** (:mod:`course_lib.counted_collectives`): each reports the bytes this rank sends to every
  active :class:`CommCounter`.
* **The conjugate operators** of Megatron-LM (Shoeybi et al., 2019) as autograd functions
  (:mod:`course_lib.tp_operators`, re-exported here):
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

The counted collectives (:mod:`course_lib.counted_collectives`) and the formulas
(:mod:`course_lib.tensor_parallel_bytes`) are modules of their own, re-exported here where the notebooks import them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .counted_collectives import (
    CommCounter,
    CommRecord,
    all_gather,
    all_reduce,
    all_to_all,
    check_tensor,
    collective_bytes,
    reduce_scatter,
    ring_exchange,
)
from .tensor_parallel_bytes import tp_bytes_per_step, tp_saved_bytes
from .tp_operators import copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp, split_to_sp
from .transformer import Block, Transformer
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


# ---------------------------------------------------------------------------------------------
# Sharded blocks and models
# ---------------------------------------------------------------------------------------------


def _group_rank(group: Any) -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs a process group: call dist.init_process_group first")
    return dist.get_rank(group), dist.get_world_size(group)


def _check_ids(name: str, ids: torch.Tensor, vocab_size: int) -> None:
    """Token ids index a vocabulary: each in [0, vocab_size), as ``F.embedding`` and ``F.cross_entropy`` require."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"{name} must be token ids in [0, {vocab_size}) (the vocabulary over every rank), "
            f"got values from {int(ids.min())} to {int(ids.max())}"
        )


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
    check_tensor("full", full)
    n = check_int("n", n, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= n:
        raise ValueError(f"rank must be < n ({n}), got {rank}")
    stem = name.removesuffix(".weight")
    is_norm = stem.endswith("norm")
    if full.dim() < (1 if is_norm else 2):
        raise ValueError(f"full must be {name!r}'s full tensor (a matrix), got shape {tuple(full.shape)}")
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
    ids, weight = check_tensor("ids", ids), check_tensor("weight", weight)
    if ids.dtype != torch.int64:
        raise TypeError(f"ids must be int64, got {ids.dtype}")
    rank, n = _group_rank(group)
    rows = weight.shape[0]
    _check_ids("ids", ids, rows * n)
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
    logits, targets = check_tensor("logits", logits), check_tensor("targets", targets)
    if targets.shape != logits.shape[:-1] or targets.dtype != torch.int64:
        raise ValueError("targets must be int64 with logits' shape less its last dimension")
    _, n = _group_rank(group)
    _check_ids("targets", targets, logits.shape[-1] * n)
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
