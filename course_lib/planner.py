"""A layout planner: memory per rank and step time of a transformer under data, tensor, pipeline and
context parallelism, ZeRO sharding, micro-batching and checkpointing, put together from the course's formulas.

Nothing here is a new formula. :func:`predict` adds up

* **model state** per rank: :func:`course_lib.sharding.model_state_bytes` of the parameters this rank's
  tensor-parallel and pipeline shard holds (:func:`shard_params`), ZeRO-sharded over the data-parallel ranks;
* **activations** per rank: :func:`course_lib.tensor_parallel.tp_saved_bytes` (notebook 16's
  :func:`~course_lib.transformer.block_saved_terms`, the heads' and MLP's terms divided by the tensor
  degree) for this stage's blocks, on ``seq_len / context`` tokens per sequence, times the micro-batches a
  1F1B pipeline keeps in flight, plus what lies outside the blocks
  (:func:`~course_lib.transformer.model_saved_terms`, the loss's log-probabilities divided by the tensor
  degree: the head is vocabulary-parallel), and, with checkpointing, one block recomputed in backward;
* **transients**: ZeRO-3's two gathered units, the fp32 gradient of the logits, communication buffers;
* **step time**: each pipeline stage's matrix products (:func:`stage_seconds`: the embedding on the first
  stage, the head on the last; with a :class:`MatmulEfficiency` at a size-dependent fraction of the peak and a
  fixed cost per micro-batch, without one at the peak: idealized), the slowest stage times the micro-batches
  plus the bubble ``(p - 1) / v`` (``v`` the interleave), and the communication that is not hidden:
  tensor-parallel collectives (:func:`~course_lib.tensor_parallel.tp_bytes_per_step`) and context-parallel ring
  exchanges (:func:`~course_lib.context_parallel.ring_attention_bytes`) sit on the critical path; the
  data-parallel reduction over data x context ranks overlaps the backward it is allowed to (ZeRO-0/1: the last
  micro-batch's; ZeRO-2/3: each micro-batch's). Each collective costs the ring's ``2 (n-1)`` steps of the α-β
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

import math
from itertools import product

from .planner_layout import (
    Cluster,
    Layout,
    MatmulEfficiency,
    PlanError,
    Prediction,
    a100_cluster,
    check_config,
    check_layout,
    cpu_cluster,
    h100_cluster,
)
from .planner_model import predict, shard_params, stage_seconds
from .sharding import Precision
from .transformer import CHECKPOINTINGS, TransformerConfig
from .validation import check_int, check_items, check_number

GiB = 2**30

__all__ = [
    "Cluster",
    "Layout",
    "MatmulEfficiency",
    "PlanError",
    "Prediction",
    "a100_cluster",
    "candidate_layouts",
    "check_layout",
    "cpu_cluster",
    "format_plan",
    "h100_cluster",
    "plan",
    "predict",
    "shard_params",
    "stage_seconds",
]


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, in O(sqrt n) steps (a global batch can be large)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


MFU_PLAUSIBLE = 0.7  # above this, format_plan says the MFU comes from an idealized model
MAX_GLOBAL_BATCH = 10**12  # sequences per step: far beyond any real run, and every layout is still enumerable


def candidate_layouts(
    config: TransformerConfig,
    devices: int,
    global_batch: int,
    seq_len: int,
    *,
    max_tensor: int | None = None,
    practical: bool = False,
) -> list[Layout]:
    """Every layout of exactly ``devices`` devices that :func:`check_layout` accepts (all ZeRO stages,
    all checkpointing modes, every micro-batch that divides the per-rank batch).

    ``practical=True`` keeps what practitioners consider: at least 2 layers per pipeline stage, and adds the
    interleaved schedules (2 or 4 chunks per stage) where the layers and micro-batches allow them."""
    config = check_config(config)
    devices = check_int("devices", devices, minimum=1, maximum=2**20)
    global_batch = check_int("global_batch", global_batch, minimum=1, maximum=MAX_GLOBAL_BATCH)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    if max_tensor is not None:
        max_tensor = check_int("max_tensor", max_tensor, minimum=1)
    if not isinstance(practical, bool):
        raise TypeError(f"practical must be True or False, got {practical!r}")
    chunks = (1, 2, 4) if practical else (1,)
    out = []
    for T, P, C in product(_divisors(devices), repeat=3):
        if devices % (T * P * C) or (max_tensor is not None and T > max_tensor):
            continue
        if practical and config.n_layers // P < 2:
            continue
        D = devices // (T * P * C)
        if global_batch % D:
            continue
        try:  # the degrees alone, once: what divides heads, layers and the sequence
            check_layout(config, Layout(D, T, 1, C, micro_batch=global_batch // D), seq_len, global_batch)
        except ValueError:
            continue
        if config.n_layers % P:
            continue
        for mb, v in product(_divisors(global_batch // D), chunks):
            m = global_batch // (D * mb)
            if m < P or (v > 1 and (P == 1 or m % P or config.n_layers % (P * v))):
                continue  # too few micro-batches for the pipeline, or no interleaved schedule here
            for zero, ck in product(range(4), CHECKPOINTINGS):
                if D * C == 1 and zero:
                    continue  # ZeRO over one rank is plain training
                out.append(Layout(D, T, P, C, zero, mb, m, ck, v))  # type: ignore[arg-type]
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
    practical: bool = True,
) -> list[Prediction]:
    """The layouts that fit, fastest first (ties: less memory first).

    A layout fits when its memory per rank is at most ``headroom`` of the device's (the rest: the
    allocator's fragmentation, the framework). ``devices`` defaults to the whole cluster; tensor parallelism
    stays inside a node (``max_tensor`` defaults to ``devices_per_node``). ``practical`` (the default) searches
    what practitioners consider (:func:`candidate_layouts`), and context parallelism only when no layout
    without it fits (a sequence's activations do not fit otherwise); ``practical=False``, every layout.
    Raises :class:`PlanError` when none fits, with the smallest need.

    >>> import textwrap
    >>> from course_lib.transformer import PRESETS
    >>> from course_lib.comm_model import AlphaBeta
    >>> small = Cluster(8, 16 * 2**30, 1e14, AlphaBeta(1e-5, 1e11), AlphaBeta(1e-5, 1e10))
    >>> try:
    ...     plan(PRESETS["llama3-8b"], small, global_batch=8, seq_len=8192)
    ... except PlanError as e:
    ...     print(textwrap.fill(str(e), 100))
    no layout of 8 devices fits: the smallest needs 17.99 GiB per rank (DP 1 x TP 4 x CP 2, ZeRO-3,
    micro-batch 1 x 8 accumulation, checkpointing full), the device has 14.40 GiB usable (90% of 16.00
    GiB)
    """
    c = check_config(config)
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    n = cluster.devices if devices is None else check_int("devices", devices, minimum=1, maximum=cluster.devices)
    headroom = check_number("headroom", headroom, finite=True)
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1], got {headroom}")
    limit = max_tensor if max_tensor is not None else cluster.devices_per_node
    if not isinstance(practical, bool):
        raise TypeError(f"practical must be True or False, got {practical!r}")
    layouts = candidate_layouts(c, n, global_batch, seq_len, max_tensor=limit, practical=practical)
    if not layouts:
        raise PlanError(
            f"no layout splits global batch {global_batch} x seq_len {seq_len} of this model over {n} devices"
            " (the degrees must divide the batch, heads, layers and sequence)"
        )
    usable = headroom * cluster.memory_bytes

    def predicted(group: list[Layout]) -> list[Prediction]:
        return [
            predict(c, cluster, lay, seq_len=seq_len, global_batch=global_batch, precision=precision) for lay in group
        ]

    if practical:  # context parallelism only where no layout without it fits
        preds = predicted([lay for lay in layouts if lay.context == 1])
        if not any(p.memory_total <= usable for p in preds):
            preds += predicted([lay for lay in layouts if lay.context > 1])
    else:
        preds = predicted(layouts)
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
    """The first ``top`` predictions as a text table: layout, GiB per rank, step time, tokens/s, MFU.

    An MFU above 70 % is marked: no published training run reaches it, so it comes from an idealized model (no
    :class:`MatmulEfficiency` on the cluster), and the table says so under it."""
    top = check_int("top", top, minimum=1)
    preds = check_items("preds", preds, Prediction, "a list of Predictions (what plan returns)")
    lines = [f"{'#':>2} {'layout':<88} {'GiB/rank':>8} {'step s':>8} {'tokens/s':>10} {'MFU':>6}"]
    flagged = False
    for i, p in enumerate(preds[:top], 1):
        mark = "*" if p.mfu > MFU_PLAUSIBLE else " "
        flagged = flagged or p.mfu > MFU_PLAUSIBLE
        lines.append(
            f"{i:>2} {p.layout.describe():<88} {p.memory_total / GiB:>8.2f} {p.step_time:>8.3f}"
            f" {p.tokens_per_second:>10.4g} {p.mfu:>5.1%}{mark}"
        )
    if flagged and any(p.idealized for p in preds[:top]):
        lines.append(
            f"* MFU above {MFU_PLAUSIBLE:.0%}: an idealized model (matrix products at the peak, nothing per"
            " micro-batch); give the cluster a MatmulEfficiency for a forecast"
        )
    elif flagged:
        lines.append(
            f"* MFU above {MFU_PLAUSIBLE:.0%}, beyond published runs of dense models: the model is idealized here"
            " (its constant may absorb recomputation these layouts skip; memory-bound operations are left out):"
            " an upper bound"
        )
    elif any(p.idealized for p in preds[:top]):
        lines.append("(idealized model: matrix products at the cluster's flat efficiency, nothing per micro-batch)")
    return "\n".join(lines)
