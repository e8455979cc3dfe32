"""The latency-bandwidth (alpha-beta) model of communication: fit it, and predict collectives with it.

One message of ``m`` bytes takes ``alpha + m / beta`` seconds: ``alpha`` is the fixed cost of a
message (software, system calls, the network's latency), ``beta`` the bandwidth in bytes per second.
A collective is a sequence of steps, each step one message on the critical path, so its time is the
sum of its steps' times. Notebook 09 derives this, fits ``alpha`` and ``beta`` for gloo from measured
send/recv times, and compares the predictions with measured all-reduces;
:func:`fit_alpha_beta` and :func:`all_reduce_steps` are the canonical versions the notebook checks
its own lines against, and that its exercise and ``benchmarks/all_reduce.py`` reuse.

>>> link = AlphaBeta(alpha=10e-6, beta=1e9)       # 10 us per message, 1 GB/s
>>> round(link.time(1_000_000) * 1e6)               # 10 us + 1000 us
1010
>>> all_reduce_steps(4000, 4, "ring")               # 2(N-1) messages of S/N
[1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0]
>>> round(predict_all_reduce(link, 4000, 4, "ring") * 1e6)
66
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .validation import check_int, check_number

__all__ = ["AlphaBeta", "ALGORITHMS", "fit_alpha_beta", "all_reduce_steps", "predict_all_reduce", "predict_buckets"]

ALGORITHMS = ("ring", "tree", "parameter_server")


@dataclass(frozen=True)
class AlphaBeta:
    """A link: ``alpha`` seconds per message, ``beta`` bytes per second.

    ``max_rel_error`` is the largest ``|predicted - measured| / measured`` over the points of a fit
    (``0.0`` for a model written by hand).
    """

    alpha: float
    beta: float
    max_rel_error: float = 0.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "max_rel_error"):
            check_number(name, getattr(self, name), finite=True)
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0 seconds, got {self.alpha}")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0 bytes per second, got {self.beta}")

    def time(self, nbytes: float) -> float:
        """Seconds to send one message of ``nbytes`` bytes: ``alpha + nbytes / beta``."""
        check_number("nbytes", nbytes, finite=True)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        return self.alpha + nbytes / self.beta


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Least-squares fit of ``seconds = alpha + nbytes / beta`` in *relative* error.

    The sizes usually span several orders of magnitude, so each point is weighted by
    ``1 / seconds``: the fit minimizes ``sum(((alpha + n / beta) - t) / t) ** 2``, which is linear in
    ``alpha`` and ``1 / beta`` (two normal equations, solved exactly). Raises ``ValueError`` when the
    data do not have that shape (a negative latency or a non-positive bandwidth would fit better).

    >>> sizes = [0, 1000, 10_000, 100_000]
    >>> fit = fit_alpha_beta(sizes, [20e-6 + n / 2e9 for n in sizes])
    >>> round(fit.alpha * 1e6, 6), round(fit.beta / 1e9, 6), fit.max_rel_error < 1e-9
    (20.0, 2.0, True)
    """
    if isinstance(nbytes, (str, bytes)) or not isinstance(nbytes, Sequence):
        raise TypeError("nbytes must be a sequence of message sizes in bytes")
    if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Sequence):
        raise TypeError("seconds must be a sequence of times in seconds")
    if len(nbytes) != len(seconds):
        raise ValueError(f"nbytes and seconds must have the same length, got {len(nbytes)} and {len(seconds)}")
    xs = [float(check_number("each size", n, finite=True)) for n in nbytes]
    ts = [float(check_number("each time", t, finite=True)) for t in seconds]
    if any(x < 0 for x in xs):
        raise ValueError("every size must be >= 0 bytes")
    if any(t <= 0 for t in ts):
        raise ValueError("every time must be > 0 seconds")
    if len(set(xs)) < 2:
        raise ValueError("the fit needs at least two different message sizes")
    # rows (1/t, x/t) . (alpha, g) ~= 1, with g = 1/beta; normal equations of a 2x2 system
    a11 = sum(1 / t**2 for t in ts)
    a12 = sum(x / t**2 for x, t in zip(xs, ts))
    a22 = sum(x * x / t**2 for x, t in zip(xs, ts))
    b1 = sum(1 / t for t in ts)
    b2 = sum(x / t for x, t in zip(xs, ts))
    det = a11 * a22 - a12 * a12
    alpha = (b1 * a22 - b2 * a12) / det
    g = (a11 * b2 - a12 * b1) / det
    if alpha < 0 or g <= 0:
        raise ValueError(
            f"these times do not fit alpha + bytes/beta (alpha={alpha:.3g} s, 1/beta={g:.3g} s/B): "
            "too few sizes, or too noisy; measure more sizes, from a few bytes to megabytes"
        )
    worst = max(abs(alpha + x * g - t) / t for x, t in zip(xs, ts))
    return AlphaBeta(alpha=alpha, beta=1 / g, max_rel_error=worst)


def all_reduce_steps(nbytes: float, n: int, algorithm: str = "ring") -> list[float]:
    """The message sizes, in bytes, on the critical path of an all-reduce of ``nbytes`` over ``n`` ranks.

    * ``"ring"``: ``2(n-1)`` steps of ``nbytes / n`` (scatter-reduce, then all-gather; every rank
      sends and receives at once, so a step costs one message);
    * ``"tree"``: a binomial tree, ``ceil(log2 n)`` rounds to reduce onto rank 0 and as many to
      broadcast back, each round one message of ``nbytes``;
    * ``"parameter_server"``: rank 0 is the server (and a worker): it receives ``n-1`` gradients and
      sends ``n-1`` results, one after the other on its link: ``2(n-1)`` messages of ``nbytes``.

    >>> all_reduce_steps(800, 8, "tree"), all_reduce_steps(800, 2, "parameter_server")
    ([800.0, 800.0, 800.0, 800.0, 800.0, 800.0], [800.0, 800.0])
    """
    check_number("nbytes", nbytes, finite=True)
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    check_int("n", n, minimum=1)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if n == 1:
        return []
    if algorithm == "ring":
        return [nbytes / n] * (2 * (n - 1))
    if algorithm == "tree":
        return [float(nbytes)] * (2 * math.ceil(math.log2(n)))
    return [float(nbytes)] * (2 * (n - 1))


def predict_all_reduce(
    link: AlphaBeta, nbytes: float, n: int, algorithm: str = "ring", *, exchange: AlphaBeta | None = None
) -> float:
    """Seconds for one all-reduce: the sum of its steps' times (:func:`all_reduce_steps`).

    A tree's or a parameter server's step is one message in one direction: ``link.time(m)``. In a
    ring's step every rank sends to its right *and* receives from its left at once; on full-duplex
    links (NVLink, InfiniBand, Ethernet) that costs one message, so by default it is ``link.time(m)``
    too. Where sending and receiving share one resource (processes on one machine, whose "link" is the
    CPU copying bytes), pass ``exchange``: the model fitted to such simultaneous exchanges.
    """
    if not isinstance(link, AlphaBeta):
        raise TypeError(f"link must be an AlphaBeta, got {type(link).__name__}")
    if exchange is not None and not isinstance(exchange, AlphaBeta):
        raise TypeError(f"exchange must be an AlphaBeta or None, got {type(exchange).__name__}")
    step = (exchange or link) if algorithm == "ring" else link
    return sum(step.time(m) for m in all_reduce_steps(nbytes, n, algorithm))


def predict_buckets(
    link: AlphaBeta,
    bucket_bytes: Sequence[float],
    n: int,
    algorithm: str = "ring",
    *,
    exchange: AlphaBeta | None = None,
) -> float:
    """Seconds for DDP's gradient communication of one step: one all-reduce per bucket, one after the other.

    No overlap with backward is counted: this is the time the communication takes, not the part of
    it that the step waits for.

    >>> link = AlphaBeta(alpha=10e-6, beta=1e9)
    >>> round(predict_buckets(link, [1_000_000, 1_000_000], 2) * 1e6)   # 2 buckets x (2 alpha + S/beta)
    2040
    """
    if isinstance(bucket_bytes, (str, bytes)) or not isinstance(bucket_bytes, Sequence) or not bucket_bytes:
        raise TypeError("bucket_bytes must be a non-empty sequence of bucket sizes in bytes")
    return sum(predict_all_reduce(link, b, n, algorithm, exchange=exchange) for b in bucket_bytes)
