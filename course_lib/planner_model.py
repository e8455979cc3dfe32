"""The planner's model of one layout: memory per rank and time per step (:func:`predict`), put together from the
course's formulas. The layouts and the search are :mod:`course_lib.planner`, which re-exports what is here.

Time, per pipeline stage (:func:`stage_seconds`): the stage's matrix products, the embedding on the first stage and
the head on the last; a synchronous pipeline runs at its slowest stage, so a step is the slowest stage's
micro-batch time x ``(micro-batches + (p - 1) / v)``, ``v`` the interleave. With a
:class:`~course_lib.planner_layout.MatmulEfficiency` on the cluster each product runs at a size-dependent fraction
of the peak and every micro-batch pays a fixed cost on every stage; without one the model is idealized.
The data-parallel reduction overlaps what it can: ZeRO-0/1's all-reduce only the last micro-batch's backward
(accumulation holds it back until then), ZeRO-2's reduce-scatters each micro-batch's backward, ZeRO-3's gathers
and reduce-scatters each micro-batch's forward and backward; ZeRO-1/2 gather the updated parameters under the next
step's first forward. Context-parallel ranks hold replicas of the weights: gradients are reduced, and ZeRO
shards, over data x context ranks.
"""

from __future__ import annotations

import dataclasses

import torch

from .comm_model import AlphaBeta
from .context_parallel import ring_attention_bytes
from .planner_layout import (
    Cluster,
    Layout,
    Prediction,
    check_config,
    check_layout,
    check_precision,
)
from .sharding import Precision, model_state_bytes
from .tensor_parallel_bytes import tp_bytes_per_step, tp_saved_bytes
from .transformer import TransformerConfig, model_saved_terms, param_counts, training_flops_per_token
from .validation import check_int

__all__ = ["predict", "shard_params", "stage_seconds"]


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
    """Seconds of one ring all-reduce of ``nbytes`` over ``n`` ranks (reduce-scatter + all-gather: the same):
    :func:`course_lib.comm_model.predict_all_reduce`'s ``2 (n - 1)`` steps of ``nbytes / n``, in closed form."""
    return 2 * (n - 1) * link.time(nbytes / n) if n > 1 else 0.0


def _link(cluster: Cluster, span: int) -> AlphaBeta:
    return cluster.intra if span <= cluster.devices_per_node else cluster.inter


def _products(c: TransformerConfig, layout: Layout, seq_len: int) -> tuple[list, list]:
    """(m, n, k, count) of one micro-batch's forward products on one rank: a block's, and the head's."""
    T, C = layout.tensor, layout.context
    M = layout.micro_batch * seq_len // C  # tokens of a micro-batch on this rank
    h, f, kv = c.d_model, c.d_ff, c.kv_heads * c.head_dim
    ups = 2 if c.mlp == "swiglu" else 1
    block = [
        (M, (h + 2 * kv) // T, h, 1),  # q, k, v projections (column-parallel)
        (M, h, h // T, 1),  # output projection (row-parallel)
        (M, f // T, h, ups),  # the MLP's up (and gate) projections
        (M, h, f // T, 1),  # its down projection
        # attention proper, per head: q k^T and probs v over the whole sequence, a causal kernel half of it
        (seq_len // C, seq_len, c.head_dim, 2 * layout.micro_batch * c.n_heads // T),
    ]
    head = [(M, c.vocab_size // T, h, 1)]
    return block, head


def _seconds(products: list, cluster: Cluster, attention_index: int | None = None, factor: float = 1.0) -> float:
    """Seconds of ``factor`` x these forward products on one device (the attention's causal half)."""
    eff = cluster.matmul
    total = 0.0
    for i, (m, n, k, count) in enumerate(products):
        flops = 2 * m * n * k * count * (0.5 if i == attention_index else 1.0)
        rate = cluster.peak_flops * cluster.efficiency * (eff.fraction(m, n, k) if eff is not None else 1.0)
        total += factor * flops / rate
    return total


def stage_seconds(config: TransformerConfig, cluster: Cluster, layout: Layout, *, seq_len: int) -> dict[str, float]:
    """Seconds of one micro-batch's forward and backward on the ``first`` and the ``last`` pipeline stage (the
    same stage when ``pipeline`` is 1), recomputation included, fixed cost excluded; and ``forward``, the first
    stage's forward alone. The first stage holds its blocks and the embedding (a lookup: no product), the last
    its blocks and the head. Backward costs two forwards (the input's gradient and the weight's).

    >>> from course_lib.transformer import PRESETS
    >>> from course_lib.planner_layout import h100_cluster
    >>> t = stage_seconds(PRESETS["llama3-8b"], h100_cluster(), Layout(pipeline=4, accumulation=4), seq_len=8192)
    >>> round(t["last"] / t["first"], 3)  # 8 blocks, and the head's 6 h V FLOPs per token on the last
    1.261
    """
    c = check_config(config)
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a Layout, got {type(layout).__name__}")
    seq_len = check_int("seq_len", seq_len, minimum=1, maximum=2**24)
    check_layout(c, layout, seq_len, layout.data * layout.micro_batch * layout.accumulation)
    block, head = _products(c, layout, seq_len)
    attn = len(block) - 1
    layers = c.n_layers // layout.pipeline
    blocks = layers * _seconds(block, cluster, attn)  # forward of the stage's blocks
    head_fwd = _seconds(head, cluster)
    again = layers * _seconds(block[attn:], cluster, 0) if layout.checkpointing == "selective" else 0.0
    recompute = 1.0 if layout.checkpointing == "full" else 0.0  # one more forward of the stage
    first = blocks + (head_fwd if layout.pipeline == 1 else 0.0)
    last = blocks + head_fwd
    return {
        "first": (3 + recompute) * first + again,
        "last": (3 + recompute) * last + again,
        "forward": first,
    }


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
    idealized = cluster.matmul is None
    return Prediction(layout, memory, time, tps, tps * fpt / (cluster.peak_flops * layout.devices), idealized)


def _memory(
    c: TransformerConfig, layout: Layout, seq_len: int, prec: Precision, sequence_parallel: bool
) -> dict[str, int]:
    """Bytes per rank: model state, the activations in flight, and checkpointing's recompute buffer."""
    T, P, C, D = layout.tensor, layout.pipeline, layout.context, layout.data
    dtype = torch.bfloat16 if prec.parameter == 2 else torch.float32
    # memory: model state
    n_params = shard_params(c, T, P)
    state = model_state_bytes(n_params, D * C, layout.stage, prec)  # CP ranks replicate the weights: ZeRO over D x C
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
    stage_blocks = in_flight * block * (c.n_layers // P)
    v = layout.interleave
    if v > 1:  # the interleaved schedule's warm-up holds (1 + (p - 1) / (p v)) times as much (Korthikanti et al. 4.2.3)
        stage_blocks = stage_blocks * (P * v + P - 1) // (P * v)
    activations = stage_blocks + sum(outside.values())
    recompute = 0
    if layout.checkpointing == "full":  # backward recomputes one block at a time: its activations, once
        full = dataclasses.replace(c, checkpointing="none")
        recompute = sum(
            tp_saved_bytes(
                full, local_seq, T, batch=layout.micro_batch, dtype=dtype, sequence_parallel=sequence_parallel
            ).values()
        )
    # transients: ZeRO-3's gathered units (the one computing and the one prefetched), the fp32 gradient of the
    # logits (the loss's backward: one micro-batch's tokens x this rank's vocabulary columns), and communication
    # buffers (a unit's unsharded gradient before its reduce-scatter; a pipeline's send and receive buffers)
    unit = _largest_unit(c, T)
    tokens = layout.micro_batch * local_seq
    buffers = unit * prec.gradient if layout.zero >= 2 else 0
    if P > 1:
        buffers += 2 * tokens * c.d_model * prec.parameter // T
    memory = {
        "parameters": state.parameters,
        "gradients": state.gradients,
        "optimizer state": state.optimizer_state,
        "activations": activations,
        "recompute buffer": recompute,
        "gathered units (ZeRO-3)": 2 * unit * prec.parameter if layout.zero == 3 else 0,
        "logits gradient (fp32)": tokens * (c.vocab_size // T) * 4,
        "communication buffers": buffers,
    }
    return memory


def _largest_unit(c: TransformerConfig, T: int) -> int:
    """Parameters of the largest unit FSDP gathers at once: a block, the embedding, or the norm and the head."""
    parts = param_counts(c)
    block = (parts["attention"] + parts["mlp"]) // c.n_layers // T + 2 * c.d_model
    return max(block, parts["embedding"] // T, parts["head"] // T + c.d_model)


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
    m, v = layout.accumulation, layout.interleave
    # time: compute, stage by stage; the slowest stage sets the pace of every micro-batch and of the bubble
    stages = stage_seconds(c, cluster, layout, seq_len=seq_len)
    slowest = max(stages["first"], stages["last"])
    compute = m * slowest
    bubble = slowest * (P - 1) / v
    fixed = cluster.matmul.per_micro_batch_s if cluster.matmul is not None else 0.0
    overhead = (m + (P - 1) / v) * fixed
    # time: communication
    tp_link, cp_link = _link(cluster, T), _link(cluster, T * C)
    pp_link, dp_link = _link(cluster, T * C * P), _link(cluster, layout.devices)
    micro_tokens = layout.micro_batch * local_seq
    tp_time = 0.0
    if T > 1:
        parts = tp_bytes_per_step(c, micro_tokens, T, bytes_per_element=p_bytes, sequence_parallel=sequence_parallel)
        calls = 4 * c.n_layers // P + 2 + 3
        steps = 2 * (T - 1) * calls
        tp_time = m * (steps * tp_link.alpha + sum(parts.values()) / P / tp_link.beta)
        if async_tensor_parallel:  # the first of T chunks waits; the rest run under the matrix products
            tp_time = tp_time / T + max(0.0, tp_time * (T - 1) / T - compute)
    cp_time = 0.0
    if C > 1:
        per_layer = ring_attention_bytes(
            layout.micro_batch, c.kv_heads, seq_len, c.head_dim, C, bytes_per_element=p_bytes
        )
        cp_time = m * (c.n_layers // P) * (4 * C * cp_link.alpha + per_layer / cp_link.beta)
    pp_time = 0.0
    if P > 1:  # each micro-batch: one activation forward and one gradient backward per chunk boundary
        msg = micro_tokens * c.d_model * p_bytes / T
        pp_time = 2 * (m * v + P - 1) * pp_link.time(msg)
    # data parallel over D x C ranks (context-parallel ranks hold replicas too). A reduce-scatter or an
    # all-gather is half a ring all-reduce. What each can hide behind (the first stage's, which finishes last):
    # ZeRO-0/1: the gradients accumulate locally (no_sync), so the reduction starts in the last micro-batch's
    # backward; ZeRO-2 reduce-scatters in every micro-batch's backward; ZeRO-1/2 all-gather the updated
    # parameters under the next step's first forward; ZeRO-3 gathers and reduce-scatters in every micro-batch.
    n_dp = D * C
    all_reduce = _ring(dp_link, n_params * prec.gradient, n_dp)
    half = all_reduce / 2
    gather = half
    if float8_all_gather:  # torchao casts the blocks' linear weights to float8; the rest is gathered as before
        parts = param_counts(c)
        linear = (parts["attention"] + parts["mlp"]) // c.n_layers // T * (c.n_layers // P)
        gather = _ring(dp_link, linear * 1 + (n_params - linear) * prec.gradient, n_dp) / 2
    per_micro = stages["first"]
    forward = stages["forward"]
    backward = per_micro - forward
    if layout.zero == 0:
        exposed_dp = max(0.0, all_reduce - backward)
    elif layout.zero == 1:
        exposed_dp = max(0.0, half - backward) + max(0.0, half - forward)
    elif layout.zero == 2:
        exposed_dp = m * max(0.0, half - backward) + max(0.0, half - forward)
    else:
        exposed_dp = m * max(0.0, 2 * gather + half - per_micro)
    time = {
        "compute": compute,
        "pipeline bubble": bubble,
        "tensor-parallel collectives": tp_time,
        "context-parallel ring": cp_time,
        "pipeline sends": pp_time,
        "data-parallel (not hidden)": exposed_dp,
        "per-micro-batch overhead": overhead,
    }
    return time
