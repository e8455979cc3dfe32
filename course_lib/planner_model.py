"""The planner's model of one layout: memory per rank and time per step (:func:`predict`), put together from the
course's formulas. The layouts and the search are :mod:`course_lib.planner`, which re-exports what is here.
"""

from __future__ import annotations

import dataclasses

import torch

from .comm_model import AlphaBeta, predict_all_reduce
from .context_parallel import ring_attention_bytes
from .pipeline import bubble_fraction
from .planner_layout import Cluster, Layout, Prediction, check_config, check_layout, check_precision
from .sharding import Precision, model_state_bytes
from .tensor_parallel_bytes import tp_bytes_per_step, tp_saved_bytes
from .transformer import TransformerConfig, model_saved_terms, param_counts, training_flops_per_token
from .validation import check_int

__all__ = ["predict", "shard_params"]


def shard_params(config: TransformerConfig, tensor: int = 1, pipeline: int = 1) -> int:
    """Parameters one rank holds under tensor and pipeline parallelism (the most loaded stage: the first).

    Tensor parallelism (:func:`course_lib.tensor_parallel.parallelize_transformer_`) splits attention, the
    MLP, the embedding and the head by ``tensor``; the norms stay whole. A pipeline stage holds
    ``n_layers / pipeline`` blocks; the first holds the embedding, the last the final norm and the head:
    this counts the larger of the two ends.

    >>> from course_lib.transformer import PRESETS, param_count
    >>> shard_params(PRESETS["tiny"]) == param_count(PRESETS["tiny"])
    True
    """
    c = check_config(config)
    tensor = check_int("tensor", tensor, minimum=1)
    pipeline = check_int("pipeline", pipeline, minimum=1)
    parts = param_counts(c)
    L = c.n_layers
    per_layer = (parts["attention"] + parts["mlp"]) // L // tensor + 2 * c.d_model
    first = parts["embedding"] // tensor + parts["positions"]
    last = parts["head"] // tensor + c.d_model
    ends = first + last if pipeline == 1 else max(first, last)
    return per_layer * (L // pipeline) + ends


def _ring(link: AlphaBeta, nbytes: float, n: int) -> float:
    """Seconds of one ring all-reduce of ``nbytes`` over ``n`` ranks (reduce-scatter + all-gather: the same)."""
    return predict_all_reduce(link, nbytes, n) if n > 1 else 0.0


def _link(cluster: Cluster, span: int) -> AlphaBeta:
    return cluster.intra if span <= cluster.devices_per_node else cluster.inter


def predict(
    config: TransformerConfig,
    cluster: Cluster,
    layout: Layout,
    *,
    seq_len: int,
    global_batch: int,
    precision: str | Precision = "mixed_adam",
    sequence_parallel: bool = False,
    float8_all_gather: bool = False,
    async_tensor_parallel: bool = False,
) -> Prediction:
    """Memory per rank and time per step of ``layout`` (see the module's docstring for what is counted).

    ``precision`` is :mod:`course_lib.sharding`'s: ``"mixed_adam"`` keeps bf16 activations, the
    ``fp32_*`` ones float32 activations. ``float8_all_gather`` (ZeRO-3 only: FSDP2 with torchao's float8
    training) all-gathers the blocks' linear weights as one byte each (the embedding, the head and the norms keep
    their bytes); the reduce-scatters keep the gradient's bytes.
    ``async_tensor_parallel`` (micro-pipelined TP) splits each tensor-parallel collective into ``tensor``
    chunks that overlap the matrix products: only the first chunk, and what the compute cannot cover, stays exposed.

    >>> from course_lib.transformer import PRESETS
    >>> from course_lib.comm_model import AlphaBeta
    >>> cpu = Cluster(4, 2**30, 1e10, AlphaBeta(1e-4, 1e9), AlphaBeta(1e-4, 1e9))
    >>> lay = Layout(data=4, micro_batch=2)
    >>> p = predict(PRESETS["tiny"], cpu, lay, seq_len=64, global_batch=8, precision="fp32_adam")
    >>> p.memory["parameters"], p.memory["optimizer state"]
    (462080, 924160)
    """
    c = check_config(config)
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    seq_len = check_int("seq_len", seq_len, minimum=1)
    global_batch = check_int("global_batch", global_batch, minimum=1)
    prec = check_precision(precision)
    check_layout(c, layout, seq_len, global_batch)
    for name, flag in (("float8_all_gather", float8_all_gather), ("async_tensor_parallel", async_tensor_parallel)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    if float8_all_gather and layout.zero != 3:
        raise ValueError(f"float8_all_gather applies to ZeRO-3 (FSDP2), not to ZeRO-{layout.zero}")
    if layout.devices > cluster.devices:
        raise ValueError(f"the layout needs {layout.devices} devices, the cluster has {cluster.devices}")
    memory = _memory(c, layout, seq_len, prec, sequence_parallel)
    time = _time(
        c, cluster, layout, seq_len, global_batch, prec, sequence_parallel, float8_all_gather, async_tensor_parallel
    )
    step = sum(time.values())
    tps = global_batch * seq_len / step
    fpt = training_flops_per_token(c, seq_len, causal=True)
    return Prediction(layout, memory, time, tps, tps * fpt / (cluster.peak_flops * layout.devices))


def _memory(
    c: TransformerConfig, layout: Layout, seq_len: int, prec: Precision, sequence_parallel: bool
) -> dict[str, int]:
    """Bytes per rank: model state, the activations in flight, and checkpointing's recompute buffer."""
    T, P, C, D = layout.tensor, layout.pipeline, layout.context, layout.data
    dtype = torch.bfloat16 if prec.parameter == 2 else torch.float32
    # memory: model state
    n_params = shard_params(c, T, P)
    state = model_state_bytes(n_params, D, layout.stage, prec)
    # memory: activations of one micro-batch on the first stage, times the micro-batches in flight (1F1B)
    local_seq = seq_len // C
    ckpt_config = dataclasses.replace(c, checkpointing=layout.checkpointing)
    block = sum(
        tp_saved_bytes(
            ckpt_config, local_seq, T, batch=layout.micro_batch, dtype=dtype, sequence_parallel=sequence_parallel
        ).values()
    )
    outside = model_saved_terms(c, local_seq, batch=layout.micro_batch, dtype=dtype, checkpointing=layout.checkpointing)
    outside.pop("blocks")
    outside["loss: log-probabilities"] //= T  # vocabulary-parallel head: each rank its columns
    in_flight = min(P, layout.accumulation)
    activations = in_flight * block * (c.n_layers // P) + sum(outside.values())
    recompute = 0
    if layout.checkpointing == "full":  # backward recomputes one block at a time: its activations, once
        full = dataclasses.replace(c, checkpointing="none")
        recompute = sum(
            tp_saved_bytes(
                full, local_seq, T, batch=layout.micro_batch, dtype=dtype, sequence_parallel=sequence_parallel
            ).values()
        )
    memory = {
        "parameters": state.parameters,
        "gradients": state.gradients,
        "optimizer state": state.optimizer_state,
        "activations": activations,
        "recompute buffer": recompute,
    }
    return memory


def _time(
    c: TransformerConfig,
    cluster: Cluster,
    layout: Layout,
    seq_len: int,
    global_batch: int,
    prec: Precision,
    sequence_parallel: bool,
    float8_all_gather: bool = False,
    async_tensor_parallel: bool = False,
) -> dict[str, float]:
    """Seconds per step: compute, the pipeline bubble, and the communication on the critical path."""
    T, P, C, D = layout.tensor, layout.pipeline, layout.context, layout.data
    p_bytes = prec.parameter
    n_params = shard_params(c, T, P)
    local_seq = seq_len // C
    # time: compute
    tokens = global_batch * seq_len
    fpt = training_flops_per_token(c, seq_len, causal=True)
    extra = 0.0
    if layout.checkpointing == "full":  # one more forward: a third of the training FLOPs
        extra = fpt / 3
    elif layout.checkpointing == "selective":  # attention proper forward again: 4 h s per token and layer, causal half
        extra = 2 * c.n_layers * c.d_model * seq_len
    flops = (fpt + extra) * tokens / layout.devices
    compute = flops / (cluster.peak_flops * cluster.efficiency)
    bubble = compute * bubble_fraction(P, layout.accumulation) / (1 - bubble_fraction(P, layout.accumulation))
    # time: communication
    tp_link, cp_link = _link(cluster, T), _link(cluster, T * C)
    pp_link, dp_link = _link(cluster, T * C * P), _link(cluster, layout.devices)
    micro_tokens = layout.micro_batch * local_seq
    tp_time = 0.0
    if T > 1:
        parts = tp_bytes_per_step(c, micro_tokens, T, bytes_per_element=p_bytes, sequence_parallel=sequence_parallel)
        calls = 4 * c.n_layers // P + 2 + 3
        steps = 2 * (T - 1) * calls
        tp_time = layout.accumulation * (steps * tp_link.alpha + sum(parts.values()) / P / tp_link.beta)
        if async_tensor_parallel:  # the first of T chunks waits; the rest run under the matrix products
            tp_time = tp_time / T + max(0.0, tp_time * (T - 1) / T - compute)
    cp_time = 0.0
    if C > 1:
        per_layer = ring_attention_bytes(
            layout.micro_batch, c.kv_heads, seq_len, c.head_dim, C, bytes_per_element=p_bytes
        )
        cp_time = layout.accumulation * (c.n_layers // P) * (4 * C * cp_link.alpha + per_layer / cp_link.beta)
    pp_time = 0.0
    if P > 1:  # each micro-batch: one activation forward and one gradient backward per stage boundary
        msg = micro_tokens * c.d_model * p_bytes / T
        pp_time = 2 * (layout.accumulation + P - 1) * pp_link.time(msg)
    # data parallel: one all-reduce per step (ZeRO-0/1: gradients accumulate locally under no_sync);
    # ZeRO-2 reduce-scatters every micro-batch's gradients (they are sharded) and all-gathers the
    # parameters once; ZeRO-3 all-gathers the parameters for each micro-batch's forward and backward
    # and reduce-scatters its gradients. A reduce-scatter or an all-gather is half a ring all-reduce.
    all_reduce = _ring(dp_link, n_params * prec.gradient, D)
    half = all_reduce / 2
    m = layout.accumulation
    gather = half
    if float8_all_gather:  # torchao casts the blocks' linear weights to float8; the rest is gathered as before
        parts = param_counts(c)
        linear = (parts["attention"] + parts["mlp"]) // c.n_layers // T * (c.n_layers // P)
        gather = _ring(dp_link, linear * 1 + (n_params - linear) * prec.gradient, D) / 2
    dp_time = {0: all_reduce, 1: all_reduce, 2: m * half + half, 3: m * (2 * gather + half)}[layout.zero]
    # hidden: ZeRO-3's gathers prefetch during forward and backward; the others' overlap the backward (2/3)
    overlap = compute if layout.zero == 3 else compute * 2 / 3
    exposed_dp = max(0.0, dp_time - overlap)
    time = {
        "compute": compute,
        "pipeline bubble": bubble,
        "tensor-parallel collectives": tp_time,
        "context-parallel ring": cp_time,
        "pipeline sends": pp_time,
        "data-parallel (not hidden)": exposed_dp,
    }
    return time
