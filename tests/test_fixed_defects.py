"""Five defects a lab built on the course's classes would inherit, each with the test that failed before its fix.

- 16's hand-written FlashAttention assumed as many keys as queries (cross-attention, KV caches);
- 14's HandZero stepped trainable parameters that got no gradient (AdamW decayed them) ...
- ... and turned a bf16 or fp16 model into fp32 (its flat buffer had the default dtype);
- ShardedOptimizer accepted add_param_group, then its step() raised KeyError;
- HandFSDP and ShardedOptimizer(shard_by="element") built their buffers on the CPU whatever the model's device.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import jupytext
import pytest
import torch
import torch.nn.functional as F

from course_lib.launch import run_ranks
from course_lib.manifest import ROOT, written_file


def _notebook_cell(stem: str, marker: str) -> str:
    """The source of the code cell of sources/STEM.py that contains ``marker``."""
    notebook = jupytext.read(ROOT / "sources" / f"{stem}.py", fmt="py:percent")
    return next(c.source for c in notebook.cells if c.cell_type == "code" and marker in c.source)


@pytest.fixture(scope="module")
def flash_attention():  # type: ignore[no-untyped-def]
    namespace = {"math": math, "torch": torch, "F": F}
    exec(_notebook_cell("16_transformer", "class FlashAttention(torch.autograd.Function)"), namespace)
    return namespace["flash_attention"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keys", [200, 64, 100])
def test_flash_attention_takes_as_many_keys_as_it_is_given(flash_attention, causal: bool, keys: int) -> None:  # type: ignore[no-untyped-def]
    """128 queries against 200, 64 or 100 keys (not a multiple of the tile): SDPA's result, forward and backward."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 128, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, keys, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    d_out = torch.randn(2, 2, 128, 16, generator=g, dtype=torch.float64)
    ours = flash_attention(q, k, v, causal, 48)
    grads = torch.autograd.grad(ours, (q, k, v), d_out)
    # SDPA's is_causal with unequal lengths: query i sees keys 0..i (the mask is tril(ones(L, S)), top-left aligned)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    expected = torch.autograd.grad(theirs, (q, k, v), d_out)
    assert torch.allclose(ours, theirs, atol=1e-10), (ours - theirs).abs().max()
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want, atol=1e-10), (got - want).abs().max()


ZERO_JOBS = """
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from zero import HandZero


class TwoLayers(nn.Module):
    # a layer the forward never uses, as a branch that is switched off for some steps

    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(6, 4), nn.Linear(6, 4)

    def forward(self, x):
        return self.used(x)


def model(dtype):
    torch.manual_seed(0)
    m = TwoLayers().to(dtype)
    nn.init.constant_(m.unused.weight, 2.0)
    return m


def unused_parameter(rank, world_size, kind, steps=3):
    m = model(torch.float32)
    net = DDP(m, find_unused_parameters=True) if kind == "ddp" else m
    params = list(m.parameters())
    opt = (torch.optim.AdamW(params, lr=0.1, weight_decay=0.1) if kind == "ddp"
           else HandZero(params, torch.optim.AdamW, stage=int(kind[-1]), lr=0.1, weight_decay=0.1))
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank))
    for _ in range(steps):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    return {name: p.detach().clone() for name, p in m.named_parameters()}


def low_precision(rank, world_size, dtype_name, stage):
    dtype = getattr(torch, dtype_name)
    m = model(dtype)
    opt = HandZero(m.used.parameters(), torch.optim.SGD, stage=stage, lr=0.1)
    dtypes = {str(p.dtype) for p in m.parameters()}
    before = m.used.weight.detach().clone()
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank)).to(dtype)
    opt.zero_grad()
    m(x).float().pow(2).mean().backward()
    opt.step()
    return {"dtypes": dtypes, "moved": not torch.equal(before, m.used.weight), "weight": m.used.weight.float()}
"""


@pytest.fixture(scope="module")
def zero_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("zero")
    (d / "zero.py").write_text(written_file("14_sharded_data_parallel", "_runs/zero.py"))
    (d / "zero_jobs.py").write_text(textwrap.dedent(ZERO_JOBS))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_hand_zero_leaves_a_parameter_without_gradient_alone(zero_dir: Path, stage: int) -> None:
    """AdamW with weight decay: DDP leaves the unused layer at 2.0; so must ZeRO (it drifted to 1.9406 before)."""
    ddp = run_ranks(f"{zero_dir}/zero_jobs.py:unused_parameter", 2, ("ddp",), cwd=zero_dir, timeout=180, echo="none")
    ours = run_ranks(
        f"{zero_dir}/zero_jobs.py:unused_parameter", 2, (f"zero{stage}",), cwd=zero_dir, timeout=180, echo="none"
    )
    for rank in (0, 1):
        assert torch.equal(ours[rank]["unused.weight"], torch.full((4, 6), 2.0)), ours[rank]["unused.weight"]
        for name, p in ddp[rank].items():
            assert torch.allclose(ours[rank][name], p, atol=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_hand_zero_keeps_a_low_precision_model_in_its_dtype(zero_dir: Path, dtype: str) -> None:
    out = run_ranks(f"{zero_dir}/zero_jobs.py:low_precision", 2, (dtype, 2), cwd=zero_dir, timeout=180, echo="none")
    for r in out:
        assert r["dtypes"] == {f"torch.{dtype}"} and r["moved"], r["dtypes"]
    assert torch.equal(out[0]["weight"], out[1]["weight"])  # the ranks agree after the all-gather


SHARDED_JOBS = """
import torch
import torch.nn as nn

from course_lib.hand_fsdp import HandFSDP
from course_lib.sharded_optim import ShardedOptimizer


def add_group(rank, world_size, shard_by):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = ShardedOptimizer(model[0].parameters(), torch.optim.AdamW, shard_by=shard_by, reduce_gradients=True,
                           lr=0.1)
    opt.add_param_group({"params": model[1].parameters(), "lr": 0.01})  # layers unfrozen later, in fine-tuning
    before = [p.detach().clone() for p in model[1].parameters()]
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()
    opt.step()
    moved = all(not torch.equal(a, b) for a, b in zip(before, model[1].parameters()))
    return [p.detach().clone() for p in model.parameters()], [g["lr"] for g in opt.param_groups], moved


def on_meta(rank, world_size):
    with torch.device("meta"):
        a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    shard = ShardedOptimizer(a.parameters(), torch.optim.SGD, shard_by="element", lr=0.1).optim.param_groups[0]
    fsdp = HandFSDP(nn.Sequential(b))
    return str(shard["params"][0].device), sorted({str(p.device) for p in fsdp.module.parameters()})
"""


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sharded")
    (d / "sharded_jobs.py").write_text(textwrap.dedent(SHARDED_JOBS))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("shard_by", ["parameter", "element"])
def test_sharded_optimizer_steps_a_group_added_later(sharded_dir: Path, shard_by: str) -> None:
    out = run_ranks(f"{sharded_dir}/sharded_jobs.py:add_group", 2, (shard_by,), timeout=180, echo="none")
    params, lrs, moved = out[0]
    assert lrs == [0.1, 0.01] and moved, "the added group was not stepped"
    assert all(torch.equal(a, b) for a, b in zip(params, out[1][0]))  # both ranks hold the same updated model


@pytest.mark.slow
def test_buffers_follow_the_models_device(sharded_dir: Path) -> None:
    """On the meta device (standing in for a GPU): the shards are built where the parameters are, not on the CPU."""
    shard_device, fsdp_devices = run_ranks(f"{sharded_dir}/sharded_jobs.py:on_meta", 2, timeout=180, echo="none")[0]
    assert shard_device == "meta" and fsdp_devices == ["meta"]
