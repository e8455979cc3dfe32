"""The checks of notebook 15's exercises (FSDP2, DTensor) accept right answers, name the mistake in wrong ones, and
hold the truth PyTorch itself computes: DTensor's local shapes, the collectives of `redistribute` and of FSDP2's step,
each measured here on a fake process group (one process, collectives that move nothing)."""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from checks import assert_check
from course_lib.exercises.fsdp2_dtensor import (
    COLLECTIVES,
    LOCAL_SHAPE_CASES,
    REDISTRIBUTIONS,
    check_fsdp2_step,
    check_local_shape,
    check_redistribute_collectives,
)
from course_lib.torch_private import clear_dtensor_caches, fake_process_group


@contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """This process as ``rank`` of a fake ``world_size`` world, torn down (DTensor's caches first) however it ends."""
    fake_process_group(world_size, rank)
    try:
        yield
    finally:
        clear_dtensor_caches()
        dist.destroy_process_group()


def _blank(*args: object) -> object:
    raise NotImplementedError


# -- A. local shapes -----------------------------------------------------------------------------------------------


def _chunks(n: int, k: int) -> list[int]:
    """The sizes torch.chunk gives, padded with empty pieces to k (DTensor's rule)."""
    sizes = [len(c) for c in torch.arange(n).chunk(k)]
    return sizes + [0] * (k - len(sizes))


def _local_shape(shape: Sequence[int], mesh: Sequence[int], placements: Sequence[Any], coord: Sequence[int]) -> Any:
    local = list(shape)
    for k, p, c in zip(mesh, placements, coord):
        if p != "R":
            local[p] = _chunks(local[p], k)[c]
    return tuple(local)


def _placements(placements: Sequence[Any]) -> list[Placement]:
    return [Replicate() if p == "R" else Shard(p) for p in placements]


def _dtensor_local_shape(shape: Any, mesh_shape: Any, placements: Any, coord: Any) -> tuple[int, ...]:
    """The shape DTensor gives: this process as the rank at `coord` of a fake world, a meta tensor distributed."""
    rank = 0
    for size, c in zip(mesh_shape, coord):
        rank = rank * size + c
    with fake_world(math.prod(mesh_shape), rank):
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        assert tuple(mesh.get_coordinate() or ()) == tuple(coord)
        piece = distribute_tensor(torch.empty(shape, device="meta"), mesh, _placements(placements), src_data_rank=None)
        return tuple(piece.to_local().shape)


def test_local_shape_reference_is_dtensors_own_for_every_coordinate() -> None:
    # the reference above (accepted by the check below) against DTensor's own computation, on every rank of each mesh
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset  # private: tests only

    for shape, mesh, placements, _ in LOCAL_SHAPE_CASES:
        for coord in itertools.product(*(range(k) for k in mesh)):
            theirs = _compute_local_shape_and_global_offset(shape, mesh, list(coord), _placements(placements))[0]
            assert tuple(theirs) == _local_shape(shape, mesh, placements, coord), (shape, mesh, placements, coord)


def _floor(shape: Any, mesh: Any, placements: Any, coord: Any) -> Any:
    local = list(shape)
    for k, p in zip(mesh, placements):
        if p != "R":
            local[p] //= k
    return tuple(local)


def _tensor_split(shape: Any, mesh: Any, placements: Any, coord: Any) -> Any:
    local = list(shape)
    for k, p, c in zip(mesh, placements, coord):
        if p != "R":
            local[p] = len(torch.arange(local[p]).tensor_split(k)[c])
    return tuple(local)


def _replicate_as_shard(shape: Any, mesh: Any, placements: Any, coord: Any) -> Any:
    return _local_shape(shape, mesh, [0 if p == "R" else p for p in placements], coord)


def _same_dim_on_global(shape: Any, mesh: Any, placements: Any, coord: Any) -> Any:
    local = list(shape)
    for k, p, c in zip(mesh, placements, coord):
        if p != "R":
            local[p] = _chunks(shape[p], k)[c]  # the global size, each time
    return tuple(local)


def _flat(shape: Any, mesh: Any, placements: Any, coord: Any) -> Any:
    local = list(shape)
    if len(mesh) == 2 and placements[0] == placements[1] != "R":
        local[placements[0]] = _chunks(shape[placements[0]], mesh[0] * mesh[1])[coord[0] * mesh[1] + coord[1]]
        return tuple(local)
    return _local_shape(shape, mesh, placements, coord)


def _negative(shape: Any, mesh: Any, placements: Any, coord: Any) -> Any:
    local = list(shape)
    for k, p, c in zip(mesh, placements, coord):
        if p != "R":
            step = -(-local[p] // k)
            local[p] = min(step, local[p] - c * step)  # not clamped at 0
    return tuple(local)


def test_local_shape() -> None:
    assert_check(
        check_local_shape,
        right=[
            _local_shape,
            _dtensor_local_shape,  # DTensor itself: the check's reference agrees with it on every case
            lambda *a: list(_local_shape(*a)),
            lambda *a: torch.Size(_local_shape(*a)),
        ],
        right_says="3, 3, 3, 1",
        not_done=[_blank, ..., None, lambda *a: None],
        wrong=[
            (_floor, "n // k rounds down"),
            (_tensor_split, "torch.tensor_split"),
            (_replicate_as_shard, 'Replicate ("R") splits nothing'),
            (_same_dim_on_global, "not the global size"),
            (_flat, "not once over all the ranks"),
            (_negative, "not negative"),
            (lambda s, m, p, c: s, "cut like torch.chunk"),
            (lambda s, m, p, c: _local_shape(s, m, p, c)[0], "a tuple of ints"),
            (lambda s, m, p, c: (True,) * len(s), "a tuple of ints"),
            (lambda s, m, p, c: _local_shape(s, m, p, c) + (1,), "as many dimensions"),
            (lambda s, m, p, c: 1 // 0, "ZeroDivisionError"),
        ],
    )
    assert not dist.is_initialized()


# -- B. redistribute's collectives ---------------------------------------------------------------------------------

_PLACEMENT = {"Shard(0)": Shard(0), "Shard(1)": Shard(1), "Replicate()": Replicate(), "Partial()": Partial()}
_NAMES = {
    "all_gather_into_tensor": "all_gather",
    "all_reduce": "all_reduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "shard_dim_alltoall": "all_to_all",
}


def _recorded(comm: CommDebugMode) -> str:
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    assert sum(counts.values()) <= 1, counts  # at most one collective each
    return _NAMES[next(iter(counts))] if counts else "none"


def _redistribute(mesh: DeviceMesh, key: str) -> tuple[str, torch.Tensor]:
    """The collective recorded for one placement change on a 1-D mesh of 4, and the local result."""
    source, target = (_PLACEMENT[p] for p in key.split(" -> "))
    local = torch.arange(8.0, device=mesh.device_type).reshape(2, 4)
    t = DTensor.from_local(local, mesh, [source], run_check=False)
    if target.is_partial():
        # redistribute() refuses a target of Partial ("for internal use only"); DTensor's operators reach it through
        # redistribute_local_tensor, which is measured instead
        from torch.distributed.tensor._dtensor_spec import DTensorSpec  # private: tests only
        from torch.distributed.tensor._redistribute import redistribute_local_tensor

        with pytest.raises(RuntimeError, match="internal use only"):
            t.redistribute(mesh, [target])
        with CommDebugMode() as comm:
            out = redistribute_local_tensor(
                local, t._spec, DTensorSpec(mesh, (target,), tensor_meta=t._spec.tensor_meta)
            )
        return _recorded(comm), out
    with CommDebugMode() as comm:
        out = t.redistribute(mesh, [target]).to_local()
    return _recorded(comm), out


def _measured(device_type: str) -> dict[str, str]:
    with fake_world(4):
        mesh = DeviceMesh(device_type, list(range(4)))
        return {key: _redistribute(mesh, key)[0] for key in REDISTRIBUTIONS}


def test_the_table_of_collectives_is_what_dtensor_runs() -> None:
    # on an accelerator's code path ("meta": no kernels run, the collectives are those CUDA devices get)
    measured = _measured("meta")
    assert set(measured.values()) <= set(COLLECTIVES)
    assert check_redistribute_collectives(measured), measured
    # on a CPU mesh DTensor falls back to an all-gather (2.13), and the check says so
    on_cpu = _measured("cpu")
    assert {k: v for k, v in on_cpu.items() if v != measured[k]} == {"Shard(0) -> Shard(1)": "all_gather"}
    assert "falls back to an all-gather" in check_redistribute_collectives(on_cpu).message
    with fake_world(4):  # Replicate -> Partial(sum) is local: each rank divides its copy by N
        _, out = _redistribute(DeviceMesh("cpu", list(range(4))), "Replicate() -> Partial()")
        assert torch.equal(out, torch.arange(8.0).reshape(2, 4) / 4)
    assert not dist.is_initialized()


RIGHT = {
    "Shard(0) -> Replicate()": "all_gather",
    "Partial() -> Replicate()": "all_reduce",
    "Partial() -> Shard(0)": "reduce_scatter",
    "Replicate() -> Shard(0)": "none",
    "Shard(0) -> Shard(1)": "all_to_all",
    "Replicate() -> Partial()": "none",
}


def test_redistribute_collectives() -> None:
    assert list(RIGHT) == list(REDISTRIBUTIONS)
    spelled = {**RIGHT, "Shard(0) -> Replicate()": "All-Gather", "Shard(0) -> Shard(1)": "alltoall"}
    half = {**dict.fromkeys(REDISTRIBUTIONS, ...), "Shard(0) -> Replicate()": "all_gather"}
    assert_check(
        check_redistribute_collectives,
        right=[RIGHT, spelled, {**RIGHT, "extra": "ignored"}],
        right_says="all-to-all",
        not_done=[..., None, {k: ... for k in REDISTRIBUTIONS}, dict.fromkeys(REDISTRIBUTIONS)],
        wrong=[
            ({**RIGHT, "Replicate() -> Shard(0)": "reduce_scatter"}, "keeps its own chunk"),
            ({**RIGHT, "Shard(0) -> Shard(1)": "all_gather"}, "falls back to an all-gather"),
            ({**RIGHT, "Partial() -> Replicate()": "all_gather"}, "the sum, on every rank, is an all-reduce"),
            ({**RIGHT, "Partial() -> Shard(0)": "all_reduce"}, "half an all-reduce"),
            ({**RIGHT, "Shard(0) -> Replicate()": "all_reduce"}, "nothing is added up"),
            ({**RIGHT, "Replicate() -> Partial()": "all_reduce"}, "divides its copy by N"),
            ({**RIGHT, "Replicate() -> Shard(0)": "broadcast"}, "give one of"),
            ({**RIGHT, "Replicate() -> Shard(0)": 0}, "give one of"),
            (half, "still to answer: 'Partial() -> Replicate()'"),
            ({**half, "Partial() -> Shard(0)": "all_gather"}, "Partial() -> Shard(0): not 'all_gather'"),
            ({k: RIGHT[k] for k in REDISTRIBUTIONS[:3]}, "no answer for"),
            (list(RIGHT.values()), "should be a dict"),
        ],
    )


# -- C. one FSDP2 step ---------------------------------------------------------------------------------------------


def _step(units: list[int], n: int, reshard: bool, param_bytes: int = 2, grad_bytes: int = 4) -> dict[str, float]:
    gathers = 2 if reshard else 1
    return {
        "all_gather": gathers * len(units) if n > 1 else 0,
        "reduce_scatter": len(units) if n > 1 else 0,
        "sent_bytes": (n - 1) / n * (gathers * param_bytes + grad_bytes) * sum(units),
        "peak_gathered_bytes": param_bytes * (max(units) if reshard else sum(units)),
    }


class _Unit(torch.nn.Module):
    def __init__(self, numel: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.sum()


def _fsdp2_counts(units: list[int], n: int, reshard: bool) -> dict[str, int]:
    """The collectives FSDP2 runs in one step (after a first one) on a fake world of n ranks."""
    with fake_world(n):
        mesh = init_device_mesh("cpu", (n,))
        model = torch.nn.Sequential(*(_Unit(p) for p in units))
        for unit in model:
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh)  # the root: no parameters of its own
        x = torch.ones(2, requires_grad=True)
        model(x).sum().backward()
        with CommDebugMode() as comm, warnings.catch_warnings():
            # under CommDebugMode the root's output is a view, which FSDP2 warns about (in-place ops): none here
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
            model(x).sum().backward()
        counts = {str(op).split(".")[-1]: c for op, c in comm.get_comm_counts().items()}
        assert set(counts) <= {"_allgather_base_", "_reduce_scatter_base_"}, counts
        return {
            "all_gather": counts.get("_allgather_base_", 0),
            "reduce_scatter": counts.get("_reduce_scatter_base_", 0),
        }


def _measured_step(units: list[int], n: int, reshard: bool, param_bytes: int = 2, grad_bytes: int = 4) -> Any:
    return {**_step(units, n, reshard, param_bytes, grad_bytes), **_fsdp2_counts(units, n, reshard)}


def test_fsdp2_counts_are_what_fsdp2_runs() -> None:
    assert _fsdp2_counts([40, 24, 8], 4, True) == {"all_gather": 6, "reduce_scatter": 3}
    assert _fsdp2_counts([40, 24, 8], 4, False) == {"all_gather": 3, "reduce_scatter": 3}
    assert _fsdp2_counts([40, 24], 1, True) == {"all_gather": 0, "reduce_scatter": 0}  # one rank: none at all
    assert not dist.is_initialized()


def _changed(key: str, value: Any) -> Any:
    def answer(units: list[int], n: int, reshard: bool, param_bytes: int = 2, grad_bytes: int = 4) -> Any:
        right = _step(units, n, reshard, param_bytes, grad_bytes)
        new = value(units, n, reshard, param_bytes, grad_bytes, right) if callable(value) else value
        return {**right, key: new}

    return answer


def test_fsdp2_step() -> None:
    frac = lambda n: (n - 1) / n  # noqa: E731
    assert_check(
        check_fsdp2_step,
        right=[
            _step,
            _measured_step,  # FSDP2's own counts, on a fake world of each case's size
            lambda *a, **k: {key: torch.tensor(v) for key, v in _step(*a, **k).items()},
            lambda *a, **k: {**_step(*a, **k), "note": "extra keys are ignored"},
        ],
        right_says="2 all-gathers and 1 reduce-scatter per unit",
        not_done=[_blank, ..., lambda *a, **k: None],
        wrong=[
            (_changed("all_gather", lambda u, n, r, pb, gb, right: len(u) if n > 1 else 0), "2 per unit"),
            (_changed("all_gather", lambda u, n, r, pb, gb, right: 2 * len(u) if n > 1 else 0), "1 per unit"),
            (_changed("all_gather", lambda u, n, r, pb, gb, right: right["all_gather"] + 2), "the root"),
            (_changed("reduce_scatter", lambda u, n, r, pb, gb, right: 2 * len(u) if n > 1 else 0), "once per step"),
            (
                _changed("all_gather", lambda u, n, r, pb, gb, right: (2 if r else 1) * len(u)),
                "on one rank FSDP2 runs no collective at all",
            ),
            (
                _changed("sent_bytes", lambda u, n, r, pb, gb, right: ((2 if r else 1) * pb + gb) * sum(u)),
                "(N-1)/N of S",
            ),
            (
                _changed("sent_bytes", lambda u, n, r, pb, gb, right: frac(n) * ((2 if r else 1) + 1) * gb * sum(u)),
                "count them in param_bytes",
            ),
            (
                _changed("sent_bytes", lambda u, n, r, pb, gb, right: frac(n) * ((2 if r else 1) + 1) * pb * sum(u)),
                "count them in grad_bytes",
            ),
            (
                _changed("sent_bytes", lambda u, n, r, pb, gb, right: frac(n) * (pb + gb) * sum(u)),
                "2 all-gathers per unit with True",
            ),
            (_changed("sent_bytes", lambda u, n, r, pb, gb, right: right["sent_bytes"] or 1.0), "nobody to send to"),
            (_changed("peak_gathered_bytes", lambda u, n, r, pb, gb, right: pb * max(u)), "the sum of the units"),
            (_changed("peak_gathered_bytes", lambda u, n, r, pb, gb, right: pb * sum(u)), "the largest unit's"),
            (
                _changed("peak_gathered_bytes", lambda u, n, r, pb, gb, right: right["peak_gathered_bytes"] / pb * gb),
                "in param_bytes, not grad_bytes",
            ),
            (
                _changed("peak_gathered_bytes", lambda u, n, r, pb, gb, right: right["peak_gathered_bytes"] / n),
                "not divided by N",
            ),
            (
                _changed(
                    "peak_gathered_bytes", lambda u, n, r, pb, gb, right: 0 if n == 1 else right["peak_gathered_bytes"]
                ),
                "still builds the unsharded parameters",
            ),
            (lambda units, n, r: _step(units, n, r), "TypeError"),  # no param_bytes / grad_bytes arguments
            (lambda *a, **k: list(_step(*a, **k).values()), "should return a dict"),
            (lambda *a, **k: {"all_gather": 1}, "returned no 'reduce_scatter'"),
            (_changed("sent_bytes", "lots"), "should return a number"),
        ],
    )
    assert not dist.is_initialized()
