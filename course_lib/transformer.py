"""The course's transformer: a small Llama-style decoder.

Notebook 16 builds it and measures it; notebooks 17 and 18 (tensor, sequence, context and expert
parallelism), 19 (FSDP2 per block), 21 (the planner) and 22 (the capstone) reuse it. So the layout follows the
conventions that PyTorch's parallelism APIs address by name:

* its configuration is a :class:`TransformerConfig` (:mod:`course_lib.transformer_config`, with the
  :data:`PRESETS`), re-exported here;
* :class:`Transformer`: token embedding ``embed`` (plus ``pos_embed`` for learned positions), the
  blocks in an ``nn.ModuleList`` called ``layers``, a final :class:`RMSNorm` ``norm`` and the output
  ``head`` (its weight *is* ``embed.weight`` when the head is tied). Each :class:`Block` has
  ``attn_norm``, ``attn`` (:class:`Attention`: separate ``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj`` ``nn.Linear`` layers, without bias), ``mlp_norm`` and ``mlp`` (:class:`MLP`:
  ``gate_proj``, ``up_proj``, ``down_proj`` for SwiGLU; ``up_proj``, ``down_proj`` for GELU). So
  ``parallelize_module`` plans (``"layers.0.attn.q_proj": ColwiseParallel()``) and per-block
  ``fully_shard(model.layers[i])`` apply as written. Reshapes use ``-1`` for the number of heads, so
  a block whose projections were split by tensor parallelism runs on its local heads unchanged.
* Attention runs through ``F.scaled_dot_product_attention`` (``attention="sdpa"``) or by hand
  (``"naive"``: the ``s x s`` scores and probabilities are materialized, and the probabilities are
  saved for backward), so the memory difference can be measured. Causal always.
* Initialization is deterministic from a seed (its own ``torch.Generator``): every process that
  builds ``Transformer(config, seed=0)`` gets the same weights. ``device="meta"`` builds the shapes
  only, for configurations far too large to allocate.

What a configuration costs (parameters, saved bytes, FLOPs, MFU) is :mod:`course_lib.transformer_counts`; its
functions are re-exported here, where the notebooks import them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .transformer_config import (
    ATTENTIONS,
    CHECKPOINTINGS,
    MLPS,
    POSITIONS,
    PRESETS,
    TransformerConfig,
    check_config,
)
from .transformer_counts import (
    block_saved_bytes,
    block_saved_terms,
    matmul_params,
    mfu,
    model_saved_bytes,
    model_saved_terms,
    param_count,
    param_counts,
    training_flops_per_token,
)
from .validation import check_int, check_number

__all__ = [
    "ATTENTIONS",
    "CHECKPOINTINGS",
    "MLPS",
    "POSITIONS",
    "PRESETS",
    "Attention",
    "Block",
    "MLP",
    "RMSNorm",
    "Transformer",
    "TransformerConfig",
    "block_saved_bytes",
    "block_saved_terms",
    "generate",
    "matmul_params",
    "mfu",
    "model_saved_bytes",
    "model_saved_terms",
    "param_count",
    "param_counts",
    "rms_norm",
    "training_flops_per_token",
]


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a hand-written backward that keeps what a fused kernel keeps: the input and 1/rms.

    The statistics are computed in float32 (float64 for float64 inputs) whatever the input's dtype.
    """

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        stat_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(stat_dtype)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xf * rstd).to(x.dtype) * weight, rstd

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, weight, _ = inputs
        _, rstd = output
        ctx.save_for_backward(x, weight, rstd)
        ctx.mark_non_differentiable(rstd)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor, _grad_rstd: Any) -> tuple[Any, ...]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        gy = grad_y.to(rstd.dtype)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (gy * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            g = gy * weight.to(rstd.dtype)
            grad_x = (rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dimension; keeps only ``x`` and ``1/rms`` for backward.

    Equal to ``F.rms_norm`` up to rounding. What it saves is what a fused RMSNorm kernel saves (the
    input, and one float32 statistic per row): the block's memory formula counts exactly that.

    >>> x = torch.tensor([[3.0, 4.0]])
    >>> rms_norm(x, torch.ones(2), eps=0.0)   # rms of (3, 4) is sqrt(12.5)
    tensor([[0.8485, 1.1314]])
    """
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError("rms_norm takes tensors x and weight")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(
            f"weight must have shape {tuple(x.shape[-1:])} (x's last dimension), got {tuple(weight.shape)}"
        )
    check_number("eps", eps, finite=True)
    out, _ = _RMSNormFunction.apply(x, weight, eps)
    return out


class RMSNorm(nn.Module):
    """Root-mean-square normalization with a learned scale (Zhang & Sennrich, 2019), through :func:`rms_norm`."""

    def __init__(self, dim: int, eps: float = 1e-5, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        check_int("dim", dim, minimum=1)
        self.eps = float(check_number("eps", eps, finite=True))
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_tables(config: TransformerConfig, device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, ``(max_seq_len, head_dim)``, halves repeated (the rotate-half layout)."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``batch, heads, seq, head_dim``) by its positions; saves only the (buffer) tables."""
    s = x.shape[-2]
    return x * cos[:s].to(x.dtype) + _rotate_half(x) * sin[:s].to(x.dtype)


def _naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(q k^T / sqrt(d)) v, the s x s matrices materialized (their probabilities saved)."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    mask = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
    probs = torch.softmax(scores + mask, dim=-1)  # an added mask saves nothing; softmax saves probs
    return probs @ v


class Attention(nn.Module):
    """Causal multi-head (or grouped-query) self-attention with separate q, k, v and output projections."""

    def __init__(self, config: TransformerConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = check_config(config)
        d, kv = config.d_model, config.kv_heads * config.head_dim
        self.q_proj = nn.Linear(d, d, bias=False, device=device)
        self.k_proj = nn.Linear(d, kv, bias=False, device=device)
        self.v_proj = nn.Linear(d, kv, bias=False, device=device)
        self.o_proj = nn.Linear(d, d, bias=False, device=device)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention proper on ``(batch, heads, seq, head_dim)`` tensors: SDPA or by hand."""
        if self.config.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        if k.shape[1] != q.shape[1]:  # grouped-query attention by hand: each kv head serves n_rep q heads
            n_rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        return _naive_attention(q, k, v)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.config.head_dim
        q = self.q_proj(x).view(b, s, -1, hd).transpose(1, 2)  # -1: the heads this rank holds
        k = self.k_proj(x).view(b, s, -1, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, hd).transpose(1, 2)
        if rope is not None:
            q, k = _apply_rope(q, *rope), _apply_rope(k, *rope)
        if self.config.checkpointing == "selective" and torch.is_grad_enabled():
            # Korthikanti et al.'s selective recomputation: keep q, k, v, recompute attention in backward
            out = checkpoint(self.core, q, k, v, use_reentrant=False, preserve_rng_state=False)
        else:
            out = self.core(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU (``down(silu(gate(x)) * up(x))``, Shazeer 2020) or GELU (``down(gelu(up(x)))``)."""

    def __init__(self, config: TransformerConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.kind = check_config(config).mlp
        d, f = config.d_model, config.d_ff
        if self.kind == "swiglu":
            self.gate_proj = nn.Linear(d, f, bias=False, device=device)
        self.up_proj = nn.Linear(d, f, bias=False, device=device)
        self.down_proj = nn.Linear(f, d, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    """One pre-norm decoder block: ``x + attn(attn_norm(x))``, then ``h + mlp(mlp_norm(h))``."""

    def __init__(self, config: TransformerConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        check_config(config)
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps, device=device)
        self.attn = Attention(config, device=device)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps, device=device)
        self.mlp = MLP(config, device=device)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), rope)
        return h + self.mlp(self.mlp_norm(h))


def _assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """``param.copy_(value)``; for a ``DTensor`` parameter, its local piece of ``value`` (sliced on this rank)."""
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(param, DTensor):
            mesh = param.device_mesh
            value = distribute_tensor(value.to(mesh.device_type), mesh, param.placements, src_data_rank=None)
    param.copy_(value)


class Transformer(nn.Module):
    """A decoder-only language model: ``embed -> layers -> norm -> head``; ``forward(ids)`` returns logits.

    ``seed`` makes the initialization deterministic (normal, std 0.02; the projections back into the
    residual stream, ``o_proj`` and ``down_proj``, scaled by ``1/sqrt(2 n_layers)`` as in GPT-2; norm
    scales 1). ``device="meta"`` allocates nothing (for counting and planning).

    >>> model = Transformer(PRESETS["nano"], seed=0)
    >>> ids = torch.randint(0, 64, (2, 16))
    >>> tuple(model(ids).shape), sum(p.numel() for p in model.parameters()) == param_count(model.config)
    ((2, 16, 64), True)
    """

    def __init__(self, config: TransformerConfig, *, seed: int = 0, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = check_config(config)
        check_int("seed", seed, minimum=0)
        self.embed = nn.Embedding(config.vocab_size, config.d_model, device=device)
        if config.positions == "learned":
            self.pos_embed = nn.Embedding(config.max_seq_len, config.d_model, device=device)
        self.layers = nn.ModuleList(Block(config, device=device) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps, device=device)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False, device=device)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        if config.positions == "rope":
            cos, sin = _rope_tables(config, device)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Re-initialize every parameter (and the rotary tables) from ``seed``; nothing to do on the meta device.

        A model built on ``meta`` and moved with ``to_empty(device=...)`` holds uninitialized memory:
        call this next. The values come from a CPU generator, so they are the same on every device.
        A parameter that is a ``DTensor`` (sharded by FSDP2's ``fully_shard``, or split by tensor
        parallelism) gets this rank's piece of the same draw: the full value of one parameter at a
        time is drawn on every rank and sliced locally (``distribute_tensor(..., src_data_rank=None)``,
        no communication), so a sharded model starts exactly where ``Transformer(config, seed=seed)`` does.
        """
        check_int("seed", seed, minimum=0)
        if self.embed.weight.device.type == "meta":
            return
        if self.config.tie_embeddings and self.head.weight is not self.embed.weight:
            self.head.weight = self.embed.weight  # to_empty() allocates the two names separately: tie them again
        if self.config.positions == "rope":
            table_cos, table_sin = self.get_buffer("rope_cos"), self.get_buffer("rope_sin")
            cos, sin = _rope_tables(self.config, table_cos.device)
            table_cos.copy_(cos)
            table_sin.copy_(sin)
        g = torch.Generator(device="cpu").manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():  # a tied head is visited once, as embed.weight
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            _assign(p, torch.randn(p.shape, generator=g, dtype=torch.float32) * std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2:
            raise TypeError("ids must be an int64 tensor of shape (batch, seq)")
        s = ids.shape[1]
        if s > self.config.max_seq_len:
            raise ValueError(f"sequence length {s} exceeds max_seq_len {self.config.max_seq_len}")
        x = self.embed(ids)
        rope = None
        if self.config.positions == "learned":
            x = x + self.pos_embed(torch.arange(s, device=ids.device))
        else:
            rope = (self.rope_cos, self.rope_sin)
        for layer in self.layers:
            if self.config.checkpointing == "full" and torch.is_grad_enabled():
                x = checkpoint(layer, x, rope, use_reentrant=False, preserve_rng_state=False)
            else:
                x = layer(x, rope)
        return self.head(self.norm(x))

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats, computed in float32 (float64 for a float64 model)."""
        logits = self(ids)
        if not isinstance(targets, torch.Tensor) or targets.shape != ids.shape:
            raise ValueError("targets must be a tensor of the same shape as ids")
        logits = logits if logits.dtype == torch.float64 else logits.float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


@torch.no_grad()
def generate(
    model: Transformer,
    prompt: torch.Tensor,
    new_tokens: int,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``prompt`` (1-D int64 ids) followed by ``new_tokens`` sampled tokens (``temperature=0``: greedy).

    Runs the whole window each step (no key/value cache), keeping the last ``max_seq_len`` tokens.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a course_lib.transformer.Transformer, got {type(model).__name__}")
    if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.int64 or prompt.dim() != 1 or not len(prompt):
        raise TypeError("prompt must be a non-empty 1-D int64 tensor of token ids")
    check_int("new_tokens", new_tokens, minimum=0)
    temperature = check_number("temperature", temperature, finite=True)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    was_training = model.training
    model.eval()
    ids = prompt.clone()
    for _ in range(new_tokens):
        logits = model(ids[-model.config.max_seq_len :].unsqueeze(0))[0, -1].float()
        if temperature == 0:
            nxt = logits.argmax().reshape(1)
        else:  # inverse CDF: one uniform draw per token, the same sample on every CPU (torch.multinomial's may differ)
            cdf = torch.softmax(logits / temperature, dim=-1).cumsum(0)
            u = torch.rand(1, generator=generator, dtype=cdf.dtype, device=cdf.device) * cdf[-1]
            nxt = torch.searchsorted(cdf, u).clamp_(max=len(cdf) - 1)
        ids = torch.cat((ids, nxt.to(ids.dtype)))
    model.train(was_training)
    return ids


# ---------------------------------------------------------------------------------------------
# The formulas
# ---------------------------------------------------------------------------------------------
