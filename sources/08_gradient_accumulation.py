# %% [markdown] slideshow={"slide_type": "slide"}
"""
# 08 · Gradient accumulation: a big batch from small ones

A batch that does not fit in memory can still be trained on: run it as `k` micro-batches, let `backward()` add their gradients into `.grad`, and step the optimizer once. This notebook proves when that is *exactly* the big batch, and shows the places where it is not: a loss normalized by the wrong count, and losses that couple the samples of a batch.

By the end you will be able to:
- write an accumulation loop whose gradients equal the big batch's (checked with `allclose`), with the loss scaled correctly for a `mean` or a `sum` loss;
- handle a short last micro-batch and the end of an epoch without leaking gradients into the next step;
- normalize a loss by its elements counted globally (tokens of variable-length sequences, across micro-batches and across ranks), and recognize losses that couple the batch (BatchNorm, in-batch negatives) and GradCache's fix;
- explain why BatchNorm breaks the equivalence, and measure how memory and time change with the micro-batch size;
- combine accumulation with a loss scaler (`torch.amp.GradScaler`): scale every micro-batch, one `unscale_`/`step`/`update` per optimizer step.

This notebook assumes: notebooks 01–03 (autograd accumulates into `.grad`; what autograd saves for backward, measured with `SavedTensorMeter`) and notebook 06 (loss scaling), and a basic training loop with `torch.optim`.
"""

# %% slideshow={"slide_type": "-"}
import copy
import time
from itertools import islice

import matplotlib.pyplot as plt
import torch
from torch import nn
from tqdm.auto import tqdm

from course_lib.data import digits
from course_lib.errors import expect_error
from course_lib.saved_tensors import SavedTensorMeter, format_bytes
from course_lib.seeding import seed_everything

seed_everything(0)
torch.set_num_threads(1)   # one thread: timings are steadier on a shared machine
train, test = digits()
X, Y = train.flat(), train.y
print(f"digits: {len(train)} training and {len(test)} test images, {X.shape[1]} pixels each, 10 classes")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 1. Accumulated micro-batches equal one big batch

`backward()` does not overwrite `.grad`, it **adds** to it. With a `mean` loss, the big batch's gradient is the average of the per-sample gradients. Split a batch of `B` samples into `k` equal micro-batches of `B/k`: each micro-batch's mean loss has the average over its own `B/k` samples, so dividing each micro-batch loss by `k` before `backward()` makes the sum in `.grad` equal the big-batch average.
"""


# %% slideshow={"slide_type": "-"}
def make_mlp() -> nn.Module:
    seed_everything(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


loss_fn = nn.CrossEntropyLoss()  # reduction="mean" (the default)
B, k = 128, 4
xb, yb = X[:B], Y[:B]

big = make_mlp()
loss_fn(big(xb), yb).backward()

acc = make_mlp()
for xm, ym in zip(xb.chunk(k), yb.chunk(k)):
    (loss_fn(acc(xm), ym) / k).backward()  # .grad += d(loss/k)/dp

for (name, p), q in zip(big.named_parameters(), acc.parameters()):
    torch.testing.assert_close(q.grad, p.grad)
max_diff = max((p.grad - q.grad).abs().max().item() for p, q in zip(big.parameters(), acc.parameters()))
assert max_diff < 1e-6  # float32 rounding: the sums are taken in another order
print(f"{k} micro-batches of {B // k} == one batch of {B}: every gradient allclose, largest difference < 1e-6 "
      f"(~{max_diff:.0e}: the last bits depend on this CPU's kernels)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The difference is not exactly zero: the additions happen in another order, and float32 rounding depends on the order. It is at the level of float32 rounding (about `1e-8` here), far below anything training notices.

The equivalence holds for whole training runs too. Below, one epoch of SGD with momentum on the digits: batches of 128 against micro-batches of 32 accumulated 4 at a time, same sample order. The parameters at the end agree to rounding, and so do the test accuracies.
"""


# %% slideshow={"slide_type": "fragment"}
def train_epoch(micro: int, k: int, seed: int = 0) -> tuple[nn.Module, int]:
    model, steps = make_mlp(), 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    order = torch.randperm(len(Y), generator=torch.Generator().manual_seed(seed))
    big_batch = micro * k
    n_full = len(Y) // big_batch * big_batch  # equal micro-batches only, for now (section 3 fixes the rest)
    for start in range(0, n_full, big_batch):
        idx = order[start : start + big_batch]
        for part in idx.chunk(k):
            (loss_fn(model(X[part]), Y[part]) / k).backward()
        opt.step()
        opt.zero_grad()
        steps += 1
    return model, steps


def accuracy(model: nn.Module) -> float:
    with torch.no_grad():
        return (model(test.flat()).argmax(1) == test.y).float().mean().item()


(m_big, steps_big), (m_acc, steps_acc) = train_epoch(micro=128, k=1), train_epoch(micro=32, k=4)
drift = max((p - q).abs().max().item() for p, q in zip(m_big.parameters(), m_acc.parameters()))
assert drift < 1e-4 and steps_big == steps_acc == len(Y) // 128
assert accuracy(m_big) == accuracy(m_acc)
print(f"after {steps_big} optimizer steps ({len(Y)} // 128): largest parameter difference < 1e-4; the same test "
      f"accuracy for batch 128 and 4 x 32: {accuracy(m_big) == accuracy(m_acc)} (~{accuracy(m_big):.4f})")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 2. Where the scale factor comes from: `mean` versus `sum`

Dividing by `k` is right for a `mean` loss only. The rule is: **the accumulated loss must be the loss you would have computed on the big batch.**
- `reduction="mean"`: each micro-batch mean must be multiplied by `n_i / N` (`1/k` when the micro-batches are equal). Forgetting it gives gradients `k` times too large, which with SGD is a `k` times larger learning rate.
- `reduction="sum"`: the big-batch sum *is* the sum of the micro-batch sums, so no factor at all. Dividing by `k` here makes the gradients `k` times too small.
"""


# %% slideshow={"slide_type": "-"}
def grads_of(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def accumulated(loss: nn.Module, scale: float) -> torch.Tensor:
    model = make_mlp()
    for xm, ym in zip(xb.chunk(k), yb.chunk(k)):
        (loss(model(xm), ym) * scale).backward()
    return grads_of(model)


def big_batch(loss: nn.Module) -> torch.Tensor:
    model = make_mlp()
    loss(model(xb), yb).backward()
    return grads_of(model)


mean_loss, sum_loss = nn.CrossEntropyLoss(), nn.CrossEntropyLoss(reduction="sum")
cases = {
    "mean loss, divided by k": (accumulated(mean_loss, 1 / k), big_batch(mean_loss)),
    "mean loss, not divided": (accumulated(mean_loss, 1.0), big_batch(mean_loss)),
    "sum loss, not divided": (accumulated(sum_loss, 1.0), big_batch(sum_loss)),
    "sum loss, divided by k": (accumulated(sum_loss, 1 / k), big_batch(sum_loss)),
}
for name, (g_acc, g_big) in cases.items():
    ratio = (g_acc.norm() / g_big.norm()).item()
    print(f"{name:<24} |accumulated| / |big batch| = {ratio:.4f}  exact: {torch.allclose(g_acc, g_big, atol=1e-6)}")
assert torch.allclose(*cases["sum loss, not divided"], atol=1e-5)
assert abs((cases["mean loss, not divided"][0].norm() / cases["mean loss, not divided"][1].norm()).item() - k) < 1e-4

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 3. The cluster post's accumulation loop, run as written

The cluster post gives this loop (reformatted; the logic is untouched). Its two claims are right: divide the loss by the number of accumulation steps *if the loss is averaged*, and reset the gradients once before the loop and after every `optimizer.step()`, never at the top of every iteration.

We run it on the digits with `TARGET_BATCH_SIZE, BATCH_FIT_IN_MEMORY = 256, 32`, the post's numbers.
"""


# %% slideshow={"slide_type": "-"}
def cluster_post_loop(network: nn.Module, optim: torch.optim.Optimizer, dataloader, accumulation_steps: int) -> int:
    """The post's loop; returns how many optimizer steps it took."""
    steps = 0
    network.zero_grad()                            # Reset gradients tensors
    for i, (imgs, labels) in enumerate(dataloader):
        preds = network(imgs)                      # Forward pass
        loss = loss_fn(preds, labels)              # Compute loss function
        loss = loss / accumulation_steps           # Normalize our loss (if averaged)
        loss.backward()                            # Backward pass
        if (i + 1) % accumulation_steps == 0:      # Wait for several backward steps
            optim.step()                           # Perform an optimizer step
            network.zero_grad()                    # Reset gradients tensors
            steps += 1
    return steps


TARGET_BATCH_SIZE, BATCH_FIT_IN_MEMORY = 256, 32
accumulation_steps = int(TARGET_BATCH_SIZE / BATCH_FIT_IN_MEMORY)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=BATCH_FIT_IN_MEMORY)
net = make_mlp()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
steps = cluster_post_loop(net, opt, loader, accumulation_steps)
n_batches = len(loader)
leftover = n_batches % accumulation_steps
print(f"{len(Y)} samples -> {n_batches} micro-batches (the last has {len(Y) - (n_batches - 1) * 32} samples), "
      f"{steps} optimizer steps")
print(f"micro-batches never stepped this epoch: {leftover}; their gradients are still in .grad: "
      f"{all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())}")
assert leftover == 5 and net[0].weight.grad.abs().sum() > 0

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The post presents accumulation as the simplest way "to split a batch between GPUs". It uses no second GPU at all: it splits the batch *in time* on one device, trading time for memory. Across GPUs, the same sum of gradients is what all-reduce computes (notebook 09).
"""

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Three things go wrong when the dataset is not a multiple of `256`, which is the usual case:

1. **The tail of the epoch is never stepped.** The last 5 micro-batches (158 samples) add their gradients to `.grad`, the loop ends, and nothing calls `step()`.
2. **The leftover gradients leak into the next epoch.** `zero_grad()` only runs after a step, so the first step of the next epoch sums 13 micro-batches (8 new + 5 stale, computed with older parameters).
3. **The short last micro-batch is over-weighted.** It holds 30 samples but counts 1/8 of the step, as much as a full one of 32. With a dataloader whose last batch is tiny (say 1 sample), that one sample would weigh as much as 32.

Below, the leak: the first step of epoch 2 sees gradients larger than any single group of 8 produces.
"""

# %% slideshow={"slide_type": "fragment"}
stale = grads_of(net).clone()
clean = copy.deepcopy(net)
clean.zero_grad()
for model in (net, clean):             # epoch 2's first 8 micro-batches, as the cluster post's loop runs them
    for _, (imgs, labels) in zip(range(accumulation_steps), loader):
        (loss_fn(model(imgs), labels) / accumulation_steps).backward()
fresh, stepped = grads_of(clean), grads_of(net)
torch.testing.assert_close(stepped, fresh + stale)   # .grad was never cleared: the stale tail rides along
print(f"|first group of epoch 2| = {fresh.norm():.4f}, |stale tail of epoch 1| = {stale.norm():.4f}, "
      f"|what the cluster post's loop steps with| = {stepped.norm():.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The fix, in three lines of the loop: weight each micro-batch's mean loss by `n_i / N` where `N` is the number of samples in its accumulation group, and step after the last micro-batch of the epoch even when the group is short. `N` must be known before the group's first `backward()`, so the function below reads the group's `k` micro-batches ahead (`itertools.islice` on the loader's iterator: the inputs of `k` micro-batches, never the whole epoch; the activations, which are what accumulation saves, still exist for one micro-batch at a time). Its gradient for the short final group equals the gradient of that group taken as one batch.

Moving `optimizer.zero_grad()` to the top of every iteration, a common "fix", would be wrong in the other direction: it clears the gradients of the previous micro-batches, so each step only sees the last micro-batch. That is shown after.
"""


# %% slideshow={"slide_type": "-"}
def accumulate_epoch(model: nn.Module, opt: torch.optim.Optimizer, loader, k: int, stop_before_step: bool = False) -> int:
    """Gradient accumulation that is exact for every group, including a short last one."""
    batches, steps = iter(loader), 0
    n_groups = -(-len(loader) // k)                  # ceil: a DataLoader knows its length without loading
    while group := list(islice(batches, k)):       # look ahead k micro-batches only, never the epoch
        n_group = sum(len(y) for _, y in group)      # N of this group, known before its first backward
        for x, y in group:
            (loss_fn(model(x), y) * (len(y) / n_group)).backward()
        if stop_before_step and steps == n_groups - 1:
            return steps                # leave the last group's gradient in .grad for inspection
        opt.step()
        opt.zero_grad()
        steps += 1
    return steps


net_fixed = make_mlp()
opt_fixed = torch.optim.SGD(net_fixed.parameters(), lr=0.1)
steps = accumulate_epoch(net_fixed, opt_fixed, loader, accumulation_steps, stop_before_step=True)
tail_x, tail_y = X[steps * 256 :], Y[steps * 256 :]
ref = copy.deepcopy(net_fixed)
ref.zero_grad()
loss_fn(ref(tail_x), tail_y).backward()
torch.testing.assert_close(grads_of(net_fixed), grads_of(ref))
print(f"short last group: {len(tail_y)} samples in {len(loader) - steps * accumulation_steps} micro-batches; "
      "its accumulated gradient equals the gradient of those samples as one batch")


# %% slideshow={"slide_type": "fragment"}
def zero_grad_every_iteration(model: nn.Module) -> torch.Tensor:
    model.zero_grad()
    for i, (xm, ym) in enumerate(zip(xb.chunk(k), yb.chunk(k))):
        model.zero_grad()                         # the misplaced reset
        (loss_fn(model(xm), ym) / k).backward()
    return grads_of(model)


wrong = zero_grad_every_iteration(make_mlp())
last_only = make_mlp()
(loss_fn(last_only(xb.chunk(k)[-1]), yb.chunk(k)[-1]) / k).backward()
torch.testing.assert_close(wrong, grads_of(last_only))
print("zero_grad() inside the loop: the stepped gradient is the last micro-batch's alone (divided by k)")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 4. BatchNorm: the one layer that sees the batch

Every layer so far treats samples independently, so splitting the batch changes nothing but rounding. `BatchNorm` in training mode normalizes with the **mean and variance of the current batch**: a micro-batch of 32 uses its own statistics, not those of the 128. The forward pass differs, so the gradients differ, and no loss scaling can repair it. The running statistics differ too: they are updated `k` times with micro-batch estimates instead of once.
"""


# %% slideshow={"slide_type": "-"}
def make_norm_mlp(norm: type[nn.Module]) -> nn.Module:
    seed_everything(0)
    return nn.Sequential(nn.Linear(64, 128), norm(128), nn.ReLU(), nn.Linear(128, 10))


for norm in (nn.BatchNorm1d, nn.LayerNorm):
    m_big, m_acc = make_norm_mlp(norm), make_norm_mlp(norm)
    loss_fn(m_big(xb), yb).backward()
    for xm, ym in zip(xb.chunk(k), yb.chunk(k)):
        (loss_fn(m_acc(xm), ym) / k).backward()
    g_big, g_acc = grads_of(m_big), grads_of(m_acc)
    rel = ((g_acc - g_big).norm() / g_big.norm()).item()
    close = torch.allclose(g_acc, g_big, atol=1e-6)
    if norm is nn.BatchNorm1d:
        rm = (m_acc[1].running_mean - m_big[1].running_mean).abs().max().item()
        line = f"{norm.__name__:<12} relative gradient difference {rel:.2f}  allclose: {close}; running_mean differs by up to {rm:.2f}"
        assert rel > 1e-3
    else:
        line = f"{norm.__name__:<12} relative gradient difference < 1e-5  allclose: {close}"
        assert rel < 1e-5
    print(line)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
What to do about it:
- Accept it. With micro-batches of 16–32 or more, BatchNorm's statistics are noisy estimates of the big batch's, and training usually behaves well; just do not expect the big-batch numbers.
- Use a normalization that does not mix samples (`LayerNorm`, `GroupNorm`): accumulation is exact again, as shown above.
- Across GPUs the same problem has a fix, `SyncBatchNorm`, which computes the statistics over all ranks' samples (notebook 11). Across *time* (accumulation) there is no such fix: the other micro-batches have not been computed yet.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 5. Count the loss elements globally: tokens, ranks, and losses that couple the batch

Section 2's rule, `n_i / N` per micro-batch, was stated for samples. The general rule: **the loss is a mean over loss elements, and `N` counts those elements over the whole accumulated batch: across micro-batches *and* across ranks.** With one loss per sample the elements are samples. A language model's loss is a mean over *tokens*, and sequences have different lengths: padding positions are masked out (`ignore_index=-100` in `cross_entropy`). Then each micro-batch holds a different number of tokens, and averaging per micro-batch gives each *micro-batch* the same weight instead of each *token*. This was a widely reported gradient-accumulation bug in Hugging Face `transformers` in 2024.

Below, a tiny token model (an embedding and a linear layer, so every token's loss is independent, like the MLP's samples) on 8 sequences of 3 to 16 tokens, padded to 16, in 4 micro-batches of 3, 2, 2 and 1 sequences (a short last one, as in section 3). Three ways to weight the micro-batches: section 1's `1/k`, section 3's `n_i / N` with `n_i` counted in sequences, and the sum of token losses divided by the number of tokens of the whole batch.
"""

# %% slideshow={"slide_type": "-"}
import torch.nn.functional as F

V, T, PAD = 50, 16, -100          # vocabulary, padded length, the target ignored by cross_entropy
SPLIT = [3, 2, 2, 1]              # sequences per micro-batch
g = torch.Generator().manual_seed(0)
lengths = torch.randint(3, T + 1, (8,), generator=g)
tokens = torch.randint(0, V, (8, T), generator=g)
targets = torch.randint(0, V, (8, T), generator=g)
targets[torch.arange(T) >= lengths[:, None]] = PAD            # padding: no loss there


def make_token_model() -> nn.Module:
    seed_everything(0)
    return nn.Sequential(nn.Embedding(V, 32), nn.Linear(32, V))


def token_loss(model: nn.Module, tok: torch.Tensor, tgt: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(model(tok).reshape(-1, V), tgt.reshape(-1), ignore_index=PAD, reduction=reduction)


def token_grads(weighting: str) -> torch.Tensor:
    model = make_token_model()
    micro = list(zip(tokens.split(SPLIT), targets.split(SPLIT)))
    n_tokens = int((targets != PAD).sum())                  # counted before any forward: from the targets
    for tok, tgt in micro:
        if weighting == "mean per micro-batch, / k":
            loss = token_loss(model, tok, tgt) / len(micro)
        elif weighting == "mean per micro-batch, x sequences / N":
            loss = token_loss(model, tok, tgt) * len(tok) / len(tokens)
        else:                                                # sum of token losses / tokens of the whole batch
            loss = token_loss(model, tok, tgt, reduction="sum") / n_tokens
        loss.backward()
    return grads_of(model)


big_model = make_token_model()
token_loss(big_model, tokens, targets).backward()            # the big batch: mean over all its tokens
g_big = grads_of(big_model)
print(f"tokens per micro-batch: {[int((t != PAD).sum()) for t in targets.split(SPLIT)]}, "
      f"{int((targets != PAD).sum())} in the whole batch")
for weighting in ("mean per micro-batch, / k", "mean per micro-batch, x sequences / N", "sum / all tokens"):
    g_acc = token_grads(weighting)
    rel = ((g_acc - g_big).norm() / g_big.norm()).item()
    exact = torch.allclose(g_acc, g_big, atol=1e-6)
    print(f"{weighting:<40} relative gradient difference {'< 1e-5' if rel < 1e-5 else f'{rel:.3f}':>7}  allclose: {exact}")
    assert exact == (weighting == "sum / all tokens") and (rel < 1e-5) == exact

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Both per-micro-batch means are wrong, by a sizeable fraction of the gradient, in a direction that depends on which micro-batches happen to be short. The fix needs the number of tokens of the *whole* accumulated batch before the first `backward()`: count them from the targets (or the attention masks), which the loader gives before any forward pass.

### Across ranks: all-reduce the token count

Three words from notebook 09, ahead of time. Data-parallel training runs one process per device; each process is a **rank** (numbered 0, 1, ...), and their number is the **world size**. `all_reduce(t, SUM)` is a *collective*: every rank calls it with its own tensor `t`, and afterwards every rank holds the sum of all of them (notebook 09 §3 runs it on real processes). DDP (notebooks 10 and 11) averages the gradients of the ranks: the step uses `(g_0 + g_1) / 2` for 2 ranks. If each rank's loss is the mean over *its* tokens, that is the global token mean only when every rank has the same number of tokens. The fix is the same rule one level up: all-reduce the token count, so every rank divides its *sum* of token losses by the global count, and multiplies by the world size (DDP's average divides by it).

Processes arrive in notebook 09, so here we compute the two ranks' arithmetic exactly, in one process: each rank is its own copy of the model with its half of the sequences (and 2 micro-batches of accumulation), `all_reduce(count, SUM)` is the sum of the two counts, and DDP's gradient is the average of the two ranks' `.grad` (notebook 11 shows, on real gloo processes, that a DDP step is exactly the step on that average).
"""


# %% slideshow={"slide_type": "fragment"}
def two_ranks(global_count: bool) -> torch.Tensor:
    world = 2
    shards = list(zip(tokens.chunk(world), targets.chunk(world)))                # each rank's 4 sequences
    local_counts = [int((tgt != PAD).sum()) for _, tgt in shards]
    n_global = sum(local_counts)                                                # dist.all_reduce(count, SUM)
    grads = []
    for (tok, tgt), n_local in zip(shards, local_counts):                       # each rank, on its own
        model = make_token_model()
        for tok_m, tgt_m in zip(tok.chunk(2), tgt.chunk(2)):                    # 2 micro-batches per rank
            total = token_loss(model, tok_m, tgt_m, reduction="sum")
            loss = total * world / n_global if global_count else total / n_local
            loss.backward()
        grads.append(grads_of(model))
    return sum(grads) / world                                                   # what DDP's all-reduce gives


print(f"tokens on each rank: {[int((t != PAD).sum()) for t in targets.chunk(2)]}")
for global_count in (False, True):
    g_ddp = two_ranks(global_count)
    rel = ((g_ddp - g_big).norm() / g_big.norm()).item()
    name = "token count all-reduced" if global_count else "each rank's own token mean"
    print(f"{name:<28} relative gradient difference {'< 1e-5' if rel < 1e-5 else f'{rel:.3f}':>7}  "
          f"allclose: {torch.allclose(g_ddp, g_big, atol=1e-6)}")
    assert torch.allclose(g_ddp, g_big, atol=1e-6) == global_count

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Losses that couple the samples of a batch

The rule assumes the loss is a sum of independent elements. Some objectives are not: BatchNorm was one (section 4). Another is a **contrastive loss with in-batch negatives** (CLIP, SimCLR): each pair's positive is scored against every other sample of the batch, so a micro-batch of 4 sees 3 negatives per sample where the batch of 16 sees 15. No weighting repairs that: the loss itself is different. (Mixture-of-experts load-balancing losses, computed from the whole batch's routing statistics, are another such case.)

The usual fix is **GradCache** (Gao et al., 2021): (1) embed the whole batch without building a graph; (2) compute the full-batch loss on those embeddings, and its gradient with respect to the embeddings only (cheap: they are small); (3) re-run the encoder one micro-batch at a time, now with a graph, and backpropagate the cached embedding gradients through it. Only one micro-batch's activations are alive at a time, and the gradient is the full batch's:
"""


# %% slideshow={"slide_type": "fragment"}
def info_nce(za: torch.Tensor, zb: torch.Tensor, tau: float = 0.1) -> torch.Tensor:
    logits = F.normalize(za, dim=1) @ F.normalize(zb, dim=1).T / tau   # every b_j is a negative for a_i, j != i
    return F.cross_entropy(logits, torch.arange(len(za)))


def make_encoder() -> nn.Module:
    seed_everything(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))


xa = X[:16]
xb_pos = X[:16] + 0.1 * torch.randn(16, 64, generator=torch.Generator().manual_seed(1))   # positives: noisy copies

enc_big = make_encoder()
info_nce(enc_big(xa), enc_big(xb_pos)).backward()                         # the full batch of 16
g_full = grads_of(enc_big)

enc_micro = make_encoder()
for a, b in zip(xa.chunk(4), xb_pos.chunk(4)):                            # 4 micro-batches of 4, / k
    (info_nce(enc_micro(a), enc_micro(b)) / 4).backward()
g_micro = grads_of(enc_micro)

enc_gc = make_encoder()
with torch.no_grad():                                                     # (1) embeddings, no graph
    za, zb = enc_gc(xa), enc_gc(xb_pos)
za.requires_grad_(), zb.requires_grad_()
info_nce(za, zb).backward()                                               # (2) d loss / d embeddings
for a, b, ga, gb in zip(xa.chunk(4), xb_pos.chunk(4), za.grad.chunk(4), zb.grad.chunk(4)):
    torch.autograd.backward([enc_gc(a), enc_gc(b)], [ga, gb])             # (3) one micro-batch at a time
g_gc = grads_of(enc_gc)

rel_micro = ((g_micro - g_full).norm() / g_full.norm()).item()
assert rel_micro > 0.01 and not torch.allclose(g_micro, g_full, atol=1e-6)
assert torch.allclose(g_gc, g_full, atol=1e-6)
print(f"contrastive loss on 4 micro-batches of 4: relative gradient difference {rel_micro:.2f} (allclose: False)")
print("GradCache, one micro-batch of activations at a time: allclose to the full batch of 16: True")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 6. Memory and time against the micro-batch size

Why accumulate at all: autograd keeps the activations of the forward pass until `backward()` (notebook 02 §4), and they grow linearly with the batch. With accumulation only one micro-batch's activations are alive at a time. The parameters, their gradients and the optimizer state do not shrink.

We measure the activations a small CNN saves for backward with `SavedTensorMeter` (deterministic: it adds up tensor sizes), for an effective batch of 256 split into micro-batches from 256 down to 2.
"""


# %% slideshow={"slide_type": "-"}
def make_cnn() -> nn.Module:
    seed_everything(0)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )


cnn = make_cnn()
param_bytes = sum(p.numel() * p.element_size() for p in cnn.parameters())
grad_bytes = param_bytes                          # one .grad buffer per parameter: same shapes, same dtype
x256, y256 = train.x[:256], train.y[:256]
micro_sizes = [256, 128, 64, 32, 16, 8, 4, 2]
saved = {}
for mb in micro_sizes:
    with SavedTensorMeter(exclude=cnn.parameters()) as meter:
        xm, ym = x256[:mb].clone(), y256[:mb].clone()   # own storage, as a DataLoader's batch has
        loss = loss_fn(cnn(xm), ym)
    loss.backward()
    saved[mb] = meter.bytes
print(f"parameters: {format_bytes(param_bytes)}; their .grad buffers: {format_bytes(grad_bytes)} more, "
      "at every micro-batch size")
per_sample = (saved[256] - saved[128]) // 128
fixed = saved[256] - 256 * per_sample           # 4 bytes: the loss keeps one float32 scalar (its total weight)
for mb in micro_sizes:
    print(f"micro-batch {mb:>3} x {256 // mb:>3} steps: activations saved for backward {format_bytes(saved[mb]):>10}"
          f"  ({mb} x {per_sample:,} + {fixed} bytes)")
assert fixed == 4 and all(saved[mb] == mb * per_sample + fixed for mb in micro_sizes)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The saved activations grow exactly linearly with the micro-batch: the same 24,880 bytes per sample at every size, plus one 4-byte scalar that the cross-entropy loss keeps whatever the batch. Cutting the micro-batch from 256 to 32 divides them by 8 (to within those 4 bytes), which is the whole point of accumulation.

Saved activations are not the whole peak: backward allocates gradients of the activations, temporaries come and go, and the `.grad` buffers stay. `course_lib.memory.measure_peak` reads every allocation and free from the CPU allocator (through `torch.profiler`: the same from run to run on one machine, but it includes the temporary workspace of the kernels, which differs between CPUs, so those peaks are printed after `~`) and reports the highest point of one accumulation step. It counts what the step allocates on top of what existed before it: the parameters, allocated when the model was built, are not in it; the `.grad` buffers are, because `zero_grad(set_to_none=True)` frees them before each step, and they are exactly what the step leaves allocated when it ends. Micro-batches 2 to `k` of a step are identical, so the peak of the first two is the peak of the whole step (checked for one size; it keeps the cell fast).
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.memory import StepMemory, measure_peak


def accumulation_step(mb: int, n_micro: int | None = None) -> StepMemory:
    cnn.zero_grad(set_to_none=True)                  # .grad is allocated inside the step, and counts
    pieces = list(zip(x256.split(mb), y256.split(mb)))[:n_micro]

    def step() -> None:
        for xm, ym in pieces:
            (loss_fn(cnn(xm), ym) * (len(ym) / 256)).backward()

    return measure_peak(step)


assert accumulation_step(64).peak_bytes == accumulation_step(64, n_micro=2).peak_bytes   # all 4 or the first 2
steps = {mb: accumulation_step(mb, n_micro=2) for mb in micro_sizes}
peaks = {mb: m.peak_bytes for mb, m in steps.items()}
for mb in micro_sizes:  # the peak includes kernel workspace, which differs between CPUs: printed last, after '~'
    print(f"micro-batch {mb:>3}: saved activations {format_bytes(saved[mb]):>10}, allocator peak of the step "
          f"~{format_bytes(peaks[mb])}")
smallest = micro_sizes[-1]
assert all(m.retained_bytes == grad_bytes for m in steps.values())   # what every step leaves: the .grad buffers
assert all(peaks[a] > peaks[b] for a, b in zip(micro_sizes, micro_sizes[1:]))
assert peaks[smallest] > grad_bytes                                   # the floor: the .grad buffers
assert peaks[256] / peaks[smallest] > 10
print(f"what each step leaves allocated: the .grad buffers, {format_bytes(grad_bytes)}, at every size")
print(f"256 -> {smallest} samples per micro-batch: the peak falls more than 10x (~{peaks[256] / peaks[smallest]:.0f}x), "
      f"towards the floor of the .grad buffers ({format_bytes(grad_bytes)}); at {smallest} it is "
      f"~{format_bytes(peaks[smallest] - grad_bytes)} above that floor")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The peak falls with the micro-batch, but less than proportionally: the gradient buffers (and, in a real step, the optimizer state) do not shrink, and the parameters, which this measurement leaves out, are there all along. Accumulation cannot go below that floor; notebook 04's checkpointing attacks the activations differently, and sharded data parallelism (ZeRO, FSDP: notebook 14) attacks the floor by splitting the gradients and optimizer state across ranks.

The price is time, and on a CPU it shows up late. A convolution on one thread does about the same work per sample whatever the batch, so the step time barely moves between micro-batches of 256 and 32. What grows with the number of micro-batches is the fixed cost of each forward and backward call (Python, PyTorch's dispatcher, starting every kernel): 128 micro-batches of 2 pay it 128 times. Two precautions make the comparison hold on a busy machine: the clock is the CPU time of this thread (`time.thread_time()`, which does not count the time the thread waits for a core while other programs run; with one thread, all of PyTorch's work happens in it), and the sizes take turns, 7 rounds, each keeping its fastest round, so that a busy spell hits them all alike. The times (after `~`) depend on the machine; the relations printed after them are asserted:
"""


# %% slideshow={"slide_type": "fragment"}
def accumulation_times(sizes: list[int], rounds: int = 7) -> dict[int, float]:
    """The least CPU time of one optimizer step on the 256 samples, per micro-batch size, in seconds."""
    model = make_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def one_step(mb: int) -> None:
        for xm, ym in zip(x256.split(mb), y256.split(mb)):
            (loss_fn(model(xm), ym) * (len(ym) / 256)).backward()
        opt.step()
        opt.zero_grad()

    for mb in sizes:
        one_step(mb)                                  # warm-up
    best = dict.fromkeys(sizes, float("inf"))
    for _ in tqdm(range(rounds), desc="rounds over the micro-batch sizes"):
        for mb in sizes:
            t0 = time.thread_time()                   # CPU time of this thread: waiting for a core is not counted
            one_step(mb)
            best[mb] = min(best[mb], time.thread_time() - t0)
    return best


times = accumulation_times(micro_sizes)
for mb in micro_sizes:
    print(f"micro-batch {mb:>3} x {256 // mb:>3}: one optimizer step on 256 samples ~{times[mb] * 1e3:.1f} ms of CPU time")
large = [mb for mb in micro_sizes if mb >= 32]
spread = max(times[mb] for mb in large) / min(times[mb] for mb in large)
ratio = times[smallest] / times[256]
assert spread < 2 and ratio > 1.5
print(f"micro-batches of {large[0]} down to {large[-1]}: slowest / fastest ~{spread:.2f}x, within 2x")
print(f"micro-batches of {smallest} against {large[0]}: ~{ratio:.1f}x the time per step, slower: {ratio > 1}")

# %% slideshow={"slide_type": "fragment"}
fig, ax1 = plt.subplots(figsize=(7, 3.6))
ax1.plot(micro_sizes, [saved[mb] / 2**20 for mb in micro_sizes], "o-", label="activations saved (MiB)")
ax1.plot(micro_sizes, [peaks[mb] / 2**20 for mb in micro_sizes], "^-", label="allocator peak of the step (MiB)")
floor_label = f".grad buffers, the floor of the peak ({format_bytes(grad_bytes)})"
ax1.axhline(grad_bytes / 2**20, color="grey", ls="--", label=floor_label)
ax1.set_xscale("log", base=2)
ax1.set_xlabel("micro-batch size (samples; effective batch fixed at 256)")
ax1.set_ylabel("memory (MiB)")
ax2 = ax1.twinx()
ax2.plot(micro_sizes, [times[mb] * 1e3 for mb in micro_sizes], "s:", color="tab:red", label="CPU time per step (ms)")
ax2.set_ylabel("CPU time per optimizer step (ms)")
ax1.set_title("Gradient accumulation trades time for activation memory")
fig.legend(loc="upper center", bbox_to_anchor=(0.45, 0.88), fontsize=8)
fig.tight_layout()
plt.show()
print(f"dashed line: {floor_label}, drawn at {grad_bytes / 2**20:.3f} MiB")
print(f"activations at 256: {format_bytes(saved[256])}; at {smallest}: {format_bytes(saved[smallest])} "
      f"({256 // smallest} x less)")

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## 7. Accumulation with a loss scaler

With float16, small gradients underflow, so the loss is multiplied by a large scale before `backward()` and the gradients divided by it before the step (notebook 06). `torch.amp.GradScaler` does this. With accumulation the rule is:

- every micro-batch: `scaler.scale(loss * weight).backward()`: all micro-batches must use the **same** scale, so the scale may only change between optimizer steps;
- once per optimizer step: `scaler.unscale_(opt)` (only if you need true gradients, e.g. for clipping), `scaler.step(opt)`, `scaler.update()`, `opt.zero_grad()`.

`GradScaler("cpu")` works on CPU, so we can check the arithmetic here: the scaled loop ends with the same parameters as plain accumulation.
"""


# %% slideshow={"slide_type": "-"}
def scaled_step(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, micro) -> None:
    n_total = sum(len(y) for _, y in micro)
    for x, y in micro:
        scaler.scale(loss_fn(model(x), y) * (len(y) / n_total)).backward()   # same scale for every micro-batch
    scaler.unscale_(opt)                                                      # once: .grad now holds true gradients
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)                # clipping needs unscaled gradients
    scaler.step(opt)                                                          # skips the step if any grad is inf/nan
    scaler.update()                                                           # the scale changes only here
    opt.zero_grad()


micro = list(zip(xb.chunk(k), yb.chunk(k)))
m_plain, m_scaled = make_mlp(), make_mlp()
opt_plain = torch.optim.SGD(m_plain.parameters(), lr=0.1)
opt_scaled = torch.optim.SGD(m_scaled.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14)

for x, y in micro:
    (loss_fn(m_plain(x), y) / k).backward()
nn.utils.clip_grad_norm_(m_plain.parameters(), max_norm=1.0)
opt_plain.step()
scaled_step(m_scaled, opt_scaled, scaler, micro)
for p, q in zip(m_plain.parameters(), m_scaled.parameters()):
    torch.testing.assert_close(p, q)
print(f"scale {scaler.get_scale():.0f}: parameters after one scaled, accumulated step equal the plain step's (allclose)")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Two ways to get it wrong, both caught by PyTorch or by the numbers:
- calling `unscale_` twice in one step (say, once per micro-batch) raises an error;
- a micro-batch that produces `inf` makes `scaler.step` **skip the whole accumulated step** and halve the scale: with accumulation, one bad micro-batch costs all `k`.
"""

# %% slideshow={"slide_type": "fragment"}
m = make_mlp()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14)
scaler.scale(loss_fn(m(micro[0][0]), micro[0][1]) / k).backward()
scaler.unscale_(opt)
with expect_error(RuntimeError, match="unscale_\\(\\) has already been called"):
    scaler.unscale_(opt)

# %% slideshow={"slide_type": "fragment"}
m = make_mlp()
before = [p.detach().clone() for p in m.parameters()]
opt = torch.optim.SGD(m.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14)
bad = [(x.clone(), y) for x, y in micro]
bad[2][0][0, 0] = float("inf")          # one corrupted input in micro-batch 2 of 4
scaled_step(m, opt, scaler, bad)
unchanged = all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
assert unchanged and scaler.get_scale() == 2.0**13
print(f"one inf in 1 of {k} micro-batches: step skipped (parameters unchanged: {unchanged}), scale 16384 -> {scaler.get_scale():.0f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Does CPU training need a scaler? It depends on the 16-bit format, not on the device. Autocast on the CPU uses `bfloat16` unless told otherwise, and `bfloat16` has float32's exponent range: its gradients do not underflow like float16's, so it needs no scaler. But `torch.autocast("cpu", dtype=torch.float16)` works too, and float16 on a CPU underflows exactly as on a GPU (notebook 06 §3 measures how much of a real gradient vanishes; notebook 07 §3 compares the two formats). Then `GradScaler("cpu")` is needed for real, not only to check the arithmetic. Below, one step of the MLP with its loss multiplied by 2^-24, a stand-in for the tiny gradients of a deep network, against the same step in float32:
"""

# %% slideshow={"slide_type": "fragment"}
print(f"largest float16: {torch.finfo(torch.float16).max:.0f}; smallest normal float16: {torch.finfo(torch.float16).tiny:.1e}")
print(f"largest bfloat16: {torch.finfo(torch.bfloat16).max:.2e}; smallest normal bfloat16: {torch.finfo(torch.bfloat16).tiny:.1e}")
assert torch.finfo(torch.bfloat16).tiny == torch.finfo(torch.float32).tiny
print("CPU autocast's default dtype:", torch.get_autocast_dtype("cpu"))

TINY = 2.0**-24


def tiny_loss_grads(dtype: torch.dtype | None, scale: float | None = None) -> torch.Tensor:
    """The true (unscaled) gradients of one step on loss * TINY, under autocast to dtype (None: float32)."""
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        out = model(xb)
        loss = loss_fn(out, yb) * TINY
    assert out.dtype == (dtype or torch.float32)            # the linear layers ran in that dtype
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                                     # a no-op when the scaler is disabled
    return grads_of(model)


g_fp32 = tiny_loss_grads(None)
for name, dtype, scale in [("float16, no scaler", torch.float16, None), ("float16, GradScaler(2^16)", torch.float16, 2.0**16),
                           ("bfloat16, no scaler", torch.bfloat16, None)]:
    g = tiny_loss_grads(dtype, scale)
    all_zero = bool((g == 0).all())
    rel = ((g - g_fp32).norm() / g_fp32.norm()).item()
    print(f"{name:<26} every gradient element zero: {all_zero!s:<5}  relative difference from float32: "
          f"{'< 0.05' if rel < 0.05 else f'{rel:.2f}'}")
    assert all_zero == (name == "float16, no scaler") and (rel < 0.05) == (not all_zero)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Summary

- `backward()` adds into `.grad`; `k` micro-batches with the loss scaled right give the big batch's gradient to rounding (checked with `allclose`, and over a whole epoch of training).
- The scale comes from the loss: a `mean` loss needs `n_i / N` per micro-batch (`1/k` when they are equal); a `sum` loss needs none. Getting it wrong multiplies the learning rate by `k` or divides it by `k`.
- The cluster post's loop is right about dividing by the accumulation steps and about where `zero_grad()` goes, but it silently drops the tail of each epoch into the next one and over-weights a short last batch: step the last group and weight by sample counts.
- The general rule: divide the sum of the loss elements by their number counted over the whole accumulated batch, across micro-batches and ranks. For a token loss with padding, a per-micro-batch mean is wrong; all-reduce the token count across DDP ranks (and multiply by the world size, which DDP's average divides by).
- Losses that couple a batch's samples are not sums of independent elements: BatchNorm makes accumulation inexact (micro-batch statistics; LayerNorm/GroupNorm do not), and in-batch-negative contrastive losses see fewer negatives per micro-batch; GradCache restores the full-batch gradient.
- Accumulation divides the activation memory by `k` and costs time: on one CPU thread little from 256 samples per micro-batch down to 32, then more and more as the fixed cost of each forward and backward call adds up (§6). Parameters, gradients and optimizer state stay.
- With a loss scaler: scale every micro-batch, then one `unscale_`/`step`/`update` per optimizer step; one `inf` anywhere skips the whole step. The scaler is needed with float16, on a GPU and on a CPU alike (autocast on the CPU defaults to bfloat16, which needs none).
- Across several processes, DDP's `no_sync()` avoids communicating during the first `k-1` micro-batches (notebook 11).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1.** Write `micro_batch_weights(sizes)`: given the number of samples in each micro-batch of one accumulation group, return the factor for each micro-batch's *mean* loss so that the accumulated gradient is the big batch's.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.accumulation import check_accumulate, check_micro_batch_weights, check_scaled_accumulation_step


def micro_batch_weights(sizes: list[int]) -> list[float]:
    raise NotImplementedError  # your code here


check_micro_batch_weights(micro_batch_weights)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2.** Write `accumulate(model, micro_batches)`: run forward and backward on each `(x, y)` micro-batch with `nn.functional.cross_entropy` so that `.grad` ends up holding the big batch's mean-loss gradient. The check uses micro-batches of unequal size. Do not step or zero the gradients.
"""


# %% slideshow={"slide_type": "-"}
def accumulate(model: nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    raise NotImplementedError  # your code here


check_accumulate(accumulate)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3.** Write `my_scaled_step(model, optimizer, scaler, micro_batches)`: one optimizer step over the micro-batches with a `GradScaler` (cross-entropy, mean). The check compares your parameters with one plain SGD step on the big batch, and counts your `update()` calls.
"""


# %% slideshow={"slide_type": "-"}
def my_scaled_step(model, optimizer, scaler, micro_batches) -> None:
    raise NotImplementedError  # your code here


check_scaled_accumulation_step(my_scaled_step)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**4.** Write `accumulate_tokens(model, micro_batches)`: each micro-batch is `(tokens, targets)`, with targets `-100` at padding positions; `model(tokens)` returns logits of shape `(batch, length, vocabulary)`. Run forward and backward on each micro-batch so that `.grad` holds the gradient of the token-mean cross-entropy of all micro-batches together. Do not step or zero the gradients.
"""

# %% slideshow={"slide_type": "-"}
from course_lib.exercises.accumulation import check_accumulate_tokens


def accumulate_tokens(model: nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    raise NotImplementedError  # your code here


check_accumulate_tokens(accumulate_tokens)

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## References

- PyTorch, *Automatic Mixed Precision examples*, section "Gradient accumulation": https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation
- PyTorch, `torch.amp.GradScaler`: https://pytorch.org/docs/stable/amp.html#gradient-scaling
- PyTorch, `torch.optim.Optimizer.zero_grad` (`set_to_none=True` by default since 2.0): https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html
- P. Goyal et al., *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour*, 2017 (batch size and learning rate): https://arxiv.org/abs/1706.02677
- S. Ioffe, C. Szegedy, *Batch Normalization*, 2015: https://arxiv.org/abs/1502.03167
- Y. Wu, K. He, *Group Normalization*, 2018 (normalization independent of the batch size): https://arxiv.org/abs/1803.08494
- P. Micikevicius et al., *Mixed Precision Training*, 2018 (loss scaling): https://arxiv.org/abs/1710.03740
- Hugging Face, *Fixing Gradient Accumulation* (2024; the token-count normalization bug in `transformers`): https://huggingface.co/blog/gradient_accumulation
- L. Gao, Y. Zhang, J. Han, J. Callan, *Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup* (GradCache), 2021: https://arxiv.org/abs/2101.06983
- A. Radford et al., *Learning Transferable Visual Models From Natural Language Supervision* (CLIP, in-batch negatives), 2021: https://arxiv.org/abs/2103.00020
"""
