from __future__ import annotations

import pytest
import torch

from course_lib.allreduce_sim import (
    Snapshot,
    chunk_bounds,
    parameter_server_all_reduce,
    parameter_server_bytes_formula,
    render_snapshot,
    ring_all_reduce,
    ring_bytes_formula,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("numel", [1, 5, 12, 100])
def test_ring_equals_sum_and_mean(n: int, numel: int) -> None:
    g = torch.Generator().manual_seed(n * 100 + numel)
    grads = [torch.randn(numel, generator=g) for _ in range(n)]
    expected = torch.stack(grads).sum(0)
    r = ring_all_reduce(grads)
    for out in r.outputs:
        torch.testing.assert_close(out, expected)
    m = ring_all_reduce(grads, op="mean")
    torch.testing.assert_close(m.outputs[-1], expected / n)
    assert r.steps == (2 * (n - 1) if numel >= 1 else 0)
    # the inputs are not modified
    assert torch.equal(grads[0], torch.randn(numel, generator=torch.Generator().manual_seed(n * 100 + numel)))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_bytes_match_formula_when_divisible(n: int) -> None:
    numel = 24 * n
    r = ring_all_reduce([torch.ones(numel) for _ in range(n)])
    s = numel * 4
    assert r.tensor_bytes == s
    assert r.sent_bytes == [ring_bytes_formula(s, n)] * n
    assert r.received_bytes == r.sent_bytes
    assert len(r.transfers) == 2 * (n - 1) * n


def test_ring_bytes_uneven_chunks_are_close_to_formula() -> None:
    r = ring_all_reduce([torch.ones(10) for _ in range(3)])  # chunks of 4, 3, 3 elements
    assert sum(r.sent_bytes) == 3 * ring_bytes_formula(40, 3)
    assert max(r.sent_bytes) <= ring_bytes_formula(40, 3) + 2 * 4


def test_ring_keeps_shape_and_dtype_and_integer_mean() -> None:
    grads = [torch.full((2, 3), i, dtype=torch.int64) for i in range(4)]
    r = ring_all_reduce(grads, op="mean")
    assert r.outputs[0].shape == (2, 3) and r.outputs[0].dtype == torch.int64
    assert torch.all(r.outputs[0] == 1)  # (0+1+2+3)//4


def test_ring_snapshots_show_progress() -> None:
    n = 4
    r = ring_all_reduce([torch.ones(8) for _ in range(n)])
    assert len(r.snapshots) == 2 * (n - 1) + 1
    after_reduce = r.snapshots[n - 1]
    assert after_reduce.phase == "scatter-reduce"
    for w in range(n):  # worker w owns the full sum of chunk w+1
        assert after_reduce.contributions[w][(w + 1) % n] == frozenset(range(n))
    assert all(c == frozenset(range(n)) for row in r.snapshots[-1].contributions for c in row)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_parameter_server(n: int) -> None:
    grads = [torch.full((6,), float(i)) for i in range(n)]
    r = parameter_server_all_reduce(grads, op="mean")
    for out in r.outputs:
        torch.testing.assert_close(out, torch.full((6,), (n - 1) / 2))
    assert r.sent_bytes == [24] * n and r.received_bytes == [24] * n
    assert r.server_sent_bytes == r.server_received_bytes == n * 24
    f = parameter_server_bytes_formula(24, n)
    assert f == {"worker": 24.0, "server": float(n * 24)}
    assert r.steps == 2


def test_formulas() -> None:
    assert ring_bytes_formula(100, 1) == 0
    assert ring_bytes_formula(100, 2) == 100
    assert ring_bytes_formula(100, 4) == 150
    with pytest.raises(ValueError, match="workers"):
        ring_bytes_formula(100, 0)
    with pytest.raises(ValueError, match="nbytes"):
        parameter_server_bytes_formula(-1, 2)


def test_chunk_bounds() -> None:
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    for numel, n in [(0, 3), (7, 7), (100, 6)]:
        sizes = [hi - lo for lo, hi in chunk_bounds(numel, n)]
        assert sizes == [len(c) for c in torch.tensor_split(torch.arange(numel), n)]
    with pytest.raises(ValueError, match="n must be"):
        chunk_bounds(3, 0)
    with pytest.raises(TypeError, match="numel"):
        chunk_bounds(3.0, 2)  # type: ignore[arg-type]


def test_validation() -> None:
    with pytest.raises(TypeError, match="list of tensors"):
        ring_all_reduce(torch.ones(3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        ring_all_reduce([])
    with pytest.raises(TypeError, match=r"tensors\[1\]"):
        ring_all_reduce([torch.ones(3), [1, 2, 3]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="same shape"):
        parameter_server_all_reduce([torch.ones(3), torch.ones(4)])
    with pytest.raises(ValueError, match="op must be"):
        ring_all_reduce([torch.ones(3)], op="max")


def test_render_snapshot() -> None:
    r = ring_all_reduce([torch.ones(3) for _ in range(3)])
    text = render_snapshot(r.snapshots[2])
    assert text.splitlines()[0] == "step 2 (scatter-reduce)"
    assert "0+1+2*" in text and "messages: 0->1[c2], 1->2[c0], 2->0[c1]" in text
    widths = {len(render_snapshot(s).splitlines()[2]) for s in r.snapshots}
    assert len(widths) == 1  # stable layout from step to step, for a slider
    ps = render_snapshot(parameter_server_all_reduce([torch.ones(2)] * 2).snapshots[1])
    assert "0->S" in ps
    with pytest.raises(TypeError, match="Snapshot"):
        render_snapshot("step 1")  # type: ignore[arg-type]
    assert isinstance(r.snapshots[0], Snapshot)
