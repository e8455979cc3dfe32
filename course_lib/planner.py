"""A layout planner: memory per rank and step time of a transformer under data, tensor, pipeline and
context parallelism, ZeRO sharding, micro-batching and checkpointing, put together from the course's formulas.

Nothing here is a new formula. :func:`predict` adds up

* **model state** per rank: :func:`course_lib.sharding.model_state_bytes` of the parameters this rank's
  tensor-parallel and pipeline shard holds (:func:`shard_params`), ZeRO-sharded over the data-parallel ranks;
* **activations** per rank: :func:`course_lib.tensor_parallel.tp_saved_bytes` (notebook 14's
  :func:`~course_lib.transformer.block_saved_terms`, the heads' and MLP's terms divided by the tensor
  degree) for this stage's blocks, on ``seq_len / context`` tokens per sequence, times the micro-batches a
  1F1B pipeline keeps in flight, plus what lies outside the blocks
  (:func:`~course_lib.transformer.model_saved_terms`, the loss's log-probabilities divided by the tensor
  degree: the head is vocabulary-parallel), and, with checkpointing, one block recomputed in backward;
* **step time**: the model FLOPs (:func:`~course_lib.transformer.training_flops_per_token`, plus the
  recomputation) over the cluster's peak, the pipeline bubble
  (:func:`course_lib.pipeline.bubble_fraction`), and the communication that is not hidden: tensor-parallel
  collectives (:func:`~course_lib.tensor_parallel.tp_bytes_per_step`) and context-parallel ring exchanges
  (:func:`~course_lib.context_parallel.ring_attention_bytes`) sit on the critical path; the data-parallel
  gradient all-reduce (or ZeRO's reduce-scatter and all-gathers) overlaps the backward pass, so only what
  exceeds the backward's compute counts. Each collective costs the ring's ``2 (n-1)`` steps of the α-β
  model (:func:`course_lib.comm_model.predict_all_reduce`).

Ranks are placed tensor-innermost (``rank = ((d * P + p) * C + c) * T + t``), so a group whose span fits in
one node uses the intra-node link, otherwise the inter-node one.

>>> from course_lib.transformer import PRESETS
>>> from course_lib.comm_model import AlphaBeta
>>> node = Cluster(8, 80 * 10**9, 989e12, AlphaBeta(2e-6, 450e9), AlphaBeta(5e-6, 50e9), nodes=1)
>>> best = plan(PRESETS["llama3-8b"], node, global_batch=32, seq_len=8192)[0]
>>> best.layout.describe()
'DP 8, ZeRO-3, micro-batch 1 x 4 accumulation, checkpointing none'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import product
from typing import Literal

import torch

from .comm_model import AlphaBeta, predict_all_reduce
from .context_parallel import ring_attention_bytes
from .pipeline import bubble_fraction
from .sharding import PRECISIONS, STAGES, Precision, model_state_bytes
from .tensor_parallel import tp_bytes_per_step, tp_saved_bytes
from .transformer import (
    CHECKPOINTINGS,
    TransformerConfig,
    model_saved_terms,
    param_counts,
    training_flops_per_token,
)
from .validation import check_int, check_number

__all__ = [
    "Cluster",
    "Layout",
    "PlanError",
    "Prediction",
    "candidate_layouts",
    "check_layout",
    "format_plan",
    "plan",
    "predict",
    "shard_params",
]

Checkpointing = Literal["none", "full", "selective"]
GiB = 2**30


@dataclass(frozen=True)
class Cluster:
    """Identical nodes of ``devices_per_node`` devices, each with ``memory_bytes`` and ``peak_flops``.

    ``intra`` and ``inter`` are the α-β models of one device's link inside a node and between nodes.
    ``efficiency`` is the fraction of the peak that the model's matrix products reach (1.0: the peak itself,
    so the predicted MFU is an upper bound).
    """

    devices_per_node: int
    memory_bytes: int
    peak_flops: float
    intra: AlphaBeta
    inter: AlphaBeta
    nodes: int = 1
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        check_int("devices_per_node", self.devices_per_node, minimum=1)
        check_int("memory_bytes", self.memory_bytes, minimum=1)
        check_int("nodes", self.nodes, minimum=1)
        for name in ("peak_flops", "efficiency"):
            value = check_number(name, getattr(self, name), finite=True)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.efficiency > 1:
            raise ValueError(f"efficiency must be <= 1 (a fraction of the peak), got {self.efficiency}")
        for name in ("intra", "inter"):
            if not isinstance(getattr(self, name), AlphaBeta):
                raise TypeError(
                    f"{name} must be a course_lib.comm_model.AlphaBeta, got {type(getattr(self, name)).__name__}"
                )

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes


@dataclass(frozen=True)
class Layout:
    """Degrees of data, tensor, pipeline and context parallelism; ZeRO stage; micro-batch; checkpointing.

    >>> Layout(data=4, tensor=2, zero=1, micro_batch=2, accumulation=4).describe()
    'DP 4 x TP 2, ZeRO-1, micro-batch 2 x 4 accumulation, checkpointing none'
    >>> Layout(zero=4)
    Traceback (most recent call last):
        ...
    ValueError: zero must be in [0, 3], got 4
    """

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    zero: int = 0
    micro_batch: int = 1
    accumulation: int = 1
    checkpointing: Checkpointing = "none"

    def __post_init__(self) -> None:
        for name in ("data", "tensor", "pipeline", "context", "micro_batch", "accumulation"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("zero", self.zero, minimum=0, maximum=3)
        if not isinstance(self.checkpointing, str):
            raise TypeError(f"checkpointing must be a string, one of {', '.join(CHECKPOINTINGS)}")
        if self.checkpointing not in CHECKPOINTINGS:
            raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTINGS)}, got {self.checkpointing!r}")

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline * self.context

    @property
    def stage(self) -> str:
        """The ZeRO stage as :mod:`course_lib.sharding` names it."""
        return STAGES[self.zero]

    def describe(self) -> str:
        degrees = [
            f"{k} {v}"
            for k, v in (("DP", self.data), ("TP", self.tensor), ("PP", self.pipeline), ("CP", self.context))
            if v > 1 or k == "DP"
        ]
        return (
            f"{' x '.join(degrees)}, ZeRO-{self.zero}, micro-batch {self.micro_batch} x {self.accumulation}"
            f" accumulation, checkpointing {self.checkpointing}"
        )


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` returns: bytes per rank by part, seconds per step by part, throughput."""

    layout: Layout
    memory: dict[str, int]
    time: dict[str, float]
    tokens_per_second: float
    mfu: float

    @property
    def memory_total(self) -> int:
        return sum(self.memory.values())

    @property
    def step_time(self) -> float:
        return sum(self.time.values())


class PlanError(ValueError):
    """No layout fits: the message says what the smallest one needs and what the device has."""


def _check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a course_lib.transformer.TransformerConfig, got {type(config).__name__}")
    return config


def _precision(precision: object) -> Precision:
    if isinstance(precision, Precision):
        return precision
    if not isinstance(precision, str):
        raise TypeError(f"precision must be a Precision or one of {', '.join(PRECISIONS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def check_layout(config: TransformerConfig, layout: Layout, seq_len: int, global_batch: int) -> None:
    """Raise ``ValueError`` when ``layout`` cannot run ``config``: a degree that does not divide what it splits.

    >>> from course_lib.transformer import PRESETS
    >>> check_layout(PRESETS["tiny"], Layout(tensor=3), 64, 8)
    Traceback (most recent call last):
        ...
    ValueError: tensor degree 3 must divide n_heads (4)
    """
    c = _check_config(config)
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a Layout, got {type(layout).__name__}")
    t = layout.tensor
    for what, value in (
        ("n_heads", c.n_heads),
        ("kv heads", c.kv_heads),
        ("d_ff", c.d_ff),
        ("vocab_size", c.vocab_size),
    ):
        if value % t:
            raise ValueError(f"tensor degree {t} must divide {what} ({value})")
    if t > 1 and c.tie_embeddings:
        raise ValueError(
            "tensor parallelism here needs an untied head (tie_embeddings=False), as course_lib.tensor_parallel does"
        )
    if c.n_layers % layout.pipeline:
        raise ValueError(f"pipeline degree {layout.pipeline} must divide n_layers ({c.n_layers})")
    if seq_len % (2 * layout.context if layout.context > 1 else 1):
        raise ValueError(
            f"context degree {layout.context} must divide seq_len ({seq_len}) into 2 x {layout.context} chunks (zigzag)"
        )
    per_step = layout.data * layout.micro_batch * layout.accumulation
    if per_step != global_batch:
        raise ValueError(
            f"data {layout.data} x micro-batch {layout.micro_batch} x accumulation {layout.accumulation} = {per_step},"
            f" not the global batch {global_batch}"
        )
    if layout.pipeline > 1 and layout.accumulation < layout.pipeline:
        raise ValueError(
            f"a pipeline of {layout.pipeline} stages needs at least {layout.pipeline} micro-batches per step,"
            f" got {layout.accumulation}"
        )


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
    c = _check_config(config)
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
) -> Prediction:
    """Memory per rank and time per step of ``layout`` (see the module's docstring for what is counted).

    ``precision`` is :mod:`course_lib.sharding`'s: ``"mixed_adam"`` keeps bf16 activations, the
    ``fp32_*`` ones float32 activations.

    >>> from course_lib.transformer import PRESETS
    >>> from course_lib.comm_model import AlphaBeta
    >>> cpu = Cluster(4, 2**30, 1e10, AlphaBeta(1e-4, 1e9), AlphaBeta(1e-4, 1e9))
    >>> lay = Layout(data=4, micro_batch=2)
    >>> p = predict(PRESETS["tiny"], cpu, lay, seq_len=64, global_batch=8, precision="fp32_adam")
    >>> p.memory["parameters"], p.memory["optimizer state"]
    (462080, 924160)
    """
    c = _check_config(config)
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    seq_len = check_int("seq_len", seq_len, minimum=1)
    global_batch = check_int("global_batch", global_batch, minimum=1)
    prec = _precision(precision)
    check_layout(c, layout, seq_len, global_batch)
    if layout.devices > cluster.devices:
        raise ValueError(f"the layout needs {layout.devices} devices, the cluster has {cluster.devices}")
    T, P, C, D = layout.tensor, layout.pipeline, layout.context, layout.data
    dtype = torch.bfloat16 if prec.parameter == 2 else torch.float32
    p_bytes = prec.parameter

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
    dp_time = {0: all_reduce, 1: all_reduce, 2: m * half + half, 3: m * 3 * half}[layout.zero]
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
    step = sum(time.values())
    tps = tokens / step
    return Prediction(layout, memory, time, tps, tps * fpt / (cluster.peak_flops * layout.devices))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(
    config: TransformerConfig, devices: int, global_batch: int, seq_len: int, *, max_tensor: int | None = None
) -> list[Layout]:
    """Every layout of exactly ``devices`` devices that :func:`check_layout` accepts (all ZeRO stages,
    all checkpointing modes, every micro-batch that divides the per-rank batch)."""
    out = []
    for T, P, C in product(_divisors(devices), repeat=3):
        if devices % (T * P * C) or (max_tensor is not None and T > max_tensor):
            continue
        D = devices // (T * P * C)
        if global_batch % D:
            continue
        for mb, zero, ck in product(_divisors(global_batch // D), range(4), CHECKPOINTINGS):
            layout = Layout(D, T, P, C, zero, mb, global_batch // (D * mb), ck)  # type: ignore[arg-type]
            if D == 1 and zero:
                continue  # ZeRO over one rank is plain training
            try:
                check_layout(config, layout, seq_len, global_batch)
            except ValueError:
                continue
            out.append(layout)
    return out


def plan(
    config: TransformerConfig,
    cluster: Cluster,
    global_batch: int,
    seq_len: int,
    *,
    precision: str | Precision = "mixed_adam",
    devices: int | None = None,
    max_tensor: int | None = None,
    headroom: float = 0.9,
) -> list[Prediction]:
    """The layouts that fit, fastest first (ties: less memory first).

    A layout fits when its memory per rank is at most ``headroom`` of the device's (the rest: the
    allocator's fragmentation, communication buffers, the framework). ``devices`` defaults to the whole
    cluster; tensor parallelism stays inside a node (``max_tensor`` defaults to ``devices_per_node``).
    Raises :class:`PlanError` when none fits, with the smallest need.

    >>> import textwrap
    >>> from course_lib.transformer import PRESETS
    >>> from course_lib.comm_model import AlphaBeta
    >>> small = Cluster(8, 16 * 2**30, 1e14, AlphaBeta(1e-5, 1e11), AlphaBeta(1e-5, 1e10))
    >>> try:
    ...     plan(PRESETS["llama3-8b"], small, global_batch=8, seq_len=8192)
    ... except PlanError as e:
    ...     print(textwrap.fill(str(e), 100))
    no layout of 8 devices fits: the smallest needs 17.95 GiB per rank (DP 1 x TP 8, ZeRO-0, micro-batch
    1 x 8 accumulation, checkpointing full), the device has 14.40 GiB usable (90% of 16.00 GiB)
    """
    c = _check_config(config)
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    n = cluster.devices if devices is None else check_int("devices", devices, minimum=1, maximum=cluster.devices)
    headroom = check_number("headroom", headroom, finite=True)
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    limit = max_tensor if max_tensor is not None else cluster.devices_per_node
    layouts = candidate_layouts(c, n, global_batch, seq_len, max_tensor=limit)
    if not layouts:
        raise PlanError(
            f"no layout splits global batch {global_batch} x seq_len {seq_len} of this model over {n} devices"
            " (the degrees must divide the batch, heads, layers and sequence)"
        )
    preds = [
        predict(c, cluster, lay, seq_len=seq_len, global_batch=global_batch, precision=precision) for lay in layouts
    ]
    usable = headroom * cluster.memory_bytes
    fits = [p for p in preds if p.memory_total <= usable]
    if not fits:
        least = min(preds, key=lambda p: p.memory_total)
        raise PlanError(
            f"no layout of {n} devices fits: the smallest needs {least.memory_total / GiB:.2f} GiB per rank"
            f" ({least.layout.describe()}), the device has {usable / GiB:.2f} GiB usable"
            f" ({headroom:.0%} of {cluster.memory_bytes / GiB:.2f} GiB)"
        )
    return sorted(fits, key=lambda p: (round(p.step_time, 12), p.memory_total))


def format_plan(preds: list[Prediction], top: int = 5) -> str:
    """The first ``top`` predictions as a text table: layout, GiB per rank, step time, tokens/s, MFU."""
    top = check_int("top", top, minimum=1)
    lines = [f"{'#':>2} {'layout':<78} {'GiB/rank':>8} {'step s':>8} {'tokens/s':>10} {'MFU':>5}"]
    for i, p in enumerate(preds[:top], 1):
        lines.append(
            f"{i:>2} {p.layout.describe():<78} {p.memory_total / GiB:>8.2f} {p.step_time:>8.3f}"
            f" {p.tokens_per_second:>10.4g} {p.mfu:>5.1%}"
        )
    return "\n".join(lines)
