"""The memory model of sharded data parallelism: bytes per rank for DDP and ZeRO stages 1, 2 and 3.

Rajbhandari et al. (2020, "ZeRO", arXiv:1910.02054) count what data-parallel training keeps per
parameter: the parameters (``P`` bytes each), their gradients (``G``) and the optimizer's state
(``K``). Mixed-precision Adam keeps fp16/bf16 parameters and gradients (``P = G = 2``) and, in fp32,
a master copy of the weights plus Adam's ``m`` and ``v`` (``K = 12``): 16 bytes per parameter. Plain
fp32 Adam keeps ``P = G = 4`` and ``K = 8`` (``m`` and ``v``): 16 bytes too. Each rank of
plain data parallelism (DDP) holds all of it; ZeRO shards it over the ``N`` data-parallel ranks:

============  ==========================  ========================
stage         what is sharded             bytes per rank
============  ==========================  ========================
DDP           nothing                     ``(P + G + K) Ψ``
ZeRO-1        optimizer state             ``(P + G) Ψ + K Ψ / N``
ZeRO-2        + gradients                 ``P Ψ + (G + K) Ψ / N``
ZeRO-3/FSDP   + parameters                ``(P + G + K) Ψ / N``
============  ==========================  ========================

A shard is ``ceil(Ψ / N)`` elements (the flat buffer is padded so every rank owns the same length),
which is what :func:`model_state_bytes` counts. Activations are not sharded by any stage: each rank
keeps those of its own micro-batch. For the course's transformer (:mod:`course_lib.transformer`,
notebook 16) :func:`transformer_activation_bytes` counts them with the formula notebook 16 checks to
the byte against ``SavedTensorMeter``; :func:`rank_memory` uses it when given the model's
configuration. For any other stack of layers, :func:`activation_bytes` takes the bytes of one layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .transformer import TransformerConfig, block_saved_bytes, model_saved_bytes
from .validation import check_bool, check_int, check_items

__all__ = [
    "PRECISIONS",
    "STAGES",
    "StateBytes",
    "Precision",
    "activation_bytes",
    "bytes_per_parameter",
    "model_state_bytes",
    "rank_memory",
    "transformer_activation_bytes",
    "zero_table",
]


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each part of the model state: parameters, gradients, optimizer state."""

    parameter: int
    gradient: int
    optimizer: int

    def __post_init__(self) -> None:
        for name in ("parameter", "gradient", "optimizer"):
            check_int(name, getattr(self, name), minimum=0, what="bytes per parameter (an int >= 0)")

    @property
    def total(self) -> int:
        return self.parameter + self.gradient + self.optimizer


PRECISIONS: dict[str, Precision] = {
    "mixed_adam": Precision(2, 2, 12),  # bf16/fp16 params and grads; fp32 master, m, v
    "fp32_adam": Precision(4, 4, 8),  # fp32 params and grads; m, v
    "fp32_sgd_momentum": Precision(4, 4, 4),  # one momentum buffer
    "fp32_sgd": Precision(4, 4, 0),  # no state
}
STAGES: tuple[str, ...] = ("ddp", "zero1", "zero2", "zero3")
_SHARDED = {"ddp": (False, False, False), "zero1": (False, False, True), "zero2": (False, True, True)}
_SHARDED["zero3"] = (True, True, True)


@dataclass(frozen=True)
class StateBytes:
    """Bytes of model state held between steps: parameters, their gradients, the optimizer's state.

    One type for the modelled bytes (:func:`model_state_bytes`, what one rank holds) and the measured
    ones (:func:`course_lib.memory.state_bytes`, counted from the tensors), so the two compare field by field.
    """

    parameters: int
    gradients: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state


def _check_stage(stage: object) -> str:
    if not isinstance(stage, str):
        raise TypeError(f"stage must be a string, one of {', '.join(STAGES)}; got {type(stage).__name__}")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    return stage


def _check_precision(precision: object) -> Precision:
    if isinstance(precision, Precision):
        return precision
    if not isinstance(precision, str):
        raise TypeError(
            f"precision must be a Precision or one of {', '.join(PRECISIONS)}; got {type(precision).__name__}"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def model_state_bytes(
    num_params: int, world_size: int, stage: str, precision: str | Precision = "mixed_adam"
) -> StateBytes:
    """Bytes of parameters, gradients and optimizer state that ONE rank holds.

    >>> model_state_bytes(1_000_000, 4, "ddp").total        # 16 bytes per parameter, everywhere
    16000000
    >>> model_state_bytes(1_000_000, 4, "zero1")           # Adam's 12 bytes split over 4 ranks
    StateBytes(parameters=2000000, gradients=2000000, optimizer_state=3000000)
    >>> model_state_bytes(10, 4, "zero3", "fp32_adam")     # shards of ceil(10 / 4) = 3 elements
    StateBytes(parameters=12, gradients=12, optimizer_state=24)
    """
    num_params = check_int("num_params", num_params, minimum=0)
    world_size = check_int("world_size", world_size, minimum=1)
    stage = _check_stage(stage)
    prec = _check_precision(precision)
    shard = math.ceil(num_params / world_size)
    p_sharded, g_sharded, k_sharded = _SHARDED[stage]
    return StateBytes(
        parameters=prec.parameter * (shard if p_sharded else num_params),
        gradients=prec.gradient * (shard if g_sharded else num_params),
        optimizer_state=prec.optimizer * (shard if k_sharded else num_params),
    )


def bytes_per_parameter(world_size: int, stage: str, precision: str | Precision = "mixed_adam") -> float:
    """Bytes per parameter on one rank, in the limit of many parameters (no padding).

    >>> [bytes_per_parameter(8, s) for s in STAGES]
    [16.0, 5.5, 3.75, 2.0]
    """
    world_size = check_int("world_size", world_size, minimum=1)
    prec = _check_precision(precision)
    p_sharded, g_sharded, k_sharded = _SHARDED[_check_stage(stage)]
    n = float(world_size)
    return (
        prec.parameter / (n if p_sharded else 1.0)
        + prec.gradient / (n if g_sharded else 1.0)
        + prec.optimizer / (n if k_sharded else 1.0)
    )


def activation_bytes(micro_batch: int, bytes_per_sample_per_layer: int, layers: int, *, checkpointing: bool) -> int:
    """Activation bytes one rank keeps for backward: ``b · a · L``, or with checkpointing in
    ``k = ceil(sqrt(L))`` segments notebook 04's count ``b · a · (k - 1 + ceil(L / k))`` (the inputs of
    the ``k - 1`` checkpointed segments, plus one segment's activations, the last one's in forward or a
    recomputed one's in backward). Sharding does not reduce it; a smaller micro-batch does.

    >>> activation_bytes(8, 1024, 16, checkpointing=False), activation_bytes(8, 1024, 16, checkpointing=True)
    (131072, 57344)
    """
    micro_batch = check_int("micro_batch", micro_batch, minimum=0)
    per = check_int("bytes_per_sample_per_layer", bytes_per_sample_per_layer, minimum=0)
    layers = check_int("layers", layers, minimum=1)
    if not check_bool("checkpointing", checkpointing):
        return micro_batch * per * layers
    k = math.ceil(math.sqrt(layers))
    return micro_batch * per * (k - 1 + math.ceil(layers / k))


def transformer_activation_bytes(
    config: TransformerConfig,
    seq_len: int,
    micro_batch: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    checkpointing: bool = False,
) -> int:
    """Activation bytes one rank needs for a micro-batch of the course's transformer (notebook 16's formula).

    Without checkpointing: everything the model keeps for backward,
    :func:`course_lib.transformer.model_saved_bytes` (its blocks, embedding, head and loss), with the
    attention the config names (SDPA for the presets). With checkpointing of every block: each block
    keeps only its input, and in backward one block at a time is recomputed, so one block's full
    activations come on top (``checkpointing="full"`` plus one :func:`~course_lib.transformer.block_saved_bytes`).

    >>> from course_lib.transformer import PRESETS
    >>> round(transformer_activation_bytes(PRESETS["llama2-7b"], 2048, 1) / 1e9, 2)
    10.37
    >>> round(transformer_activation_bytes(PRESETS["llama2-7b"], 2048, 1, checkpointing=True) / 1e9, 2)
    1.15
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a course_lib.transformer.TransformerConfig, got {type(config).__name__}")
    micro_batch = check_int("micro_batch", micro_batch, minimum=0)
    if micro_batch == 0:
        check_int("seq_len", seq_len, minimum=1)
        return 0
    if not check_bool("checkpointing", checkpointing):
        return model_saved_bytes(config, seq_len, batch=micro_batch, dtype=dtype, checkpointing="none")
    kept = model_saved_bytes(config, seq_len, batch=micro_batch, dtype=dtype, checkpointing="full")
    return kept + block_saved_bytes(config, seq_len, batch=micro_batch, dtype=dtype, checkpointing="none")


def _activation_dtype(prec: Precision) -> torch.dtype:
    """The dtype activations are kept in: 16-bit when the parameters are, float32 when they are 4 bytes."""
    if prec.parameter == 2:
        return torch.bfloat16
    if prec.parameter == 4:
        return torch.float32
    raise ValueError(f"a transformer's activations need 2- or 4-byte parameters, got {prec.parameter}")


def rank_memory(
    num_params: int,
    world_size: int,
    stage: str,
    precision: str | Precision = "mixed_adam",
    *,
    micro_batch: int = 0,
    bytes_per_sample_per_layer: int = 0,
    layers: int = 1,
    checkpointing: bool = False,
    model: TransformerConfig | None = None,
    seq_len: int | None = None,
) -> dict[str, int]:
    """Model state and activations of one rank, and their sum (what the calculator shows).

    Activations: for the course's transformer pass ``model`` (its configuration) and ``seq_len``;
    :func:`transformer_activation_bytes` counts them, in bf16 for 2-byte parameters and float32 for
    4-byte ones. For another layer stack pass ``bytes_per_sample_per_layer`` and ``layers``
    (:func:`activation_bytes`).

    >>> rank_memory(1000, 2, "zero2", "fp32_adam", micro_batch=4, bytes_per_sample_per_layer=100, layers=4)
    {'parameters': 4000, 'gradients': 2000, 'optimizer': 4000, 'activations': 1600, 'total': 11600}
    >>> from course_lib.transformer import PRESETS
    >>> r = rank_memory(6_738_415_616, 8, "zero3", micro_batch=1, model=PRESETS["llama2-7b"], seq_len=2048)
    >>> {k: round(v / 1e9, 1) for k, v in r.items()}
    {'parameters': 1.7, 'gradients': 1.7, 'optimizer': 10.1, 'activations': 10.4, 'total': 23.8}
    """
    state = model_state_bytes(num_params, world_size, stage, precision)
    if model is not None:
        if bytes_per_sample_per_layer:
            raise ValueError("give either model (and seq_len) or bytes_per_sample_per_layer, not both")
        if seq_len is None:
            raise ValueError("model needs seq_len, the length of each sequence of the micro-batch")
        dtype = _activation_dtype(_check_precision(precision))
        acts = transformer_activation_bytes(model, seq_len, micro_batch, dtype=dtype, checkpointing=checkpointing)
    else:
        if seq_len is not None:
            raise ValueError("seq_len is used with model only")
        acts = activation_bytes(micro_batch, bytes_per_sample_per_layer, layers, checkpointing=checkpointing)
    return {
        "parameters": state.parameters,
        "gradients": state.gradients,
        "optimizer": state.optimizer_state,
        "activations": acts,
        "total": state.total + acts,
    }


def zero_table(world_sizes: Sequence[int] = (1, 2, 4, 8, 64), precision: str | Precision = "mixed_adam") -> str:
    """Bytes per parameter on one rank, one row per stage, one column per world size.

    >>> print(zero_table((1, 8)))
    bytes/param    N=1    N=8
    ddp             16     16
    zero1           16    5.5
    zero2           16   3.75
    zero3           16      2
    """
    sizes = check_items("world_sizes", world_sizes, int, "a non-empty sequence of ints", minimum=1)
    if not sizes:
        raise ValueError(f"world_sizes must be a non-empty sequence of ints >= 1, got {world_sizes!r}")
    lines = ["bytes/param" + "".join(f"{'N=' + str(n):>7}" for n in sizes)]
    for stage in STAGES:
        lines.append(f"{stage:<11}" + "".join(f"{bytes_per_parameter(n, stage, precision):>7.4g}" for n in sizes))
    return "\n".join(lines)
