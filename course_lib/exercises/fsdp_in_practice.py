"""Checks for notebook 19 (FSDP2 in a real script: per-block units, accumulation, mixed precision)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..transformer import PRESETS, Transformer, TransformerConfig
from .core import Wrong, as_number, call_learner, exercise

__all__ = [
    "block_gather_bytes",
    "check_block_gather_bytes",
    "check_collectives_per_step",
    "check_float8_scales",
    "collectives_per_step",
]


def collectives_per_step(n_blocks: int, micro_batches: int, *, sync_every_micro_batch: bool = True) -> dict[str, int]:
    """FSDP2's collectives in one step of notebook 19's script, torchtitan's units: the embedding and each block
    (``reshard_after_forward`` at its default: gathered in forward and again in backward), the final norm with the
    untied head (``reshard_after_forward=False``: gathered once), and a root with no parameter (no collective);
    gradients reduce-scattered after each micro-batch, or after the last one only (``set_requires_gradient_sync``).

    >>> collectives_per_step(2, 2)
    {'all_gather': 14, 'reduce_scatter': 8}
    >>> collectives_per_step(2, 2, sync_every_micro_batch=False)["reduce_scatter"]
    4
    """
    if n_blocks < 0 or micro_batches < 1:
        raise ValueError("n_blocks must be >= 0 and micro_batches >= 1")
    if n_blocks > 1_000_000 or micro_batches > 1_000_000:
        raise ValueError("n_blocks and micro_batches must be at most 1,000,000")
    units = n_blocks + 2
    return {
        "all_gather": micro_batches * (2 * n_blocks + 3),
        "reduce_scatter": units * (micro_batches if sync_every_micro_batch else 1),
    }


def block_gather_bytes(config: TransformerConfig, param_dtype: torch.dtype) -> int:
    """Bytes of one block's parameters gathered whole, in ``param_dtype`` (what one all-gather brings
    together; ``MixedPrecisionPolicy(param_dtype=...)`` casts the shards before gathering).

    >>> block_gather_bytes(PRESETS["tiny"], torch.float32)
    198144
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    with torch.device("meta"):
        block = Transformer(config).layers[0]
    size = torch.empty((), dtype=param_dtype).element_size()
    return sum(p.numel() for p in block.parameters()) * size


@exercise(
    "collectives of an accumulated step",
    todo="write collectives(n_blocks, micro_batches, sync_every_micro_batch) returning "
    "{'all_gather': ..., 'reduce_scatter': ...}",
)
def check_collectives_per_step(collectives: Any) -> str:
    cases = [(2, 2, False), (2, 2, True), (4, 1, False), (8, 4, False), (8, 4, True), (0, 3, False)]
    for n, m, sync in cases:
        call = f"collectives({n}, {m}, {sync})"
        got = call_learner(collectives, n, m, sync)
        if not isinstance(got, dict) or set(got) != {"all_gather", "reduce_scatter"}:
            raise Wrong(f"{call} should return a dict with the keys 'all_gather' and 'reduce_scatter', got {got!r}")
        want = collectives_per_step(n, m, sync_every_micro_batch=sync)
        ag = as_number(got["all_gather"], f"{call}['all_gather']")
        rs = as_number(got["reduce_scatter"], f"{call}['reduce_scatter']")
        if ag != want["all_gather"]:
            if ag == m * (2 * n + 4):
                raise Wrong(
                    f"{call}: the norm and head unit (reshard_after_forward=False) is not gathered again in backward"
                )
            if ag == m * (2 * n + 1):
                raise Wrong(f"{call}: the embedding and the norm with the head are units of their own, not the root's")
            if ag == m * (n + 2):
                raise Wrong(f"{call}: each block is gathered twice per micro-batch, once in forward, once in backward")
            if ag == 2 * n + 3 and m > 1:
                raise Wrong(f"{call}: every micro-batch runs forward and backward, so it gathers again")
            raise Wrong(
                f"{call}['all_gather'] = {ag:g}; count per micro-batch: the embedding and each block twice, the norm "
                "and head once, the root (no parameter) never"
            )
        if rs != want["reduce_scatter"]:
            per_sync = m if sync else 1
            if rs == (n + 3) * per_sync:
                raise Wrong(f"{call}: the root has no parameter, so no gradient to reduce-scatter")
            if sync and rs == n + 2 and m > 1:
                raise Wrong(f"{call}: with sync every micro-batch, each micro-batch reduce-scatters every unit")
            if not sync and rs == (n + 2) * m:
                raise Wrong(f"{call}: without sync, gradients are reduce-scattered after the last micro-batch only")
            if rs == n * per_sync:
                raise Wrong(
                    f"{call}: the embedding's unit and the norm and head's have gradients to reduce-scatter too"
                )
            raise Wrong(
                f"{call}['reduce_scatter'] = {rs:g}; one per unit with parameters each time gradients are synchronized"
            )
    return (
        "the embedding and each block twice per micro-batch, the norm and head once; one reduce-scatter per unit with "
        "parameters per synchronization"
    )


@exercise("bytes of one block's all-gather", todo="write gather_bytes(config, param_dtype)")
def check_block_gather_bytes(gather_bytes: Any) -> str:
    cases = [(PRESETS["tiny"], torch.float32), (PRESETS["tiny"], torch.bfloat16), (PRESETS["nano"], torch.float32)]
    cases += [(PRESETS["llama2-7b"], torch.bfloat16)]
    for config, dtype in cases:
        call = f"gather_bytes(<{config.d_model} wide>, {dtype})"
        got = as_number(call_learner(gather_bytes, config, dtype), call)
        want = block_gather_bytes(config, dtype)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        size = torch.empty((), dtype=dtype).element_size()
        if math.isclose(got, want * 4 / size) and size != 4:
            raise Wrong(f"{call} = {got:,.0f} counts 4 bytes per parameter: the policy gathers in {dtype}")
        if math.isclose(got, want - 2 * config.d_model * size):
            raise Wrong(f"{call} = {got:,.0f} leaves out the block's two norm weights")
        if math.isclose(got, want / size):
            raise Wrong(f"{call} = {got:,.0f} is the number of parameters: multiply by the bytes per element")
        raise Wrong(f"{call} = {got:,.0f}: count every parameter of one block (attention, MLP, norms)")
    return "one block's parameters whole, in the policy's param_dtype: the largest buffer a block unit gathers"


@exercise("float8 scales", todo="write float8_scales(x, recipe) as described above")
def check_float8_scales(fn: Any) -> str:
    top = torch.finfo(torch.float8_e4m3fn).max
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=gen)
    x[2] *= 1e5  # an outlier row
    for recipe in ("tensorwise", "rowwise"):
        scale = call_learner(fn, x.clone(), recipe)
        if not isinstance(scale, torch.Tensor):
            raise Wrong(f"float8_scales should return a tensor of scales, got {type(scale).__name__} for {recipe!r}")
        want_shape = () if recipe == "tensorwise" else (x.shape[0], 1)
        if tuple(scale.shape) != want_shape:
            raise Wrong(
                f"{recipe}: the scale should have shape {want_shape} (one per tensor, or one per row kept as a "
                f"column so that x / scale broadcasts), got {tuple(scale.shape)}"
            )
        scaled = (x / scale).abs()
        peaks = scaled.max() if recipe == "tensorwise" else scaled.amax(dim=1)
        if torch.allclose(peaks, torch.ones_like(peaks), rtol=1e-5):
            raise Wrong(f"{recipe}: x / scale peaks at 1; the largest element should land on e4m3's largest, {top:g}")
        if not torch.allclose(peaks, torch.full_like(peaks, top), rtol=1e-5):
            raise Wrong(
                f"{recipe}: x / scale should peak at exactly {top:g} (per row for rowwise): scale = amax / {top:g}"
            )
    return "tensorwise: one amax / 448; rowwise: one per row, and the outlier row no longer squeezes the others"
