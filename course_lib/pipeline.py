"""Pipeline schedules: who computes what when, the bubble it leaves, and its Gantt chart.

A model split into ``p`` stages (one per device) and a batch split into ``m`` micro-batches
gives ``2 * p * m`` tasks: the forward ``F`` and the backward ``B`` of each micro-batch on each
stage. A *schedule* says when each task runs. This module

* simulates the GPipe schedule (all forwards, then all backwards) from per-stage task times,
  respecting the two dependencies a pipeline has: stage ``s`` can run ``F`` of micro-batch ``i``
  only after stage ``s-1`` did, and ``B`` of micro-batch ``i`` only after stage ``s+1`` did;
  each stage runs one task at a time (:func:`gpipe_schedule`);
* gives the bubble of the textbook formula, ``(p - 1) / (m + p - 1)``, the fraction of the
  devices' time spent idle when every task of a kind takes the same time
  (:func:`bubble_fraction`);
* measures the idle fraction of any list of tasks, simulated or timed for real
  (:func:`idle_fraction`, :func:`makespan`);
* draws a schedule as a Gantt chart, one row per stage (:func:`plot_gantt`).

The same :class:`Task` records describe a simulated schedule and a measured one (start and end
times read from a clock in each process), so both go through the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .validation import check_int, check_number, is_number

__all__ = ["Task", "bubble_fraction", "gpipe_schedule", "idle_fraction", "makespan", "plot_gantt", "min_micro_batches"]

_KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class Task:
    """One forward (``kind="F"``) or backward (``kind="B"``) of one micro-batch on one stage.

    A zero-bubble schedule splits the backward: ``"B"`` is then its input-gradient half, ``"W"`` its
    weight-gradient half. ``chunk`` is the model chunk of an interleaved schedule (the stage's
    ``chunk``-th virtual stage; 0 otherwise). ``start`` and ``end`` are in any time unit (the same for
    every task of a schedule).
    """

    stage: int
    micro: int
    kind: str
    start: float
    end: float
    chunk: int = 0

    def __post_init__(self) -> None:
        check_int("stage", self.stage, minimum=0)
        check_int("micro", self.micro, minimum=0)
        check_int("chunk", self.chunk, minimum=0)
        if self.kind not in _KINDS:
            raise ValueError(
                f"kind must be 'F' (forward), 'B' (backward, or its input-gradient half) or 'W' (weight gradient), "
                f"got {self.kind!r}"
            )
        if not self.end >= self.start:
            raise ValueError(f"a task cannot end ({self.end}) before it starts ({self.start})")

    @property
    def duration(self) -> float:
        return self.end - self.start


MAX_SIMULATED_TASKS = 2_000_000  # gpipe_schedule simulates 2 x n_stages x n_micro tasks: a second or two at most


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """``(p - 1) / (m + p - 1)``: the idle fraction of a GPipe step with equal task times.

    Each stage is busy for ``m`` slots of the ``m + p - 1`` slots the step takes (forward and
    backward alike), so ``p - 1`` of every ``m + p - 1`` slots are bubble.

    >>> bubble_fraction(2, 1), bubble_fraction(4, 4)
    (0.5, 0.42857142857142855)
    """
    p = check_int("n_stages", n_stages, minimum=1)
    m = check_int("n_micro", n_micro, minimum=1)
    return (p - 1) / (m + p - 1)


def min_micro_batches(n_stages: int, max_bubble: float) -> int:
    """The fewest micro-batches that bring the GPipe bubble down to ``max_bubble`` or below."""
    p = check_int("n_stages", n_stages, minimum=1)
    check_number("max_bubble", max_bubble)
    if not 0 < max_bubble <= 1:
        raise ValueError(f"max_bubble must be in (0, 1], got {max_bubble}")
    if p == 1:
        return 1
    # (p - 1) / (m + p - 1) <= b  <=>  m >= (p - 1) (1 - b) / b: the closed form, then a step either way for rounding
    m = max(1, math.ceil((p - 1) * (1 - max_bubble) / max_bubble))
    while m > 1 and bubble_fraction(p, m - 1) <= max_bubble:
        m -= 1
    while bubble_fraction(p, m) > max_bubble:
        m += 1
    return m


def _times(name: str, value: Any, p: int) -> list[float]:
    if is_number(value):
        values = [float(value)] * p
    elif isinstance(value, Sequence) and not isinstance(value, str):
        values = [float(v) for v in value]
        if len(values) != p:
            raise ValueError(f"{name} must give one time per stage ({p}), got {len(values)}")
    else:
        raise TypeError(f"{name} must be a number or a sequence of {p} numbers, got {type(value).__name__}")
    if any(not v > 0 for v in values):
        raise ValueError(f"{name} must be > 0, got {values}")
    return values


def gpipe_schedule(
    n_stages: int,
    n_micro: int,
    forward_time: float | Sequence[float] = 1.0,
    backward_time: float | Sequence[float] = 2.0,
) -> list[Task]:
    """Simulate one GPipe step: every forward (micro-batches in order), then every backward.

    ``forward_time`` / ``backward_time``: the time of one micro-batch's forward / backward on a
    stage, one number for all stages or one per stage. Each task starts as soon as its input is
    ready and its stage is free. Backwards run in reverse micro-batch order (the last forward's
    backward first, as GPipe and ``torch.distributed.pipelining.ScheduleGPipe`` do). With
    ``n_micro=1`` this is the naive split: one stage works at a time.
    """
    p = check_int("n_stages", n_stages, minimum=1)
    m = check_int("n_micro", n_micro, minimum=1)
    if p * m > MAX_SIMULATED_TASKS // 2:
        raise ValueError(
            f"n_stages x n_micro = {p * m:,} is too many to simulate task by task (at most "
            f"{MAX_SIMULATED_TASKS // 2:,}); bubble_fraction({p}, {m}) gives the bubble in closed form"
        )
    f = _times("forward_time", forward_time, p)
    b = _times("backward_time", backward_time, p)
    free = [0.0] * p
    f_end: dict[tuple[int, int], float] = {}
    tasks: list[Task] = []
    for i in range(m):
        for s in range(p):
            start = max(free[s], f_end.get((s - 1, i), 0.0))
            end = start + f[s]
            f_end[(s, i)] = end
            free[s] = end
            tasks.append(Task(s, i, "F", start, end))
    b_end: dict[tuple[int, int], float] = {}
    for i in reversed(range(m)):
        for s in reversed(range(p)):
            ready = b_end[(s + 1, i)] if s + 1 < p else f_end[(s, i)]
            start = max(free[s], ready)
            end = start + b[s]
            b_end[(s, i)] = end
            free[s] = end
            tasks.append(Task(s, i, "B", start, end))
    return tasks


def _tasks(tasks: Iterable[Task]) -> list[Task]:
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable):
        raise TypeError(f"tasks must be an iterable of Task, got {type(tasks).__name__}")
    out = list(tasks)
    if not out:
        raise ValueError("tasks is empty: a schedule needs at least one task")
    if not all(isinstance(t, Task) for t in out):
        raise TypeError("every item of tasks must be a course_lib.pipeline.Task")
    return out


def makespan(tasks: Iterable[Task]) -> float:
    """Time from the first task's start to the last task's end."""
    ts = _tasks(tasks)
    return max(t.end for t in ts) - min(t.start for t in ts)


def idle_fraction(tasks: Iterable[Task], n_stages: int | None = None) -> float:
    """The fraction of ``n_stages * makespan`` in which no task runs: the measured bubble.

    ``n_stages`` defaults to the number of stages that appear in ``tasks``. Tasks of one stage
    must not overlap (a stage runs one task at a time).
    """
    ts = _tasks(tasks)
    stages = sorted({t.stage for t in ts})
    p = len(stages) if n_stages is None else check_int("n_stages", n_stages, minimum=1)
    if stages[-1] >= p:
        raise ValueError(f"a task runs on stage {stages[-1]} but n_stages is {p}")
    span = makespan(ts)
    if span <= 0:
        raise ValueError("the tasks take no time: cannot compute an idle fraction")
    busy = 0.0
    for s in stages:
        mine = sorted((t for t in ts if t.stage == s), key=lambda t: t.start)
        for a, c in zip(mine, mine[1:]):
            if c.start < a.end - 1e-9 * max(1.0, abs(a.end)):
                raise ValueError(f"tasks overlap on stage {s}: {a} and {c}")
        busy += sum(t.duration for t in mine)
    return 1.0 - busy / (p * span)


def plot_gantt(
    tasks: Iterable[Task],
    ax: Any = None,
    *,
    title: str | None = None,
    time_unit: str = "time slots",
    label_micro: bool = True,
) -> Any:
    """Draw a schedule: one row per stage, forwards in blue, backwards in orange, weight gradients in green,
    gaps = bubble; an interleaved schedule's odd chunks hatched.

    Returns the matplotlib ``Axes``. Stage 0 is the top row. The title defaults to one stating
    the idle fraction.
    """
    import matplotlib.pyplot as plt

    ts = _tasks(tasks)
    if not isinstance(time_unit, str) or not time_unit:
        raise ValueError("time_unit must be a non-empty string (for the x-axis label)")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 1.0 + 0.5 * (max(t.stage for t in ts) + 1)))
    p = max(t.stage for t in ts) + 1
    t0 = min(t.start for t in ts)
    colors = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}
    for t in ts:
        row = p - 1 - t.stage
        ax.broken_barh(
            [(t.start - t0, t.duration)],
            (row - 0.4, 0.8),
            facecolors=colors[t.kind],
            edgecolor="white",
            hatch="//" if t.chunk % 2 else None,
        )
        if label_micro and t.duration > 0:
            ax.text(
                t.start - t0 + t.duration / 2,
                row,
                f"{t.kind}{t.micro}",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {p - 1 - r}" for r in range(p)])
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_xlim(0, makespan(ts))
    if title is None:
        title = f"{p} stages, {1 + max(t.micro for t in ts)} micro-batches: idle {idle_fraction(ts, p):.0%}"
    ax.set_title(title)
    return ax
