from __future__ import annotations

import dataclasses

import pytest
import torch

from course_lib.comm_model import AlphaBeta, predict_all_reduce
from course_lib.pipeline import bubble_fraction
from course_lib.planner import (
    Cluster,
    Layout,
    MatmulEfficiency,
    PlanError,
    a100_cluster,
    candidate_layouts,
    check_layout,
    cpu_cluster,
    format_plan,
    h100_cluster,
    plan,
    predict,
    shard_params,
    stage_seconds,
)
from course_lib.saved_tensors import SavedTensorMeter
from course_lib.sharding import Precision, model_state_bytes, rank_memory, transformer_activation_bytes
from course_lib.tensor_parallel import shard_of
from course_lib.transformer import PRESETS, Transformer, param_count, param_counts, training_flops_per_token

TINY = dataclasses.replace(PRESETS["tiny"], tie_embeddings=False, attention="naive")
SLOW_LINKS = dict(intra=AlphaBeta(1e-4, 1e9), inter=AlphaBeta(1e-4, 1e9))
CPU = Cluster(devices_per_node=8, memory_bytes=2**30, peak_flops=5e9, **SLOW_LINKS)  # type: ignore[arg-type]
FP32 = Precision(4, 4, 8)


def _predict(layout: Layout, *, config=TINY, seq_len: int = 64, global_batch: int = 16, precision=FP32, cluster=CPU):
    return predict(config, cluster, layout, seq_len=seq_len, global_batch=global_batch, precision=precision)


# --- inputs ------------------------------------------------------------------------------------------


def test_cluster_and_layout_validate_their_fields() -> None:
    with pytest.raises(TypeError, match="devices_per_node must be an int"):
        Cluster(8.0, 2**30, 1e12, **SLOW_LINKS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peak_flops must be > 0"):
        Cluster(8, 2**30, 0.0, **SLOW_LINKS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="efficiency must be <= 1"):
        Cluster(8, 2**30, 1e12, efficiency=1.5, **SLOW_LINKS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="intra must be a course_lib.comm_model.AlphaBeta"):
        Cluster(8, 2**30, 1e12, intra=(1e-5, 1e9), inter=AlphaBeta(1e-5, 1e9))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data must be >= 1"):
        Layout(data=0)
    with pytest.raises(ValueError, match="zero must be in \\[0, 3\\]"):
        Layout(zero=4)
    with pytest.raises(ValueError, match="checkpointing must be one of none, full, selective"):
        Layout(checkpointing="some")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a course_lib.transformer.TransformerConfig"):
        predict("tiny", CPU, Layout(), seq_len=64, global_batch=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cluster must be a Cluster"):
        predict(TINY, "cpu", Layout(), seq_len=64, global_batch=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="precision must be one of"):
        _predict(Layout(data=4, micro_batch=4), precision="fp8")


@pytest.mark.parametrize(
    "layout, global_batch, message",
    [
        (Layout(tensor=3, micro_batch=16), 16, "tensor degree 3 must divide n_heads \\(4\\)"),
        (Layout(tensor=8, micro_batch=16), 16, "tensor degree 8 must divide n_heads"),
        (Layout(pipeline=3, micro_batch=1, accumulation=16), 16, "pipeline degree 3 must divide n_layers \\(2\\)"),
        (Layout(context=3, micro_batch=16), 16, "context degree 3 must divide seq_len \\(64\\)"),
        (Layout(data=3, micro_batch=5), 16, "data 3 x micro-batch 5 x accumulation 1 = 15, not the global batch 16"),
        (Layout(pipeline=2, micro_batch=16), 16, "a pipeline of 2 stages needs at least 2 micro-batches"),
    ],
)
def test_impossible_layouts_are_refused_with_the_reason(layout: Layout, global_batch: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _predict(layout, global_batch=global_batch)


def test_more_devices_than_the_cluster_and_tied_tensor_parallelism_are_refused() -> None:
    with pytest.raises(ValueError, match="the layout needs 16 devices, the cluster has 8"):
        _predict(Layout(data=16, micro_batch=1))
    with pytest.raises(ValueError, match="needs an untied head"):
        check_layout(PRESETS["tiny"], Layout(tensor=2, micro_batch=16), 64, 16)


def test_a_model_that_fits_nowhere_says_how_much_it_needs() -> None:
    small = Cluster(8, 2**16, 1e12, **SLOW_LINKS)  # type: ignore[arg-type]
    with pytest.raises(
        PlanError,
        match=r"no layout of 8 devices fits: the smallest needs .* GiB per rank .*the device has 0.00 GiB usable",
    ):
        plan(TINY, small, 8, 64, precision="fp32_adam")
    with pytest.raises(PlanError, match="no layout splits global batch 7"):
        plan(PRESETS["nano"], CPU, 7, 63, devices=8)
    assert issubclass(PlanError, ValueError)


# --- each formula against the library's other copy and against a measurement -----------------------


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_state_is_the_sharding_modules(stage: int) -> None:
    p = _predict(Layout(data=4, zero=stage, micro_batch=4), precision="mixed_adam")
    state = model_state_bytes(param_count(TINY), 4, ("ddp", "zero1", "zero2", "zero3")[stage], "mixed_adam")
    assert (p.memory["parameters"], p.memory["gradients"], p.memory["optimizer state"]) == (
        state.parameters,
        state.gradients,
        state.optimizer_state,
    )


@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_rank_memory_is_rank_memory(checkpointing: bool) -> None:
    config = PRESETS["llama2-7b"]
    layout = Layout(data=8, zero=3, micro_batch=1, accumulation=1, checkpointing="full" if checkpointing else "none")
    cluster = Cluster(8, 80 * 10**9, 1e15, **SLOW_LINKS)  # type: ignore[arg-type]
    p = predict(config, cluster, layout, seq_len=2048, global_batch=8)
    r = rank_memory(
        param_count(config), 8, "zero3", micro_batch=1, model=config, seq_len=2048, checkpointing=checkpointing
    )
    state_and_activations = ("parameters", "gradients", "optimizer state", "activations", "recompute buffer")
    assert sum(p.memory[k] for k in state_and_activations) == r["total"]
    assert p.memory["activations"] + p.memory["recompute buffer"] == transformer_activation_bytes(
        config, 2048, 1, checkpointing=checkpointing
    )


def test_tensor_parallel_parameters_are_what_parallelize_keeps() -> None:
    model = Transformer(TINY, seed=0)
    for n in (1, 2, 4):
        kept = sum(shard_of(name, p.detach(), 0, n).numel() for name, p in model.named_parameters())
        assert shard_params(TINY, n) == kept
    assert shard_params(TINY) == param_count(TINY)
    one_stage = shard_params(TINY, 1, 2)  # a stage: one block and the larger end (embedding or head + norm)
    assert one_stage < param_count(TINY) and one_stage > param_count(TINY) // 2 - TINY.vocab_size * TINY.d_model


@pytest.mark.parametrize("checkpointing", ["none", "full", "selective"])
def test_activations_match_the_saved_tensor_meter(checkpointing: str) -> None:
    config = dataclasses.replace(TINY, checkpointing=checkpointing)
    model = Transformer(config, seed=0)
    ids = torch.randint(0, config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    with SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:
        model.loss(ids, ids.roll(-1, 1))
    p = _predict(Layout(data=4, micro_batch=4, checkpointing=checkpointing))  # type: ignore[arg-type]
    assert p.memory["activations"] == meter.bytes


# --- time ----------------------------------------------------------------------------------------------


def test_compute_is_flops_over_peak_and_checkpointing_adds_a_forward() -> None:
    none = _predict(Layout(data=4, micro_batch=4))
    full = _predict(Layout(data=4, micro_batch=4, checkpointing="full"))
    selective = _predict(Layout(data=4, micro_batch=4, checkpointing="selective"))
    flops = training_flops_per_token(TINY, 64, causal=True) * 16 * 64 / 4
    assert none.time["compute"] == pytest.approx(flops / 5e9)
    assert full.time["compute"] == pytest.approx(none.time["compute"] * 4 / 3)
    assert none.time["compute"] < selective.time["compute"] < full.time["compute"]
    assert none.mfu == pytest.approx(none.time["compute"] / none.step_time)


def test_bubble_and_collectives() -> None:
    p = _predict(Layout(data=2, pipeline=2, micro_batch=2, accumulation=4))
    b = bubble_fraction(2, 4)
    assert p.time["pipeline bubble"] == pytest.approx(p.time["compute"] * b / (1 - b))
    assert p.time["pipeline sends"] > 0
    tp = _predict(Layout(data=4, tensor=2, micro_batch=4))
    assert (
        tp.time["tensor-parallel collectives"] > 0
        and _predict(Layout(data=8, micro_batch=2)).time["tensor-parallel collectives"] == 0
    )
    cp = _predict(Layout(data=4, context=2, micro_batch=4))
    assert cp.time["context-parallel ring"] > 0


def test_data_parallel_traffic_is_hidden_behind_backward_until_it_is_longer() -> None:
    slow = Cluster(8, 2**30, 1e15, intra=AlphaBeta(1e-3, 1e6), inter=AlphaBeta(1e-3, 1e6))  # compute ~0, links slow
    ar = predict_all_reduce(slow.intra, param_count(TINY) * 4, 4)
    exposed = {z: _predict(Layout(data=4, zero=z, micro_batch=2, accumulation=2), cluster=slow).time for z in range(4)}
    # ZeRO-0: the all-reduce waits for the last micro-batch and hides behind its backward only (2/3 of it)
    last_backward = exposed[0]["compute"] / 2 * 2 / 3
    assert exposed[0]["data-parallel (not hidden)"] == pytest.approx(ar - last_backward)
    # ZeRO-1: the reduce-scatter behind that backward, the all-gather behind the next forward
    assert exposed[1]["data-parallel (not hidden)"] == pytest.approx(
        ar / 2 - last_backward + ar / 2 - last_backward / 2
    )
    # ZeRO-2: a reduce-scatter behind every micro-batch's backward
    assert exposed[2]["data-parallel (not hidden)"] == pytest.approx(
        2 * (ar / 2 - last_backward) + ar / 2 - last_backward / 2
    )
    assert (
        exposed[1]["data-parallel (not hidden)"]
        < exposed[2]["data-parallel (not hidden)"]
        < exposed[3]["data-parallel (not hidden)"]
    )
    assert _predict(Layout(data=4, micro_batch=4)).time["data-parallel (not hidden)"] == 0.0  # hidden on CPU's numbers


def test_float8_all_gather_sends_a_byte_a_parameter_in_zero3_gathers_only() -> None:
    slow = Cluster(8, 2**30, 1e15, intra=AlphaBeta(0.0, 1e6), inter=AlphaBeta(0.0, 1e6))  # compute ~0, alpha 0
    lay = Layout(data=4, zero=3, micro_batch=2, accumulation=2)
    base = predict(TINY, slow, lay, seq_len=64, global_batch=16, precision="mixed_adam")
    f8 = predict(TINY, slow, lay, seq_len=64, global_batch=16, precision="mixed_adam", float8_all_gather=True)
    n = shard_params(TINY)
    parts = param_counts(TINY)
    linear = parts["attention"] + parts["mlp"]  # the blocks' linear weights: the only ones cast to float8
    rs = predict_all_reduce(slow.intra, n * 2, 4) / 2  # the gradients: bf16 under mixed_adam
    ag_bf16 = predict_all_reduce(slow.intra, n * 2, 4) / 2
    ag_f8 = predict_all_reduce(slow.intra, linear + (n - linear) * 2, 4) / 2
    assert ag_bf16 / 2 < ag_f8 < ag_bf16
    dp, dp8 = base.time["data-parallel (not hidden)"], f8.time["data-parallel (not hidden)"]
    compute = base.time["compute"]
    assert dp == pytest.approx(2 * (2 * ag_bf16 + rs) - compute)
    assert dp8 == pytest.approx(2 * (2 * ag_f8 + rs) - compute)
    with pytest.raises(ValueError, match="ZeRO-3"):
        predict(TINY, slow, Layout(data=4, zero=1, micro_batch=4), seq_len=64, global_batch=16, float8_all_gather=True)
    with pytest.raises(TypeError, match="float8_all_gather must be True or False"):
        predict(TINY, slow, lay, seq_len=64, global_batch=16, float8_all_gather=1)  # type: ignore[arg-type]


def test_async_tensor_parallel_leaves_one_chunk_exposed_while_compute_covers_the_rest() -> None:
    lay = Layout(data=2, tensor=4, micro_batch=4)
    fast = Cluster(8, 2**30, 5e9, intra=AlphaBeta(1e-6, 1e12), inter=AlphaBeta(1e-6, 1e12))  # collectives << compute
    sync = predict(TINY, fast, lay, seq_len=64, global_batch=8).time["tensor-parallel collectives"]
    hidden = predict(TINY, fast, lay, seq_len=64, global_batch=8, async_tensor_parallel=True)
    assert hidden.time["tensor-parallel collectives"] == pytest.approx(sync / 4)
    slow = Cluster(8, 2**30, 1e18, intra=AlphaBeta(1e-3, 1e6), inter=AlphaBeta(1e-3, 1e6))  # compute ~0
    sync = predict(TINY, slow, lay, seq_len=64, global_batch=8).time["tensor-parallel collectives"]
    a = predict(TINY, slow, lay, seq_len=64, global_batch=8, async_tensor_parallel=True).time
    assert a["tensor-parallel collectives"] == pytest.approx(sync - a["compute"])  # nothing to hide behind


# --- the search ---------------------------------------------------------------------------------------


def test_plan_ranks_feasible_layouts_fastest_first() -> None:
    preds = plan(TINY, CPU, 16, 64, precision="fp32_adam")
    times = [p.step_time for p in preds]
    assert times == sorted(times)
    assert all(p.memory_total <= 0.9 * CPU.memory_bytes and p.layout.devices == 8 for p in preds)
    table = format_plan(preds, top=3).splitlines()
    assert len(table) == 5 and table[1].startswith(" 1 ") and "idealized" in table[-1]
    with pytest.raises(ValueError, match="headroom must be in"):
        plan(TINY, CPU, 16, 64, headroom=0)


def test_candidates_are_all_valid_and_cover_the_devices() -> None:
    layouts = candidate_layouts(TINY, 4, 16, 64)
    assert layouts and len(set(layouts)) == len(layouts)
    for lay in layouts:
        check_layout(TINY, lay, 64, 16)
        assert lay.devices == 4
    assert Layout(data=2, tensor=2, micro_batch=8) in layouts
    assert not [lay for lay in layouts if lay.tensor > 2] or all(lay.tensor in (1, 2, 4) for lay in layouts)


def test_the_h100_cluster_is_the_one_the_notebooks_plan_for() -> None:
    c = h100_cluster(4)
    assert (c.devices, c.memory_bytes, c.peak_flops) == (32, 80 * 10**9, 989e12)
    assert (c.intra.beta, c.inter.beta) == (450e9, 50e9)
    with pytest.raises(ValueError, match="nodes"):
        h100_cluster(0)


def test_the_cpu_cluster_is_this_machines_nominal_processes() -> None:
    c = cpu_cluster()
    assert (c.devices_per_node, c.memory_bytes, c.peak_flops, c.matmul) == (8, 2**30, 5e9, None)
    assert (c.intra.alpha, c.intra.beta, c.inter.alpha, c.inter.beta) == (100e-6, 2e9, 100e-6, 2e9)
    # a tiny transformer's step on it: idealized, so its time is FLOPs over 5 GFLOP/s plus unhidden communication
    tiny = dataclasses.replace(PRESETS["tiny"], tie_embeddings=False)
    assert predict(tiny, c, Layout(data=4, micro_batch=4), seq_len=64, global_batch=16).idealized


# --- the time model a practitioner can use (per-stage work, interleave, overlap window, CP, transients) -------

LLAMA8B = PRESETS["llama3-8b"]


def test_the_last_stage_carries_the_head_and_sets_the_pace() -> None:
    node = h100_cluster(1)
    lay = Layout(data=2, pipeline=4, micro_batch=1, accumulation=8)
    stages = stage_seconds(LLAMA8B, node, lay, seq_len=8192)
    h, V = LLAMA8B.d_model, LLAMA8B.vocab_size
    head = 6 * h * V * 8192 / node.peak_flops  # one micro-batch through the head, forward and backward
    assert stages["last"] - stages["first"] == pytest.approx(head)
    p = predict(LLAMA8B, node, lay, seq_len=8192, global_batch=16)
    assert p.time["compute"] == pytest.approx(8 * stages["last"])
    assert p.time["pipeline bubble"] == pytest.approx(3 * stages["last"])
    one = stage_seconds(LLAMA8B, node, Layout(data=8, micro_batch=1), seq_len=8192)
    flops = training_flops_per_token(LLAMA8B, 8192, causal=True) * 8192
    assert one["first"] == one["last"] == pytest.approx(flops / node.peak_flops)  # one stage: all of the model
    with pytest.raises(TypeError, match="layout must be a Layout"):
        stage_seconds(LLAMA8B, node, "PP 4", seq_len=8192)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_len must be"):
        stage_seconds(LLAMA8B, node, lay, seq_len=0)


def _outside(p) -> int:
    """The activations outside the pipeline stage's blocks (embedding, final norm, head, loss)."""
    from course_lib.transformer import model_saved_terms

    terms = model_saved_terms(LLAMA8B, 8192, batch=1, dtype=torch.bfloat16)
    terms.pop("blocks")
    terms["loss: log-probabilities"] //= p.layout.tensor
    return sum(terms.values())


def test_interleave_divides_the_bubble_and_is_checked() -> None:
    node = h100_cluster(1)
    plain = predict(LLAMA8B, node, Layout(pipeline=4, micro_batch=1, accumulation=8), seq_len=8192, global_batch=8)
    two = predict(
        LLAMA8B, node, Layout(pipeline=4, micro_batch=1, accumulation=8, interleave=2), seq_len=8192, global_batch=8
    )
    assert two.time["pipeline bubble"] == pytest.approx(plain.time["pipeline bubble"] / 2)
    blocks = plain.memory["activations"] - _outside(plain)
    assert blocks > 0 and two.memory["activations"] - _outside(two) == blocks * (8 + 3) // 8  # 1 + (p - 1) / (p v)
    assert two.time["pipeline sends"] > plain.time["pipeline sends"]
    assert "PP 4 (2 chunks)" in two.layout.describe()
    for layout, message in (
        (Layout(micro_batch=1, accumulation=8, interleave=2), "needs a pipeline"),
        (Layout(pipeline=4, micro_batch=1, accumulation=8, interleave=3), "must divide n_layers"),
        (Layout(pipeline=4, micro_batch=1, accumulation=6, interleave=2), "multiple of it"),
    ):
        with pytest.raises(ValueError, match=message):
            check_layout(LLAMA8B, layout, 8192, layout.micro_batch * layout.accumulation)
    with pytest.raises(ValueError, match="interleave must be >= 1"):
        Layout(interleave=0)


def test_matmul_efficiency_slows_small_products_and_charges_each_micro_batch() -> None:
    e = MatmulEfficiency(peak_fraction=0.5, half_size=100.0, per_micro_batch_s=0.01)
    assert e.fraction(100, 100, 100) == pytest.approx(0.5 / 8)
    assert e.fraction(10**6, 10**6, 10**6) == pytest.approx(0.5, rel=1e-3)
    for bad, message in (
        (dict(peak_fraction=0.0), "peak_fraction must be in"),
        (dict(peak_fraction=1.5), "peak_fraction must be in"),
        (dict(half_size=-1.0), "half_size must be >= 0"),
        (dict(per_micro_batch_s=float("nan")), "per_micro_batch_s must be finite"),
    ):
        with pytest.raises(ValueError, match=message):
            MatmulEfficiency(**bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="m must be an int"):
        e.fraction(1.5, 2, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="matmul must be a MatmulEfficiency"):
        Cluster(8, 2**30, 1e12, matmul=0.5, **SLOW_LINKS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="matmul must be a MatmulEfficiency"):
        h100_cluster(1, matmul="fast")  # type: ignore[arg-type]
    lay = Layout(data=8, micro_batch=1, accumulation=4)
    ideal = predict(LLAMA8B, h100_cluster(1), lay, seq_len=8192, global_batch=32)
    real = predict(LLAMA8B, h100_cluster(1, matmul=e), lay, seq_len=8192, global_batch=32)
    assert ideal.idealized and not real.idealized
    assert real.time["per-micro-batch overhead"] == pytest.approx(4 * 0.01)
    assert 2 < real.time["compute"] / ideal.time["compute"] < 2.5  # half the peak, and more for the small sizes
    assert real.mfu < 0.5 < ideal.mfu


def test_the_overlap_window_under_accumulation_is_one_micro_batchs_backward() -> None:
    nodes = h100_cluster(8)  # 64 GPUs: the gradient all-reduce crosses the network
    lay = Layout(data=64, zero=0, micro_batch=1, accumulation=4)
    p = predict(LLAMA8B, nodes, lay, seq_len=8192, global_batch=256)
    per_micro = p.time["compute"] / 4
    grads = shard_params(LLAMA8B) * 2  # bf16 gradients
    ar = 2 * 63 * nodes.inter.time(grads / 64)
    assert p.time["data-parallel (not hidden)"] == pytest.approx(ar - per_micro * 2 / 3)
    assert p.time["data-parallel (not hidden)"] > 0.3  # hidden behind the whole step's backward, it would be 0
    z2 = predict(LLAMA8B, nodes, dataclasses.replace(lay, zero=2), seq_len=8192, global_batch=256)
    assert z2.time["data-parallel (not hidden)"] < p.time["data-parallel (not hidden)"]


def test_context_parallel_ranks_reduce_gradients_and_shard_zero_with_the_data_ranks() -> None:
    node = h100_cluster(1)
    cp = predict(LLAMA8B, node, Layout(data=2, context=4, zero=3, micro_batch=1), seq_len=8192, global_batch=2)
    dp = predict(LLAMA8B, node, Layout(data=8, zero=3, micro_batch=1), seq_len=8192, global_batch=8)
    assert cp.memory["parameters"] == dp.memory["parameters"]  # sharded over 2 x 4 = 8 ranks either way
    slow = Cluster(8, 80 * 10**9, 1e18, intra=AlphaBeta(0.0, 1e9), inter=AlphaBeta(0.0, 1e9))  # compute ~0
    lay = Layout(data=2, context=2, micro_batch=1)
    t = predict(TINY, slow, lay, seq_len=64, global_batch=2, precision=FP32).time["data-parallel (not hidden)"]
    assert t == pytest.approx(predict_all_reduce(slow.intra, param_count(TINY) * 4, 4), rel=1e-3)


def test_transients_are_counted() -> None:
    node = h100_cluster(1)
    z3 = predict(LLAMA8B, node, Layout(data=8, zero=3, micro_batch=1), seq_len=8192, global_batch=8)
    V, h = LLAMA8B.vocab_size, LLAMA8B.d_model
    assert z3.memory["logits gradient (fp32)"] == 8192 * V * 4
    assert z3.memory["gathered units (ZeRO-3)"] == 2 * (V * h + h) * 2  # the head and norm, twice, bf16
    assert z3.memory["communication buffers"] == (V * h + h) * 2
    z1 = predict(LLAMA8B, node, Layout(data=8, zero=1, micro_batch=1), seq_len=8192, global_batch=8)
    assert z1.memory["gathered units (ZeRO-3)"] == 0 == z1.memory["communication buffers"]


def test_the_practical_search_and_the_mfu_flag() -> None:
    every = candidate_layouts(LLAMA8B, 8, 64, 8192)
    practical = candidate_layouts(LLAMA8B, 8, 64, 8192, practical=True)
    assert all(LLAMA8B.n_layers // lay.pipeline >= 2 for lay in practical)
    assert any(lay.interleave > 1 for lay in practical) and not any(lay.interleave > 1 for lay in every)
    with pytest.raises(TypeError, match="practical must be True or False"):
        candidate_layouts(LLAMA8B, 8, 64, 8192, practical=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="practical must be True or False"):
        plan(LLAMA8B, h100_cluster(1), 64, 8192, practical="yes")  # type: ignore[arg-type]
    fits = plan(LLAMA8B, h100_cluster(1), 64, 8192)
    assert all(p.layout.context == 1 for p in fits)  # a sequence fits without context parallelism
    ideal = format_plan(fits, top=1)
    assert fits[0].mfu > 0.7 and "*" in ideal.splitlines()[1] and "idealized" in ideal
    real = format_plan(plan(LLAMA8B, h100_cluster(1, matmul=MatmulEfficiency()), 64, 8192), top=3)
    assert "*" not in real and "idealized" not in real  # the Megatron constant: below 70 %
    long = plan(LLAMA8B, h100_cluster(1), 8, 131072)  # 128K tokens: one sequence does not fit without CP
    assert all(p.layout.context > 1 for p in long)


def test_the_a100_cluster_is_narayanans() -> None:
    c = a100_cluster(2)
    assert (c.devices, c.peak_flops, c.intra.beta, c.inter.beta) == (16, 312e12, 300e9, 25e9)
    with pytest.raises(ValueError, match="nodes"):
        a100_cluster(0)
