# %% [markdown] slideshow={"slide_type": "slide"}
"""
# Lab · expert parallelism with all-to-all

Notebook 18 §2 spread the experts of a mixture-of-experts layer over two processes: each rank routes its own tokens, sends each kept token to the rank that holds its expert with an all-to-all, runs its experts on what arrives, and sends the results back with a second all-to-all. In this lab you write that mechanism yourself, for a top-1 layer, and it runs as two real processes beside the same layer computed in one process.

By the end you will have written, and seen pass against one process:
- the counts exchange, which tells every rank how many rows it will receive from each rank, for each of its experts;
- the dispatch: each kept token's row sent to its expert's rank with `all_to_all_single` and its split sizes;
- the local experts run on the rows that arrived, and the combine that sends the results back;
- the results put back at their tokens and scaled by their gates, dropped tokens passing through unchanged;
- an all-to-all as an `autograd.Function` whose backward is the reverse all-to-all.

This lab assumes notebook 18 §2 (expert parallelism, `course_lib.moe`) and notebook 03 (custom `autograd.Function`s). Expected time: about an hour.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The task

Fill in the four places marked `YOUR CODE HERE` in the cell below, then run it (it writes `_runs/lab_experts.py`) and the check after it. The module's docstring is the specification. About 25 lines.

Three rules decide whether it is right, and each has a check of its own:

1. **The layer computes what it computes in one process.** A kept token's output is `x + gate * expert(x)` with its own expert's result, a dropped token's output is `x`; the gradients of the inputs, of the experts' weights and of the router (through the gate) are those of one process.
2. **Both sides of every all-to-all agree on the split sizes.** `input_split_sizes[r]` is how many rows this rank sends to rank `r`, `output_split_sizes[r]` how many it receives from rank `r`; a rank cannot know the second without being told, so a first, small all-to-all exchanges the counts. The check compares the two ranks' sizes before each all-to-all runs.
3. **Only what must travel travels.** Per step and per rank: the counts, the kept tokens' rows for other ranks' experts, their results back, and the same two exchanges reversed in backward: the bytes `course_lib.moe.expert_parallel_bytes` gives.
"""

# %% slideshow={"slide_type": "-"}
import os

os.makedirs("_runs", exist_ok=True)  # scratch folder for the files this notebook writes (git ignores it)

# %% slideshow={"slide_type": "subslide"}
# %%writefile _runs/lab_experts.py
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
    # YOUR CODE HERE
    raise NotImplementedError()


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, send, recv):
        # YOUR CODE HERE
        raise NotImplementedError()

    @staticmethod
    def backward(ctx, grad):
        # YOUR CODE HERE
        raise NotImplementedError()


def moe_forward(x, expert, kept, gate, local_experts, n_experts):
    # YOUR CODE HERE
    raise NotImplementedError()


# %% [markdown] slideshow={"slide_type": "slide"}
"""
## The check

`check_experts_lab()` starts 2 processes (gloo, CPU). Each builds `course_lib.moe.MoE` with 4 SwiGLU experts, top-1 routing and a capacity factor of 1, from the same seed, keeps its own 2 experts and 32 tokens, routes them with the router (replicated on both ranks) and calls your `moe_forward`. It trains 2 steps with SGD and 2 with AdamW; the router's gradient is summed over the ranks, as a replicated parameter's is. In the same processes it runs the layer in one process on both ranks' tokens. Every `all_to_all_single` your code issues is first compared with the other rank's split sizes, so that a mismatch stops the job with the sizes in the error. It checks:

- the outputs equal one process's (relative error ≤ 1e-5), and when they do not, whether the dropped tokens changed, the gate is missing or the results went to other tokens;
- the gradients of the inputs, of each rank's experts and of the router equal one process's (relative error ≤ 1e-5, `course_lib.equivalence.compare_gradients`);
- the parameters after 2 SGD steps and after 2 AdamW steps equal one process's within 1e-6: both compute each expert on the same rows, only grouped in other batches, so only the rounding of float32 differs;
- 3 all-to-alls in forward and 2 in backward, and the bytes each sends to the other rank equal the formula's.

A wrong answer names the check that failed, what was measured, and the mistake that usually causes it.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.labs.experts import check_experts_lab

print(check_experts_lab())

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Hints, if you are stuck

- `torch.nonzero(kept).flatten()` gives the kept tokens; `torch.argsort(expert[tokens], stable=True)` orders them by expert, and since expert `e` lives on rank `e // per`, by destination rank too. Keep that sorted list of tokens: the results come back in its order.
- `torch.bincount(values, minlength=n)` counts the rows per expert (`n_experts`) or per rank (`world`).
- The counts exchange sends `per` numbers to every rank: `exchange(counts, [per] * world, [per] * world)`. What arrives is, for each source rank in turn, its rows for each of this rank's experts; `.view(world, per).sum(1)` gives `recv`.
- `torch.arange(per).repeat(world).repeat_interleave(counts_in)` labels every received row with its local expert.
- Out-of-place `index_copy` and `index_add` (without the trailing underscore) keep the graph for autograd: `x.index_add(0, tokens, values)` is `x` with `values` added at those rows, and its gradient flows to both.
- `AllToAll.backward` receives the gradient of what `forward` returned, and returns the gradient of what `forward` received, followed by `None` for each of the two lists of sizes.

## Summary

- Expert parallelism moves tokens, not weights: two all-to-alls per layer in forward (dispatch, combine) and their two reverses in backward, each sending whatever the router decided, so the split sizes must first be exchanged.
- The capacity bounds what a rank receives per expert; a dropped token costs no communication and keeps its residual path.
- An all-to-all's backward is the all-to-all with the input and output split sizes swapped.

## References

- PyTorch: [`all_to_all_single`](https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_to_all_single) and [extending autograd with `Function`](https://pytorch.org/docs/stable/notes/extending.html).
- D. Lepikhin et al., *GShard: Scaling Giant Models with Conditional Computation and Automatic Sharding*, ICLR 2021, [arXiv:2006.16668](https://arxiv.org/abs/2006.16668); W. Fedus, B. Zoph, N. Shazeer, *Switch Transformers*, JMLR 2022, [arXiv:2101.03961](https://arxiv.org/abs/2101.03961).
"""
