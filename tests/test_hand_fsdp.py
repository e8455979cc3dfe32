"""FSDP by hand against FSDP2's ``fully_shard``, on 2 gloo ranks (one launch for every check).

Tolerance: after 3 AdamW steps of 2 accumulated micro-batches the gathered parameters must be
**equal** to FSDP2's (max difference 0.0), both in fp32 and with bf16 compute and an fp32 master
(``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``): the same bf16 all-gather,
the same bf16 forward and backward, the same fp32 reduce-scatter and the same element-wise AdamW, so
the same bits. The test asserts exact equality, and it holds.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.hand_fsdp import SHARD_NAME, HandFSDP, shard_layout
from course_lib.launch import run_ranks
from course_lib.sharding import model_state_bytes
from course_lib.simulated_compute import Timeline, record_collectives


class Net(nn.Module):
    """Units: three layers of ``blocks`` (sizes not divisible by 2); the root keeps the tied embedding/head,
    a normalisation layer (BatchNorm's buffers in fp32; LayerNorm under bf16, which BatchNorm's
    fp32 statistics do not allow, in FSDP2 either) and a frozen weight."""

    def __init__(self, norm: str = "batch") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(11, 6)
        self.blocks = nn.Sequential(
            nn.Linear(6, 13),
            nn.BatchNorm1d(13) if norm == "batch" else nn.LayerNorm(13),
            nn.Tanh(),
            nn.Linear(13, 7),
            nn.Tanh(),
            nn.Linear(7, 6),
        )
        self.frozen = nn.Linear(6, 6)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.blocks(self.emb(idx).mean(1))))

    def units(self) -> list[nn.Module]:
        return [self.blocks[0], self.blocks[3], self.blocks[5]]


def _mlp(width: int = 64, depth: int = 3) -> nn.Sequential:  # notebook 14's model shape, smaller
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, width))


# -- without a process group ---------------------------------------------------------------------


def test_shard_layout() -> None:
    assert shard_layout([10, 3], 4) == (16, 4)
    assert shard_layout([91], 2) == (92, 46) and shard_layout([], 3) == (0, 0)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        shard_layout([1], 0)


def test_hand_fsdp_checks_its_arguments() -> None:
    m = _mlp()
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        HandFSDP("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="units must be a list"):
        HandFSDP(m, m[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="param_dtype must be a floating-point"):
        HandFSDP(m, [m[0]], param_dtype=torch.int8)
    with pytest.raises(TypeError, match="reshard_after_forward must be a bool"):
        HandFSDP(m, [m[0]], reshard_after_forward=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a submodule"):
        HandFSDP(m, [nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="the root unit"):
        HandFSDP(m, [m])
    with pytest.raises(ValueError, match="listed twice"):
        HandFSDP(m, [m[0], m[0]])
    with pytest.raises(RuntimeError, match="needs a process group"):
        HandFSDP(m, [m[0]])


# -- the worker, run on 2 gloo ranks -------------------------------------------------------------


def _fully_shard(model: nn.Module, units: list[nn.Module], world_size: int, **kwargs: Any) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))  # explicit: FSDP2 would pick a GPU if it saw one
    for u in units:
        fully_shard(u, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)


def _against_fsdp2(rank: int, world_size: int, bf16: bool) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32} if bf16 else {}
    finals: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, Any] = {}
    for kind in ("fsdp2", "hand"):
        model = Net("layer" if bf16 else "batch")
        if kind == "fsdp2":
            _fully_shard(
                model, model.units(), world_size, **({"mp_policy": MixedPrecisionPolicy(**policy)} if bf16 else {})
            )
        else:
            fsdp = HandFSDP(model, model.units(), **policy)
            out["names"] = [n for n, _ in model.named_parameters()]
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, weight_decay=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own data
            opt.zero_grad()
            for _ in range(2):  # accumulation over two micro-batches
                idx, y = torch.randint(0, 11, (8, 3), generator=g), torch.randint(0, 11, (8,), generator=g)
                F.cross_entropy(model(idx).float(), y).backward()
            opt.step()
        if kind == "fsdp2":
            finals[kind] = {
                n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in model.named_parameters()
            }
        else:
            full = fsdp.full_parameters()
            full.update({n: p.detach().clone() for n, p in model.named_parameters() if not n.endswith(SHARD_NAME)})
            finals[kind] = full
            out["log"] = fsdp.log.summary()
            out["units"] = fsdp.unit_numels()
            out["frozen_dtype"] = str(model.frozen.weight.dtype)
    out["same_names"] = sorted(finals["fsdp2"]) == sorted(finals["hand"])
    out["max_diff"] = max((finals["fsdp2"][k] - finals["hand"][k]).abs().max().item() for k in finals["fsdp2"])
    return out


def _bytes_and_counts(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.tensor.debug import CommDebugMode

    x, y = torch.randn(4, 64), torch.randn(4, 64)
    out: dict[str, Any] = {"numel": sum(p.numel() for p in _mlp().parameters())}
    # FSDP2's collectives in one step (after a first one), counted by CommDebugMode
    for reshard in (True, False):
        model = _mlp()
        _fully_shard(model, [m for m in model if isinstance(m, nn.Linear)], world_size, reshard_after_forward=reshard)
        F.mse_loss(model(x), y).backward()
        seen = Timeline(rank)
        with CommDebugMode() as comm, record_collectives(seen):
            F.mse_loss(model(x), y).backward()
        out[f"fsdp2_{reshard}"] = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
        out[f"fsdp2_{reshard}_recorded"] = [s.label for s in seen.spans]
    # ours, in bf16 both ways (the ZeRO-3 model's 2-byte parameters and gradients)
    for reshard in (True, False):
        model = _mlp()
        fsdp = HandFSDP(
            model,
            [m for m in model if isinstance(m, nn.Linear)],
            param_dtype=torch.bfloat16,
            reduce_dtype=torch.bfloat16,
            reshard_after_forward=reshard,
        )
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        F.mse_loss(model(x).float(), y).backward()
        opt.step()
        fsdp.reset_counters()
        F.mse_loss(model(x).float(), y).backward()
        opt.step()
        state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if v.dim() > 0)
        out[f"hand_{reshard}"] = {
            "log": fsdp.log.summary(),
            "peak": fsdp.peak_gathered_bytes,
            "now": fsdp.gathered_now_bytes,
            "shard_bytes": fsdp.shard_bytes,
            "state_bytes": state,
            "params_are_shards": [n for n, _ in model.named_parameters()],
        }
    return out


def _timeline(rank: int, world_size: int) -> list[tuple[str, str]]:
    timeline = Timeline(rank)
    model = _mlp(depth=2)
    HandFSDP(model, [model[0], model[2]], timeline=timeline)
    F.mse_loss(model(torch.randn(2, 64)), torch.zeros(2, 64)).backward()
    return [(s.lane, s.label) for s in timeline.spans]


def _refusals(rank: int, world_size: int) -> dict[str, str]:
    out = {}
    model = Net()
    try:
        HandFSDP(model, [model.emb])  # the embedding is tied to the head, which stays in the root
    except ValueError as e:
        out["shared"] = str(e)
    model = _mlp()
    HandFSDP(model, [model[0]])
    try:
        HandFSDP(model, [model[2]])
    except ValueError as e:
        out["twice"] = str(e)
    return out


def worker(rank: int, world_size: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore")  # FSDP2's hook warnings about patterns these small models do not use
    return {
        "fp32": _against_fsdp2(rank, world_size, bf16=False),
        "bf16": _against_fsdp2(rank, world_size, bf16=True),
        "bytes": _bytes_and_counts(rank, world_size),
        "refusals": _refusals(rank, world_size),
        "timeline": _timeline(rank, world_size),
    }


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    return run_ranks(f"{__file__}:worker", 2, timeout=240, echo="none")


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_equal_to_fully_shard(reports: list[dict[str, Any]], precision: str) -> None:
    for r in reports:
        rep = r[precision]
        assert rep["same_names"]
        assert rep["max_diff"] == 0.0
    rep = reports[0][precision]
    # the master shards replaced the trainable parameters; the frozen weight stayed, in fp32
    assert rep["names"] == [
        SHARD_NAME,  # the root's: registered on the model itself
        f"blocks.0.{SHARD_NAME}",
        f"blocks.3.{SHARD_NAME}",
        f"blocks.5.{SHARD_NAME}",
        "frozen.weight",
    ]
    assert rep["frozen_dtype"] == "torch.float32"
    # units: 6*13+13 = 91 elements padded to 92; 13*7+7 = 98; 7*6+6 = 48; the root: emb/head (tied: 66 once),
    # the BatchNorm's (or LayerNorm's) 26, the frozen layer's trainable bias 6
    assert rep["units"] == {"blocks.0": (91, 92), "blocks.3": (98, 98), "blocks.5": (48, 48), "root": (98, 98)}
    # per forward+backward: every unit gathered twice (the root once: it keeps its parameters until
    # backward), one reduce-scatter per unit; 6 forward+backward passes
    assert rep["log"]["all_gather"][0] == 6 * (3 * 2 + 1) and rep["log"]["reduce_scatter"][0] == 6 * 4


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_collective_counts_equal_fsdp2s(reports: list[dict[str, Any]]) -> None:
    b = reports[0]["bytes"]
    for reshard in (True, False):
        theirs, ours = b[f"fsdp2_{reshard}"], b[f"hand_{reshard}"]["log"]
        # CommDebugMode's names for FSDP2's all-gather and reduce-scatter on gloo
        assert theirs["_allgather_base_"] == ours["all_gather"][0] == (6 if reshard else 3)
        assert theirs["_reduce_scatter_base_"] == ours["reduce_scatter"][0] == 3
        # record_collectives sees the same calls, each of one Linear(64, 64) unit in fp32: 64 * 65 * 4 bytes
        recorded = b[f"fsdp2_{reshard}_recorded"]
        assert sorted(set(recorded)) == ["all_gather_single 16,640 B", "reduce_scatter_single 16,640 B"]
        assert recorded.count("all_gather_single 16,640 B") == (6 if reshard else 3)


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_bytes_and_peak_against_the_zero3_model(reports: list[dict[str, Any]]) -> None:
    b = reports[0]["bytes"]
    psi, n = b["numel"], 2
    hand = b["hand_True"]
    gathered, reduced = hand["log"]["all_gather"][1], hand["log"]["reduce_scatter"][1]
    assert gathered == 2 * 2 * psi and reduced == 2 * psi  # bf16: two all-gathers and one reduce-scatter of 2 bytes
    sent = (n - 1) / n * (gathered + reduced)  # what a ring sends of them
    assert sent == 3 * (n - 1) / n * 2 * psi  # the ZeRO-3 traffic of notebook 14's exercise: 1.5 x DDP's
    zero3 = model_state_bytes(psi, n, "zero3", "fp32_adam")
    assert hand["shard_bytes"] == zero3.parameters and hand["state_bytes"] == zero3.optimizer_state
    # the fp32 master and Adam's m and v: mixed-precision Adam's 12 bytes per parameter, sharded
    assert hand["shard_bytes"] + hand["state_bytes"] == model_state_bytes(psi, n, "zero3", "mixed_adam").optimizer_state
    unit_bf16 = (64 * 64 + 64) * 2
    assert hand["peak"] == unit_bf16 and hand["now"] == 0  # one unit at a time, all freed after the step
    assert b["hand_False"]["peak"] == 3 * unit_bf16  # kept from forward to backward: all of them at once
    assert hand["params_are_shards"] == [f"{i}.{SHARD_NAME}" for i in (0, 2, 4)]


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_refuses_a_parameter_shared_by_two_units_and_sharding_twice(reports: list[dict[str, Any]]) -> None:
    assert "shared between two units" in reports[0]["refusals"]["shared"]
    assert "already sharded" in reports[0]["refusals"]["twice"]


@pytest.mark.slow  # its `reports` fixture launches 2 ranks
def test_timeline_records_each_collective(reports: list[dict[str, Any]]) -> None:
    assert reports[0]["timeline"] == [
        ("comm", "all-gather 0 (forward)"),
        ("comm", "all-gather 2 (forward)"),
        ("comm", "all-gather 2 (backward)"),
        ("comm", "reduce-scatter 2"),
        ("comm", "all-gather 0 (backward)"),
        ("comm", "reduce-scatter 0"),
    ]
