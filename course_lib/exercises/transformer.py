"""Checks for notebook 16 (the transformer: parameters, activation memory, attention by hand)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..attention import attention_block, merge_attention
from ..transformer import PRESETS, TransformerConfig, block_saved_bytes, param_count
from .core import Wrong, as_number, call_learner, exercise

__all__ = ["check_merge", "check_param_count", "check_saved_bytes", "PARAM_CASES", "SAVED_CASES"]

_TINY = PRESETS["tiny"]
PARAM_CASES: dict[str, TransformerConfig] = {
    "tiny": _TINY,
    "nano": PRESETS["nano"],
    "tiny, untied head": dataclasses.replace(_TINY, tie_embeddings=False),
    "tiny, GELU MLP": dataclasses.replace(_TINY, mlp="gelu"),
    "tiny, learned positions": dataclasses.replace(_TINY, positions="learned"),
    "tiny, 2 kv heads": dataclasses.replace(_TINY, n_kv_heads=2),
    "Llama 2 7B": PRESETS["llama2-7b"],
    "Llama 3 8B": PRESETS["llama3-8b"],
}


def _near(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=1e-12, abs_tol=0.5)


@exercise("parameter count", todo="write n_params(config) from the config's fields (not with param_count)")
def check_param_count(n_params: Any) -> str:
    for name, c in PARAM_CASES.items():
        call = f"n_params({name})"
        got = as_number(call_learner(n_params, c), call)
        want = param_count(c)
        if _near(got, want):
            continue
        d, L, f, V = c.d_model, c.n_layers, c.d_ff, c.vocab_size
        kv = c.kv_heads * c.head_dim
        if c.tie_embeddings and _near(got, want + V * d):
            raise Wrong(f"{call}: a tied head IS the embedding matrix; count it once")
        if not c.tie_embeddings and _near(got, want - V * d):
            raise Wrong(f"{call}: an untied head is a V x h matrix of its own; count it")
        if _near(got, want - (2 * L + 1) * d) or _near(got, want - 2 * L * d):
            raise Wrong(f"{call}: the norms have parameters too: two scales of width h per block, and the final norm")
        if _near(got, want - d):
            raise Wrong(f"{call}: one norm short: after the last block comes the final norm")
        if kv != d and _near(got, want + 2 * L * d * (d - kv)):
            raise Wrong(f"{call}: with grouped-query attention k_proj and v_proj are h x (kv_heads x head_dim)")
        if c.mlp == "swiglu" and _near(got, want - L * d * f):
            raise Wrong(f"{call}: SwiGLU has three matrices per block (gate, up, down), not two")
        if c.mlp == "gelu" and _near(got, want + L * d * f):
            raise Wrong(f"{call}: a GELU MLP has two matrices per block (up, down); only SwiGLU has a gate")
        if c.positions == "learned" and _near(got, want - c.max_seq_len * d):
            raise Wrong(f"{call}: learned positions are a table of max_seq_len x h parameters")
        raise Wrong(
            f"{call} returned {got:,.0f}, which is not the count: add the parts of the notebook's list one by one "
            "(embedding, per block attention + MLP + two norms, final norm, head unless tied, learned positions)"
        )
    return "the count of every configuration, from the embedding to the head, Llama 2 7B's 6,738,415,616 included"


SAVED_CASES: list[tuple[str, TransformerConfig, int, str, int]] = [
    ("tiny", _TINY, 128, "sdpa", 4),
    ("tiny", _TINY, 128, "naive", 4),
    ("tiny", _TINY, 64, "naive", 2),
    ("tiny, GELU MLP", dataclasses.replace(_TINY, mlp="gelu"), 100, "naive", 4),
    ("tiny, GELU MLP", dataclasses.replace(_TINY, mlp="gelu"), 100, "sdpa", 2),
    ("Llama 2 7B", PRESETS["llama2-7b"], 4096, "sdpa", 2),
    ("Llama 2 7B", PRESETS["llama2-7b"], 4096, "naive", 2),
    ("Llama 3 8B", PRESETS["llama3-8b"], 8192, "sdpa", 2),
    ("Llama 3 8B", PRESETS["llama3-8b"], 2048, "naive", 2),
]
_DTYPES = {2: torch.bfloat16, 4: torch.float32}


@exercise(
    "saved bytes of a block",
    todo="write saved_bytes(config, seq_len, attention, p): what one block keeps for one sequence",
)
def check_saved_bytes(saved_bytes: Any) -> str:
    for name, c, s, attention, p in SAVED_CASES:
        call = f"saved_bytes({name}, {s}, {attention!r}, {p})"
        got = as_number(call_learner(saved_bytes, c, s, attention, p), call)
        want = block_saved_bytes(c, s, dtype=_DTYPES[p], attention=attention)
        if _near(got, want):
            continue
        h, f, a = c.d_model, c.d_ff, c.n_heads
        kv = c.kv_heads * c.head_dim
        probs = s * a * s * p
        if attention == "naive" and _near(got, want - probs):
            raise Wrong(f"{call}: naive attention keeps its probabilities, n_heads x seq_len numbers per token")
        if attention == "naive" and _near(got, want + probs):
            raise Wrong(f"{call}: only the probabilities stay; softmax's backward needs its output, not the scores")
        if attention == "sdpa" and (_near(got, want + probs) or _near(got, want + probs - 4 * s * a)):
            raise Wrong(f"{call}: SDPA keeps no s x s tensor; only a log-sum-exp per token and head")
        if attention == "sdpa" and _near(got, want - 4 * s * a):
            raise Wrong(f"{call}: SDPA also keeps the log-sum-exp, one float32 per token and head")
        if attention == "sdpa" and _near(got, want + s * h * p):
            raise Wrong(f"{call}: the output projection keeps a view of SDPA's output: the same bytes, counted once")
        stats = 8 * s + (4 * s * a if attention == "sdpa" else 0)
        if p != 4 and _near(got, want - stats + stats * p // 4):
            raise Wrong(f"{call}: 1/rms and the log-sum-exp are float32, 4 bytes each, whatever p is")
        if _near(got, want - 8 * s):
            raise Wrong(f"{call}: each RMSNorm also keeps 1/rms, one float32 per token (two norms per block)")
        if kv != h and attention == "sdpa" and _near(got, want + 2 * s * (h - kv) * p):
            raise Wrong(f"{call}: with grouped-query attention SDPA keeps k and v at kv_heads x head_dim")
        if kv != h and attention == "naive" and _near(got, want - 2 * s * (h - kv) * p):
            raise Wrong(
                f"{call}: naive attention repeats k and v to every head before its products, which keep the copies"
            )
        if c.mlp == "swiglu" and any(_near(got, want - n * s * f * p) for n in (1, 2, 3)):
            raise Wrong(f"{call}: SwiGLU keeps four tensors of width d_ff: gate, silu(gate), up and their product")
        raise Wrong(
            f"{call} returned {got:,.0f}, which is not what the meter measures: go through section 3's list of "
            "terms (two norms, the projections' input, q, k, v, the attention output or probabilities, the MLP)"
        )
    return "every term, for SDPA and naive attention, 16- and 32-bit, grouped-query attention included"


def _partials(
    seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two partial results of causal attention over keys 0-5 and 6-11, for queries at positions 3-10.

    Queries 3-5 see no key of the second block: there ``out2 = 0`` and ``lse2 = -inf``.
    """
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=dtype) for n in (8, 12, 12))
    out1, lse1 = attention_block(q, k[..., :6, :], v[..., :6, :], causal=True, q_start=3, k_start=0)
    out2, lse2 = attention_block(q, k[..., 6:, :], v[..., 6:, :], causal=True, q_start=3, k_start=6)
    return out1, lse1, out2, lse2, q, k


@exercise("merge two partial results", todo="write merge(out1, lse1, out2, lse2) returning (out, lse)")
def check_merge(merge: Any) -> str:
    for seed, dtype, tol in ((0, torch.float64, 1e-10), (1, torch.float32, 1e-5)):
        out1, lse1, out2, lse2, _, _ = _partials(seed, dtype)
        cases = [("two blocks", (out1, lse1, out2, lse2)), ("the same blocks, swapped", (out2, lse2, out1, lse1))]
        nothing = (torch.zeros_like(out2), torch.full_like(lse2, float("-inf")))
        cases.append(("a side that saw no key", (out1, lse1, *nothing)))
        cases.append(("two sides that saw no key", (*nothing, *nothing)))
        for label, args in cases:
            call = f"merge(...) on {label} ({str(dtype)[6:]})"
            result = call_learner(merge, *(a.clone() for a in args))
            if not isinstance(result, tuple) or len(result) != 2:
                raise Wrong(f"{call} should return a tuple (out, lse), got {type(result).__name__}")
            got_out, got_lse = result
            if not isinstance(got_out, torch.Tensor) or not isinstance(got_lse, torch.Tensor):
                raise Wrong(f"{call} should return two tensors")
            want_out, want_lse = merge_attention(*args)
            if got_out.shape != want_out.shape or got_lse.shape != want_lse.shape:
                raise Wrong(
                    f"{call}: out should keep the shape {tuple(want_out.shape)} and lse {tuple(want_lse.shape)}, got "
                    f"{tuple(got_out.shape)} and {tuple(got_lse.shape)}"
                )
            if torch.isnan(got_out).any() or torch.isnan(got_lse).any():
                raise Wrong(
                    f"{call} gave NaN: where lse is -inf, exp(lse_i - lse) is exp(-inf + inf); "
                    "such a side must weigh 0 (and with no key at all, keep out = 0, lse = -inf)"
                )
            lse_ok = torch.allclose(got_lse.double(), want_lse.double(), atol=tol, rtol=0, equal_nan=False)
            if not lse_ok:
                if label == "two blocks" and torch.allclose(got_lse.double(), torch.maximum(lse1, lse2).double()):
                    raise Wrong(f"{call}: the total mass is exp(lse1) + exp(lse2): lse is their logaddexp, not the max")
                if label == "two blocks" and torch.allclose(got_lse.double(), (lse1 + lse2).double()):
                    raise Wrong(
                        f"{call}: lse is the log of a sum of masses, log(exp(lse1) + exp(lse2)), not lse1 + lse2"
                    )
                raise Wrong(f"{call}: lse is not the log-sum-exp over both blocks")
            if not torch.allclose(got_out.double(), want_out.double(), atol=tol, rtol=0):
                if label == "two blocks" and torch.allclose(got_out.double(), ((out1 + out2) / 2).double()):
                    raise Wrong(f"{call}: a plain average ignores how much softmax mass each block holds")
                raise Wrong(f"{call}: weigh each output by its block's share of the total mass, exp(lse_i - lse)")
    return "partial results merge exactly, in either order, and a side that saw no key weighs nothing"
