"""Published training runs, their layouts and measured throughput, to check the planner's time model against.

Two tables:

* :data:`MEGATRON` — Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM* (SC'21, arXiv:2104.04473), Table 1: GPT models of 1.7B to 1T parameters on up to 3,072 A100 80 GB
  GPUs (DGX A100 nodes), sequences of 2,048 tokens, a 51,200-token vocabulary, the interleaved schedule, full
  activation recomputation and plain data parallelism. Its throughput counts the paper's FLOPs,
  ``96 B s l h^2 (1 + s / 6h + V / 16 l h)`` per step (:func:`megatron_flops_per_step`: the forward, the backward
  and the recomputed forward of every layer, attention not halved, the head), per second and GPU.
* :data:`LLAMA3` — Llama Team, *The Llama 3 Herd of Models* (arXiv:2407.21783), Table 4: the 405B model on 8,192 and
  16,384 H100s, 16M tokens per batch, in bf16; its throughput is model FLOPs (no recomputation) per second and GPU.

:func:`compare` predicts one run with the planner: the published degrees with the paper's stated choices, the
planner's best micro-batch and interleave for them, and the rank of that layout among every layout the planner
considers for the same model, GPUs and batch. :func:`fit_peak_fraction` fits the one calibrated constant,
:class:`~course_lib.planner_layout.MatmulEfficiency`'s ``peak_fraction``, on a list of runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .planner import MatmulEfficiency, Prediction, a100_cluster, h100_cluster, plan, predict
from .planner_layout import Cluster, Layout
from .transformer import TransformerConfig, training_flops_per_token
from .validation import check_instance, check_items

__all__ = [
    "LLAMA3",
    "MEGATRON",
    "Comparison",
    "PublishedRun",
    "compare",
    "fit_peak_fraction",
    "megatron_flops_per_step",
]


@dataclass(frozen=True)
class PublishedRun:
    """One row of a published table: the model, the layout's degrees, the batch and the measured throughput.

    ``zero`` and ``checkpointing`` are the paper's choices (``None``: not stated, the planner's best);
    ``megatron_flops`` says which FLOPs the published TFLOP/s counts (:func:`megatron_flops_per_step`'s, or the
    model's own, :func:`~course_lib.transformer.training_flops_per_token` with causal attention).
    """

    source: str
    name: str
    config: TransformerConfig
    gpus: int
    tensor: int
    pipeline: int
    context: int
    global_batch: int
    seq_len: int
    tflops_per_gpu: float
    zero: int | None = None
    checkpointing: str | None = None
    megatron_flops: bool = False

    @property
    def data(self) -> int:
        return self.gpus // (self.tensor * self.pipeline * self.context)

    def cluster(self, matmul: MatmulEfficiency | None) -> Cluster:
        """The paper's cluster, nodes of 8 GPUs: DGX A100 for Megatron's runs, H100 for Llama 3's."""
        make = a100_cluster if self.megatron_flops else h100_cluster
        return make(self.gpus // 8, matmul=matmul)


def _gpt(params: str, heads: int, hidden: int, layers: int) -> tuple[str, TransformerConfig]:
    # GPT as Megatron-LM trains it: learned positions, a GELU MLP of 4h; the head is kept untied (tensor
    # parallelism here splits the head apart from the embedding; its FLOPs are counted either way)
    config = TransformerConfig(
        vocab_size=51200, d_model=hidden, n_layers=layers, n_heads=heads, d_ff=4 * hidden, max_seq_len=2048,
        tie_embeddings=False, mlp="gelu", positions="learned",
    )  # fmt: skip
    return params, config


_MEGATRON_ROWS = [  # parameters, heads, hidden, layers, TP, PP, GPUs, batch, achieved TFLOP/s per GPU (Table 1)
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
MEGATRON = [
    PublishedRun(
        "Narayanan et al. 2021, Table 1",
        *_gpt(name, heads, hidden, layers),
        gpus,
        tp,
        pp,
        1,
        batch,
        2048,
        tflops,
        zero=0,
        checkpointing="full",
        megatron_flops=True,
    )  # fmt: skip
    for name, heads, hidden, layers, tp, pp, gpus, batch, tflops in _MEGATRON_ROWS
]
# Llama 3 405B has 126 layers; the planner needs equal stages, so this is its 128-layer twin (1.6 % more
# parameters; the paper gives the first and last of its 16 stages one layer fewer)
LLAMA3_405B = TransformerConfig(
    vocab_size=128256, d_model=16384, n_layers=128, n_heads=128, n_kv_heads=8, d_ff=53248, max_seq_len=131072,
    tie_embeddings=False, rope_theta=500000.0,
)  # fmt: skip
LLAMA3 = [
    PublishedRun("Llama 3, Table 4", "405B, 8K", LLAMA3_405B, 8192, 8, 16, 1, 2048, 8192, 430),
    PublishedRun("Llama 3, Table 4", "405B, 8K", LLAMA3_405B, 16384, 8, 16, 1, 2048, 8192, 400),
    PublishedRun("Llama 3, Table 4", "405B, 128K", LLAMA3_405B, 16384, 8, 16, 16, 128, 131072, 380),
]


def megatron_flops_per_step(config: TransformerConfig, global_batch: int, seq_len: int) -> float:
    """The FLOPs per step that Narayanan et al. (2021) count: ``96 B s l h^2 (1 + s / 6h + V / 16 l h)``.

    >>> from course_lib.published_runs import MEGATRON
    >>> r = MEGATRON[-1]
    >>> round(megatron_flops_per_step(r.config, r.global_batch, r.seq_len) / 1e18, 1)  # the 1T model's step
    51.4
    """
    check_instance("config", config, TransformerConfig, "a course_lib.transformer.TransformerConfig")
    B, s = _positive("global_batch", global_batch), _positive("seq_len", seq_len)
    L, h, V = config.n_layers, config.d_model, config.vocab_size
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= 2**40:
        raise ValueError(f"{name} must be in [1, 2**40], got {value}")
    return value


@dataclass(frozen=True)
class Comparison:
    """The planner against one published run: its prediction for the published layout, the throughput it
    implies in the paper's own FLOPs, the relative error, and that layout's rank among the planner's layouts."""

    run: PublishedRun
    published: Prediction
    tflops_per_gpu: float
    error: float
    rank: int
    candidates: int
    best: Prediction


def _published_layouts(run: PublishedRun) -> list[Layout]:
    """The published degrees with every micro-batch, interleave, ZeRO stage and checkpointing the paper leaves open."""
    per_rank = run.global_batch // run.data
    stage_layers = run.config.n_layers // run.pipeline
    out = []
    for mb in (d for d in range(1, per_rank + 1) if per_rank % d == 0):
        for v in (d for d in range(1, 5) if stage_layers % d == 0 and (d == 1 or run.pipeline > 1)):
            for zero in [run.zero] if run.zero is not None else range(4):
                for ck in [run.checkpointing] if run.checkpointing else ("none", "selective", "full"):
                    m = per_rank // mb
                    if m < run.pipeline or (v > 1 and m % run.pipeline):
                        continue
                    out.append(Layout(run.data, run.tensor, run.pipeline, run.context, zero, mb, m, ck, v))  # type: ignore[arg-type]
    return out


def compare(run: PublishedRun, matmul: MatmulEfficiency | None = None, *, rank: bool = True) -> Comparison:
    """Predict ``run`` with the planner (``matmul``: the efficiency model; ``None`` is the idealized one).

    The published layout is the fastest of :func:`_published_layouts` that fits in 90 % of a GPU's memory;
    its rank counts the planner's own layouts (:func:`course_lib.planner.plan`, what practitioners consider)
    that are faster, plus one (``rank=False`` skips that search: rank 0).
    """
    check_instance("run", run, PublishedRun, "a PublishedRun (a row of MEGATRON or LLAMA3)")
    if matmul is not None:
        check_instance("matmul", matmul, MatmulEfficiency, "a MatmulEfficiency or None")
    if not isinstance(rank, bool):
        raise TypeError(f"rank must be True or False, got {rank!r}")
    cluster = run.cluster(matmul)
    usable = 0.9 * cluster.memory_bytes
    preds = [
        predict(run.config, cluster, lay, seq_len=run.seq_len, global_batch=run.global_batch)
        for lay in _published_layouts(run)
    ]
    fits = [p for p in preds if p.memory_total <= usable]
    if not fits:
        raise ValueError(f"no layout with the published degrees of {run.name} fits in 90 % of a GPU's memory")
    theirs = min(fits, key=lambda p: p.step_time)
    if run.megatron_flops:
        flops = megatron_flops_per_step(run.config, run.global_batch, run.seq_len)
    else:
        flops = training_flops_per_token(run.config, run.seq_len, causal=True) * run.global_batch * run.seq_len
    tflops = flops / theirs.step_time / run.gpus / 1e12
    ranking, best = ([], theirs)
    if rank:
        ranking = plan(run.config, cluster, run.global_batch, run.seq_len)
        best = ranking[0]
    position = sum(p.step_time < theirs.step_time * (1 - 1e-9) for p in ranking) + 1 if rank else 0
    error = tflops / run.tflops_per_gpu - 1
    return Comparison(run, theirs, tflops, error, position, len(ranking), best)


def fit_peak_fraction(runs: list[PublishedRun], matmul: MatmulEfficiency | None = None) -> float:
    """The ``peak_fraction`` that minimizes the mean squared log-error of the predicted throughput over ``runs``
    (the other constants of ``matmul`` kept), by golden-section search on [0.3, 1]; to 0.001.

    >>> 0.3 <= fit_peak_fraction(MEGATRON[:1]) <= 1
    True
    """
    runs = check_items("runs", runs, PublishedRun, "a list of PublishedRuns")
    if not runs:
        raise ValueError("runs must not be empty")
    base = matmul if matmul is not None else MatmulEfficiency()
    check_instance("matmul", base, MatmulEfficiency, "a MatmulEfficiency or None")

    def loss(fraction: float) -> float:
        e = dataclasses.replace(base, peak_fraction=fraction)
        return sum(math.log1p(compare(r, e, rank=False).error) ** 2 for r in runs) / len(runs)

    lo, hi = 0.3, 1.0
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > 1e-3:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return round((lo + hi) / 2, 3)
