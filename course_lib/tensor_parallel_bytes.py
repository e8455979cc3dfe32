"""What tensor and sequence parallelism cost per rank: the bytes sent per step and the bytes kept for backward.

:func:`tp_bytes_per_step` (the bytes one rank sends per training step, by part) and :func:`tp_saved_bytes` (what one
block keeps for backward per rank, with and without sequence parallelism). Notebook 17 checks them against
:class:`~course_lib.counted_collectives.CommCounter` and :class:`~course_lib.saved_tensors.SavedTensorMeter`;
:mod:`course_lib.planner` uses them.
"""

from __future__ import annotations

import torch

from .counted_collectives import collective_bytes
from .transformer_config import TransformerConfig
from .transformer_counts import block_saved_terms
from .validation import check_bool, check_int

__all__ = ["tp_bytes_per_step", "tp_saved_bytes"]


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

    Notebook 16's :func:`~course_lib.transformer.block_saved_terms`, with the heads' and the MLP's
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
