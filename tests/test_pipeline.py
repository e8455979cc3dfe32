from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from course_lib.pipeline import (
    Task,
    bubble_fraction,
    gpipe_schedule,
    idle_fraction,
    makespan,
    min_micro_batches,
    plot_gantt,
)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (3, 5), (4, 8), (8, 2)])
def test_simulated_gpipe_idle_equals_the_formula(p: int, m: int) -> None:
    tasks = gpipe_schedule(p, m, forward_time=1.0, backward_time=2.0)
    assert len(tasks) == 2 * p * m
    assert idle_fraction(tasks) == pytest.approx(bubble_fraction(p, m))
    assert makespan(tasks) == pytest.approx((m + p - 1) * 3.0)


def test_bubble_formula_values() -> None:
    assert bubble_fraction(1, 7) == 0.0
    assert bubble_fraction(2, 1) == 0.5
    assert bubble_fraction(2, 3) == pytest.approx(0.25)
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)


def test_schedule_respects_dependencies_and_one_task_per_stage() -> None:
    tasks = gpipe_schedule(3, 4, forward_time=[1.0, 2.0, 1.5], backward_time=[2.0, 1.0, 3.0])
    by = {(t.stage, t.micro, t.kind): t for t in tasks}
    for (s, i, kind), t in by.items():
        if kind == "F" and s > 0:
            assert t.start >= by[(s - 1, i, "F")].end
        if kind == "B" and s < 2:
            assert t.start >= by[(s + 1, i, "B")].end
        if kind == "B" and s == 2:
            assert t.start >= by[(s, i, "F")].end
    for s in range(3):
        mine = sorted((t for t in tasks if t.stage == s), key=lambda t: t.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))
        assert [t.kind for t in mine] == ["F"] * 4 + ["B"] * 4  # GPipe: all forwards, then all backwards
        assert [t.micro for t in mine if t.kind == "B"] == [3, 2, 1, 0]
    # unequal stages: the slow stage sets the pace, the bubble is larger than the formula's
    assert idle_fraction(tasks) > bubble_fraction(3, 4)


def test_naive_split_keeps_one_stage_busy_at_a_time() -> None:
    tasks = gpipe_schedule(4, 1)
    spans = sorted((t.start, t.end) for t in tasks)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert idle_fraction(tasks) == pytest.approx(0.75)


def test_idle_fraction_of_measured_tasks() -> None:
    tasks = [
        Task(0, 0, "F", 10.0, 11.0),
        Task(1, 0, "F", 11.5, 12.5),
        Task(1, 0, "B", 12.5, 13.5),
        Task(0, 0, "B", 14.0, 15.0),
    ]
    assert makespan(tasks) == 5.0
    assert idle_fraction(tasks) == pytest.approx(1 - 4 / 10)
    assert idle_fraction(tasks, n_stages=4) == pytest.approx(1 - 4 / 20)


def test_min_micro_batches() -> None:
    assert min_micro_batches(2, 0.5) == 1
    assert min_micro_batches(2, 0.2) == 4
    assert min_micro_batches(4, 0.1) == 27
    assert bubble_fraction(4, 27) <= 0.1 < bubble_fraction(4, 26)


def test_plot_gantt_draws_one_bar_per_task() -> None:
    import matplotlib.pyplot as plt

    tasks = gpipe_schedule(2, 3)
    ax = plot_gantt(tasks)
    assert len(ax.collections) == len(tasks)
    assert "idle 25%" in ax.get_title()
    assert ax.get_xlabel() == "time (time slots)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 1", "stage 0"]
    plt.close(ax.figure)


def test_zero_bubble_and_interleaved_tasks_are_drawn() -> None:
    import matplotlib.pyplot as plt

    split = [Task(0, 0, "F", 0.0, 1.0), Task(0, 0, "B", 1.0, 2.0), Task(0, 0, "W", 2.0, 3.0, chunk=1)]
    ax = plot_gantt(split, title="one stage")
    assert len(ax.collections) == 3 and ax.get_title() == "one stage"
    assert [c.get_hatch() for c in ax.collections] == [None, None, "//"]
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="chunk must be"):
        Task(0, 0, "F", 0.0, 1.0, chunk=-1)


def test_validation() -> None:
    with pytest.raises(TypeError, match="n_stages must be an int"):
        bubble_fraction(2.0, 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_micro must be >= 1"):
        bubble_fraction(2, 0)
    with pytest.raises(ValueError, match="one time per stage"):
        gpipe_schedule(2, 2, forward_time=[1.0])
    with pytest.raises(ValueError, match="must be > 0"):
        gpipe_schedule(2, 2, backward_time=0)
    with pytest.raises(TypeError, match="forward_time must be a number"):
        gpipe_schedule(2, 2, forward_time="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind must be"):
        Task(0, 0, "X", 0.0, 1.0)
    with pytest.raises(ValueError, match="cannot end"):
        Task(0, 0, "F", 2.0, 1.0)
    with pytest.raises(ValueError, match="stage must be"):
        Task(-1, 0, "F", 0.0, 1.0)
    with pytest.raises(ValueError, match="empty"):
        idle_fraction([])
    with pytest.raises(TypeError, match="Task"):
        makespan([(0, 0, "F", 0.0, 1.0)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="overlap"):
        idle_fraction([Task(0, 0, "F", 0.0, 2.0), Task(0, 1, "F", 1.0, 3.0)])
    with pytest.raises(ValueError, match="n_stages is 1"):
        idle_fraction([Task(1, 0, "F", 0.0, 1.0)], n_stages=1)
    with pytest.raises(ValueError, match="max_bubble must be in"):
        min_micro_batches(2, 0.0)
    with pytest.raises(TypeError, match="max_bubble must be a number"):
        min_micro_batches(2, "0.1")  # type: ignore[arg-type]
