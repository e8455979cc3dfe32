# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 21 · Planning a layout: memory and time by counting

Notebooks 09–20 taught each technique on its own, on a tiny transformer; a real run must first choose how much of each to use, on a cluster it rents by the hour. This notebook sizes a parallel layout before running it. A planner built from the course's own formulas predicts each rank's memory and the time of a step for any mix of data, tensor, pipeline and context parallelism, ZeRO stage, micro-batch and checkpointing. Seven layouts of the transformer, run on 4 and 8 processes, check its memory; two published tables of layouts and measured throughput (Megatron-LM's on A100s, Llama 3's on H100s) check its time; then it plans Llama 3 on H100 clusters next to the layout Meta published, and you can ask it about your own model and cluster.

By the end you will be able to:
- predict memory per rank and step time of a data, tensor, pipeline and context parallel layout with ZeRO and checkpointing, and say which term each technique changes;
- check a planner's memory against a real run, and its time against published runs, and say where and why they disagree;
- rank the layouts that fit a cluster, and read why the first ones win.

This notebook assumes: notebooks 09 (the α-β model), 13 (pipelines and their bubble), 14 (ZeRO), 16 (the transformer's counts), 17 and 18 (tensor and context parallelism) and 19 (FSDP2). It runs on 2 CPU cores; timings are marked `~`. No GPU needed.
"""

# %% slideshow={"slide_type": "-"}
import os

import torch

from course_lib.seeding import seed_everything

seed_everything(0)
os.makedirs("_runs", exist_ok=True)  # scratch folder for the scripts this notebook writes (git ignores it)
print(f"torch {torch.__version__.split('+')[0]}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Plan a layout by counting

Which technique, and how much of each, is arithmetic before it is an experiment. Practitioners size a run by counting two things:

- **memory per rank**: the model state (parameters, gradients, optimizer state; ZeRO shards it over the data-parallel ranks, tensor and pipeline parallelism split the parameters themselves) plus the activations of the micro-batches in flight;
- **time per step**: each pipeline stage's FLOPs over what its matrix products reach, the slowest stage times the micro-batches plus the pipeline's bubble, plus the communication that nothing hides.

The course owns every piece, and `course_lib.planner` puts them together: `course_lib.sharding.model_state_bytes` (notebook 14), `course_lib.tensor_parallel.tp_saved_bytes` and `tp_bytes_per_step` (notebook 17; the blocks' saved tensors are notebook 16's `block_saved_terms`), `course_lib.context_parallel.ring_attention_bytes`, the bubble of notebook 13, the α-β model of `course_lib.comm_model` (notebook 09) and the FLOPs of `course_lib.transformer.training_flops_per_token`. A `Layout` names the degrees (data, tensor, pipeline, context), the ZeRO stage, the micro-batch and accumulation, the checkpointing and the interleave (model chunks per pipeline rank); `predict` returns the bytes per rank and the seconds per step, part by part; `plan` ranks the layouts that fit.

The time model, term by term:

- **stages**: the first stage holds its blocks and the embedding, the last its blocks and the head (`stage_seconds`); a synchronous pipeline runs at its slowest stage, so a step is the slowest stage's micro-batch time × (micro-batches + (p − 1)/v), with v chunks per rank in an interleaved schedule;
- **matrix products**: with a `MatmulEfficiency` on the cluster each product reaches a fraction of the peak that grows with its size, and every micro-batch pays a fixed cost on every stage; without one the model is idealized (every product at the peak);
- **data parallel**: under accumulation DDP's gradients wait for the last micro-batch (`no_sync`), so ZeRO-0/1's reduction hides behind that micro-batch's backward only; ZeRO-2 reduce-scatters behind each micro-batch's backward, ZeRO-3 gathers and reduce-scatters behind each micro-batch. Context-parallel ranks hold replicas of the weights, so gradients are reduced, and ZeRO shards, over data × context ranks;
- **critical path**: tensor-parallel collectives, the context-parallel ring and the pipeline's sends count in full.

The memory adds the transients that decide an out-of-memory at scale: ZeRO-3's two gathered units (the one computing, the one prefetched), the fp32 gradient of the logits (V × 4 bytes per token of the micro-batch) and the communication buffers.
"""

# %% slideshow={"slide_type": "-"}
import dataclasses

from course_lib.comm_model import AlphaBeta
from course_lib.launch import run_ranks
from course_lib.planner import Cluster, Layout, PlanError, cpu_cluster, format_plan, plan, predict
from course_lib.sharding import PRECISIONS, Precision
from course_lib.transformer import PRESETS, TransformerConfig, param_count

# the tiny transformer of notebook 16, untied (tensor parallelism splits the embedding and the head apart)
# and with hand-written attention (so that selective checkpointing has its s^2 probabilities to drop)
TINY = dataclasses.replace(PRESETS["tiny"], tie_embeddings=False, attention="naive")
SEQ, BATCH = 64, 16  # 16 sequences of 64 tokens per optimizer step, on every layout
# this machine as a "cluster" of CPU processes: nominal numbers, assumed (not measured): 5 GFLOP/s per process,
# gloo over loopback with 100 us per message and 2 GB/s
CPU = cpu_cluster()  # Cluster(8 per node, 1 GiB, 5 GFLOP/s, links of AlphaBeta(100e-6, 2e9)); the capstone (notebook 22) uses it too
FP32_ADAM = PRECISIONS["fp32_adam"]  # Precision(4, 4, 8): float32 parameters and gradients, Adam's m and v
SHARDED_ADAM = Precision(4, 4, 12)  # + ShardedOptimizer's own float32 copy of its shard (like mixed precision's master weights)
LAYOUTS = {  # name: (processes of the launch, layout)
    "DDP": (4, Layout(data=4, micro_batch=4)),
    "ZeRO-1": (4, Layout(data=4, zero=1, micro_batch=4)),
    "DDP + full ckpt": (4, Layout(data=4, micro_batch=4, checkpointing="full")),
    "DDP + selective": (4, Layout(data=4, micro_batch=4, checkpointing="selective")),
    "DDP, 2 x accum 2": (4, Layout(data=4, micro_batch=2, accumulation=2)),
    "DDP on 8": (8, Layout(data=8, micro_batch=2)),
    "TP 2 x DP 4": (8, Layout(data=4, tensor=2, micro_batch=4)),
}
predicted = {name: predict(TINY, CPU, lay, seq_len=SEQ, global_batch=BATCH, precision=SHARDED_ADAM if lay.zero else FP32_ADAM)
             for name, (_, lay) in LAYOUTS.items()}
print(f"{TINY.describe()}\n{param_count(TINY):,} parameters; global batch {BATCH} x {SEQ} tokens")
print(f"this machine, assumed: {CPU.peak_flops / 1e9:g} GFLOP/s per process, links of {CPU.intra.alpha * 1e6:g} µs per message"
      f" and {CPU.intra.beta / 1e9:g} GB/s\n")
PARTS = ("parameters", "gradients", "optimizer state", "activations", "recompute buffer")  # what the ranks hold between steps
print(f"{'layout':<17}" + "".join(f"{k:>17}" for k in PARTS) + f"{'transients':>11}{'step ms':>9}")
for name, p in predicted.items():
    transients = p.memory_total - sum(p.memory[k] for k in PARTS)
    print(f"{name:<17}" + "".join(f"{p.memory[k]:>17,}" for k in PARTS) + f"{transients:>11,}{1e3 * p.step_time:>9.1f}")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Checked here: seven layouts on 4 and 8 processes

The script below runs each layout for real on the tiny transformer: DDP (its gradients views of its buckets, so there is no second copy), ZeRO-1 (`course_lib.sharded_optim.ShardedOptimizer`, sharded by element), full and selective checkpointing, a smaller micro-batch with accumulation, and tensor parallelism (`course_lib.tensor_parallel`, notebook 17) on pairs of ranks with data parallelism across the pairs. One launch per process count runs its layouts in turn. Each rank counts what it holds exactly, as notebook 14 does: the model state from the tensors themselves (`course_lib.memory.state_bytes`; Adam's 0-d step counters, 4 bytes per tensor, left out as the model leaves them out), the activations with `course_lib.saved_tensors.SavedTensorMeter` around one micro-batch's forward (parameters and the rotary tables, which are model buffers, excluded). Step times are the median of three steps, after `~`.
"""

# %% slideshow={"slide_type": "-"}
# %%writefile _runs/capstone_layouts.py
"""Run transformer layouts for real on the CPU ranks of one launch; count each rank's bytes exactly."""
import dataclasses
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.memory import state_bytes
from course_lib.saved_tensors import SavedTensorMeter
from course_lib.sharded_optim import ShardedOptimizer
from course_lib.tensor_parallel import parallelize_transformer_, tensor_parallel_loss
from course_lib.transformer import Transformer


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def run_layout(rank, world, config, lay, groups, seq_len, global_batch, steps):
    T, D, mb, accum = lay["tensor"], lay["data"], lay["micro_batch"], lay["accumulation"]
    tp_group, dp_group = groups[T]["tp"], groups[T]["dp"]
    dp_rank = rank // T
    config = dataclasses.replace(config, checkpointing=lay["checkpointing"])
    model = Transformer(config, seed=0)
    if T > 1:
        parallelize_transformer_(model, tp_group)
        net = model
    else:
        net = DDP(model, gradient_as_bucket_view=True)  # gradients are views of DDP's buckets: no second copy
    if lay["zero"] == 1:
        opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, shard_by="element", group=dp_group, lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randint(0, config.vocab_size, (global_batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    mine = data[dp_rank * mb * accum:(dp_rank + 1) * mb * accum]

    def forward(k):
        part = mine[k * mb:(k + 1) * mb]
        ids, tg = part[:, :-1].clone(), part[:, 1:].clone()  # their own storage, as a data loader's batch
        if T > 1:
            return tensor_parallel_loss(model, ids, tg)
        logits = net(ids)  # DDP's forward (its hooks), the loss as Transformer.loss computes it
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tg.flatten())

    def step():
        opt.zero_grad(set_to_none=False)
        for k in range(accum):
            sync = net.no_sync() if (T == 1 and k < accum - 1) else nullcontext()
            with sync:
                (forward(k) / accum).backward()
        if T > 1:  # data parallel by hand across the tp groups' twins
            for p in model.parameters():
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= D
        opt.step()

    step()  # warm: gradients and optimizer state exist
    with SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()]) as meter:  # rotary tables: model's
        loss = forward(0)
    loss.backward()  # frees what the meter saw
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    st = state_bytes(model, opt.optim if isinstance(opt, ShardedOptimizer) else opt)
    scalars = 0
    inner = opt.optim if isinstance(opt, ShardedOptimizer) else opt
    for s in inner.state.values():  # Adam's step counters: one 0-d float per tensor, left out as the model does
        scalars += sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() == 0)
    optimizer = st.optimizer_state - scalars
    if isinstance(opt, ShardedOptimizer):  # its shard's own float32 copy of the parameters: optimizer state too
        optimizer += nbytes(p for g in opt.optim.param_groups for p in g["params"])
    return {"name": lay["name"], "parameters": st.parameters, "gradients": st.gradients, "optimizer state": optimizer,
            "activations": meter.bytes, "step_s": statistics.median(times)}


def measure(rank, world, config, layouts, seq_len, global_batch, steps=3):
    torch.set_num_threads(1)
    groups = {}
    for T in sorted({lay["tensor"] for lay in layouts}):  # every rank creates every group, in the same order
        tps = [dist.new_group(list(range(d * T, (d + 1) * T))) for d in range(world // T)]
        dps = [dist.new_group(list(range(t, world, T))) for t in range(T)]
        groups[T] = {"tp": tps[rank // T], "dp": dps[rank % T]}
    return [run_layout(rank, world, config, lay, groups, seq_len, global_batch, steps) for lay in layouts]


# %% slideshow={"slide_type": "-"}
def spec(name, lay):
    return {"name": name, "data": lay.data, "tensor": lay.tensor, "zero": lay.zero, "micro_batch": lay.micro_batch,
            "accumulation": lay.accumulation, "checkpointing": lay.checkpointing}


measured = {}
for world in (4, 8):
    group = [spec(name, lay) for name, (n, lay) in LAYOUTS.items() if n == world]
    ranks = run_ranks("_runs/capstone_layouts.py:measure", nprocs=world, args=(TINY, group, SEQ, BATCH), timeout=600, echo="none")
    for i, row in enumerate(ranks[0]):
        worst = {k: max(r[i][k] for r in ranks) for k in ("parameters", "gradients", "optimizer state", "activations")}
        worst["step_s"] = max(r[i]["step_s"] for r in ranks)  # the slowest rank sets the step
        measured[row["name"]] = worst
print(f"{'layout':<17} {'part':<16} {'predicted':>10} {'measured':>10} {'error':>8}")
worst_error = 0.0
for name, p in predicted.items():
    for part in ("parameters", "gradients", "optimizer state", "activations"):
        pred, meas = p.memory[part], measured[name][part]
        error = (pred - meas) / meas
        worst_error = max(worst_error, abs(error))
        print(f"{name:<17} {part:<16} {pred:>10,} {meas:>10,} {error:>+8.2%}")
assert worst_error <= 0.05
print(f"every part of every layout within 5%: largest error {worst_error:.2%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Every data-parallel row matches to the byte: the model state is `model_state_bytes` of the rank's parameters (ZeRO-1's optimizer state is `ceil(Ψ / 4)` elements of the padded flat shard: m, v and the shard's own copy), and the activations are notebook 16's count. Under tensor parallelism the parameters, gradients and optimizer state match exactly too (the blocks, the embedding and the head split in two, the norms whole); its activations are 0.06% over the prediction: the vocabulary-parallel embedding and loss keep masks and local targets that the planner leaves out. Full checkpointing's row is what a rank holds after its forward (each block's input); in backward one recomputed block comes on top, the planner's "recompute buffer".

Now the step times. The prediction is FLOPs over a nominal peak plus the unhidden communication; the measurement is this loaded machine's. Each launch's layouts are ranked by both (1 = fastest):
"""

# %% slideshow={"slide_type": "-"}
for world in (4, 8):
    names = [name for name, (n, _) in LAYOUTS.items() if n == world]
    by_pred = sorted(names, key=lambda n: predicted[n].step_time)
    by_meas = sorted(names, key=lambda n: measured[n]["step_s"])
    print(f"{world} processes: {'layout':<17} {'predicted ms':>12} {'rank':>5}   measured ms, rank")
    for name in names:
        tied = sum(predicted[n].step_time < predicted[name].step_time - 1e-12 for n in names) + 1
        print(f"{'':<13}{name:<17} {1e3 * predicted[name].step_time:>12.1f} {tied:>5}   "
              f"~{1e3 * measured[name]['step_s']:.1f}, ~{by_meas.index(name) + 1}")
    base = names[0]
    for name in names[1:]:
        ratio = predicted[name].step_time / predicted[base].step_time
        print(f"{'':<13}{name} / {base}: predicted x{ratio:.2f} ({'slower' if ratio > 1 + 1e-9 else 'the same'}), "
              f"measured x~{measured[name]['step_s'] / measured[base]['step_s']:.2f}")
assert predicted["DDP + full ckpt"].step_time > predicted["DDP"].step_time  # one more forward: +1/3 of the FLOPs
assert predicted["TP 2 x DP 4"].step_time > predicted["DDP on 8"].step_time  # its collectives are on the critical path

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Where the orders differ, and why. The planner counts FLOPs and bytes; on two shared CPU cores a model of 0.13 M parameters is dominated by what it does not count:

- **accumulation** and **ZeRO-1** tie with DDP in the prediction (the same FLOPs; the extra communication is assumed hidden). Measured, accumulation pays each micro-batch's fixed cost (Python, kernel calls, one more forward and backward) twice, and ZeRO-1's parameter all-gather and copies run on the same CPU cores as the compute: on a CPU nothing overlaps for free.
- **Selective checkpointing** is predicted a few percent slower (attention proper recomputed); measured, its extra Python per block costs more than its arithmetic, as notebook 04 showed for small layers.
- **Tensor parallelism** is predicted a little slower than DDP on 8 (a ring all-reduce of 2 steps for each of its 13 collectives per micro-batch, at 100 µs per message); measured, it is several times slower (the ratio above): 8 processes sharing 2 cores wait for each other at every one of those collectives, and each waits for the slowest.

On a GPU cluster the compute term dominates and the prediction is closer; the memory is what the planner gets exactly, and memory decides what fits. That is why only the memory is asserted here.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. Checked against published runs

A time model is worth what it predicts for runs it was not fitted on. Two papers publish layouts next to their measured throughput:

- **Megatron-LM** (Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, SC'21, arXiv:2104.04473, Table 1): GPT models of 1.7B to 1T parameters on 32 to 3,072 A100 80 GB GPUs (DGX A100 nodes: 312 TFLOP/s dense bf16 each, NVLink 600 GB/s per GPU in total, eight 200 Gb/s InfiniBand NICs per node), sequences of 2,048 tokens, a 51,200-token vocabulary, the interleaved schedule, full recomputation and plain data parallelism. Its TFLOP/s count the paper's own FLOPs, recomputation included: `96 B s l h² (1 + s/6h + V/16lh)` per step.
- **Llama 3** (*The Llama 3 Herd of Models*, arXiv:2407.21783, Table 4): the 405B model on 8,192 and 16,384 H100s, TP 8 and PP 16, 16M tokens per batch, 430, 400 and 380 TFLOP/s per GPU (43%, 41% and 38% bf16 MFU); the last row trains 128K-token sequences with CP 16. Its TFLOP/s are model FLOPs.

`course_lib.published_runs` holds both tables. For each row, `compare` predicts the published degrees with the paper's stated choices (Megatron: no ZeRO, full recomputation; Llama 3: the planner's best ZeRO stage and checkpointing that fit) and the planner's best micro-batch and interleave; converts the step time into the paper's own FLOPs per second and GPU; and ranks that layout among every layout the planner considers for the same model, GPUs and batch.

One constant is calibrated: `MatmulEfficiency.peak_fraction`, the fraction of the peak that large matrix products reach, fitted on Megatron's table (A100s) and tested on Llama 3's (H100s). The two others are assumed, not fitted: a product's rate halves at a dimension of 64, and a micro-batch costs 1 ms per stage besides its products.
"""

# %% slideshow={"slide_type": "-"}
import math
import time

from course_lib.planner import MatmulEfficiency, stage_seconds
from course_lib.published_runs import LLAMA3, MEGATRON, compare, fit_peak_fraction

start = time.perf_counter()
a100_fraction = fit_peak_fraction(MEGATRON)
A100_EFF = MatmulEfficiency(peak_fraction=a100_fraction)
assert A100_EFF == MatmulEfficiency()  # the library's default is this fit
print(f"fitted on Megatron-LM's Table 1: peak_fraction {a100_fraction:.3f} (large products reach {a100_fraction * 312:.0f} TFLOP/s of the A100's 312)\n")
print(f"assumed, not fitted: a product's rate halves at a dimension of {A100_EFF.half_size:g};"
      f" {A100_EFF.per_micro_batch_s * 1e3:g} ms per micro-batch and stage besides its products\n")
print(f"{'model':<9}{'GPUs':>6}{'TP':>4}{'PP':>4}{'DP':>5}  {'published':>9} {'predicted':>9} {'error':>7}   rank of the published layout   planner's choice for it")
megatron = [compare(r, A100_EFF) for r in MEGATRON]
for c in megatron:
    r, lay = c.run, c.published.layout
    print(f"{r.name:<9}{r.gpus:>6}{r.tensor:>4}{r.pipeline:>4}{r.data:>5}  {r.tflops_per_gpu:>9.0f} {c.tflops_per_gpu:>9.1f} {c.error:>+7.1%}"
          f"   {c.rank:>4} of {c.candidates:<18}   micro-batch {lay.micro_batch}, {lay.interleave} chunk(s)")
rms = math.sqrt(sum(c.error**2 for c in megatron) / len(megatron))
print(f"TFLOP/s per GPU in the paper's FLOPs; root-mean-square error {rms:.1%}, largest {max(abs(c.error) for c in megatron):.1%}")
print(f"small models predicted faster than measured: {all(c.error > 0 for c in megatron[:4])}; the largest slower: {all(c.error < 0 for c in megatron[-4:])}")
for c in (megatron[0], megatron[-1]):
    print(f"{c.run.name}: the planner's first choice: {c.best.layout.describe()}")
assert rms < 0.15 and all(abs(c.error) < 0.2 for c in megatron)


# %% slideshow={"slide_type": "-"}
def llama_rows(eff, rank):
    rows = [compare(r, eff, rank=rank) for r in LLAMA3]
    for c in rows:
        r = c.run
        where = f"rank {c.rank} of {c.candidates}" if rank else ""
        print(f"  {r.gpus:>6} GPUs, CP {r.context:>2}, {r.seq_len:>6} tokens: published {r.tflops_per_gpu:.0f}, predicted {c.tflops_per_gpu:.0f}"
              f" TFLOP/s per GPU ({c.error:+.1%}; MFU {c.published.mfu:.0%}) {where}")
    return rows


print(f"Llama 3 405B (its 128-layer twin) on H100s, with the A100's constant ({a100_fraction:.3f}):")
tested = llama_rows(A100_EFF, rank=False)
h100_fraction = fit_peak_fraction(LLAMA3[:1])
H100_EFF = MatmulEfficiency(peak_fraction=h100_fraction)
print(f"\nrefitted on the 8,192-GPU row alone: peak_fraction {h100_fraction:.3f}; the other two rows are the test:")
llama = llama_rows(H100_EFF, rank=True)
first = llama[0].published
print(f"\nthe published layout as the planner runs it: {first.layout.describe()}")
print("  time by part:", ", ".join(f"{k} {v:.2f} s" for k, v in first.time.items() if v))
print(f"  memory: {first.memory_total / 2**30:.1f} GiB per rank; without recomputation {predict(LLAMA3[0].config, LLAMA3[0].cluster(H100_EFF), dataclasses.replace(first.layout, checkpointing='none'), seq_len=8192, global_batch=2048).memory_total / 2**30:.0f} GiB")
long = llama[2].published
print(f"the 128K row: {long.layout.describe()}")
print("  time by part:", ", ".join(f"{k} {v:.2f} s" for k, v in long.time.items() if v))
twin = LLAMA3[0].config
for p in (16, 128):
    lay = Layout(data=8192 // (8 * p), tensor=8, pipeline=p, micro_batch=1, accumulation=max(p, 32))
    st = stage_seconds(twin, LLAMA3[0].cluster(H100_EFF), lay, seq_len=8192)
    print(f"PP {p:>3}: the last stage (its {128 // p} blocks and the head) takes {st['last'] / st['first']:.2f}x the first stage's time")
print(f"\nall of this section's published runs compared in ~{time.perf_counter() - start:.0f} s")
assert all(c.error < -0.25 for c in tested) and abs(llama[1].error) < 0.1 and llama[2].error < -0.2

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Where they agree, where they disagree, and why (the numbers are the outputs above):

- **Megatron's table, the fit**: one constant brings every row within the printed bound, but not evenly: the small models run slower than predicted and the largest faster. The constant is low because it absorbs what the model does not count, the memory-bound operations of the 2021 kernels (layer norms, GeLU, softmax and dropout, unfused, before FlashAttention). Their time grows with s·h per layer, the products' with s·h², so they weigh more in a small model; one constant fitted to every row averages them, and the trend remains.
- **Llama 3 with the A100's constant**: every row is predicted far too slow (the errors printed). The constant is not a property of the model but of the GPU and the software of its time: on H100s in 2024 the products are closer to the peak.
- **Llama 3 with the H100's constant**: fitted on one row, it predicts the 16,384-GPU row at TP 8, PP 16 within a few percent. The constant comes out high because the planner charges the published layout full recomputation (without it the printed memory does not fit), one more forward per step; Meta's run recomputed less, and the constant absorbs the difference. That is also why it overstates the MFU of layouts that recompute nothing (the 8B cases below, marked).
- **The 128K-token row** is predicted too slow: the model charges the context-parallel exchange in full, as a ring that waits at every step, where Llama 3 all-gathered the keys and values (grouped-query attention makes them small) and overlapped the exchange with the attention.
- **Unequal stages**: at PP 16 the twin's last stage carries the head on top of its blocks and sets the pace (the ratio printed); at PP 128 the head costs as much as a large part of a stage. The paper removes one layer from its first and last stages to balance them; the planner's twin keeps equal stages and pays the imbalance.
- **The ranks**: the planner puts Llama 3's published layouts among its first few and Megatron's in the middle of its list, never first. Its first choices (printed) shard with ZeRO over many more data-parallel ranks, with shorter pipelines or none and less recomputation, and it assumes ZeRO's collectives overlap perfectly; Megatron's code of 2021 had no ZeRO, and at thousands of ranks the latency of every collective grows beyond the α-β model's ring.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. Applied there: Llama 3 on H100s

The same planner on published models and hardware, with the H100's constant. The specifications, with their sources:

- **H100 SXM** (NVIDIA H100 Tensor Core GPU datasheet): 80 GB of HBM3; 989 TFLOP/s dense bf16 (the datasheet's 1,979 is with 2:4 sparsity); NVLink 900 GB/s per GPU in total, so 450 GB/s each way.
- **A node** (NVIDIA DGX H100 user guide): 8 H100s on NVLink, one 400 Gb/s InfiniBand port (ConnectX-7) per GPU: 50 GB/s each way between nodes.
- **Latencies** α: assumed 5 µs inside a node and 10 µs between nodes (an order of magnitude, not a datasheet number).
- **Models** (Llama Team, *The Llama 3 Herd of Models*, arXiv:2407.21783, Table 3): 8B (32 layers, width 4,096, FFN 14,336, 32 heads), 70B (80 layers, 8,192, 28,672, 64 heads), 405B (126 layers, 16,384, 53,248, 128 heads), all with 8 key/value heads and a 128K vocabulary; 8,192-token sequences in pre-training.

The planner needs equal pipeline stages: for the 405B model it plans a 128-layer twin (1.6% more parameters), since 126 layers do not split into 16 equal stages. It searches what practitioners consider: tensor parallelism within a node, at least 2 layers per stage, interleaves of 1, 2 or 4, and context parallelism only when a sequence's activations do not fit without it.
"""

# %% slideshow={"slide_type": "-"}
H100 = dict(devices_per_node=8, memory_bytes=80 * 10**9, peak_flops=989e12,
            intra=AlphaBeta(5e-6, 450e9), inter=AlphaBeta(10e-6, 50e9), matmul=H100_EFF)
LLAMA3_SHAPE = dict(vocab_size=128256, n_kv_heads=8, max_seq_len=8192, tie_embeddings=False, rope_theta=500000.0)
MODELS = {
    "Llama 3 8B": PRESETS["llama3-8b"],
    "Llama 3 70B": TransformerConfig(d_model=8192, n_layers=80, n_heads=64, d_ff=28672, **LLAMA3_SHAPE),
    "Llama 3 405B (128 layers)": TransformerConfig(d_model=16384, n_layers=128, n_heads=128, d_ff=53248, **LLAMA3_SHAPE),
}
full_405b = dataclasses.replace(MODELS["Llama 3 405B (128 layers)"], n_layers=126)
print(f"the 128-layer twin of the 405B model: {param_count(MODELS['Llama 3 405B (128 layers)']) / param_count(full_405b) - 1:.1%}"
      f" more parameters than the 126 layers ({param_count(full_405b) / 1e9:.1f}B)\n")
CASES = [("Llama 3 8B", 1, 64), ("Llama 3 8B", 8, 512), ("Llama 3 70B", 64, 1024)]
for model, nodes, batch in CASES:
    gpus = 8 * nodes
    best = plan(MODELS[model], Cluster(nodes=nodes, **H100), global_batch=batch, seq_len=8192)
    print(f"{model}, {param_count(MODELS[model]) / 1e9:.1f}B parameters, on {gpus} H100s, {batch} sequences of 8192 per step:")
    print(format_plan(best, top=3), end="\n\n")
ideal = plan(MODELS["Llama 3 8B"], Cluster(nodes=1, **{**H100, "matmul": None}), global_batch=64, seq_len=8192)
print("the same 8B case with the idealized model (every product at the peak):")
print(format_plan(ideal, top=1))
print(f"\nLlama 3 405B on 8,192 H100s, 2,048 sequences: the published layout ranks {llama[0].rank} of {llama[0].candidates};"
      f" the planner's first: {llama[0].best.layout.describe()}, MFU {llama[0].best.mfu:.0%} against {llama[0].published.mfu:.0%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**How far to trust it.** The outputs above show where the planner's numbers stand:

- **memory** is counted, not modelled: within 5% of what the ranks held, exactly for every data-parallel layout (asserted). Trust it to say what fits; its transients are what a memory tracker adds at scale (notebook 19 §7 measures them for Llama 3 8B);
- **time**, with the calibrated efficiency, lands within the printed errors of two published tables, once its one constant is fitted for the GPU and the software: the A100's does not carry over to the H100. Refit it on one measured run of your own before trusting a forecast;
- **the idealized model** (no `MatmulEfficiency`) runs every product at the peak: its MFU is an upper bound, and the planner marks any MFU above 70 % as idealized. No published run of a dense model reaches it;
- **what the model still leaves out**: memory-bound operations beyond the constant, collectives that take longer than the ring model says at thousands of ranks, the overlap of the context-parallel exchange, and the fixed costs of CPU processes (the step times above are off by large factors both ways).

So: trust its memory to decide what fits, use its times to compare layouts on a cluster whose constant you have measured, and make the last choice by measuring.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Your numbers

The planner, for your model and your cluster. Choose a model, the number of GPUs, what each has, the batch, and the fraction of the peak that large matrix products reach (the H100's constant fitted above; 0 for the idealized model); it prints the five fastest layouts that fit, or why none does. The static version after it prints the same text for two cases. The short table after that says which technique answers which bottleneck; the planner's columns are the numbers behind it.
"""

# %% slideshow={"slide_type": "fragment"}
import ipywidgets as widgets
from IPython.display import display

CHOICES = {"tiny (this notebook)": TINY, **MODELS}


def advise(model, gpus, gpus_per_node, memory_gb, tflops, nvlink_gb_s, network_gb_s, batch, seq_len, matmul_pct):
    """The planner's five fastest layouts for these numbers, or why nothing fits."""
    config = CHOICES[model]
    if gpus % gpus_per_node:
        return f"{gpus} GPUs do not make whole nodes of {gpus_per_node}"
    if not 0 <= matmul_pct <= 100:
        return f"the matrix products' fraction of the peak must be in [0, 100] %, got {matmul_pct}"
    eff = dataclasses.replace(H100_EFF, peak_fraction=matmul_pct / 100) if matmul_pct else None
    cluster = Cluster(gpus_per_node, int(memory_gb * 1e9), tflops * 1e12, AlphaBeta(5e-6, nvlink_gb_s * 1e9),
                      AlphaBeta(10e-6, network_gb_s * 1e9), nodes=gpus // gpus_per_node, matmul=eff)
    try:
        return f"{model} on {gpus} GPUs, {batch} x {seq_len} tokens per step:\n" + format_plan(
            plan(config, cluster, global_batch=batch, seq_len=seq_len, precision="mixed_adam"), top=5)
    except (PlanError, ValueError) as e:
        return f"{model} on {gpus} GPUs: {e}"


knobs = dict(
    model=widgets.Dropdown(options=list(CHOICES), value="Llama 3 8B", description="model:"),
    gpus=widgets.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=8, description="GPUs:"),
    gpus_per_node=widgets.Dropdown(options=[1, 2, 4, 8], value=8, description="per node:"),
    memory_gb=widgets.FloatText(value=80.0, description="GB each:"),
    tflops=widgets.FloatText(value=989.0, description="TFLOP/s:"),
    nvlink_gb_s=widgets.FloatText(value=450.0, description="node GB/s:"),
    network_gb_s=widgets.FloatText(value=50.0, description="net GB/s:"),
    batch=widgets.IntText(value=64, description="batch:"),
    seq_len=widgets.IntText(value=8192, description="seq len:"),
    matmul_pct=widgets.FloatText(value=round(100 * h100_fraction, 1), description="matmul %:"),
)
advice = widgets.Output()


def refresh(change=None):
    advice.outputs = ()
    advice.append_stdout(advise(**{k: w.value for k, w in knobs.items()}) + "\n")


for w in knobs.values():
    w.observe(refresh, names="value")
refresh()
display(widgets.VBox([*knobs.values(), advice]))

# %% slideshow={"slide_type": "fragment"}
# static fallback: the same text for two cases (one that fits, one that does not)
MATMUL_PCT = round(100 * h100_fraction, 1)
print(advise("Llama 3 8B", 8, 8, 80.0, 989.0, 450.0, 50.0, 64, 8192, MATMUL_PCT), end="\n\n")
print(advise("Llama 3 70B", 8, 8, 80.0, 989.0, 450.0, 50.0, 8, 8192, MATMUL_PCT))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- Size a layout by counting: `course_lib.planner` adds up the course's formulas; on seven real layouts of the transformer (DDP, ZeRO-1, full and selective checkpointing, accumulation, tensor × data parallel) its memory per rank is within 5% of what the ranks hold (exact for every data-parallel one). Its time model runs each pipeline stage (the head on the last), the interleaved bubble, the overlap each ZeRO stage allows under accumulation and a matrix-product efficiency calibrated on one constant: fitted on Megatron-LM's published A100 runs, refitted on one Llama 3 run, it predicts the other published runs within the errors printed in section 3, and says where and why it misses (the 128K-token run's context-parallel exchange).
- A time model is worth what it predicts for runs it was not fitted on: one constant fitted on Megatron-LM's table, one on a single row of Llama 3's, each tested on the others, with the errors and the ranks of the published layouts printed in section 3.
- The planner's memory is what to trust first, since memory decides what fits; its times rank layouts that differ in communication and bubble, and the last choice is made by measuring.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

1. Write `tp_rank_params(config, n)`: how many parameters one of `n` tensor-parallel ranks holds for a `TransformerConfig` with an untied head, as `course_lib.tensor_parallel` splits it (section 2's "TP 2 x DP 4" row). `course_lib.transformer.param_counts(config)` gives the parts; decide which of them divide by `n`.
2. Write `pipeline_step_time(stage_seconds, micro_batches, interleave)`: the time of one step of a synchronous pipeline whose stages take `stage_seconds[i]` per micro-batch (forward and backward), with `interleave` model chunks per rank, communication left out (section 1's time model).
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.planning import check_pipeline_step_time, check_tp_rank_params


def tp_rank_params(config, n):
    raise NotImplementedError  # your code here: course_lib.transformer.param_counts(config) has the parts


print(check_tp_rank_params(tp_rank_params))


# %% slideshow={"slide_type": "-"}
def pipeline_step_time(stage_seconds, micro_batches, interleave):
    raise NotImplementedError  # your code here


print(check_pipeline_step_time(pipeline_step_time))

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- Llama Team, AI @ Meta, *The Llama 3 Herd of Models*, 2024, [arXiv:2407.21783](https://arxiv.org/abs/2407.21783) (Table 3: model shapes; Table 4: the 405B run's parallel layouts and TFLOP/s per GPU).
- D. Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM*, SC 2021, [arXiv:2104.04473](https://arxiv.org/abs/2104.04473) (Table 1: GPT 1.7B to 1T on A100s, layouts and achieved TFLOP/s per GPU; the interleaved schedule); NVIDIA, [A100 Tensor Core GPU datasheet](https://www.nvidia.com/en-us/data-center/a100/) (312 TFLOP/s dense bf16, NVLink 600 GB/s).
- NVIDIA, [H100 Tensor Core GPU datasheet](https://www.nvidia.com/en-us/data-center/h100/) (80 GB HBM3, 989 TFLOP/s dense bf16, NVLink 900 GB/s) and [DGX H100 user guide](https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html) (8 GPUs per node, ConnectX-7 400 Gb/s per GPU).
- V. Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*, 2022, [arXiv:2205.05198](https://arxiv.org/abs/2205.05198) (selective recomputation, sequence parallelism).
- S. Rajbhandari et al., *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*, SC 2020, [arXiv:1910.02054](https://arxiv.org/abs/1910.02054) (sharding: notebook 14).
"""
