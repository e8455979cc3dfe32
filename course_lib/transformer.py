"""The course's transformer: a small Llama-style decoder, and the formulas that size it.

Notebook 14 builds it and measures it; notebooks 15 (tensor, sequence, context and expert
parallelism), 16 (FSDP2 per block, ``torch.compile``) and 17 (the layout planner) reuse it. So the
layout follows the conventions that PyTorch's parallelism APIs address by name:

* :class:`TransformerConfig` is a frozen dataclass (vocabulary, width, depth, heads, key/value
  heads, MLP width, context length, tied head, MLP kind, position kind, attention implementation,
  checkpointing); :data:`PRESETS` holds tiny configurations for the CPU and two published models
  for the arithmetic.
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

The formulas are functions of a configuration: :func:`param_count` (and its parts,
:func:`param_counts`), :func:`matmul_params` (the ``N`` of ``6N``), :func:`block_saved_bytes` (what
one block keeps for backward: naive or SDPA attention, no, full or selective checkpointing, any
dtype; term by term in :func:`block_saved_terms`), :func:`model_saved_bytes` (the whole model with
its embedding, head and loss), :func:`training_flops_per_token` (``6N`` plus the attention term)
and :func:`mfu`. Notebook 14 checks each against ``sum(p.numel())``, ``SavedTensorMeter`` (to the
byte) and ``FlopCounterMode`` (to the FLOP); :mod:`course_lib.sharding` uses the memory formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .validation import check_bool, check_int, check_number

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

AttentionKind = Literal["sdpa", "naive"]
MLPKind = Literal["swiglu", "gelu"]
PositionKind = Literal["rope", "learned"]
CheckpointKind = Literal["none", "full", "selective"]
ATTENTIONS: tuple[str, ...] = ("sdpa", "naive")
MLPS: tuple[str, ...] = ("swiglu", "gelu")
POSITIONS: tuple[str, ...] = ("rope", "learned")
CHECKPOINTINGS: tuple[str, ...] = ("none", "full", "selective")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, one of {', '.join(allowed)}; got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a decoder-only transformer, and how it runs attention and checkpointing.

    ``n_kv_heads`` (grouped-query attention) defaults to ``n_heads`` (plain multi-head attention);
    ``d_model`` must divide into ``n_heads`` heads, and ``n_heads`` into ``n_kv_heads`` groups.
    ``attention`` and ``checkpointing`` change how the model runs, not its parameters:
    ``dataclasses.replace(config, attention="naive")`` gives the same model with hand-written attention.

    >>> c = TransformerConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=172, max_seq_len=128)
    >>> c.head_dim, c.kv_heads
    (16, 4)
    >>> TransformerConfig(d_model=64, n_heads=5)
    Traceback (most recent call last):
        ...
    ValueError: d_model (64) must be a multiple of n_heads (5)
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    d_ff: int = 172
    max_seq_len: int = 128
    tie_embeddings: bool = True
    mlp: MLPKind = "swiglu"
    positions: PositionKind = "rope"
    attention: AttentionKind = "sdpa"
    checkpointing: CheckpointKind = "none"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            check_int(name, getattr(self, name), minimum=1)
        if self.n_kv_heads is not None:
            check_int("n_kv_heads", self.n_kv_heads, minimum=1, what="an int or None")
        check_bool("tie_embeddings", self.tie_embeddings)
        _check_choice("mlp", self.mlp, MLPS)
        _check_choice("positions", self.positions, POSITIONS)
        _check_choice("attention", self.attention, ATTENTIONS)
        _check_choice("checkpointing", self.checkpointing, CHECKPOINTINGS)
        for name in ("norm_eps", "rope_theta"):
            value = check_number(name, getattr(self, name), finite=True)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        """Width of one head, ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (``n_kv_heads``, or ``n_heads`` when that is None)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def describe(self) -> str:
        """The configuration in one line, for printing."""
        kv = "" if self.kv_heads == self.n_heads else f", {self.kv_heads} kv heads"
        return (
            f"vocab {self.vocab_size}, d_model {self.d_model}, {self.n_layers} layers, {self.n_heads} heads{kv}"
            f" (head_dim {self.head_dim}), d_ff {self.d_ff}, context {self.max_seq_len}, {self.mlp} MLP,"
            f" {self.positions} positions, {'tied' if self.tie_embeddings else 'untied'} head,"
            f" {self.attention} attention, checkpointing {self.checkpointing}"
        )


PRESETS: dict[str, TransformerConfig] = {
    # Trained in notebook 14 on 2 CPU cores (bytes of Python's documentation): a few hundred steps in seconds.
    "tiny": TransformerConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=172, max_seq_len=128),
    # For measurements and tests: every formula checked on it in well under a second.
    "nano": TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64),
    # Published models, for the arithmetic only (build them with device="meta").
    # Llama 2 7B (Touvron et al., 2023): 32 layers, 4096 wide, 32 heads, SwiGLU 11008, 4096 context.
    "llama2-7b": TransformerConfig(
        vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008, max_seq_len=4096, tie_embeddings=False
    ),
    # Llama 3 8B (Llama Team, 2024): grouped-query attention with 8 kv heads, SwiGLU 14336, 8192 context.
    "llama3-8b": TransformerConfig(
        vocab_size=128256,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        d_ff=14336,
        max_seq_len=8192,
        tie_embeddings=False,
        rope_theta=500000.0,
    ),
}


def _check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    return config


# ---------------------------------------------------------------------------------------------
# The modules
# ---------------------------------------------------------------------------------------------


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
        self.config = _check_config(config)
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
        self.kind = _check_config(config).mlp
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
        _check_config(config)
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
        self.config = _check_config(config)
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


def param_counts(config: TransformerConfig) -> dict[str, int]:
    """Parameters by part: ``embedding``, ``positions``, ``attention``, ``mlp``, ``norms``, ``head``.

    ``attention`` and ``mlp`` are summed over the layers; ``norms`` counts the two per block and the
    final one; ``head`` is 0 when it is tied (it is the embedding).

    >>> param_counts(PRESETS["llama2-7b"])["attention"] == 32 * 4 * 4096 * 4096
    True
    """
    c = _check_config(config)
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
    c = _check_config(config)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    batch = check_int("batch", batch, minimum=1)
    p, st = _dtype_bytes(dtype)
    attn = c.attention if attention is None else _check_choice("attention", attention, ATTENTIONS)
    ckpt = c.checkpointing if checkpointing is None else _check_choice("checkpointing", checkpointing, CHECKPOINTINGS)
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
    c = _check_config(config)
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
    c = _check_config(config)
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
