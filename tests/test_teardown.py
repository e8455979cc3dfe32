"""The teardown every launched script ends with: it frees every group, and it says what holds one that survives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from course_lib.launch import LaunchError, run_ranks
from course_lib.teardown import OUTLIVED, end_process_group, holders

JOBS = """
import gc, weakref
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.hand_ddp import HandDDP

KEPT = []


def fsdp_step(rank, world_size, with_comm_debug_mode):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    mode = CommDebugMode() if with_comm_debug_mode else None
    for _ in range(2):
        if mode is not None:
            with mode:
                model(torch.randn(4, 8)).sum().backward()
        else:
            model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    return "trained"  # run_ranks's worker then ends the group; in strict mode it raises if one survives


def ddp_kept_in_a_global(rank, world_size):
    KEPT.append(DDP(torch.nn.Linear(4, 2)))


def hand_ddp_freed_without_the_collector(rank, world_size):
    gc.disable()
    try:
        model = torch.nn.Linear(4, 2)
        hand = HandDDP(model)
        hand(torch.randn(3, 4)).sum().backward()
        hand.finish()
        alive = weakref.ref(hand)
        del hand, model
        return alive() is None  # reference counting alone freed it: no cycle through the hooks
    finally:
        gc.enable()
"""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("teardown")
    (d / "teardown_jobs.py").write_text(textwrap.dedent(JOBS))
    return d


def test_without_a_group_there_is_nothing_to_end() -> None:
    assert end_process_group() is True
    assert end_process_group(barrier=False, strict=True) is True


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="barrier"):
        end_process_group(barrier=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="strict"):
        end_process_group(strict="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        holders(object(), limit=0)
    with pytest.raises(TypeError, match="max_hops"):
        holders(object(), max_hops=2.5)  # type: ignore[arg-type]


class _Thing:
    pass


def _held_by_a_local() -> list[str]:
    thing = _Thing()
    return holders(thing)


def test_holders_names_a_local_variable_and_a_global() -> None:
    assert any("a local variable of _held_by_a_local()" in chain for chain in _held_by_a_local())
    assert any("global 'KEEP_FOR_THE_TEST'" in chain for chain in holders(KEEP_FOR_THE_TEST[0]))


KEEP_FOR_THE_TEST = [_Thing()]


@pytest.mark.slow
@pytest.mark.parametrize("with_comm_debug_mode", [False, True])
def test_fsdp2_jobs_end_with_every_group_freed(jobs: Path, with_comm_debug_mode: bool) -> None:
    """Strict teardown (run_ranks's worker ends the group): DTensor's caches and CommDebugMode's hooks let it go."""
    out = run_ranks(
        f"{jobs}/teardown_jobs.py:fsdp_step",
        2,
        (with_comm_debug_mode,),
        timeout=180,
        env={"COURSE_LIB_STRICT_TEARDOWN": "1"},
        echo="none",
    )
    assert out == ["trained", "trained"]


@pytest.mark.slow
def test_a_model_kept_in_a_global_is_named_as_the_holder(jobs: Path) -> None:
    with pytest.raises(LaunchError) as info:
        run_ranks(
            f"{jobs}/teardown_jobs.py:ddp_kept_in_a_global",
            2,
            timeout=180,
            env={"COURSE_LIB_STRICT_TEARDOWN": "1"},
            echo="none",
        )
    assert OUTLIVED in str(info.value) and "global 'KEPT'" in str(info.value)


@pytest.mark.slow
def test_hand_ddp_is_freed_by_reference_counting_alone(jobs: Path) -> None:
    assert run_ranks(f"{jobs}/teardown_jobs.py:hand_ddp_freed_without_the_collector", 2, timeout=180, echo="none") == [
        True,
        True,
    ]
