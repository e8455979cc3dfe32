from __future__ import annotations

import torch

from checks import assert_check
from course_lib.attention import merge_attention
from course_lib.exercises.transformer import check_merge, check_param_count, check_saved_bytes
from course_lib.transformer import TransformerConfig


def _blank(*args: object) -> object:
    raise NotImplementedError


def _params(c: TransformerConfig) -> int:
    """A learner's count, written from the fields (not with param_count)."""
    d, f, L, V = c.d_model, c.d_ff, c.n_layers, c.vocab_size
    kv = c.kv_heads * c.head_dim
    per_block = 2 * d * d + 2 * d * kv + (3 if c.mlp == "swiglu" else 2) * d * f + 2 * d
    total = V * d + L * per_block + d + (0 if c.tie_embeddings else V * d)
    return total + (c.max_seq_len * d if c.positions == "learned" else 0)


def test_param_count() -> None:
    def untied_always(c: TransformerConfig) -> int:
        return _params(c) + (c.vocab_size * c.d_model if c.tie_embeddings else 0)

    def no_norms(c: TransformerConfig) -> int:
        return _params(c) - (2 * c.n_layers + 1) * c.d_model

    def no_final_norm(c: TransformerConfig) -> int:
        return _params(c) - c.d_model

    def full_kv(c: TransformerConfig) -> int:
        kv = c.kv_heads * c.head_dim
        return _params(c) + 2 * c.n_layers * c.d_model * (c.d_model - kv)

    def two_mlp_matrices(c: TransformerConfig) -> int:
        return _params(c) - (c.n_layers * c.d_model * c.d_ff if c.mlp == "swiglu" else 0)

    def no_positions(c: TransformerConfig) -> int:
        return _params(c) - (c.max_seq_len * c.d_model if c.positions == "learned" else 0)

    assert_check(
        check_param_count,
        right=[_params, lambda c: float(_params(c)), lambda c: torch.tensor(_params(c))],
        right_says="6,738,415,616",
        not_done=[_blank, ...],
        wrong=[
            (untied_always, "tied head IS the embedding"),
            (no_norms, "norms have parameters"),
            (no_final_norm, "final norm"),
            (full_kv, "grouped-query attention"),
            (two_mlp_matrices, "three matrices"),
            (no_positions, "learned positions"),
            (lambda c: 12 * c.n_layers * c.d_model**2, "add the parts"),
            (lambda c: "many", "return a number"),
            (lambda c: c.width, "AttributeError"),
        ],
    )


def _saved(c: TransformerConfig, s: int, attention: str, p: int) -> int:
    """A learner's count of one block's saved bytes, one sequence, written from section 3."""
    h, f, a = c.d_model, c.d_ff, c.n_heads
    kv = c.kv_heads * c.head_dim
    norms = 2 * (s * h * p + 4 * s)
    inputs = 2 * s * h * p  # the q/k/v projections' input and the MLP projections' input
    if attention == "sdpa":
        attn = s * h * p + 2 * s * kv * p + s * h * p + 4 * s * a  # q, k, v, output, log-sum-exp
    else:
        attn = 3 * s * h * p + a * s * s * p + s * h * p  # q, k, v repeated to every head, probabilities, output
    mlp = (4 if c.mlp == "swiglu" else 2) * s * f * p
    return norms + inputs + attn + mlp


def test_saved_bytes() -> None:
    def shift(delta):  # type: ignore[no-untyped-def]
        return lambda c, s, att, p: _saved(c, s, att, p) + delta(c, s, att, p)

    def kv_width(c, s, att, p):  # type: ignore[no-untyped-def]
        return 2 * s * (c.kv_heads * c.head_dim - c.d_model) * p if att == "naive" else 0

    assert_check(
        check_saved_bytes,
        right=[_saved, lambda c, s, att, p: float(_saved(c, s, att, p))],
        not_done=[_blank, ..., lambda c, s, att, p: None],
        wrong=[
            (shift(lambda c, s, att, p: -c.n_heads * s * s * p if att == "naive" else 0), "keeps its probabilities"),
            (shift(lambda c, s, att, p: c.n_heads * s * s * p if att == "naive" else 0), "only the probabilities"),
            (shift(lambda c, s, att, p: c.n_heads * s * s * p if att == "sdpa" else 0), "no s x s tensor"),
            (shift(lambda c, s, att, p: -4 * s * c.n_heads if att == "sdpa" else 0), "also keeps the log-sum-exp"),
            (shift(lambda c, s, att, p: s * c.d_model * p if att == "sdpa" else 0), "view of SDPA's output"),
            (shift(lambda c, s, att, p: -8 * s), "1/rms"),
            (
                shift(lambda c, s, att, p: (8 * s + (4 * s * c.n_heads if att == "sdpa" else 0)) * (p - 4) // 4),
                "float32, 4 bytes",
            ),
            (shift(kv_width), "repeats k and v"),
            (shift(lambda c, s, att, p: -2 * s * c.d_ff * p if c.mlp == "swiglu" else 0), "four tensors"),
            (shift(lambda c, s, att, p: 1000), "section 3's list"),
            (lambda c, s, att, p: [1], "return a number"),
        ],
    )


def _right_merge(o1, l1, o2, l2):  # type: ignore[no-untyped-def]
    lse = torch.logaddexp(l1, l2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(l1 - safe)[..., None] * o1 + torch.exp(l2 - safe)[..., None] * o2, lse


def test_merge() -> None:
    def naive_nan(o1, l1, o2, l2):  # type: ignore[no-untyped-def]
        lse = torch.logaddexp(l1, l2)
        return torch.exp(l1 - lse)[..., None] * o1 + torch.exp(l2 - lse)[..., None] * o2, lse

    def with_max(o1, l1, o2, l2):  # type: ignore[no-untyped-def]
        out, _ = _right_merge(o1, l1, o2, l2)
        return out, torch.maximum(l1, l2)

    def lse_sum(o1, l1, o2, l2):  # type: ignore[no-untyped-def]
        out, _ = _right_merge(o1, l1, o2, l2)
        return out, l1 + l2

    def average(o1, l1, o2, l2):  # type: ignore[no-untyped-def]
        return (o1 + o2) / 2, _right_merge(o1, l1, o2, l2)[1]

    def unnormalized(o1, l1, o2, l2):  # type: ignore[no-untyped-def]
        lse = torch.logaddexp(l1, l2)
        return o1 + o2, lse

    assert_check(
        check_merge,
        right=[_right_merge, merge_attention],
        right_says="in either order",
        not_done=[_blank, ...],
        wrong=[
            (naive_nan, "gave NaN"),
            (with_max, "not the max"),
            (lse_sum, "not lse1 + lse2"),
            (average, "plain average"),
            (unnormalized, "share of the total mass"),
            (lambda o1, l1, o2, l2: o1, "tuple (out, lse)"),
            (lambda o1, l1, o2, l2: (o1, "lse"), "two tensors"),
            (lambda o1, l1, o2, l2: (o1[..., 0], l1), "keep the shape"),
        ],
    )
