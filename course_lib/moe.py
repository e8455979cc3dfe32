"""A top-k mixture-of-experts MLP, in one process and with its experts spread over ranks (expert parallelism).

A mixture-of-experts layer (Shazeer et al., 2017; GShard, Lepikhin et al., 2020; Switch, Fedus et al.,
2021) replaces the MLP of a block by ``E`` smaller MLPs, the *experts*, and a *router*: a linear layer
that scores every token against every expert. Each token goes to its ``k`` best-scoring experts, and
its output is their outputs weighted by the router's probabilities. An expert takes at most
``capacity = ceil(capacity_factor x tokens x k / E)`` tokens per batch; the assignments past that are
*dropped* (the token keeps only its residual path for that slot).

* :func:`route` — the routing decisions as plain tensors (:class:`Routing`): each token's experts
  and weights, which assignments are kept, each expert's load, and the auxiliary load-balancing
  loss of Switch Transformers, ``E * sum_e f_e P_e`` (``f_e`` the fraction of assignments expert
  ``e`` received, ``P_e`` its mean router probability), which is 1 when the load is even.
* :class:`MoE` — the layer in one process; ``forward`` leaves its :class:`Routing` in ``last_routing``.
* :func:`send_counts` — the rows a rank sends to each rank when its experts live on ``n`` ranks
  (expert ``e`` on rank ``e // (E / n)``): the split sizes of the all-to-all.
* :func:`expert_parallel_forward` — the same layer when each rank holds ``E / n`` experts and its
  own tokens: the router runs locally, an all-to-all (``all_to_all_single`` with split sizes)
  *dispatches* each kept assignment to its expert's rank, the experts run there, and a second
  all-to-all *combines* the results back. Equal to :class:`MoE` on each rank's tokens.
* :func:`expert_parallel_bytes` — what one rank sends per training step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .counted_collectives import all_to_all
from .validation import check_int, check_items, check_number

__all__ = ["MoE", "Expert", "Routing", "expert_parallel_bytes", "expert_parallel_forward", "route", "send_counts"]


@dataclass(frozen=True)
class Routing:
    """The router's decisions for ``T`` tokens and ``k`` slots.

    ``experts`` and ``weights`` are ``(T, k)`` (expert index, router probability); ``kept`` is a
    ``(T, k)`` bool (False: dropped for lack of capacity); ``load`` is the number of kept tokens per
    expert, ``wanted`` the number routed to it before the capacity cut; ``aux_loss`` the
    load-balancing loss (a differentiable scalar).
    """

    experts: torch.Tensor
    weights: torch.Tensor
    kept: torch.Tensor
    load: torch.Tensor
    wanted: torch.Tensor
    capacity: int
    aux_loss: torch.Tensor

    @property
    def dropped(self) -> int:
        """Assignments dropped for lack of capacity."""
        return int((~self.kept).sum())


def capacity_of(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """``ceil(capacity_factor * tokens * top_k / n_experts)``: the most tokens one expert takes.

    >>> capacity_of(64, 4, 2, 1.0), capacity_of(64, 4, 2, 1.25)
    (32, 40)
    """
    tokens = check_int("tokens", tokens, minimum=0)
    n_experts = check_int("n_experts", n_experts, minimum=1)
    top_k = check_int("top_k", top_k, minimum=1)
    cf = check_number("capacity_factor", capacity_factor, finite=True)
    if not 0 < cf <= 1000:
        raise ValueError(f"capacity_factor must be in (0, 1000], got {cf}")
    return math.ceil(cf * tokens * top_k / n_experts)


def route(logits: torch.Tensor, top_k: int, capacity_factor: float = 1.25) -> Routing:
    """Top-``k`` routing of ``(T, E)`` router logits, with a capacity per expert.

    Slots are served in order: every token's first choice before any second choice (GShard's
    priority), tokens in their order within a slot; an assignment that finds its expert full is
    dropped.

    >>> r = route(torch.tensor([[2.0, 0.0], [1.5, 0.0], [1.0, 0.0]]), top_k=1, capacity_factor=1.0)
    >>> r.capacity, r.wanted.tolist(), r.load.tolist(), r.kept.flatten().tolist()
    (2, [3, 0], [2, 0], [True, True, False])
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() != 2:
        raise TypeError("logits must be a floating-point tensor of shape (tokens, n_experts)")
    T, E = logits.shape
    top_k = check_int("top_k", top_k, minimum=1)
    if top_k > E:
        raise ValueError(f"top_k ({top_k}) must be <= the number of experts ({E})")
    capacity = capacity_of(T, E, top_k, capacity_factor)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    onehot = F.one_hot(experts.t().reshape(-1), E)  # slot-major: all first choices, then all second choices
    position = (onehot.cumsum(0) - 1).mul(onehot).sum(-1)  # place in its expert's queue
    kept = (position < capacity).view(top_k, T).t()
    wanted = onehot.sum(0)
    load = (onehot * kept.t().reshape(-1, 1)).sum(0)
    f = wanted.float() / (T * top_k)
    aux = E * (f * probs.mean(0)).sum()
    return Routing(experts, weights.to(logits.dtype), kept, load, wanted, capacity, aux)


class Expert(nn.Module):
    """One expert: a SwiGLU MLP, ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        check_int("d_model", d_model, minimum=1)
        check_int("d_ff", d_ff, minimum=1)
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """A top-``k`` mixture of ``n_experts`` SwiGLU experts with a linear router; weights from ``seed``.

    ``forward(x)`` takes ``(..., d_model)`` and returns the same shape; the routing of the last
    call is in ``last_routing`` (its ``aux_loss`` is what a training loop adds, times a small
    coefficient).

    >>> moe = MoE(16, 32, n_experts=4, top_k=2)
    >>> moe(torch.randn(2, 8, 16)).shape, int(moe.last_routing.wanted.sum())
    (torch.Size([2, 8, 16]), 32)
    """

    def __init__(
        self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2, capacity_factor: float = 1.25, *, seed: int = 0
    ) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        d_ff = check_int("d_ff", d_ff, minimum=1)
        self.n_experts = check_int("n_experts", n_experts, minimum=1)
        self.top_k = check_int("top_k", top_k, minimum=1)
        if top_k > n_experts:
            raise ValueError(f"top_k ({top_k}) must be <= n_experts ({n_experts})")
        capacity_of(1, n_experts, top_k, capacity_factor)  # validates the factor
        self.capacity_factor = float(capacity_factor)
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_ff) for _ in range(n_experts))
        g = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.last_routing: Routing | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        r = route(self.router(flat), self.top_k, self.capacity_factor)
        self.last_routing = r
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero((r.experts == e) & r.kept, as_tuple=True)
            if len(token):
                out = out.index_add(0, token, expert(flat[token]) * r.weights[token, slot].unsqueeze(-1))
        return out.view(shape)


def send_counts(experts: torch.Tensor, kept: torch.Tensor, n_experts: int, n_ranks: int) -> list[int]:
    """Rows this rank sends to each of ``n_ranks`` ranks: its kept assignments, by the rank of their expert.

    Expert ``e`` lives on rank ``e // (n_experts / n_ranks)``.

    >>> send_counts(torch.tensor([[0, 3], [1, 2]]), torch.ones(2, 2, dtype=torch.bool), 4, 2)
    [2, 2]
    """
    if not isinstance(experts, torch.Tensor) or not isinstance(kept, torch.Tensor) or experts.shape != kept.shape:
        raise TypeError("experts and kept must be tensors of one shape (tokens, k)")
    if kept.dtype != torch.bool:
        raise TypeError(f"kept must be a bool mask (True: the assignment is kept), got {kept.dtype}")
    if experts.is_floating_point() or experts.is_complex() or experts.dtype == torch.bool:
        raise TypeError(f"experts must hold integer expert ids, got {experts.dtype}")
    n_experts = check_int("n_experts", n_experts, minimum=1)
    n_ranks = check_int("n_ranks", n_ranks, minimum=1)
    if n_experts % n_ranks:
        raise ValueError(f"n_experts ({n_experts}) must be divisible by n_ranks ({n_ranks})")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= n_experts):
        raise ValueError(
            f"experts must be expert ids in [0, {n_experts}), got values from {int(experts.min())} to "
            f"{int(experts.max())}"
        )
    per = n_experts // n_ranks
    owner = experts[kept] // per
    return [int((owner == r).sum()) for r in range(n_ranks)]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return all_to_all(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def expert_parallel_forward(moe: MoE, x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """:class:`MoE` with this rank's experts only, on this rank's tokens ``x``: dispatch, compute, combine.

    ``moe`` holds all ``E`` experts' modules (every rank builds the same layer from the same seed),
    but only experts ``rank * E/n ... (rank+1) * E/n - 1`` are used here; the others' weights get no
    gradient. Returns what ``moe(x)`` returns in one process; ``moe.last_routing`` is this rank's.
    """
    if not isinstance(moe, MoE):
        raise TypeError(f"moe must be a course_lib.moe.MoE, got {type(moe).__name__}")
    if not dist.is_initialized():
        raise RuntimeError("expert_parallel_forward needs a process group: call dist.init_process_group first")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    E = moe.n_experts
    if E % n:
        raise ValueError(f"{E} experts do not divide over {n} ranks")
    per = E // n
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    r = route(moe.router(flat), moe.top_k, moe.capacity_factor)
    moe.last_routing = r
    token, slot = torch.nonzero(r.kept, as_tuple=True)
    expert = r.experts[token, slot]
    order = torch.argsort(expert, stable=True)  # rows grouped by expert, hence by destination rank
    token, slot, expert = token[order], slot[order], expert[order]
    per_expert = torch.bincount(expert, minlength=E)
    # 1. how many rows each rank will receive, per expert: a small all-to-all of counts
    counts_in = all_to_all(per_expert.view(n, per), [1] * n, [1] * n, group)  # (source, local expert)
    send = per_expert.view(n, per).sum(1).tolist()
    recv = counts_in.sum(1).tolist()
    # 2. dispatch the token rows to their experts' ranks
    rows = _AllToAll.apply(flat[token], send, recv, group)
    # 3. run the local experts on their rows (grouped by source, then by expert within a source)
    local_expert = torch.repeat_interleave(
        torch.arange(per).repeat(n), counts_in.reshape(-1)
    )  # local expert of every received row
    out_rows = torch.zeros_like(rows)
    for j in range(per):
        idx = torch.nonzero(local_expert == j, as_tuple=True)[0]
        if len(idx):
            out_rows = out_rows.index_copy(0, idx, moe.experts[rank * per + j](rows[idx]))
    # 4. combine: send the results back, weight them, add them to their tokens
    back = _AllToAll.apply(out_rows, recv, send, group)
    out = torch.zeros_like(flat).index_add(0, token, back * r.weights[token, slot].unsqueeze(-1))
    return out.view(shape)


def expert_parallel_bytes(send: list[int], recv: list[int], rank: int, row_bytes: int, *, n_experts: int) -> int:
    """Bytes one rank sends in a training step of :func:`expert_parallel_forward`.

    ``send[r]``/``recv[r]``: rows this rank sends to / receives from rank ``r`` at dispatch. Forward:
    the counts (``n_experts`` int64 less its own ranks' share), dispatch (the rows sent to others) and
    combine (the rows received from others, sent back). Backward: the two all-to-alls again, reversed.

    >>> expert_parallel_bytes([3, 5], [3, 4], 0, 64, n_experts=4)   # 2 x (5 + 4) rows of 64 B, 2 counts of 8 B
    1168
    """
    send = check_items("send", send, int, "a list of row counts (ints), one per rank", minimum=0)
    recv = check_items("recv", recv, int, "a list of row counts (ints), one per rank", minimum=0)
    n = len(send)
    if len(recv) != n:
        raise ValueError("send and recv must be lists of non-negative ints, one per rank, of one length")
    rank = check_int("rank", rank, minimum=0)
    if rank >= n:
        raise ValueError(f"rank must be < {n}, got {rank}")
    row_bytes = check_int("row_bytes", row_bytes, minimum=0)
    n_experts = check_int("n_experts", n_experts, minimum=1)
    out_rows = sum(send) - send[rank]
    in_rows = sum(recv) - recv[rank]
    counts = (n_experts - n_experts // n) * 8
    return counts + 2 * (out_rows + in_rows) * row_bytes
