"""Typical bugs in the ring-attention lab (solutions/lab_18_ring_attention.py): patches its check must reject."""

from mutants import Mutant

_POSTED = """    requests = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, k, (rank + 1) % n),
            dist.P2POp(dist.isend, v, (rank + 1) % n),
            dist.P2POp(dist.irecv, k_next, (rank - 1) % n),
            dist.P2POp(dist.irecv, v_next, (rank - 1) % n),
        ]
    )
"""

MUTANTS = [
    Mutant(
        "off by one at the block boundary: the block just after the queries is computed",
        "if not causal or k_start <= q_start + q_len - 1:",
        "if not causal or k_start <= q_start + q_len:",
        ("✗ contiguous, causal: output and log-sum-exp", "NaN in the output", "✗ blocks in the future skipped"),
    ),
    Mutant(
        "the causal mask hides a query's own key",
        'scores = scores.masked_fill(kj[None, :] > qi[:, None], float("-inf"))',
        'scores = scores.masked_fill(kj[None, :] >= qi[:, None], float("-inf"))',
        ("✗ zig-zag, causal: output and log-sum-exp", "NaN in the output", "does not see its own key"),
    ),
    Mutant(
        "merge without rescaling the running output",
        "    out = torch.exp(lse - new_lse)[..., None] * out + torch.exp(block_lse - new_lse)[..., None] * block_out\n",
        "    out = out + torch.exp(block_lse - new_lse)[..., None] * block_out\n",
        ("✗ contiguous, not causal: output and log-sum-exp", "the log-sum-exp is right and the output is not"),
    ),
    Mutant(
        "the log-sum-exp merged without subtracting the maximum",
        "    new_lse = torch.logaddexp(lse, block_lse)\n",
        "    new_lse = torch.log(torch.exp(lse) + torch.exp(block_lse))\n",
        ("✗ zig-zag, causal, large scores: output and log-sum-exp", "overflowing"),
    ),
    Mutant(
        "the 1/sqrt(d) scale missing",
        "    scale = 1.0 / math.sqrt(q.shape[-1])\n",
        "    scale = 1.0\n",
        ("✗ contiguous, causal: output and log-sum-exp", "without the 1/sqrt(head_dim) scale"),
    ),
    Mutant(  # sends to rank - 1, receives from rank + 1
        "blocks passed in the wrong direction",
        _POSTED,
        _POSTED.replace("(rank + 1)", "(rank + 9)").replace("(rank - 1)", "(rank + 1)").replace("+ 9", "- 1"),
        ("✗ ring direction", "rank 0 sends to [3] and receives from [1]", "✗ zig-zag, causal: output and log-sum-exp"),
    ),
    Mutant(
        "the block held taken to be rank r + s's",
        "        source = (rank - step) % n  # whose block this rank holds at this step\n",
        "        source = (rank + step) % n\n",
        ("✗ contiguous, causal: output and log-sum-exp", "(r - s) mod n"),
    ),
    Mutant(
        "the zig-zag layout gives rank r chunks r and n + r",
        "    return tuple(((r * c, c), ((2 * n - 1 - r) * c, c)) for r in range(n))\n",
        "    return tuple(((r * c, c), ((n + r) * c, c)) for r in range(n))\n",
        ("✗ zig-zag layout", "((0, 8), (32, 8))", "chunk 2n-1-r"),
    ),
    Mutant(
        "waits for the next block before computing the current one",
        "            k_next, v_next, requests = post_next(k, v, rank, n)\n",
        "            k_next, v_next, requests = post_next(k, v, rank, n)\n"
        "            for request in requests:\n"
        "                request.wait()\n"
        "            requests = []  # waited for already (a second wait() would never return)\n",
        ("✗ next block posted before the compute", "0 of 6"),
    ),
    Mutant(
        "deadlock: every rank receives before it sends",
        _POSTED,
        "    dist.recv(k_next, (rank - 1) % n)\n"
        "    dist.recv(v_next, (rank - 1) % n)\n"
        "    requests = [dist.isend(k, (rank + 1) % n), dist.isend(v, (rank + 1) % n)]\n",
        ("✗ the job finishes", "a receive must meet a send"),
        timeout=20.0,
    ),
]
