"""The simulated compute device: layers of known duration, the timeline, and what is read from it."""

from __future__ import annotations

import threading
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from course_lib.simulated_compute import (  # noqa: E402
    LANES,
    SimulatedLayer,
    Span,
    Timeline,
    busy_seconds,
    delay,
    exposed_seconds,
    hidden_seconds,
    plot_timeline,
    simulated_mlp,
)


def test_delay_is_the_identity_and_takes_its_times() -> None:
    x = torch.randn(5, requires_grad=True)
    t0 = time.perf_counter()
    y = delay(x, forward_ms=30, backward_ms=0)
    forward_s = time.perf_counter() - t0
    assert torch.equal(y, x) and forward_s >= 0.030
    t0 = time.perf_counter()
    (y * 3).sum().backward()
    backward_s = time.perf_counter() - t0
    assert x.grad is not None and torch.equal(x.grad, torch.full((5,), 3.0))
    assert backward_s < 5.0  # 0 ms asked: no sleep (a loose bound, the machine may be busy)
    t0 = time.perf_counter()
    delay(x, 0, 40).sum().backward()
    assert time.perf_counter() - t0 >= 0.040


def test_the_sleep_releases_the_gil() -> None:
    # another Python thread keeps counting while a simulated layer "computes"
    stop, count = threading.Event(), [0]

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = count[0]
        delay(torch.ones(1), 100, 0)
        assert count[0] - before > 1000
    finally:
        stop.set()
        t.join()


def test_simulated_layer_records_spans_and_gradients_are_ready_after_its_backward() -> None:
    tl = Timeline(rank=3)
    layer = SimulatedLayer(nn.Linear(4, 2), forward_ms=5, backward_ms=20, timeline=tl, name="L7")
    ready_at: list[float] = []
    layer.module.weight.register_post_accumulate_grad_hook(lambda p: ready_at.append(tl.now()))
    layer(torch.randn(3, 4)).sum().backward()
    spans = tl.spans
    assert [(s.rank, s.lane, s.label) for s in spans] == [(3, "compute", "F L7"), (3, "compute", "B L7")]
    assert spans[0].duration >= 0.005 and spans[1].duration >= 0.020
    assert ready_at and ready_at[0] >= spans[1].end  # the gradient comes at the end of the simulated backward


def test_simulated_mlp_is_seeded_and_sized() -> None:
    a, b = simulated_mlp(16, 3, 1, 1, seed=5), simulated_mlp(16, 3, 1, 1, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert sum(p.numel() for p in a.parameters()) == 3 * 16 * 17
    assert [layer.name for layer in a] == ["L0", "L1", "L2"]
    assert not torch.equal(next(simulated_mlp(16, 3, 1, 1, seed=6).parameters()), next(a.parameters()))


def test_timeline_clock_and_spans() -> None:
    tl = Timeline()
    tl.add("comm", "x", 0.5, 0.7)
    tl.add("compute", "y", 0.1, 0.2)
    assert [s.label for s in tl.spans] == ["y", "x"]  # ordered by start
    tl.spans.clear()  # a copy
    assert len(tl.spans) == 2
    tl.reset()
    assert tl.spans == [] and 0 <= tl.now() < 1.0
    with tl.span("compute", "block"):
        time.sleep(0.01)
    assert tl.spans[0].duration >= 0.01


def test_span_and_timeline_validation() -> None:
    assert LANES == ("compute", "comm")
    with pytest.raises(ValueError, match="lane must be one of"):
        Span(0, "disk", "x", 0, 1)
    with pytest.raises(ValueError, match="cannot end"):
        Span(0, "comm", "x", 2, 1)
    with pytest.raises(ValueError, match="rank must be >= 0"):
        Span(-1, "comm", "x", 0, 1)
    with pytest.raises(TypeError, match="label must be a string"):
        Timeline().add("comm", 3, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank must be an int"):
        Timeline(rank=True)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        delay([1.0], 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="forward_ms must be >= 0"):
        delay(torch.ones(1), -1, 1)
    with pytest.raises(TypeError, match="backward_ms must be a number"):
        delay(torch.ones(1), 1, "2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeline must be a Timeline"):
        delay(torch.ones(1), 1, 1, timeline="t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="label must be a string"):
        delay(torch.ones(1), 1, 1, label=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        SimulatedLayer(lambda x: x, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeline must be a Timeline"):
        SimulatedLayer(nn.Identity(), 1, 1, timeline=[])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a string"):
        SimulatedLayer(nn.Identity(), 1, 1, name=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"depth must be in \[1, 10000\]"):
        simulated_mlp(4, 0, 1, 1)
    with pytest.raises(ValueError, match="more than the 4 GiB"):
        simulated_mlp(2**15, 2, 1, 1)  # refused before a byte is allocated


SPANS = [
    Span(0, "compute", "F L0", 0.0, 1.0),
    Span(0, "compute", "B L1", 2.0, 4.0),
    Span(0, "comm", "bucket 0", 3.0, 5.0),  # 1 s hidden behind B L1, 1 s exposed
    Span(0, "comm", "bucket 1", 3.5, 4.5),  # inside the first one: adds nothing to busy time
    Span(1, "compute", "B L1", 0.0, 2.0),
    Span(1, "comm", "bucket 0", 1.0, 2.0),  # all of it hidden
]


def test_busy_hidden_and_exposed_seconds() -> None:
    assert busy_seconds(SPANS, "comm", rank=0) == 2.0
    assert busy_seconds(SPANS, "comm") == 3.0
    assert busy_seconds(SPANS, "compute", rank=1) == 2.0
    assert hidden_seconds(SPANS, rank=0) == 1.0 and hidden_seconds(SPANS, rank=1) == 1.0
    assert hidden_seconds(SPANS) == 2.0
    assert exposed_seconds(SPANS, end=5.0, rank=0) == 1.0
    assert exposed_seconds(SPANS, end=1.5, rank=1) == 0.0  # never negative
    with pytest.raises(ValueError, match="no compute span of rank 2"):
        exposed_seconds(SPANS, end=1.0, rank=2)
    with pytest.raises(TypeError, match="spans must be an iterable"):
        busy_seconds(3, "comm")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="every item of spans"):
        hidden_seconds([("compute", 0, 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="lane must be one of"):
        busy_seconds(SPANS, "gpu")


def test_plot_timeline_draws_a_row_per_rank_and_lane() -> None:
    ax = plot_timeline(SPANS)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "rank 1 comm",
        "rank 1 compute",
        "rank 0 comm",
        "rank 0 compute",
    ]
    assert ax.get_xlabel() == "time (ms)" and "1000.0 ms per rank" in ax.get_title()  # 2 s hidden over 2 ranks
    assert ax.get_xlim() == (0.0, 5000.0)
    plt.close(ax.figure)
    _, ax = plt.subplots()
    assert plot_timeline(SPANS, ax, title="t", time_unit="s", label=lambda s: "").get_title() == "t"
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="spans is empty"):
        plot_timeline([])
    with pytest.raises(ValueError, match="time_unit"):
        plot_timeline(SPANS, time_unit="us")


def test_record_collectives_patches_and_restores() -> None:
    import torch.distributed as dist

    from course_lib.simulated_compute import RECORDED_COLLECTIVES, record_collectives

    before = {name: getattr(dist, name) for name in RECORDED_COLLECTIVES}
    with record_collectives(Timeline()):
        assert all(getattr(dist, name) is not before[name] for name in RECORDED_COLLECTIVES)
    assert all(getattr(dist, name) is before[name] for name in RECORDED_COLLECTIVES)
    with pytest.raises(TypeError, match="timeline must be a Timeline"):
        with record_collectives([]):  # type: ignore[arg-type]
            pass
