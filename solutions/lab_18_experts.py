"""Lab: expert parallelism for a top-1 mixture of experts, with all-to-all.

A mixture-of-experts layer has `n_experts` experts spread over the `world` ranks of the default process group:
expert `e` lives on rank `e // (n_experts // world)` (with 4 experts on 2 ranks, rank 0 holds experts 0 and 1,
rank 1 experts 2 and 3). Each rank has its own tokens `x`, shape (T, d), and the router's decision for each:
`expert[t]` the expert of token t, `kept[t]` whether it fits that expert's capacity, `gate[t]` the router's
probability for that expert (a differentiable tensor).

`moe_forward(x, expert, kept, gate, local_experts, n_experts)` returns, for each token, `x[t] + gate[t] *
expert_e(x[t])` if it was kept and `x[t]` unchanged if it was dropped; `local_experts[j]` is expert
`rank * (n_experts // world) + j`. It is differentiable: autograd sends the gradients back through the exchanges.

1. the rows to send: the kept tokens' rows, sorted by expert (stably), hence grouped by destination rank;
2. the counts: `counts[e]`, the rows for expert e (an int64 tensor of n_experts); one `all_to_all_single` of it with
   equal splits gives each rank the counts for its own experts, from every rank (source-major);
3. dispatch: `AllToAll.apply(rows, send, recv)`, `send[r]` rows to rank r, `recv[r]` rows from rank r;
4. each local expert runs on the rows received for it (within each source's block, grouped by expert);
5. combine: `AllToAll.apply(results, recv, send)`: the results come back in the order the rows were sent;
6. each result goes back to its token, times the token's gate, added to x.

`exchange(rows, send, recv)` is one `dist.all_to_all_single` along dimension 0; `AllToAll` is the same exchange as
an autograd Function whose backward sends the gradient back the other way.
"""

import torch
import torch.distributed as dist


def exchange(rows, send, recv):
    """Send `send[r]` rows of `rows` to rank r; return the `sum(recv)` rows received, grouped by source rank."""
    ### BEGIN SOLUTION
    out = rows.new_empty((sum(recv), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send)
    return out
    ### END SOLUTION


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send, recv):
        ### BEGIN SOLUTION
        ctx.send, ctx.recv = send, recv
        return exchange(rows, send, recv)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return exchange(grad, ctx.recv, ctx.send), None, None
        ### END SOLUTION


def moe_forward(x, expert, kept, gate, local_experts, n_experts):
    ### BEGIN SOLUTION
    world = dist.get_world_size()
    per = n_experts // world  # experts per rank
    owner = expert // per  # the rank that holds each token's expert
    kept_tokens = torch.nonzero(kept).flatten()
    token = kept_tokens[torch.argsort(expert[kept_tokens], stable=True)]  # grouped by expert, so by owner
    counts = torch.bincount(expert[token], minlength=n_experts)
    counts_in = exchange(counts, [per] * world, [per] * world)  # from each rank, the rows for each of my experts
    send = torch.bincount(owner[token], minlength=world).tolist()
    recv = counts_in.view(world, per).sum(1).tolist()
    rows = AllToAll.apply(x[token], send, recv)
    local = torch.arange(per).repeat(world).repeat_interleave(counts_in)  # the local expert of each row received
    results = torch.zeros_like(rows)
    for j, module in enumerate(local_experts):
        idx = torch.nonzero(local == j).flatten()
        results = results.index_copy(0, idx, module(rows[idx]))
    back = AllToAll.apply(results, recv, send)
    return x.index_add(0, token, back * gate[token].unsqueeze(1))
    ### END SOLUTION
