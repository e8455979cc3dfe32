"""What a configuration of the course's transformer costs: parameters, saved activations, FLOPs, MFU.

Functions of a :class:`~course_lib.transformer_config.TransformerConfig` alone: :func:`param_count` (and its parts,
:func:`param_counts`), :func:`matmul_params` (the ``N`` of ``6N``), :func:`block_saved_bytes` (what one block keeps
for backward: naive or SDPA attention, no, full or selective checkpointing, any dtype; term by term in
:func:`block_saved_terms`), :func:`model_saved_bytes` (the whole model with its embedding, head and loss),
:func:`training_flops_per_token` (``6N`` plus the attention term) and :func:`mfu`. Notebook 16 checks each against
``sum(p.numel())``, ``SavedTensorMeter`` (to the byte) and ``FlopCounterMode`` (to the FLOP);
:mod:`course_lib.sharding` and :mod:`course_lib.planner` use them.
"""

from __future__ import annotations

import torch

from .transformer_config import (
    ATTENTIONS,
    CHECKPOINTINGS,
    PRESETS,  # noqa: F401  (the examples in the docstrings use it)
    TransformerConfig,
    check_choice,
    check_config,
)
from .validation import check_bool, check_int, check_number

__all__ = [
    "block_saved_bytes",
    "block_saved_terms",
    "matmul_params",
    "mfu",
    "model_saved_bytes",
    "model_saved_terms",
    "param_count",
    "param_counts",
    "training_flops_per_token",
]


def param_counts(config: TransformerConfig) -> dict[str, int]:
    """Parameters by part: ``embedding``, ``positions``, ``attention``, ``mlp``, ``norms``, ``head``.

    ``attention`` and ``mlp`` are summed over the layers; ``norms`` counts the two per block and the
    final one; ``head`` is 0 when it is tied (it is the embedding).

    >>> param_counts(PRESETS["llama2-7b"])["attention"] == 32 * 4 * 4096 * 4096
    True
    """
    c = check_config(config)
    d, f, L = c.d_model, c.d_ff, c.n_layers
    kv = c.kv_heads * c.head_dim
    return {
        "embedding": c.vocab_size * d,
        "positions": c.max_seq_len * d if c.positions == "learned" else 0,
        "attention": L * (2 * d * d + 2 * d * kv),
        "mlp": L * (3 if c.mlp == "swiglu" else 2) * d * f,
        "norms": (2 * L + 1) * d,
        "head": 0 if c.tie_embeddings else c.vocab_size * d,
    }


def param_count(config: TransformerConfig) -> int:
    """Number of parameters of ``Transformer(config)``, equal to ``sum(p.numel() for p in model.parameters())``.

    >>> param_count(PRESETS["llama2-7b"])     # Llama 2 7B
    6738415616
    >>> param_count(PRESETS["llama3-8b"])     # Llama 3 8B
    8030261248
    """
    return sum(param_counts(config).values())


def matmul_params(config: TransformerConfig) -> int:
    """The ``N`` of "6N FLOPs per token": weights that take part in a matrix product.

    Every projection of every block, and the head (even when tied: the head's product is computed
    whatever its weight is shared with). Not the embedding lookups, not the norms' scales.

    >>> c = PRESETS["nano"]
    >>> matmul_params(c) == param_count(c) - param_counts(c)["embedding"] - param_counts(c)["norms"] + 64 * 32
    True
    """
    parts = param_counts(config)
    return parts["attention"] + parts["mlp"] + config.vocab_size * config.d_model


def _dtype_bytes(dtype: object) -> tuple[int, int]:
    """Bytes per element of ``dtype``, and of the float32 statistics (float64 for float64)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype.itemsize, 8 if dtype == torch.float64 else 4


def block_saved_terms(
    config: TransformerConfig,
    seq_len: int,
    *,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    attention: str | None = None,
    checkpointing: str | None = None,
) -> dict[str, int]:
    """What one :class:`Block` keeps for backward, term by term, in bytes, for ``batch`` sequences of ``seq_len``.

    ``attention`` and ``checkpointing`` default to the config's. With ``T = batch * seq_len`` tokens,
    ``h = d_model``, ``h_kv = n_kv_heads * head_dim``, ``f = d_ff``, ``a = n_heads`` and ``p`` bytes
    per element (statistics in float32):

    * the two norms keep their inputs (``T h p`` each) and 1/rms (``4 T``); the projections after
      them keep the normalized tensors (``T h p`` each);
    * SDPA keeps ``q`` (rotated), ``k`` (rotated), ``v``, its output (which ``o_proj`` keeps too, as a
      view) and the log-sum-exp (``4 T a``); naive attention keeps ``q``, ``k``, ``v`` (``k`` and ``v``
      repeated to ``a`` heads when grouped), the probabilities ``T a s p`` (the ``s^2`` term), and
      ``o_proj`` keeps a copy of the output;
    * SwiGLU keeps the gate's output, its SiLU, the up projection and their product (``4 T f p``);
      GELU keeps the up projection and its GELU (``2 T f p``);
    * ``checkpointing="full"`` keeps the block's input only; ``"selective"`` (Korthikanti et al.,
      2022) recomputes attention proper: ``q``, ``k``, ``v`` and the output stay, the
      probabilities (naive) or the log-sum-exp (SDPA) go.

    >>> terms = block_saved_terms(PRESETS["tiny"], 128, attention="naive")
    >>> terms["attention probabilities"] == 128 * 4 * 128 * 4     # T a s p
    True
    """
    c = check_config(config)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    batch = check_int("batch", batch, minimum=1)
    p, st = _dtype_bytes(dtype)
    attn = c.attention if attention is None else check_choice("attention", attention, ATTENTIONS)
    ckpt = c.checkpointing if checkpointing is None else check_choice("checkpointing", checkpointing, CHECKPOINTINGS)
    T, h, f, a = batch * seq_len, c.d_model, c.d_ff, c.n_heads
    hkv = c.kv_heads * c.head_dim
    if ckpt == "full":
        return {"block input": T * h * p}
    terms = {
        "attention norm: input": T * h * p,
        "attention norm: 1/rms": T * st,
        "q, k, v projections: input": T * h * p,
        "attention: q": T * h * p,
    }
    selective = ckpt == "selective"
    grouped_by_hand = attn == "naive" and not selective  # repeated k, v are what the products keep
    terms["attention: k"] = T * (h if grouped_by_hand else hkv) * p
    terms["attention: v"] = T * (h if grouped_by_hand else hkv) * p
    if attn == "naive" and not selective:
        terms["attention probabilities"] = T * a * seq_len * p
    if attn == "sdpa" and not selective:
        terms["attention: log-sum-exp"] = T * a * st
    terms["attention output (o_proj input)"] = T * h * p
    terms["MLP norm: input"] = T * h * p
    terms["MLP norm: 1/rms"] = T * st
    terms["MLP projections: input"] = T * h * p
    if c.mlp == "swiglu":
        terms["MLP: gate, silu(gate), up, product"] = 4 * T * f * p
    else:
        terms["MLP: up, gelu(up)"] = 2 * T * f * p
    return terms


def block_saved_bytes(
    config: TransformerConfig,
    seq_len: int,
    *,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    attention: str | None = None,
    checkpointing: str | None = None,
) -> int:
    """Bytes one block keeps for backward: the sum of :func:`block_saved_terms`.

    Per token and layer, SDPA's count is linear in the sequence length; naive attention adds
    ``a * seq_len * p`` bytes per token, the term that takes over at long context.

    >>> llama = PRESETS["llama2-7b"]
    >>> block_saved_bytes(llama, 4096, dtype=torch.bfloat16) / 2**20          # MiB per sequence and layer
    600.53125
    >>> block_saved_bytes(llama, 4096, dtype=torch.bfloat16, attention="naive") / 2**20
    1624.03125
    """
    return sum(
        block_saved_terms(
            config, seq_len, batch=batch, dtype=dtype, attention=attention, checkpointing=checkpointing
        ).values()
    )


def model_saved_terms(
    config: TransformerConfig,
    seq_len: int,
    *,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    attention: str | None = None,
    checkpointing: str | None = None,
) -> dict[str, int]:
    """What a whole :class:`Transformer` keeps for backward of :meth:`Transformer.loss`, in bytes, by part.

    The blocks (``n_layers`` times :func:`block_saved_bytes`) plus what lies outside them: the token
    ids the embedding keeps (int64), learned positions' ids (one ``arange`` per call), the final norm
    (input and 1/rms), the head's input, and the loss: the float32 log-probabilities
    (``T * vocab_size * 4`` bytes), the int64 targets and one float32 scalar (the total weight).
    """
    c = check_config(config)
    block = block_saved_bytes(
        c, seq_len, batch=batch, dtype=dtype, attention=attention, checkpointing=checkpointing
    )  # validates the rest
    p, st = _dtype_bytes(dtype)
    T, h = batch * seq_len, c.d_model
    return {
        "blocks": c.n_layers * block,
        "token ids": T * 8,
        "position ids": seq_len * 8 if c.positions == "learned" else 0,
        "final norm: input and 1/rms": T * h * p + T * st,
        "head: input": T * h * p,
        "loss: log-probabilities": T * c.vocab_size * st,
        "loss: targets and total weight": T * 8 + st,
    }


def model_saved_bytes(
    config: TransformerConfig,
    seq_len: int,
    *,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    attention: str | None = None,
    checkpointing: str | None = None,
) -> int:
    """Bytes the whole model keeps for backward of its loss: the sum of :func:`model_saved_terms`."""
    return sum(
        model_saved_terms(
            config, seq_len, batch=batch, dtype=dtype, attention=attention, checkpointing=checkpointing
        ).values()
    )


def training_flops_per_token(config: TransformerConfig, seq_len: int, *, causal: bool = False) -> int:
    """Model FLOPs of one training step (forward and backward), per token: ``6 N + 12 L h s``.

    ``N`` is :func:`matmul_params`: a product with a ``k x n`` weight costs ``2 k n`` FLOPs per token
    forward and twice that backward (the input's gradient and the weight's). Attention proper adds
    ``q k^T`` and ``probs v``: ``4 h s`` per token and layer forward, ``8 h s`` backward (the
    convention of Chowdhery et al., 2022, appendix B, used for MFU). ``causal=True`` counts only the
    half of the score matrix a causal kernel computes. Recomputation (checkpointing, FlashAttention's
    backward) is not model FLOPs: it does not count here.

    >>> training_flops_per_token(PRESETS["llama2-7b"], 4096)     # Llama 2 7B at its 4096-token context
    46084915200
    """
    c = check_config(config)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    check_bool("causal", causal)
    attention = 12 * c.n_layers * c.d_model * seq_len
    return 6 * matmul_params(c) + (attention // 2 if causal else attention)


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: the fraction of the peak that the model's own FLOPs reach.

    >>> round(mfu(1000.0, 6e9, 1e13), 3)       # 6 TFLOP/s of model work on a 10 TFLOP/s peak
    0.6
    """
    for name, value in (
        ("tokens_per_second", tokens_per_second),
        ("flops_per_token", flops_per_token),
        ("peak_flops", peak_flops),
    ):
        check_number(name, value, finite=True)
        if value < 0 or (name == "peak_flops" and value == 0):
            raise ValueError(f"{name} must be {'> 0' if name == 'peak_flops' else '>= 0'}, got {value}")
    return tokens_per_second * flops_per_token / peak_flops
