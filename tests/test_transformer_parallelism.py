"""course_lib.tensor_parallel, .context_parallel and .moe: formulas and validation in one process; every parallel
version against one process, with its bytes against the formulas, on real gloo processes (one launch of 2 ranks,
one of 3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from course_lib.context_parallel import (
    contiguous_layout,
    ring_attention,
    ring_attention_bytes,
    ring_work,
    shard_sequence,
    unshard_sequence,
    zigzag_layout,
)
from course_lib.launch import run_ranks
from course_lib.moe import MoE, capacity_of, expert_parallel_bytes, expert_parallel_forward, route, send_counts
from course_lib.tensor_parallel import (
    COLUMN_PARALLEL,
    ROW_PARALLEL,
    CommCounter,
    all_reduce,
    collective_bytes,
    copy_to_tp,
    parallelize_transformer_,
    shard_block_,
    shard_of,
    tensor_parallel_loss,
    tp_bytes_per_step,
    tp_saved_bytes,
)
from course_lib.transformer import PRESETS, Transformer, TransformerConfig, block_saved_bytes, block_saved_terms

CFG = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32, tie_embeddings=False)


# --- formulas and validation, one process -----------------------------------------------------------------


def test_collective_bytes() -> None:
    assert collective_bytes("all_reduce", 1000, 4) == 1500
    assert collective_bytes("all_gather", 1000, 4) == collective_bytes("reduce_scatter", 1000, 4) == 750
    assert collective_bytes("all_to_all", 123, 4) == collective_bytes("send", 123, 4) == 123
    assert collective_bytes("all_reduce", 1000, 1) == 0
    with pytest.raises(ValueError, match="op must be one of"):
        collective_bytes("broadcast", 10, 2)
    with pytest.raises(ValueError):
        collective_bytes("all_reduce", -1, 2)
    with pytest.raises(TypeError):
        collective_bytes("all_reduce", 1.5, 2)  # type: ignore[arg-type]


def test_comm_counter_records_by_op_and_group() -> None:
    c = CommCounter()
    c.add("all_reduce", None, 400, (100,), n=2)
    c.add("send", None, 40, (10,), n=2)
    assert c.sent() == 440 and c.sent("send") == 40 and c.sent(group="world") == 440 and c.sent(group="tp") == 0
    assert c.table() == {("all_reduce", "world"): (1, 400), ("send", "world"): (1, 40)}
    c.reset()
    assert c.sent() == 0 and c.table() == {}
    with c:  # nothing of this module ran: nothing recorded
        pass
    assert c.records == []


def test_tp_bytes_per_step_parts() -> None:
    tokens, n, p = 256, 4, 4
    act = tokens * CFG.d_model * p
    parts = tp_bytes_per_step(CFG, tokens, n)
    assert parts == {
        "blocks": 4 * CFG.n_layers * 2 * (n - 1) * act // n,
        "embedding and head": 2 * 2 * (n - 1) * act // n,
        "cross-entropy": 3 * 2 * (n - 1) * 4 * tokens // n,
    }
    sp = tp_bytes_per_step(CFG, tokens, n, sequence_parallel=True)
    assert sp["blocks"] == parts["blocks"] and sp["embedding and head"] == parts["embedding and head"]
    assert sp["norm weight gradients"] == (2 * CFG.n_layers + 1) * 2 * (n - 1) * CFG.d_model * p // n
    assert tp_bytes_per_step(CFG, tokens, 1) == {"blocks": 0, "embedding and head": 0, "cross-entropy": 0}
    with pytest.raises(TypeError):
        tp_bytes_per_step("tiny", 1, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tp_bytes_per_step(CFG, 0, 2)


def test_tp_saved_bytes_divides_the_right_terms() -> None:
    c = PRESETS["tiny"]
    whole = block_saved_terms(c, 128)
    tp = tp_saved_bytes(c, 128, 2)
    sp = tp_saved_bytes(c, 128, 2, sequence_parallel=True)
    assert sum(tp_saved_bytes(c, 128, 1).values()) == block_saved_bytes(c, 128)
    assert (
        tp["attention: q"] == whole["attention: q"] // 2
        and tp["attention norm: input"] == whole["attention norm: input"]
    )
    assert sp["attention norm: input"] == whole["attention norm: input"] // 2
    assert sp["q, k, v projections: input"] == whole["q, k, v projections: input"]  # the gathered input stays whole
    assert sum(sp.values()) < sum(tp.values()) < sum(whole.values())
    with pytest.raises(ValueError, match="does not divide"):
        tp_saved_bytes(c, 128, 3)


def test_shard_of_and_shard_block() -> None:
    full = torch.arange(24.0).view(4, 6)
    assert torch.equal(shard_of("layers.1.attn.q_proj.weight", full, 1, 2), full[2:])
    assert torch.equal(shard_of("layers.0.mlp.down_proj.weight", full, 0, 2), full[:, :3])
    assert torch.equal(shard_of("embed.weight", full, 1, 2), full[2:])
    assert shard_of("layers.0.mlp_norm.weight", full, 1, 2) is full
    with pytest.raises(ValueError, match="not a parameter"):
        shard_of("layers.0.attn.rope", full, 0, 2)
    with pytest.raises(ValueError):
        shard_of("embed.weight", full, 2, 2)
    model = Transformer(CFG, seed=0)
    ref = Transformer(CFG, seed=0)
    block = shard_block_(model.layers[0], 1, 2)  # type: ignore[arg-type]
    for name in (*COLUMN_PARALLEL, *ROW_PARALLEL):
        got = block.get_submodule(name).weight
        want = shard_of(f"layers.0.{name}.weight", ref.layers[0].get_submodule(name).weight, 1, 2)
        assert torch.equal(got, want), name
    with pytest.raises(TypeError):
        shard_block_(model, 0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divisible"):
        shard_block_(Transformer(CFG, seed=0).layers[0], 0, 3)  # type: ignore[arg-type]


def test_tensor_parallel_functions_need_a_group_and_tensors() -> None:
    with pytest.raises(TypeError):
        all_reduce([1.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        copy_to_tp("x")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="process group"):
        parallelize_transformer_(Transformer(CFG, seed=0))
    with pytest.raises(ValueError, match="untied"):
        parallelize_transformer_(Transformer(dataclasses.replace(CFG, tie_embeddings=True), seed=0))
    with pytest.raises(ValueError, match="parallelize_transformer_"):
        tensor_parallel_loss(
            Transformer(CFG, seed=0), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)
        )


def test_layouts_and_ring_work() -> None:
    assert contiguous_layout(8, 2) == (((0, 4),), ((4, 4),))
    assert zigzag_layout(16, 4)[1] == ((2, 2), (12, 2))
    x = torch.arange(32).view(2, 16)
    for lay in (contiguous_layout(16, 4), zigzag_layout(16, 4)):
        parts = [shard_sequence(x, lay, r) for r in range(4)]
        assert torch.equal(unshard_sequence(parts, lay), x)
    contig, zig = ring_work(contiguous_layout(128, 4)), ring_work(zigzag_layout(128, 4))
    assert [sum(w) for w in contig] == [1024, 2048, 3072, 4096]
    assert [sum(w) for w in zig] == [2304] * 4
    assert ring_work(contiguous_layout(8, 2), causal=False) == [[16, 16], [16, 16]]
    with pytest.raises(ValueError, match="divisible"):
        zigzag_layout(10, 4)
    with pytest.raises(TypeError):
        ring_work(((0, 4),))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        shard_sequence(x, contiguous_layout(16, 4), 4)
    with pytest.raises(ValueError, match="parts"):
        unshard_sequence([x], contiguous_layout(16, 4))


def test_ring_attention_bytes() -> None:
    block = 2 * 4 * 16 * 8 * 4
    assert ring_attention_bytes(2, 4, 64, 8, 4, backward=False) == 6 * block
    assert ring_attention_bytes(2, 4, 64, 8, 4) == 6 * block + 14 * block
    assert ring_attention_bytes(2, 4, 64, 8, 1) == 0
    with pytest.raises(ValueError):
        ring_attention_bytes(1, 1, 10, 8, 4)
    with pytest.raises(RuntimeError, match="process group"):
        q = torch.randn(1, 1, 4, 2)
        ring_attention(q, q, q, layout=contiguous_layout(4, 1))
    with pytest.raises(ValueError, match="one shape"):
        ring_attention(
            torch.randn(1, 2, 4, 2), torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2), layout=contiguous_layout(4, 1)
        )


def test_route_capacity_and_aux_loss() -> None:
    assert capacity_of(64, 4, 2, 1.25) == 40
    logits = torch.tensor([[3.0, 0.0, 0.0], [2.0, 1.0, 0.0], [1.0, 0.5, 0.0], [0.0, 1.0, 0.0]])
    r = route(logits, top_k=1, capacity_factor=1.0)  # capacity 2; expert 0 wanted by 3 tokens
    assert r.capacity == 2 and r.wanted.tolist() == [3, 1, 0] and r.load.tolist() == [2, 1, 0] and r.dropped == 1
    assert r.kept.flatten().tolist() == [True, True, False, True]
    r2 = route(logits, top_k=2, capacity_factor=1.0)  # first choices are served before second choices
    assert r2.experts[:, 0].tolist() == [0, 0, 0, 1] and int(r2.wanted.sum()) == 8
    even = route(torch.zeros(8, 4), top_k=1)
    assert abs(even.aux_loss.item() - 1.0) < 1e-6  # uniform probabilities: E * sum(f * 1/E) = 1
    skewed = route(torch.tensor([[5.0, 0, 0, 0]] * 8), top_k=1)
    assert skewed.aux_loss.item() > 3.0
    with pytest.raises(ValueError, match="top_k"):
        route(logits, top_k=4)
    with pytest.raises(TypeError):
        route(torch.zeros(3), top_k=1)
    with pytest.raises(ValueError):
        capacity_of(4, 2, 1, 0.0)


def test_moe_and_send_counts() -> None:
    moe = MoE(8, 16, n_experts=4, top_k=2, capacity_factor=2.0, seed=0)
    x = torch.randn(10, 8)
    y = moe(x)
    r = moe.last_routing
    assert r is not None and y.shape == x.shape and r.dropped == 0
    by_hand = torch.zeros_like(x)
    for t in range(10):
        for s in range(2):
            e = int(r.experts[t, s])
            by_hand[t] += r.weights[t, s] * moe.experts[e](x[t : t + 1])[0]
    assert torch.allclose(y, by_hand, atol=1e-6)
    experts = torch.tensor([[0, 3], [1, 2], [3, 2]])
    kept = torch.tensor([[True, True], [True, False], [False, True]])
    assert send_counts(experts, kept, 4, 2) == [2, 2]
    assert send_counts(experts, kept, 4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="divisible"):
        send_counts(experts, kept, 4, 3)
    assert expert_parallel_bytes([3, 5], [3, 4], 0, 64, n_experts=4) == 16 + 2 * 9 * 64
    with pytest.raises(ValueError):
        expert_parallel_bytes([1], [1, 2], 0, 4, n_experts=2)
    with pytest.raises(ValueError, match="top_k"):
        MoE(8, 16, n_experts=2, top_k=3)
    with pytest.raises(RuntimeError, match="process group"):
        expert_parallel_forward(moe, x)


# --- on real processes ---------------------------------------------------------------------------------------

_WORKER = """
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.context_parallel import (contiguous_layout, ring_attention, ring_attention_bytes, shard_sequence,
                                         zigzag_layout)
from course_lib.moe import MoE, expert_parallel_bytes, expert_parallel_forward, send_counts
from course_lib.tensor_parallel import (CommCounter, all_gather, all_to_all, parallelize_transformer_, reduce_scatter,
                                        shard_of, sync_sequence_parallel_grads, tensor_parallel_loss, tp_bytes_per_step)
from course_lib.transformer import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=60, d_model=24, n_layers=2, n_heads=6, d_ff=48, max_seq_len=24, tie_embeddings=False)


def diff(a, b):
    return (a - b).abs().max().item()


def check(rank, n):
    out = {}
    g = torch.Generator().manual_seed(0)
    # collectives along a dimension
    x = torch.arange(12.0).view(2, 6) + 100 * rank
    gathered = all_gather(x, 1)
    out["all_gather"] = torch.equal(gathered, torch.cat([torch.arange(12.0).view(2, 6) + 100 * r for r in range(n)], 1))
    summed = reduce_scatter(torch.ones(2, 3 * n) * (rank + 1), 1)
    out["reduce_scatter"] = torch.equal(summed, torch.full((2, 3), float(sum(range(1, n + 1)))))
    rows = torch.arange(float(n)).view(n, 1) + 10 * rank
    received = all_to_all(rows, [1] * n, [1] * n).flatten().tolist()
    out["all_to_all"] = received == [float(rank + 10 * s) for s in range(n)]
    # tensor (and sequence) parallel model against one process, bytes against the formula
    ids = torch.randint(0, 60, (2, 12), generator=g)
    targets = torch.randint(0, 60, (2, 12), generator=g)
    ref = Transformer(CFG, seed=0).double()
    ref.loss(ids, targets).backward()
    full = dict(ref.named_parameters())
    for sp in (False, True):
        model = parallelize_transformer_(Transformer(CFG, seed=0).double(), None, sequence_parallel=sp)
        with CommCounter() as c:
            loss = tensor_parallel_loss(model, ids, targets)
            loss.backward()
            sync_sequence_parallel_grads(model)
        out[f"tp sp={sp}"] = max(diff(p.grad, shard_of(k, full[k].grad, rank, n)) for k, p in model.named_parameters())
        formula = tp_bytes_per_step(CFG, 24, n, bytes_per_element=8, sequence_parallel=sp)
        out[f"tp bytes sp={sp}"] = (c.sent(), sum(formula.values()))
    # ring attention, causal and not, both layouts, forward and backward
    q, k, v, dout = (torch.randn(2, 3, 8 * n, 4, dtype=torch.float64, generator=g) for _ in range(4))
    for causal in (True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        ref_out.backward(dout)
        for name, lay in (("contiguous", contiguous_layout(8 * n, n)), ("zigzag", zigzag_layout(8 * n, n))):
            mine = [shard_sequence(t, lay, rank, 2).requires_grad_() for t in (q, k, v)]
            with CommCounter() as c:
                o = ring_attention(*mine, layout=lay, causal=causal)
                o.backward(shard_sequence(dout, lay, rank, 2))
            out[f"ring {name} causal={causal}"] = max(
                diff(o, shard_sequence(ref_out, lay, rank, 2)),
                *(diff(a.grad, shard_sequence(b.grad, lay, rank, 2)) for a, b in zip(mine, leaves)))
            formula = ring_attention_bytes(2, 3, 8 * n, 4, n, bytes_per_element=8)
            out[f"ring bytes {name} causal={causal}"] = (c.sent(), formula)
    # expert parallelism against one process
    xs = torch.randn(n, 16, 8, generator=g, dtype=torch.float64)
    ref_moe = MoE(8, 12, n_experts=2 * n, top_k=2, capacity_factor=1.0, seed=1).double()
    ref_x = xs.clone().requires_grad_()
    sum((ref_moe(ref_x[s]) ** 2).sum() for s in range(n)).backward()
    moe = MoE(8, 12, n_experts=2 * n, top_k=2, capacity_factor=1.0, seed=1).double()
    x = xs[rank].clone().requires_grad_()
    with CommCounter() as c:
        y = expert_parallel_forward(moe, x)
        (y ** 2).sum().backward()
    r = moe.last_routing
    send = send_counts(r.experts, r.kept, 2 * n, n)
    counts = torch.tensor(send)
    everyone = [torch.zeros(n, dtype=torch.long) for _ in range(n)]
    dist.all_gather(everyone, counts)
    recv = [int(everyone[s][rank]) for s in range(n)]
    mine = range(2 * rank, 2 * rank + 2)
    expert_grads = [diff(p.grad, q.grad) for e in mine
                    for p, q in zip(moe.experts[e].parameters(), ref_moe.experts[e].parameters())]
    out["ep"] = max(diff(x.grad, ref_x.grad[rank]), *expert_grads)
    out["ep dropped"] = r.dropped
    out["ep bytes"] = (c.sent(), expert_parallel_bytes(send, recv, rank, 8 * 8, n_experts=2 * n))
    return out
"""


@pytest.mark.slow  # launches 2 and 3 ranks
@pytest.mark.parametrize("n", [2, 3])
def test_every_parallel_version_equals_one_process_and_its_bytes_the_formula(tmp_path: Path, n: int) -> None:
    worker = tmp_path / "tp_worker.py"
    worker.write_text(_WORKER)
    results = run_ranks(f"{worker}:check", nprocs=n, timeout=240, echo="none")
    for rank, res in enumerate(results):
        assert res["all_gather"] and res["reduce_scatter"] and res["all_to_all"], rank
        for key, value in res.items():
            if key.startswith(("tp sp", "ring contiguous", "ring zigzag")) or key == "ep":
                assert value < 1e-10, (rank, key, value)
            if "bytes" in key:
                assert value[0] == value[1], (rank, key, value)
    assert any(res["ep dropped"] for res in results)  # capacity factor 1.0: the test covers dropped assignments
