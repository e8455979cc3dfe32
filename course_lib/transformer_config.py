"""The course transformer's configuration: :class:`TransformerConfig` and the :data:`PRESETS`.

A frozen dataclass of the choices that size a Llama-style decoder (vocabulary, width, depth, heads, key/value heads,
MLP width, context length, tied head, MLP kind, position kind, attention implementation, checkpointing), validated
when it is built. :data:`PRESETS` holds tiny configurations for the CPU and published ones for the arithmetic. The
model is :mod:`course_lib.transformer`; what a configuration costs is :mod:`course_lib.transformer_counts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .validation import check_bool, check_int, check_number

__all__ = [
    "ATTENTIONS",
    "CHECKPOINTINGS",
    "MLPS",
    "POSITIONS",
    "PRESETS",
    "TransformerConfig",
    "check_choice",
    "check_config",
]

AttentionKind = Literal["sdpa", "naive"]
MLPKind = Literal["swiglu", "gelu"]
PositionKind = Literal["rope", "learned"]
CheckpointKind = Literal["none", "full", "selective"]
ATTENTIONS: tuple[str, ...] = ("sdpa", "naive")
MLPS: tuple[str, ...] = ("swiglu", "gelu")
POSITIONS: tuple[str, ...] = ("rope", "learned")
CHECKPOINTINGS: tuple[str, ...] = ("none", "full", "selective")


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
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
        check_choice("mlp", self.mlp, MLPS)
        check_choice("positions", self.positions, POSITIONS)
        check_choice("attention", self.attention, ATTENTIONS)
        check_choice("checkpointing", self.checkpointing, CHECKPOINTINGS)
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
    # Trained in notebook 16 on 2 CPU cores (bytes of Python's documentation): a few hundred steps in seconds.
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


def check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    return config


# ---------------------------------------------------------------------------------------------
# The modules
# ---------------------------------------------------------------------------------------------
