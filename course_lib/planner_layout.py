"""The planner's vocabulary: a :class:`Cluster`, a :class:`Layout` of parallelism degrees and a :class:`Prediction`,
and :func:`check_layout`, which says why a layout cannot run a model. The planner is :mod:`course_lib.planner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .comm_model import AlphaBeta
from .sharding import PRECISIONS, STAGES, Precision
from .transformer import CHECKPOINTINGS, TransformerConfig
from .validation import check_int, check_number

__all__ = [
    "Cluster",
    "Layout",
    "MatmulEfficiency",
    "PlanError",
    "Prediction",
    "a100_cluster",
    "check_config",
    "check_layout",
    "check_precision",
    "cpu_cluster",
    "h100_cluster",
]

Checkpointing = Literal["none", "full", "selective"]
GiB = 2**30


@dataclass(frozen=True)
class MatmulEfficiency:
    """How fast a matrix product runs, as a fraction of the peak, and a fixed cost per micro-batch and stage.

    A product of an ``m x k`` by a ``k x n`` matrix reaches ``peak_fraction * f(m) * f(n) * f(k)`` of the peak,
    with ``f(d) = d / (d + half_size)``: large products approach ``peak_fraction``, a dimension of ``half_size``
    halves the rate (small products are bound by memory traffic and the kernel's launch, not by the arithmetic).
    ``per_micro_batch_s`` is the fixed cost of one micro-batch's forward and backward on one pipeline stage
    (kernel launches, the optimizer's and the framework's bookkeeping, spread over the micro-batches).

    The defaults are the course's calibration: ``peak_fraction`` fitted on Megatron-LM's published runs on A100s
    (Narayanan et al., 2021, Table 1; :mod:`course_lib.published_runs`), ``half_size`` and ``per_micro_batch_s``
    assumed, not fitted.

    >>> e = MatmulEfficiency()
    >>> round(e.fraction(8192, 8192, 8192), 3) == round(e.peak_fraction * (8192 / (8192 + e.half_size)) ** 3, 3)
    True
    """

    peak_fraction: float = 0.534
    half_size: float = 64.0
    per_micro_batch_s: float = 1e-3

    def __post_init__(self) -> None:
        value = check_number("peak_fraction", self.peak_fraction, finite=True)
        if not 0 < value <= 1:
            raise ValueError(f"peak_fraction must be in (0, 1], got {value}")
        for name in ("half_size", "per_micro_batch_s"):
            value = check_number(name, getattr(self, name), finite=True)
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    def fraction(self, m: int, n: int, k: int) -> float:
        """The fraction of the peak that an ``m x k`` by ``k x n`` product reaches."""
        out = self.peak_fraction
        for name, d in (("m", m), ("n", n), ("k", k)):
            d = check_int(name, d, minimum=1)
            out *= d / (d + self.half_size)
        return out


@dataclass(frozen=True)
class Cluster:
    """Identical nodes of ``devices_per_node`` devices, each with ``memory_bytes`` and ``peak_flops``.

    ``intra`` and ``inter`` are the α-β models of one device's link inside a node and between nodes.
    ``efficiency`` is the fraction of the peak that the model's matrix products reach (1.0: the peak itself,
    so the predicted MFU is an upper bound). ``matmul`` (a :class:`MatmulEfficiency`) replaces that flat
    fraction by one that depends on each product's size, with a fixed cost per micro-batch and stage; without
    it (``None``) the model is idealized: every product at ``efficiency`` of the peak, nothing per micro-batch.
    """

    devices_per_node: int
    memory_bytes: int
    peak_flops: float
    intra: AlphaBeta
    inter: AlphaBeta
    nodes: int = 1
    efficiency: float = 1.0
    matmul: MatmulEfficiency | None = None

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
        if self.matmul is not None and not isinstance(self.matmul, MatmulEfficiency):
            raise TypeError(f"matmul must be a MatmulEfficiency or None, got {type(self.matmul).__name__}")

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes


def _check_matmul(matmul: object) -> MatmulEfficiency | None:
    if matmul is not None and not isinstance(matmul, MatmulEfficiency):
        raise TypeError(f"matmul must be a MatmulEfficiency or None, got {type(matmul).__name__}")
    return matmul


def h100_cluster(nodes: int = 1, *, matmul: MatmulEfficiency | None = None) -> Cluster:
    """``nodes`` nodes of 8 H100 SXM GPUs: 80 GB and 989 TFLOP/s of dense bf16 each (NVIDIA's H100 datasheet),
    NVLink 4 inside a node (450 GB/s per direction, 5 us per message) and one 400 Gb/s InfiniBand NIC per GPU
    between nodes (50 GB/s, 10 us): the cluster notebooks 19 and 21 plan for. Without ``matmul`` its time model
    is idealized (every product at the peak).

    >>> h100_cluster(2).devices
    16
    """
    nodes = check_int("nodes", nodes, minimum=1)
    matmul = _check_matmul(matmul)
    return Cluster(8, 80 * 10**9, 989e12, AlphaBeta(5e-6, 450e9), AlphaBeta(10e-6, 50e9), nodes=nodes, matmul=matmul)


def a100_cluster(nodes: int = 1, *, matmul: MatmulEfficiency | None = None) -> Cluster:
    """``nodes`` DGX A100 nodes (the machines of Narayanan et al., 2021): 8 A100 80 GB GPUs, 312 TFLOP/s of dense
    bf16 each (NVIDIA's A100 datasheet), NVLink 3 inside a node (600 GB/s per GPU in total: 300 GB/s per
    direction, 5 us) and 8 HDR InfiniBand NICs of 200 Gb/s per node (25 GB/s per GPU, 10 us).

    >>> a100_cluster(2).devices, a100_cluster().peak_flops
    (16, 312000000000000.0)
    """
    nodes = check_int("nodes", nodes, minimum=1)
    matmul = _check_matmul(matmul)
    return Cluster(8, 80 * 10**9, 312e12, AlphaBeta(5e-6, 300e9), AlphaBeta(10e-6, 25e9), nodes=nodes, matmul=matmul)


def cpu_cluster() -> Cluster:
    """This machine's CPU processes as a cluster for the course's tiny transformer, with nominal numbers that are
    assumed, not measured: 8 processes to a "node", 1 GiB and 5 GFLOP/s each, gloo over loopback at 100 us per
    message and 2 GB/s, every product at that rate (idealized). Notebooks 22 and 21 set their runs against it.

    >>> cpu_cluster().peak_flops, cpu_cluster().matmul is None
    (5000000000.0, True)
    """
    return Cluster(8, 2**30, 5e9, AlphaBeta(100e-6, 2e9), AlphaBeta(100e-6, 2e9))


@dataclass(frozen=True)
class Layout:
    """Degrees of data, tensor, pipeline and context parallelism; ZeRO stage; micro-batch; checkpointing;
    ``interleave``: the model chunks (virtual stages) each pipeline rank holds in an interleaved 1F1B schedule.

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
    interleave: int = 1

    def __post_init__(self) -> None:
        for name in ("data", "tensor", "pipeline", "context", "micro_batch", "accumulation", "interleave"):
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
        chunks = f" ({self.interleave} chunks)" if self.interleave > 1 else ""
        return (
            f"{' x '.join(degrees)}{chunks}, ZeRO-{self.zero}, micro-batch {self.micro_batch} x {self.accumulation}"
            f" accumulation, checkpointing {self.checkpointing}"
        )


@dataclass(frozen=True)
class Prediction:
    """What :func:`predict` returns: bytes per rank by part, seconds per step by part, throughput; ``idealized``
    when the cluster has no :class:`MatmulEfficiency` (every product at its flat ``efficiency``)."""

    layout: Layout
    memory: dict[str, int]
    time: dict[str, float]
    tokens_per_second: float
    mfu: float
    idealized: bool = False

    @property
    def memory_total(self) -> int:
        return sum(self.memory.values())

    @property
    def step_time(self) -> float:
        return sum(self.time.values())


class PlanError(ValueError):
    """No layout fits: the message says what the smallest one needs and what the device has."""


def check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a course_lib.transformer.TransformerConfig, got {type(config).__name__}")
    return config


def check_precision(precision: object) -> Precision:
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
    c = check_config(config)
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a Layout, got {type(layout).__name__}")
    seq_len = check_int("seq_len", seq_len, minimum=1)
    global_batch = check_int("global_batch", global_batch, minimum=1)
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
    v = layout.interleave
    if v > 1:
        if layout.pipeline == 1:
            raise ValueError(f"interleave {v} needs a pipeline (pipeline > 1)")
        if c.n_layers % (layout.pipeline * v):
            raise ValueError(f"pipeline {layout.pipeline} x interleave {v} must divide n_layers ({c.n_layers})")
        if layout.accumulation % layout.pipeline:
            raise ValueError(
                f"an interleaved schedule runs the micro-batches in groups of {layout.pipeline}: accumulation"
                f" {layout.accumulation} must be a multiple of it"
            )
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
