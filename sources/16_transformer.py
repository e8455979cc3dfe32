# %% [markdown] slideshow={"slide_type": "slide"}
r"""
# 16 · The transformer: a small decoder, its memory and FLOPs, and attention down to FlashAttention

Every model so far in the course was an MLP or a small CNN. What practitioners train, size and debug is a transformer, and its costs have a shape of their own: attention builds an $s \times s$ matrix per head, the MLP is wider than the residual stream, and the loss over a large vocabulary is a tensor of its own. This notebook builds a small decoder in the style of today's open models, trains it on text that ships with Python, and then points the course's meters at it: the bytes each block keeps for backward, the FLOPs of a training step, the fraction of the hardware's peak a run reaches, and attention rewritten by hand until it is FlashAttention.

By the end you will be able to:
- build a Llama-style decoder (RMSNorm, rotary positions, causal attention through `scaled_dot_product_attention`, SwiGLU, residuals, a tied head) from one block up, and count its parameters with a formula that gives Llama 2 7B's 6,738,415,616;
- train it on one CPU core on Python's documentation, and read its loss curve, held-out loss and samples;
- derive the bytes a block saves for backward from Korthikanti et al. (2022), check the formula to the byte for naive and SDPA attention, and say where the $s^2$ term takes over and what full and selective checkpointing change;
- count the training FLOPs per token ($6N$ plus attention), check them with `FlopCounterMode`, and turn a measured tokens/s into MFU, here and for a published training run;
- write attention by hand down to a FlashAttention-2 `autograd.Function` (tiled online softmax forward, recomputing backward), equal to SDPA forward and backward, with O(s) saved bytes instead of O(s²).

This notebook assumes: notebooks 02 and 03 (saved tensors, `SavedTensorMeter`, writing and `gradcheck`-ing an `autograd.Function`), 04 and 05 (where training memory goes, checkpointing, selective checkpointing, `FlopCounterMode`, `measure_peak`) and 06 (bf16). Notebook 14's ZeRO calculator uses the memory formula of section 3; notebooks 17–19, 21 and 22 reuse the model.
"""

# %% slideshow={"slide_type": "-"}
import dataclasses
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from course_lib.attention import attention_block, attention_block_backward, blockwise_attention, merge_attention
from course_lib.data import decode, encode, text_batch, text_corpus
from course_lib.device import requires_gpu
from course_lib.errors import expect_error
from course_lib.memory import step_peak_memory
from course_lib.saved_tensors import SavedTensorMeter, format_bytes
from course_lib.seeding import seed_everything
from course_lib.timing import matmul_tflops
from course_lib.transformer import (
    PRESETS, Transformer, block_saved_bytes, block_saved_terms, generate, matmul_params, mfu,
    model_saved_bytes, model_saved_terms, param_count, param_counts, training_flops_per_token,
)

seed_everything(0)
torch.set_num_threads(1)   # one thread: steadier on a shared machine, and these small products gain little from two
notebook_start = time.perf_counter()
print("torch", torch.__version__.split("+")[0], "| threads:", torch.get_num_threads())

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 1. The model, built up from one block

A decoder-only language model reads token ids and predicts, at every position, the next token. Its layout:

- the **embedding** turns each id into a vector of width $h$ (`d_model`), the *residual stream*;
- $L$ **blocks** each add two things to the stream: **attention** (every position reads from the positions before it) and an **MLP** (every position on its own). Each reads a normalized copy of the stream ("pre-norm") and adds its result back (a residual);
- a final norm and the **head**, a product with a $V \times h$ matrix, give one score (logit) per vocabulary entry.

Today's open models (Llama, Mistral, Qwen) differ from GPT-2 in four details, all in `course_lib.transformer`: **RMSNorm** (scale by the root mean square; no mean subtraction, no bias), **rotary positions** (RoPE: queries and keys are rotated by an angle proportional to their position, instead of adding a learned position vector), a **SwiGLU** MLP ($\text{down}(\text{silu}(\text{gate}(x)) \cdot \text{up}(x))$, three matrices instead of two) and **no biases, no dropout**. The configuration is a frozen dataclass; the preset trained here is tiny:
"""

# %% slideshow={"slide_type": "fragment"}
cfg = PRESETS["tiny"]
print(cfg.describe())
model = Transformer(cfg, seed=0)
print(model.layers[0])
with expect_error(ValueError, match="multiple of n_heads"):
    dataclasses.replace(cfg, n_heads=5)                   # the config checks itself: 64 does not split into 5 heads
with expect_error(ValueError, match="exceeds max_seq_len"):
    model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.int64))   # the rotary tables stop at the context length

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### One block, by hand

The module names are the ones PyTorch's parallelism APIs will address in notebooks 17 and 19: `layers.0.attn.q_proj`, `layers.0.mlp.down_proj`. Here is block 0's forward pass written out with those modules, the shape after each step printed. Attention works per head: the width 64 is split into 4 heads of 16, `(batch, seq, width)` becomes `(batch, heads, seq, head_dim)`, and back.
"""

# %% slideshow={"slide_type": "fragment"}
block = model.layers[0]
b, s, hd = 2, 16, cfg.head_dim
x = torch.randn(b, s, cfg.d_model)
cos, sin = model.rope_cos[:s], model.rope_sin[:s]


def rotate(t):
    """RoPE: pairs (t_i, t_{i+hd/2}) turned by a position-dependent angle; cos/sin are (seq, head_dim) tables."""
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin


steps = []


def show(name, t):
    steps.append((name, tuple(t.shape)))
    return t


xn = show("attn_norm(x)", block.attn_norm(x))
q = show("q_proj, split into heads", block.attn.q_proj(xn).view(b, s, -1, hd).transpose(1, 2))
k = show("k_proj, split into heads", block.attn.k_proj(xn).view(b, s, -1, hd).transpose(1, 2))
v = show("v_proj, split into heads", block.attn.v_proj(xn).view(b, s, -1, hd).transpose(1, 2))
q, k = show("q rotated (RoPE)", rotate(q)), show("k rotated (RoPE)", rotate(k))
heads = show("causal softmax(q k^T / sqrt(d)) v", F.scaled_dot_product_attention(q, k, v, is_causal=True))
h1 = show("x + o_proj(heads joined)", x + block.attn.o_proj(heads.transpose(1, 2).reshape(b, s, -1)))
hn = show("mlp_norm(h)", block.mlp_norm(h1))
inner = show("silu(gate_proj(.)) * up_proj(.)", F.silu(block.mlp.gate_proj(hn)) * block.mlp.up_proj(hn))
out = show("h + down_proj(.)", h1 + block.mlp.down_proj(inner))
for name, shape in steps:
    print(f"{name:<36} {shape}")
lib_out = block(x, (model.rope_cos, model.rope_sin))
print(f"by hand == Block.forward: {torch.allclose(out, lib_out, atol=1e-6)}, "
      f"largest difference < 1e-6")
assert torch.allclose(out, lib_out, atol=1e-6)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
Two properties carry the design, and both can be checked in a line.

- **Rotary positions encode distance.** Rotating a query at position $m$ and a key at position $n$ by angles proportional to $m$ and $n$ leaves their dot product depending on $m - n$ only: the same pair of vectors, 3 positions apart, scores the same anywhere in the sequence.
- **Causality.** Position $i$ may read positions $\le i$ only, so the logits before a position cannot change when a later token does. Without it, training on next-token prediction would let the model read the answer.
"""

# %% slideshow={"slide_type": "fragment"}
qv, kv = torch.randn(hd), torch.randn(hd)


def rotate_at(t, pos):
    half = hd // 2
    return t * model.rope_cos[pos] + torch.cat((-t[half:], t[:half])) * model.rope_sin[pos]


scores_3_apart = [float(rotate_at(qv, m) @ rotate_at(kv, m - 3)) for m in (3, 20, 70, 127)]
print("q.k with the key 3 positions back, at positions 3, 20, 70, 127:", [round(v, 4) for v in scores_3_apart])
assert max(scores_3_apart) - min(scores_3_apart) < 1e-4

ids = torch.randint(0, cfg.vocab_size, (1, 32))
changed = ids.clone()
changed[0, 20] = (ids[0, 20] + 1) % cfg.vocab_size          # change the token at position 20
with torch.no_grad():
    before, after = model(ids), model(changed)
same_before = torch.allclose(before[0, :20], after[0, :20], atol=1e-6)
print(f"logits at positions 0-19 unchanged: {same_before}; at 20-31 changed: {not torch.allclose(before[0, 20:], after[0, 20:])}")
assert same_before and not torch.allclose(before[0, 20:], after[0, 20:])

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### RMSNorm, written as a custom Function

The block's norms are `course_lib.transformer.RMSNorm`, a custom `autograd.Function` (notebook 03's tool) whose forward keeps for backward only its input and one float32 number per row, $1/\text{rms}$. That is what fused GPU kernels keep, and what the memory formula of section 3 counts. PyTorch's `F.rms_norm` gives the same values, but on the CPU it is composed of elementary operations, and those keep a third tensor, the normalized input:
"""

# %% slideshow={"slide_type": "fragment"}
w = block.attn_norm.weight
xg = x.clone().requires_grad_()
with SavedTensorMeter(exclude=[w]) as ours:
    y_ours = block.attn_norm(xg)
with SavedTensorMeter(exclude=[w]) as composite:
    y_torch = F.rms_norm(xg, (cfg.d_model,), w, cfg.norm_eps)
tokens = b * s
print(f"same values: {torch.allclose(y_ours, y_torch, atol=1e-6)} (largest difference < 1e-6)")
print(f"course RMSNorm keeps {ours.bytes:,} B = {tokens} tokens x ({cfg.d_model} + 1) x 4 B")
print(f"F.rms_norm on the CPU keeps {composite.bytes:,} B = {tokens} tokens x (2 x {cfg.d_model} + 1) x 4 B")
assert torch.allclose(y_ours, y_torch, atol=1e-6)
assert ours.bytes == tokens * (cfg.d_model + 1) * 4 and composite.bytes == tokens * (2 * cfg.d_model + 1) * 4
gx = torch.autograd.grad(y_ours.square().sum(), xg)[0]
assert torch.allclose(gx, torch.autograd.grad(y_torch.square().sum(), xg)[0], atol=1e-5)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### Counting the parameters

With $h$ = `d_model`, $h_{kv}$ = key/value width (`n_kv_heads × head_dim`, equal to $h$ without grouped-query attention), $f$ = `d_ff` and $V$ = vocabulary:

- attention: $q$ and $o$ are $h \times h$, $k$ and $v$ are $h \times h_{kv}$: $2h^2 + 2h\,h_{kv}$ per block;
- MLP: SwiGLU has three $h \times f$ matrices, $3hf$ (GELU: $2hf$); two norm scales, $2h$;
- embedding $Vh$; the head $Vh$ more unless it is tied to the embedding (the same tensor, counted once); the final norm $h$; learned positions (when used) a table of `max_seq_len` × $h$.

`param_counts` adds these up by part; the sum must equal `sum(p.numel())` of the built model, for every variant. On the `meta` device (shapes without memory, notebook 01) the same check runs on two published models: Llama 2 7B and Llama 3 8B (grouped-query attention, 8 key/value heads).
"""

# %% slideshow={"slide_type": "fragment"}
variants = {
    "tiny (tied, SwiGLU, RoPE)": cfg,
    "untied head": dataclasses.replace(cfg, tie_embeddings=False),
    "GELU MLP": dataclasses.replace(cfg, mlp="gelu"),
    "learned positions": dataclasses.replace(cfg, positions="learned"),
    "2 kv heads (GQA)": dataclasses.replace(cfg, n_kv_heads=2),
    "Llama 2 7B (meta)": PRESETS["llama2-7b"],
    "Llama 3 8B (meta)": PRESETS["llama3-8b"],
}
print(f"{'variant':<26}{'formula':>15}{'sum(numel)':>15}   parts")
for name, c in variants.items():
    built = Transformer(c, device="meta" if "meta" in name else None)
    counted = sum(p.numel() for p in built.parameters())
    parts = {k: v for k, v in param_counts(c).items() if v}
    print(f"{name:<26}{param_count(c):>15,}{counted:>15,}   " + ", ".join(f"{k} {v:,}" for k, v in parts.items()))
    assert counted == param_count(c)
assert param_count(PRESETS["llama2-7b"]) == 6_738_415_616 and param_count(PRESETS["llama3-8b"]) == 8_030_261_248
shares = {name: param_counts(c)["embedding"] / param_count(c) for name, c in (("tiny", cfg), ("Llama 2 7B", PRESETS["llama2-7b"]))}
print("share of the parameters in the embedding: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
The formula gives 6,738,415,616 for Llama 2 7B and 8,030,261,248 for Llama 3 8B: the "7B" and "8B" of the names. In the tiny model the embedding is a large share (its 16,384 parameters are 14 % of the total); at 7B it is 2 %, and nearly all parameters sit in the blocks' matrices. Those matrices are what the FLOPs of section 4 count.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 2. Training on Python's own documentation

The corpus is one that every Python installation carries: the English documentation topics of the standard library's `pydoc_data` (what `help("assert")` prints). `course_lib.data.text_corpus` returns it as UTF-8 **bytes**, so the vocabulary is the 256 byte values and no tokenizer has to be trained; the last topics in alphabetical order are held out whole, so the held-out loss is measured on text the model never saw. (The topics are regenerated for every Python release, so sizes can differ by a little on your machine: they carry a `~`.)

The loss is the cross-entropy of the next byte, in nats. Two references frame it: guessing uniformly among 256 bytes scores $\ln 256 = 5.545$, and a model that knows only how frequent each byte is (no context at all) scores the *unigram* cross-entropy, measured below on the held-out text.
"""

# %% slideshow={"slide_type": "fragment"}
corpus = text_corpus()
print(f"training text ~{len(corpus.train) / 1e3:.0f} kB; held out ~{len(corpus.held_out) / 1e3:.0f} kB: "
      f"the topics {', '.join(corpus.held_out_topics)}")
counts = torch.bincount(corpus.train.long(), minlength=256).double() + 1      # byte frequencies, add-one smoothed
unigram = -(counts / counts.sum()).log()[corpus.held_out.long()].mean().item()
print(f"uniform guess: {math.log(256):.3f} nats/byte; unigram cross-entropy on the held-out text ~{unigram:.3f}")
assert 2.5 < unigram < math.log(256)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Before training, the model's predictions are nearly uniform, and what it writes is noise (bytes that are not valid UTF-8 show as �). `generate` samples one byte at a time from the model's softmax; the sampling generator is seeded.
"""

# %% slideshow={"slide_type": "fragment"}
prompt = encode("The ")
untrained_sample = decode(generate(model, prompt, 120, generator=torch.Generator().manual_seed(0)))
print(repr(untrained_sample))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The training loop is the course's usual one: AdamW (β₂ = 0.95 and weight decay 0.1, as for most language models; `fused=True` updates each parameter in one kernel instead of a dozen), a learning rate warmed up for 20 steps and then decayed on a cosine, 300 steps of 32 windows of 64 bytes. The held-out loss is measured on 8 fixed batches every 25 steps. It is a real training run, on one thread: the cell prints how long it took (after a `~`: the time depends on the machine and on what else it runs).
"""

# %% slideshow={"slide_type": "fragment"}
STEPS, BATCH, SEQ, LR = 300, 32, 64, 3e-3
optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
batches = torch.Generator().manual_seed(0)
held_out_batches = [text_batch(corpus.held_out, 16, SEQ, generator=torch.Generator().manual_seed(i)) for i in range(8)]


def held_out_loss():
    with torch.no_grad():
        return sum(model.loss(xb, yb).item() for xb, yb in held_out_batches) / len(held_out_batches)


def lr_at(step):
    warm = min(1.0, (step + 1) / 20)
    return LR * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / STEPS)))


train_losses, held_out_curve = [], [(0, held_out_loss())]
start = time.perf_counter()
for step in tqdm(range(STEPS), desc="training the tiny decoder"):
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step)
    xb, yb = text_batch(corpus.train, BATCH, SEQ, generator=batches)
    loss = model.loss(xb, yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    train_losses.append(loss.item())
    if (step + 1) % 25 == 0:
        held_out_curve.append((step + 1, held_out_loss()))
train_seconds = time.perf_counter() - start
print(f"{STEPS} steps in ~{train_seconds:.1f} s")

# %% slideshow={"slide_type": "subslide"}
final_held_out = held_out_curve[-1][1]
uniform = math.log(cfg.vocab_size)                         # a uniform guess over the 256 byte values
smoothed = [sum(train_losses[max(0, i - 19):i + 1]) / len(train_losses[max(0, i - 19):i + 1]) for i in range(STEPS)]
fig, ax = plt.subplots(figsize=(7.5, 3.6))
ax.plot(range(1, STEPS + 1), train_losses, color="tab:blue", alpha=0.25, lw=0.8)
ax.plot(range(1, STEPS + 1), smoothed, color="tab:blue", label="training loss (20-step mean)")
ax.plot(*zip(*held_out_curve), ".-", color="tab:orange", label="held-out loss (unseen topics)")
ax.axhline(uniform, ls=":", color="grey", label=f"uniform guess, ln {cfg.vocab_size}")
ax.axhline(unigram, ls="--", color="grey", label="byte frequencies only (unigram)")
ax.set(title="Tiny decoder on Python's documentation, one CPU core", xlabel="training step",
       ylabel="cross-entropy (nats per byte)", ylim=(0, 6))
ax.legend(fontsize=8)
plt.show()
for step, value in held_out_curve[::4]:
    print(f"step {step:>3}: held-out loss ~{value:.3f} nats/byte")
print(f"final held-out ~{final_held_out:.3f} nats/byte = ~{final_held_out / math.log(2):.2f} bits/byte; "
      f"unigram ~{unigram:.3f}; uniform {uniform:.3f}")
assert final_held_out < unigram - 0.5 and held_out_curve[0][1] > uniform - 0.5

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
The held-out loss ends well below the unigram line: the model has learned to use context, and it does so on topics it never trained on. (The losses depend on the machine's arithmetic in their last digits, and 300 steps of training amplify those differences: yours will be close to these, not equal.) What it writes now, from the same prompt and the same sampling seed. This cell's output is entirely machine-dependent: yours will read differently. The cell after it checks what does hold everywhere:
"""

# %% slideshow={"slide_type": "fragment"} tags=["nbval-ignore-output"]
trained_sample = decode(generate(model, prompt, 300, temperature=0.8, generator=torch.Generator().manual_seed(0)))
print(trained_sample)

# %% slideshow={"slide_type": "fragment"}
vocabulary = set(decode(corpus.train.long()).split())


def sample_stats(text):
    """Share of letters and spaces among the generated characters, and of the words the training text contains."""
    generated = text[len("The "):]
    letters = sum(ch.isascii() and (ch.isalpha() or ch == " ") for ch in generated) / len(generated)
    words = generated.split()
    return letters, sum(word in vocabulary for word in words) / max(len(words), 1)


before_stats, after_stats = sample_stats(untrained_sample), sample_stats(trained_sample)
for name, (letters, known) in (("before training", before_stats), ("after training", after_stats)):
    print(f"{name}: letters and spaces ~{letters:.0%} of the generated characters, "
          f"words found in the training text ~{known:.0%}")
assert after_stats[0] > 0.7 > 0.3 > before_stats[0] and after_stats[1] > 0.2 > before_stats[1]

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 3. Activation memory of a block

### Korthikanti's count, adapted

Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models") count what one GPT-3 block keeps for backward, in 16-bit, for a micro-batch of $b$ sequences of $s$ tokens, width $h$, $a$ heads:

| part | what is kept | bytes |
|---|---|---|
| attention | QKV input $2sbh$; $Q$, $K$ $4sbh$; softmax output $2as^2b$; its dropout mask $as^2b$ and output $2as^2b$; $V$ $2sbh$; output-projection input $2sbh$; dropout mask $sbh$ | $11sbh + 5as^2b$ |
| MLP ($h \to 4h \to h$) | input $2sbh$; GELU input $8sbh$; GELU output $8sbh$; dropout mask $sbh$ | $19sbh$ |
| two LayerNorms | their inputs | $4sbh$ |
| **total** | | $sbh\,(34 + 5as/h)$ |

Our block differs in four ways, and each changes a term:

1. **No dropout**: the two $sbh$ masks go, and of the $5as^2b$ only the softmax output $2as^2b$ stays (the scores before the softmax are never kept: softmax's backward needs its output only).
2. **RMSNorm** keeps, besides its input, $1/\text{rms}$: one float32 per token, $4sb$ bytes per norm.
3. **SwiGLU**: the MLP keeps its input, then the gate's output, its SiLU, the up projection and their product, four tensors of width $f$: $2sbh + 8sbf$ instead of $19sbh$. (Grouped-query attention would shrink $K$ and $V$ to width $h_{kv}$.)
4. **SDPA** never materializes the probabilities. It keeps $q$, $k$, $v$, its output (which the output projection keeps anyway, as a view) and one float32 **log-sum-exp** per token and head, $4asb$: the $s^2$ term is gone.

RoPE adds nothing: the rotated $q$ and $k$ replace the unrotated ones, and the rotation multiplies by cos/sin tables, constants kept once per model. `block_saved_terms` holds the result, term by term, for any configuration, attention, checkpointing and dtype. For the tiny model, one sequence of 128 tokens, float32:
"""

# %% slideshow={"slide_type": "fragment"}
for attention in ("naive", "sdpa"):
    terms = block_saved_terms(cfg, 128, attention=attention)
    print(f"--- {attention} attention: {sum(terms.values()):,} bytes per block")
    for name, nbytes in terms.items():
        print(f"  {name:<38}{nbytes:>9,} B")

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
For a GPT-style configuration (GELU MLP with $f = 4h$, no grouped-query attention, 16-bit) the count must be Korthikanti's without the dropout terms, plus the norms' statistics, exactly: $sbh \cdot 32 + 2as^2b + 8sb$. With GPT-3 175B's shape ($h$ = 12288, $a$ = 96, $s$ = 2048, Brown et al., 2020):
"""

# %% slideshow={"slide_type": "fragment"}
gpt3 = dataclasses.replace(PRESETS["tiny"], vocab_size=50257, d_model=12288, n_layers=96, n_heads=96, d_ff=4 * 12288,
                           max_seq_len=2048, mlp="gelu")
S3, B3, H3, A3 = 2048, 1, 12288, 96
ours_naive = block_saved_bytes(gpt3, S3, dtype=torch.bfloat16, attention="naive")
korthikanti = S3 * B3 * H3 * (34 + 5 * A3 * S3 / H3)
assert ours_naive == S3 * B3 * H3 * 32 + 2 * A3 * S3**2 * B3 + 8 * S3 * B3
print(f"Korthikanti et al., with dropout:        {korthikanti / 2**20:>8,.0f} MiB per layer and sequence")
print(f"ours, naive attention (no dropout):      {ours_naive / 2**20:>8,.0f} MiB  = sbh*32 + 2as^2b + 8sb exactly")
print(f"ours, SDPA:                              {block_saved_bytes(gpt3, S3, dtype=torch.bfloat16) / 2**20:>8,.0f} MiB")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Measured to the byte

Now the meter: `SavedTensorMeter` (notebook 03) sees every tensor autograd packs for backward and counts each storage once; the parameters and the rotary tables (buffers) are excluded, so what remains is activations. First the list of what one SDPA block keeps, tensor by tensor, then the totals against the formula for both attentions, both dtypes and grouped-query attention:
"""


# %% slideshow={"slide_type": "fragment"}
def measure_block(c, seq_len, batch=1, dtype=torch.float32):
    """What block 0 of Transformer(c) keeps for backward: the meter, parameters and buffers excluded."""
    m = Transformer(c, seed=0).to(dtype)
    x = torch.randn(batch, seq_len, c.d_model, dtype=dtype, requires_grad=True)
    rope = (m.rope_cos, m.rope_sin) if c.positions == "rope" else None
    with SavedTensorMeter(exclude=[*m.parameters(), *m.buffers()]) as meter:
        if c.checkpointing == "full":          # the model checkpoints each block in its own forward
            checkpoint(m.layers[0], x, rope, use_reentrant=False, preserve_rng_state=False)
        else:
            m.layers[0](x, rope)
    return meter


meter = measure_block(cfg, 128)
kept = [r for r in meter.records if r.new_storage and not r.is_parameter]
names = ["attn_norm: input x", "attn_norm: 1/rms", "q/k/v_proj: input", "SDPA: q (rotated)", "SDPA: k (rotated)",
         "SDPA: v", "SDPA: log-sum-exp", "SDPA: output (= o_proj input)", "mlp_norm: input", "mlp_norm: 1/rms",
         "gate/up_proj: input", "silu: gate", "product: silu(gate)", "product: up", "down_proj: input"]
print(f"{len(kept)} storages kept by one SDPA block (1 x 128 tokens, float32), in the order they were saved:")
for name, r in zip(names, kept, strict=True):
    print(f"  {name:<31}{str(list(r.shape)):<16}{str(r.dtype)[6:]:<9}{r.storage_nbytes:>7,} B")

rows = [("tiny", cfg, torch.float32), ("tiny", cfg, torch.bfloat16),
        ("tiny, 2 kv heads", dataclasses.replace(cfg, n_kv_heads=2), torch.float32),
        ("tiny, GELU", dataclasses.replace(cfg, mlp="gelu"), torch.float32)]
print(f"\n{'configuration':<18}{'dtype':<10}{'attention':<10}{'formula':>10}{'measured':>10}")
for name, c, dtype in rows:
    for attention in ("naive", "sdpa"):
        ca = dataclasses.replace(c, attention=attention)
        formula, measured = block_saved_bytes(ca, 128, batch=4, dtype=dtype), measure_block(ca, 128, 4, dtype).bytes
        print(f"{name:<18}{str(dtype)[6:]:<10}{attention:<10}{formula:>10,}{measured:>10,}")
        assert formula == measured

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Every row agrees to the byte. The listing shows SDPA's keepings in order: the norm's input and 1/rms, the projections' input, rotated $q$ and $k$, $v$, the log-sum-exp (the `[1, 4, 128]` float32), the attention output, then the MLP's side. The same holds for the **whole model**: `model_saved_terms` adds what lies outside the blocks, the token ids the embedding keeps (int64), the final norm, the head's input, and the loss. The loss's float32 log-probabilities, $4V$ bytes per token, are the term to watch: a fifth of a block for the tiny model, most of one for Llama 2 7B, and three blocks' worth for Llama 3 8B with its 128,256-entry vocabulary (which is why fused, chunked cross-entropy kernels exist).
"""

# %% slideshow={"slide_type": "fragment"}
llama = PRESETS["llama2-7b"]
ids_t, targets_t = text_batch(corpus.train, BATCH, SEQ, generator=torch.Generator().manual_seed(0))
with SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()]) as whole:
    model.loss(ids_t, targets_t)
predicted = model_saved_bytes(cfg, SEQ, batch=BATCH)
print(f"whole tiny model, {BATCH} x {SEQ} tokens: formula {predicted:,} B, measured {whole.bytes:,} B")
assert predicted == whole.bytes
for name, c, dtype in (("tiny, float32", cfg, torch.float32), ("Llama 2 7B, bf16", llama, torch.bfloat16),
                       ("Llama 3 8B, bf16", PRESETS["llama3-8b"], torch.bfloat16)):
    log_probs = model_saved_terms(c, 1, dtype=dtype)["loss: log-probabilities"]
    per_block = block_saved_bytes(c, 1, dtype=dtype)              # per token: SDPA's count does not depend on s
    print(f"{name:<17} per token: one block {per_block:>9,} B, the loss's log-probabilities {log_probs:>9,} B "
          f"({log_probs / per_block:.2f} blocks)")
assert model_saved_terms(PRESETS["llama3-8b"], 1, dtype=torch.bfloat16)["loss: log-probabilities"] > 3 * block_saved_bytes(
    PRESETS["llama3-8b"], 1, dtype=torch.bfloat16)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### Where the attention term takes over

Per token and layer, everything SDPA keeps is independent of $s$; naive attention adds $a\,s\,p$ bytes per token ($p$ = bytes per element), growing with the context. The two are equal at $s^* = (\text{linear bytes per token}) / (a\,p)$. The meter confirms the growth on the tiny model; the formula extends it to Llama 2 7B in bf16, with full checkpointing (the block's input only) and selective recomputation (Korthikanti et al.'s: recompute attention proper in backward, keep everything else):
"""

# %% slideshow={"slide_type": "fragment"}
print(f"{'seq':>5}{'naive measured':>16}{'per token':>11}{'sdpa measured':>15}{'per token':>11}")
for seq_len in (16, 32, 64, 128):
    naive = measure_block(dataclasses.replace(cfg, attention="naive"), seq_len).bytes
    sdpa = measure_block(cfg, seq_len).bytes
    assert naive == block_saved_bytes(cfg, seq_len, attention="naive") and sdpa == block_saved_bytes(cfg, seq_len)
    print(f"{seq_len:>5}{naive:>16,}{naive // seq_len:>11,}{sdpa:>15,}{sdpa // seq_len:>11,}")


def crossover(c, p):
    """Sequence length at which naive attention's probabilities equal the rest of the block."""
    rest = block_saved_terms(c, 1, dtype=p, attention="naive")
    linear = sum(v for k, v in rest.items() if k != "attention probabilities")
    return linear / (c.n_heads * p.itemsize)


print(f"s* for tiny (float32): {crossover(cfg, torch.float32):,.0f} tokens; "
      f"for Llama 2 7B (bf16): {crossover(llama, torch.bfloat16):,.0f} tokens")

# %% slideshow={"slide_type": "subslide"}
lengths = [2**i for i in range(9, 16)]
curves = {
    "naive attention": dict(attention="naive"),
    "SDPA": dict(attention="sdpa"),
    "naive + selective recomputation": dict(attention="naive", checkpointing="selective"),
    "full checkpointing (block input only)": dict(checkpointing="full"),
}
styles = [dict(marker="o"), dict(marker="s", lw=4, alpha=0.5), dict(marker="x", ls="--", color="black"), dict(marker="o")]
fig, ax = plt.subplots(figsize=(7.5, 4))
for (label, kw), style in zip(curves.items(), styles):
    ax.plot(lengths, [block_saved_bytes(llama, n, dtype=torch.bfloat16, **kw) / 2**30 for n in lengths], label=label, **style)
ax.axvline(crossover(llama, torch.bfloat16), ls=":", color="grey", label="s*: probabilities = everything else")
ax.set(xscale="log", yscale="log", title="Llama 2 7B, one sequence, one block, bf16",
       xlabel="sequence length s (tokens)", ylabel="bytes kept for backward (GiB)")
ax.set_xticks(lengths, [str(n) for n in lengths])
ax.legend(fontsize=8)
plt.show()
print(f"{'s':>6}{'naive':>12}{'SDPA':>12}{'naive+selective':>17}{'full ckpt':>12}")
for n in (2048, 8192, 32768):
    print(f"{n:>6}" + "".join(f"{format_bytes(block_saved_bytes(llama, n, dtype=torch.bfloat16, **kw)):>{w}}"
                             for kw, w in zip(curves.values(), (12, 12, 17, 12))))
at_32k = {k: block_saved_bytes(llama, 32768, dtype=torch.bfloat16, **kw) for k, kw in curves.items()}
print(f"at 32768 tokens naive keeps {at_32k['naive attention'] / at_32k['SDPA']:.1f}x SDPA's bytes; "
      f"SDPA keeps {at_32k['SDPA'] / at_32k['full checkpointing (block input only)']:.1f}x full checkpointing's")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Read the plot by slopes. SDPA's line grows like $s$ (a constant per token); naive attention bends up to $s^2$ after $s^*$ = 2,400 tokens, and at 32,768 tokens one block keeps 14.6× what it keeps with SDPA. Selective recomputation of attention proper brings naive attention back onto SDPA's line: that is exactly the job FlashAttention does inside its kernel (section 5). Full checkpointing keeps one tensor of width $h$ per token, 18.8× less than SDPA's ($h$ against $8h + 4f$ with $f$ = 11008 ≈ 2.7 $h$, plus the statistics), and pays with a second forward pass.

Below, an explorer for any preset; its static version after it prints the same text for a few settings.
"""

# %% slideshow={"slide_type": "fragment"}
import ipywidgets as widgets
from IPython.display import display


def describe_memory(preset, seq_len, attention, checkpointing, dtype_name):
    c, dtype = PRESETS[preset], {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    per_block = block_saved_bytes(c, seq_len, dtype=dtype, attention=attention, checkpointing=checkpointing)
    whole = model_saved_bytes(c, seq_len, dtype=dtype, attention=attention, checkpointing=checkpointing)
    return (f"{preset}, s={seq_len}, {attention}, checkpointing {checkpointing}, {dtype_name}: "
            f"{format_bytes(per_block)} per block and sequence, {format_bytes(whole)} for the whole model")


memory_controls = dict(
    preset=widgets.Dropdown(options=list(PRESETS), value="llama2-7b", description="preset:"),
    seq_len=widgets.SelectionSlider(options=[2**i for i in range(7, 18)], value=4096, description="seq len:"),
    attention=widgets.ToggleButtons(options=["sdpa", "naive"], description="attention:"),
    checkpointing=widgets.ToggleButtons(options=["none", "selective", "full"], description="checkpoint:"),
    dtype_name=widgets.ToggleButtons(options=["bf16", "fp32"], description="dtype:"),
)
memory_shown = widgets.Output()


def update_memory(change=None):
    memory_shown.outputs = ()
    memory_shown.append_stdout(describe_memory(**{k: w.value for k, w in memory_controls.items()}) + "\n")


for control in memory_controls.values():
    control.observe(update_memory, names="value")
update_memory()
display(widgets.VBox([*memory_controls.values(), memory_shown]))

# %% slideshow={"slide_type": "fragment"}
for attention, checkpointing in (("naive", "none"), ("sdpa", "none"), ("naive", "selective"), ("sdpa", "full")):
    print(describe_memory("llama2-7b", 4096, attention, checkpointing, "bf16"))

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Checkpointing: bytes kept, peak, and the FLOPs it costs

`TransformerConfig.checkpointing` switches the model between keeping everything, recomputing attention proper (`"selective"`, a `checkpoint` around the attention core) and recomputing each whole block (`"full"`, a `checkpoint` around each block). Three measurements per setting, on the tiny model with naive attention: what the forward keeps (the meter, against the formula, exact), the peak of a whole training step read from the allocator (`course_lib.memory`, notebook 04; it includes the recomputation during backward and temporary buffers, so it carries a `~`), and the FLOPs of the step counted by `FlopCounterMode` (exact):
"""

# %% slideshow={"slide_type": "fragment"}
B_CK, S_CK = 8, 128
ids_ck, targets_ck = text_batch(corpus.train, B_CK, S_CK, generator=torch.Generator().manual_seed(1))
ck_rows = {}
for checkpointing in ("none", "selective", "full"):
    c = dataclasses.replace(cfg, attention="naive", checkpointing=checkpointing)
    m = Transformer(c, seed=0)
    with SavedTensorMeter(exclude=[*m.parameters(), *m.buffers()]) as meter:
        m.loss(ids_ck, targets_ck)                      # what the forward keeps (freed at once: no backward)
    with FlopCounterMode(display=False) as flops:
        m.loss(ids_ck, targets_ck).backward()           # one training step, recomputation included
    step_flops = flops.get_total_flops()
    peak = step_peak_memory(m, (ids_ck, targets_ck), forward=lambda mm, i, t: mm.loss(i, t)).peak_bytes
    assert meter.bytes == model_saved_bytes(c, S_CK, batch=B_CK)
    ck_rows[checkpointing] = (meter.bytes, peak, step_flops)
base_flops = ck_rows["none"][2]
print(f"{'checkpointing':<14}{'kept (exact)':>14}{'step peak':>13}{'FLOPs vs none':>15}")
for name, (kept_bytes, peak, step_flops) in ck_rows.items():
    print(f"{name:<14}{format_bytes(kept_bytes):>14}{'~' + format_bytes(peak):>13}  x{step_flops / base_flops:.4f}")
T_CK, h, f, L = B_CK * S_CK, cfg.d_model, cfg.d_ff, cfg.n_layers
scores_fwd = T_CK * L * 2 * h * S_CK                                        # q k^T of every layer
blocks_fwd = T_CK * 2 * (matmul_params(cfg) - cfg.vocab_size * h) + T_CK * L * 4 * h * S_CK
down_fwd = T_CK * L * 2 * f * h                                             # each block's last product
assert ck_rows["selective"][2] - base_flops == scores_fwd
assert ck_rows["full"][2] - base_flops == blocks_fwd - down_fwd
print(f"recomputed: selective = q k^T of each layer ({scores_fwd:,} FLOPs); "
      f"full = each block's forward minus its down_proj ({blocks_fwd - down_fwd:,})")
assert ck_rows["full"][0] < ck_rows["selective"][0] < ck_rows["none"][0]
assert ck_rows["full"][1] < ck_rows["none"][1] and ck_rows["selective"][1] < ck_rows["none"][1]

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
The FLOPs column is exact, and the asserts say what was recomputed, with one surprise each. PyTorch's non-reentrant `checkpoint` reruns a forward **only until it has rebuilt the last tensor backward needs**, then stops: the selective variant recomputes $qk^\top$ and the softmax but not `probs @ v` (nothing kept its output), and the full variant recomputes every block except its final `down_proj` product. Here attention is a large share of the work because the model is narrow ($h$ = 64 against $s$ = 128); for Llama 2 7B at 4096 tokens the same selective recomputation costs about 2 % more FLOPs and saves 63 % of each block's bytes. This is the trade of notebooks 04 and 05 (store or recompute), now priced term by term on a real block.
"""

# %% slideshow={"slide_type": "fragment"}
ll_none = block_saved_bytes(llama, 4096, dtype=torch.bfloat16, attention="naive")
ll_sel = block_saved_bytes(llama, 4096, dtype=torch.bfloat16, attention="naive", checkpointing="selective")
extra = 2 * llama.n_layers * llama.d_model * 4096 / training_flops_per_token(llama, 4096)   # q k^T again
print(f"Llama 2 7B, s=4096: selective recomputation saves {1 - ll_sel / ll_none:.0%} of a block's bytes "
      f"for {extra:.1%} more FLOPs")

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 4. FLOPs per token, and MFU

### $6N$ plus attention

A product of an input row with a $k \times n$ weight costs $2kn$ FLOPs (a multiply and an add per weight). Backward computes two products of the same size, the input's gradient and the weight's. So every weight that takes part in a product costs **2 FLOPs per token forward and 4 backward: 6 per training token**. With $N$ the number of such weights (`matmul_params`: every projection, and the head even when it is tied; not the embedding lookup, not the norms) that is $6N$ per token.

Attention proper multiplies activations by activations: $qk^\top$ and then probabilities times $v$, each $2sh$ FLOPs per token and layer forward, twice that backward. Per token:

$$\text{FLOPs}_{\text{train}} = 6N + 12\,L\,h\,s$$

(Chowdhery et al., 2022, appendix B, whose convention MFU uses). A causal kernel skips the masked half of the scores, so the work it really does is $6N + 6Lhs$; MFU is conventionally quoted with the full $12Lhs$. `FlopCounterMode` counts the matrix products from their shapes, so with naive attention (its products are ordinary `bmm`s) forward and backward must match the formula exactly:
"""

# %% slideshow={"slide_type": "fragment"}
T_F = BATCH * SEQ
N = matmul_params(cfg)
for attention in ("naive", "sdpa"):
    m = Transformer(dataclasses.replace(cfg, attention=attention), seed=0)
    with FlopCounterMode(display=False) as fwd:
        loss_f = m.loss(ids_t, targets_t)
    with FlopCounterMode(display=False) as bwd:
        loss_f.backward()
    print(f"{attention:<5}: forward {fwd.get_total_flops():>12,}  backward {bwd.get_total_flops():>12,}  FLOPs counted")
    if attention == "naive":
        counted_naive = fwd.get_total_flops() + bwd.get_total_flops()
        assert fwd.get_total_flops() == T_F * (2 * N + 4 * cfg.n_layers * cfg.d_model * SEQ)
        assert bwd.get_total_flops() == 2 * fwd.get_total_flops()
    else:
        assert fwd.get_total_flops() + bwd.get_total_flops() == 6 * N * T_F     # no attention at all
print(f"formula: {T_F} tokens x (6 x {N:,} + 12 x {cfg.n_layers} x {cfg.d_model} x {SEQ}) = "
      f"{T_F * training_flops_per_token(cfg, SEQ):,}")
assert counted_naive == T_F * training_flops_per_token(cfg, SEQ)

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
Naive attention matches the formula to the FLOP, forward and backward. With SDPA, `FlopCounterMode` on the CPU counts exactly $6N$ per token and **no attention at all**: the CPU kernel, `_scaled_dot_product_flash_attention_for_cpu`, has no FLOP formula registered (`torch/utils/flop_counter.py` registers the CUDA flash, memory-efficient and cuDNN kernels). On a GPU those are counted, and their backward as five products where the forward has two (2.5 times the forward, where autograd's backward of naive attention is twice its forward), because the flash backward recomputes $qk^\top$; section 5 counts the same on the hand-written version. A counter is only as good as its table: check what it counts before quoting an MFU from it.

### Tokens per second and MFU on this CPU

**MFU** (model FLOPs utilization, Chowdhery et al., 2022) is the model's own FLOPs per second divided by the hardware's peak: tokens/s × FLOPs per token / peak. Recomputation does not count (with it, the ratio is the *hardware* FLOPs utilization, HFU). The peak here is this CPU's own float32 matrix-multiply rate on one core (this notebook runs on one thread), measured with `course_lib.timing.matmul_tflops`; the step time is the best of a few timed training steps of the tiny model, and of a wider one. Both depend on the machine and on what else it is doing (on a busy machine the ratio of two timings is noisy, and can even exceed 1 when the peak was measured at a busy moment), hence the `~`:
"""

# %% slideshow={"slide_type": "fragment"}
from torch.profiler import ProfilerActivity, profile


def training_step(c, batch, seq_len):
    """One AdamW training step of a fresh Transformer(c) on a fixed batch, as a function of no arguments."""
    m = Transformer(c, seed=0)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    xb, yb = text_batch(corpus.train, batch, seq_len, generator=torch.Generator().manual_seed(2))

    def one_step():
        opt.zero_grad(set_to_none=True)
        m.loss(xb, yb).backward()
        opt.step()

    one_step()                                               # warm-up
    return one_step


def seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def share_in_products(fn, repeats=3):
    """Share of fn's CPU time spent in matrix products and attention kernels, from the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    events = prof.key_averages()
    products = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::bmm", "aten::addmm")
                   or e.key.startswith("aten::_scaled_dot_product"))
    return products / sum(e.self_cpu_time_total for e in events)


wide = dataclasses.replace(cfg, d_model=256, d_ff=688)
runs = {"tiny (h=64)": (cfg, BATCH, SEQ), "wider (h=256)": (wide, 8, 128)}
step_fns = {name: training_step(*args) for name, args in runs.items()}
best = {name: math.inf for name in runs}
peak = 0.0
for _ in range(6):        # interleaved, so that the peak and the steps see the same moments of a busy machine
    peak = max(peak, matmul_tflops(512, torch.float32, device="cpu", repeats=3) * 1e12)
    for name, fn in step_fns.items():
        best[name] = min(best[name], seconds(fn))
print(f"this CPU's float32 matmul peak on one thread ~{peak / 1e9:.0f} GFLOP/s (512 x 512 products)")
for name, (c, bsz, seq_len) in runs.items():
    tps, fpt = bsz * seq_len / best[name], training_flops_per_token(c, seq_len)
    share = share_in_products(step_fns[name])
    print(f"{name:<14}{param_count(c):>10,} parameters, {fpt / 1e6:5.2f} MFLOP/token: ~{tps:.0f} tokens/s, "
          f"MFU ~{mfu(tps, fpt, peak):.0%}; step time in products ~{share:.0%}")
    assert tps > 0 and 0 < share < 1

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Why the MFU is well below 1: only part of the step is matrix products at all (the last column, read from the profiler), and only those do model FLOPs. The rest is element-wise work (norms, RoPE, SiLU, the softmax of the loss, AdamW's update) that streams memory and adds nothing to the count; the products themselves are small, and small products run below the benchmark's rate. The wider model's products are four times wider and its MFU is typically higher. On GPUs the same accounting explains why MFU grows with model width and micro-batch, and why element-wise work is fused into the products' kernels.

### The same arithmetic for a published run

Llama 2 7B was trained on 2.0 trillion tokens at 4,096-token context, and its pretraining took 184,320 GPU-hours of A100-80GB (Touvron et al., 2023, table 2). An A100's dense bf16 tensor-core peak is 312 TFLOP/s (NVIDIA A100 datasheet). The formula turns these into an MFU; and into what the same run would take on H100 SXM GPUs (989 TFLOP/s dense bf16, NVIDIA H100 datasheet) at that MFU:
"""

# %% slideshow={"slide_type": "fragment"}
fpt_llama = training_flops_per_token(llama, 4096)
TOKENS, GPU_HOURS, A100, H100 = 2.0e12, 184_320, 312e12, 989e12
implied = TOKENS * fpt_llama / (GPU_HOURS * 3600 * A100)
print(f"Llama 2 7B: N = {matmul_params(llama):,} weights in products; at s = 4096: {fpt_llama / 1e9:.2f} GFLOP per token "
      f"(6N = {6 * matmul_params(llama) / 1e9:.2f}, attention {12 * llama.n_layers * llama.d_model * 4096 / 1e9:.2f})")
print(f"training compute: {TOKENS * fpt_llama:.3g} FLOPs; implied MFU on A100s: {implied:.0%}")
h100_tps = implied * H100 / fpt_llama
print(f"at that MFU one H100 processes {h100_tps:,.0f} tokens/s; 2.0T tokens on 1,024 H100s: "
      f"{TOKENS / (h100_tps * 1024) / 86400:.1f} days")
for seq_len in (4096, 32768):
    share = 12 * llama.n_layers * llama.d_model * seq_len / training_flops_per_token(llama, seq_len)
    print(f"attention's share of the FLOPs at s = {seq_len}: {share:.0%}")
assert 0.3 < implied < 0.6

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
About 45 % MFU. For comparison, Meta reports 38–43 % for Llama 3 405B on 16,000 H100s ([Llama Team, 2024](https://arxiv.org/abs/2407.21783), table 4). The last two lines are why long-context training is an attention problem: at 4,096 tokens attention is 14 % of the FLOPs, at 32,768 it is over half. Notebook 21's planner runs exactly this arithmetic for every layout it considers.
"""

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## 5. Attention by hand, down to FlashAttention

### Naive and causal

Attention for one head: scores $S = qk^\top/\sqrt{d}$, probabilities $P = \text{softmax}(S)$ row by row, output $O = Pv$. Causal masking sets the scores above the diagonal to $-\infty$ before the softmax, so their probabilities are exactly 0. Written out and compared with SDPA:
"""


# %% slideshow={"slide_type": "fragment"}
def naive_attention(q, k, v, causal=False):
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:   # -inf above the diagonal; adding it keeps nothing for backward (masked_fill would keep the mask)
        scores = scores + torch.full(scores.shape[-2:], float("-inf")).triu(1)
    return torch.softmax(scores, dim=-1) @ v


q, k, v = torch.randn(3, 2, 4, 64, 16).unbind(0)              # batch 2, 4 heads, 64 positions, head_dim 16
for causal in (False, True):
    diff = (naive_attention(q, k, v, causal) - F.scaled_dot_product_attention(q, k, v, is_causal=causal)).abs().max()
    print(f"causal={causal!s:<5} naive == SDPA: {diff < 1e-5}, largest difference < 1e-5")
    assert diff < 1e-5
probs = torch.softmax((q @ k.transpose(-2, -1) / 4).masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), float("-inf")), -1)
print(f"causal probabilities: rows sum to 1: {torch.allclose(probs.sum(-1), torch.ones(2, 4, 64))}; "
      f"above the diagonal exactly 0: {bool((probs.triu(1) == 0).all())}")

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### The online softmax

The naive version needs a whole row of scores before it can normalize: the softmax divides by $\sum_j e^{S_j}$ and, to avoid overflow, subtracts the row's maximum first. Milakov & Gimelshein (2018) noticed that both can be **carried along**: read the scores a tile at a time, keep the running maximum $m$ and the running sum $\ell = \sum e^{S_j - m}$, and when a tile brings a larger maximum, rescale what you have by $e^{m_{\text{old}} - m_{\text{new}}}$. One row, tiles of 4, float64:
"""

# %% slideshow={"slide_type": "fragment"}
row = torch.tensor([1.0, 3.0, -2.0, 0.5, 4.0, 2.0, -1.0, 6.0, 0.0, 5.5, 1.5, 2.5], dtype=torch.float64)
m_run, l_run = torch.tensor(-math.inf, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
for start in range(0, len(row), 4):
    tile = row[start:start + 4]
    m_new = torch.maximum(m_run, tile.max())
    l_run = l_run * torch.exp(m_run - m_new) + torch.exp(tile - m_new).sum()   # rescale the old sum, add the tile
    m_run = m_new
    print(f"after scores {start}-{start + 3}: running max {m_run.item():.1f}, running sum {l_run.item():.4f}")
online = torch.exp(row - m_run) / l_run
print(f"online softmax == torch.softmax: {torch.allclose(online, torch.softmax(row, 0))}; "
      f"log-sum-exp m + log l = {(m_run + l_run.log()).item():.4f} == torch.logsumexp {torch.logsumexp(row, 0).item():.4f}")
assert torch.allclose(online, torch.softmax(row, 0)) and torch.isclose(m_run + l_run.log(), torch.logsumexp(row, 0))

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
Attention needs $Pv$, not $P$, and the same trick carries the output: keep an unnormalized accumulator $\text{acc} = \sum_j e^{S_j - m} v_j$, rescale it with the sum, and divide by $\ell$ at the end. What a tile contributes is a **partial result**: its own normalized output and its own log-sum-exp. Two partial results over disjoint keys merge exactly, each weighted by its share of the total mass, $e^{\text{lse}_i - \text{lse}}$ with $\text{lse} = \log(e^{\text{lse}_1} + e^{\text{lse}_2})$. The library has this merge in `course_lib.attention` (`attention_block` for one block of keys, `merge_attention`), because notebook 18's ring attention merges the blocks that arrive from other devices this way. The hand-written running update and the library's merge must agree, tile after tile:
"""

# %% slideshow={"slide_type": "fragment"}
q1, k1, v1 = torch.randn(1, 1, 16, dtype=torch.float64), torch.randn(1, 12, 16, dtype=torch.float64), torch.randn(1, 12, 16, dtype=torch.float64)
s_row = (q1 @ k1.transpose(-2, -1))[0, 0] / 4
m_run, l_run, acc = torch.tensor(-math.inf, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64), torch.zeros(16, dtype=torch.float64)
lib_out, lib_lse = torch.zeros(1, 1, 16, dtype=torch.float64), torch.full((1, 1), -math.inf, dtype=torch.float64)
for start in range(0, 12, 4):
    tile, v_tile = s_row[start:start + 4], v1[0, start:start + 4]
    m_new = torch.maximum(m_run, tile.max())
    scale_old = torch.exp(m_run - m_new)
    p_tile = torch.exp(tile - m_new)
    l_run, acc, m_run = l_run * scale_old + p_tile.sum(), acc * scale_old + p_tile @ v_tile, m_new
    lib_out, lib_lse = merge_attention(lib_out, lib_lse, *attention_block(q1, k1[:, start:start + 4], v1[:, start:start + 4]))
    assert torch.allclose(acc / l_run, lib_out[0, 0]) and torch.isclose(m_run + l_run.log(), lib_lse[0, 0])
full_attention = F.scaled_dot_product_attention(q1, k1, v1)[0, 0]
print(f"after 3 tiles: hand-written running output == library merge == SDPA: "
      f"{torch.allclose(acc / l_run, lib_out[0, 0]) and torch.allclose(acc / l_run, full_attention)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### FlashAttention-2 as an `autograd.Function`

FlashAttention (Dao et al., 2022; FlashAttention-2, Dao, 2023) is this loop, tiled over queries as well as keys, with one more decision: **what to keep for backward**. Naive attention keeps $P$, $s^2$ numbers per head. FlashAttention keeps only $O$ and the log-sum-exp $L$ (one number per query), and in backward **recomputes** each tile of $P$ as $e^{S - L}$, which needs no running max any more: $L$ already is the normalizer. The backward of softmax attention, tile by tile (with $D = \text{rowsum}(dO \circ O)$):

$$dv \mathrel{+}= P^\top dO, \qquad dP = dO\,v^\top, \qquad dS = P \circ (dP - D), \qquad dq \mathrel{+}= dS\,k/\sqrt d, \qquad dk \mathrel{+}= dS^\top q/\sqrt d$$

This is **notebook 04's trade** (recompute instead of store: gradient checkpointing, applied inside one operation) built with **notebook 03's tool** (a custom `autograd.Function` that decides what `save_for_backward` keeps). Causal tiles above the diagonal are skipped entirely, in both directions.
"""


# %% slideshow={"slide_type": "fragment"}
class FlashAttention(torch.autograd.Function):
    """Causal or full attention on (batch, heads, seq, head_dim); keeps q, k, v, O and L, never P."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, tile=64):
        n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]    # as many keys as queries, or not (cross-attention)
        scale, acc_dtype = d ** -0.5, torch.float64 if q.dtype == torch.float64 else torch.float32
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=acc_dtype, device=q.device)
        for i0 in range(0, n_q, tile):                              # a tile of queries...
            qi = q[..., i0:i0 + tile, :]
            rows = torch.arange(i0, i0 + qi.shape[-2], device=q.device)
            m = torch.full(qi.shape[:-1], -math.inf, dtype=acc_dtype, device=q.device)
            l = torch.zeros_like(m)
            acc = torch.zeros(qi.shape, dtype=acc_dtype, device=q.device)
            last = min(i0 + qi.shape[-2], n_k) if causal else n_k   # causal: query i sees keys 0..i (SDPA's rule)
            for j0 in range(0, last, tile):                         # ...against tiles of keys
                s_ij = (qi @ k[..., j0:j0 + tile, :].transpose(-2, -1)).to(acc_dtype) * scale
                if causal and j0 + tile > i0:                       # the diagonal tile: mask later keys
                    cols = torch.arange(j0, j0 + s_ij.shape[-1], device=q.device)
                    s_ij = s_ij.masked_fill(cols > rows[:, None], -math.inf)
                m_new = torch.maximum(m, s_ij.amax(-1))
                p = torch.exp(s_ij - m_new[..., None])
                correction = torch.exp(m - m_new)
                l = l * correction + p.sum(-1)
                acc = acc * correction[..., None] + (p.to(v.dtype) @ v[..., j0:j0 + tile, :]).to(acc_dtype)
                m = m_new
            out[..., i0:i0 + tile, :] = (acc / l[..., None]).to(q.dtype)
            lse[..., i0:i0 + tile] = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)                    # O(s): no s x s tensor
        ctx.causal, ctx.tile = causal, tile
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, tile, n_q, n_k, acc_dtype = ctx.causal, ctx.tile, q.shape[-2], k.shape[-2], lse.dtype
        scale = q.shape[-1] ** -0.5
        dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
        dk, dv = torch.zeros(k.shape, dtype=acc_dtype, device=q.device), torch.zeros(v.shape, dtype=acc_dtype, device=q.device)
        D = (d_out.to(acc_dtype) * out.to(acc_dtype)).sum(-1)
        for j0 in range(0, n_k, tile):                              # a tile of keys (FlashAttention-2's outer loop)...
            kj, vj = k[..., j0:j0 + tile, :], v[..., j0:j0 + tile, :]
            cols = torch.arange(j0, j0 + kj.shape[-2], device=q.device)
            for i0 in range(j0 if causal else 0, n_q, tile):        # ...against the query tiles that see it
                qi, doi = q[..., i0:i0 + tile, :], d_out[..., i0:i0 + tile, :]
                s_ij = (qi @ kj.transpose(-2, -1)).to(acc_dtype) * scale
                if causal and i0 < j0 + tile:
                    rows = torch.arange(i0, i0 + qi.shape[-2], device=q.device)
                    s_ij = s_ij.masked_fill(cols > rows[:, None], -math.inf)
                p = torch.exp(s_ij - lse[..., i0:i0 + tile, None])  # recomputed from L, not stored
                dv[..., j0:j0 + tile, :] += (p.transpose(-2, -1).to(v.dtype) @ doi).to(acc_dtype)
                dp = (doi @ vj.transpose(-2, -1)).to(acc_dtype)
                ds = p * (dp - D[..., i0:i0 + tile, None])
                dq[..., i0:i0 + tile, :] += (ds.to(q.dtype) @ kj).to(acc_dtype) * scale
                dk[..., j0:j0 + tile, :] += (ds.transpose(-2, -1).to(q.dtype) @ qi).to(acc_dtype) * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def flash_attention(q, k, v, causal=False, tile=64):
    return FlashAttention.apply(q, k, v, causal, tile)


# %% [markdown] slideshow={"slide_type": "subslide"}
"""
### Checked: forward and backward against SDPA and the naive version, `gradcheck`, the library's twin

In float32, on 200 positions (not a multiple of the tile, so the last tile is ragged), with and without the causal mask: the output and the three gradients must agree with SDPA and with `naive_attention` within $10^{-5}$. Then `gradcheck` in float64 (notebook 03), and the library's pieces, which notebook 18 uses: `blockwise_attention` (the fold of `attention_block` and `merge_attention`) must give the same output **and** log-sum-exp, and `attention_block_backward` summed over key blocks the same gradients.
"""

# %% slideshow={"slide_type": "fragment"}
seed_everything(0)
qf, kf, vf = (torch.randn(2, 4, 200, 32, requires_grad=True) for _ in range(3))
g_out = torch.randn(2, 4, 200, 32)
impls = {"FlashAttention by hand": flash_attention, "SDPA": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
         "naive": naive_attention}
for causal in (False, True):
    results = {}
    for name, fn in impls.items():
        o = fn(qf, kf, vf, causal)
        results[name] = [o.detach(), *torch.autograd.grad(o, (qf, kf, vf), g_out)]
    ref = results["SDPA"]
    for name in ("FlashAttention by hand", "naive"):
        worst = max((a - b).abs().max().item() for a, b in zip(results[name], ref))
        print(f"causal={causal!s:<5} {name:<23} vs SDPA: output, dq, dk, dv allclose: {worst < 1e-5}, largest difference < 1e-5")
        assert worst < 1e-5

q64, k64, v64 = (torch.randn(1, 2, 10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
for causal in (False, True):
    assert torch.autograd.gradcheck(lambda q, k, v: flash_attention(q, k, v, causal, 4), (q64, k64, v64))
print("gradcheck in float64 (10 positions, tiles of 4): passed, causal and not")

# Cross-attention and a KV cache have as many keys as they have, not as many as queries. With unequal lengths SDPA's
# causal mask is top-left aligned (query i sees keys 0..i): the tiles above follow the same rule.
for keys in (64, 300):
    kx, vx = (torch.randn(2, 4, keys, 32, requires_grad=True) for _ in range(2))
    for causal in (False, True):
        ours = flash_attention(qf, kx, vx, causal)
        sdpa = F.scaled_dot_product_attention(qf, kx, vx, is_causal=causal)
        pairs = zip([ours, *torch.autograd.grad(ours, (qf, kx, vx), g_out)], [sdpa, *torch.autograd.grad(sdpa, (qf, kx, vx), g_out)])
        assert all((a - b).abs().max().item() < 1e-5 for a, b in pairs)
print("200 queries against 64 and 300 keys, causal and not: output and gradients as SDPA's, within 1e-5")

with torch.no_grad():
    hand_out = flash_attention(qf, kf, vf, True)
lib_out, lib_lse = blockwise_attention(qf.detach(), kf.detach(), vf.detach(), block_size=64, causal=True)
hand_lse = torch.logsumexp(torch.where(torch.ones(200, 200, dtype=torch.bool).tril(),
                                       qf.detach() @ kf.detach().transpose(-2, -1) / math.sqrt(32), -math.inf), -1)
dq_lib = torch.zeros_like(qf)
dk_lib, dv_lib = torch.zeros_like(kf), torch.zeros_like(vf)
for j0 in range(0, 200, 64):
    dq_b, dk_b, dv_b = attention_block_backward(qf.detach(), kf[..., j0:j0 + 64, :].detach(), vf[..., j0:j0 + 64, :].detach(),
                                                lib_out, lib_lse, g_out, causal=True, k_start=j0)
    dq_lib += dq_b
    dk_lib[..., j0:j0 + 64, :], dv_lib[..., j0:j0 + 64, :] = dk_b, dv_b
hand_grads = results["FlashAttention by hand"][1:]
twins = (torch.allclose(hand_out, lib_out, atol=1e-5) and torch.allclose(lib_lse, hand_lse, atol=1e-5)
         and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(hand_grads, (dq_lib, dk_lib, dv_lib))))
print(f"course_lib.attention's blockwise forward (output and LSE) and block backward == the hand-written Function: {twins}")
assert twins

# %% [markdown] slideshow={"slide_type": "subslide"}
r"""
### Saved bytes: O(s) against O(s²), and the FLOPs of recomputing

The meter on both, 4 heads of width 32, growing sequence length. FlashAttention keeps $q$, $k$, $v$, $O$ (four tensors of $s \cdot d$ numbers per head) and $L$ ($s$ float32 per head); naive attention keeps $q$, $k$, $v$ and $P$ ($s^2$ per head). `FlopCounterMode` counts the price: the forward does 2 products per pair of tiles it visits, the backward 5 (the recomputed $qk^\top$ is the fifth), and a causal pass visits only the tiles on and below the diagonal:
"""

# %% slideshow={"slide_type": "fragment"}
HEADS, D_HEAD, TILE = 4, 32, 64
print(f"{'seq':>6}{'flash keeps':>13}{'naive keeps':>13}{'ratio':>8}{'tile pairs':>13}{'flash fwd FLOPs':>17}{'bwd / fwd':>11}")
kept = []                                                              # (flash, naive) saved bytes per length
for n in (128, 256, 512, 1024):
    qs, ks, vs = (torch.randn(1, HEADS, n, D_HEAD, requires_grad=True) for _ in range(3))
    with SavedTensorMeter() as flash_meter, FlopCounterMode(display=False) as f_fwd:
        o_flash = flash_attention(qs, ks, vs, True, TILE)
    with FlopCounterMode(display=False) as f_bwd:
        o_flash.backward(torch.ones_like(o_flash))
    with SavedTensorMeter() as naive_meter:
        naive_attention(qs, ks, vs, True)
    tiles = n // TILE
    pairs = tiles * (tiles + 1) // 2                                   # causal: on and below the diagonal
    assert flash_meter.bytes == HEADS * (4 * n * D_HEAD * 4 + n * 4)    # q, k, v, O in float32, and L
    assert naive_meter.bytes == HEADS * (3 * n * D_HEAD * 4 + n * n * 4)
    assert f_fwd.get_total_flops() == pairs * HEADS * 2 * (2 * TILE * TILE * D_HEAD)
    assert f_bwd.get_total_flops() * 2 == 5 * f_fwd.get_total_flops()
    print(f"{n:>6}{format_bytes(flash_meter.bytes):>13}{format_bytes(naive_meter.bytes):>13}"
          f"{naive_meter.bytes / flash_meter.bytes:>7.1f}x{f'{pairs} of {tiles * tiles}':>13}{f_fwd.get_total_flops():>17,}"
          f"{f_bwd.get_total_flops() / f_fwd.get_total_flops():>10.1f}x")
    kept.append((flash_meter.bytes, naive_meter.bytes))
flash_growth = [b[0] / a[0] for a, b in zip(kept, kept[1:])]
naive_growth = [b[1] / a[1] for a, b in zip(kept, kept[1:])]
print("each doubling of the sequence: FlashAttention keeps " + ", ".join(f"{g:.2f}x" for g in flash_growth)
      + " as much (doubles: O(s)); naive keeps " + ", ".join(f"{g:.2f}x" for g in naive_growth)
      + " (nearly quadruples: O(s²))")
assert all(g == 2 for g in flash_growth) and 3.5 < naive_growth[-1] < 4
print(f"~{time.perf_counter() - notebook_start:.0f} s since the notebook started")

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
Doubling the sequence doubles what FlashAttention keeps and nearly quadruples what naive attention keeps. The backward costs 2.5 times the forward instead of 2: one extra product per tile, the price of not storing $P$. And a causal pass does roughly half the work of a full one (at 1,024 tokens, 136 of 256 tile pairs), which is why `training_flops_per_token(..., causal=True)` counts half the attention term.

On the CPU this Python loop is slower than SDPA's fused kernel, which runs the same algorithm in compiled code, without Python between tiles. The next cell measures both at 1,024 tokens, forward and backward, on this thread's CPU time (best of three, interleaved):
"""


# %% slideshow={"slide_type": "fragment"}
def cpu_seconds(attend):
    start = time.thread_time()
    out = attend(qs, ks, vs)
    torch.autograd.grad(out, (qs, ks, vs), torch.ones_like(out))
    return time.thread_time() - start


best = {"hand-written": math.inf, "SDPA": math.inf}
for _ in range(3):
    best["hand-written"] = min(best["hand-written"], cpu_seconds(lambda q, k, v: flash_attention(q, k, v, True, TILE)))
    best["SDPA"] = min(best["SDPA"], cpu_seconds(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
cpu_ratio = best["hand-written"] / best["SDPA"]
print(f"{qs.shape[-2]:,} tokens, causal, forward and backward: hand-written ~{best['hand-written'] * 1e3:.0f} ms, "
      f"SDPA ~{best['SDPA'] * 1e3:.0f} ms; hand-written / SDPA ~{cpu_ratio:.1f}x: slower")
assert cpu_ratio > 1  # the lesson: on a CPU the hand-written tiles are slower than SDPA's fused kernel

# %% [markdown] slideshow={"slide_type": "fragment"}
"""
On a GPU the gap is the whole point of FlashAttention: the tiles live in on-chip SRAM and $P$ never touches the GPU's main memory. The next cell times PyTorch's flash kernel against the hand-written version on a GPU, when there is one:
"""

# %% slideshow={"slide_type": "fragment"}
if requires_gpu("SDPA's flash kernel against the hand-written FlashAttention, forward and backward", capability=(8, 0)):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bg, hg, sg, dg = 4, 16, 4096, 64
    qg, kg, vg = (torch.randn(bg, hg, sg, dg, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dog = torch.randn(bg, hg, sg, dg, device="cuda", dtype=torch.bfloat16)

    def sdpa_step():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        return [o, *torch.autograd.grad(o, (qg, kg, vg), dog)]

    def hand_step():
        o = flash_attention(qg, kg, vg, True, 128)
        return [o, *torch.autograd.grad(o, (qg, kg, vg), dog)]

    def time_ms(fn, repeats=5):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats

    worst = max(((a.float() - b.float()).abs().max() / a.float().abs().max()).item()
                for a, b in zip(sdpa_step(), hand_step()))
    t_sdpa, t_hand = time_ms(sdpa_step), time_ms(hand_step)
    work = 3.5 * 4 * bg * hg * sg * sg * dg / 2               # causal: forward 2 products, backward 5, half the tiles
    print(f"{torch.cuda.get_device_name()}: batch {bg}, {hg} heads, {sg} tokens, head_dim {dg}, bf16, causal")
    print(f"SDPA flash kernel: ~{t_sdpa:.2f} ms per forward+backward (~{work / t_sdpa / 1e9:.0f} TFLOP/s)")
    print(f"hand-written     : ~{t_hand:.2f} ms (~{work / t_hand / 1e9:.0f} TFLOP/s), ~{t_hand / t_sdpa:.0f}x slower")
    print(f"outputs and gradients agree: largest difference ~{worst:.1%} of the largest value (bf16)")
    assert worst < 0.05

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## Summary

- The course's transformer (`course_lib.transformer`) is a Llama-style decoder: embedding, blocks of RMSNorm → attention (separate `q_proj`, `k_proj`, `v_proj`, `o_proj`, RoPE, causal SDPA) → residual → RMSNorm → SwiGLU (`gate_proj`, `up_proj`, `down_proj`) → residual, a final norm and a (tied) head. Its parameter count per block is $2h^2 + 2h\,h_{kv} + 3hf + 2h$; the formula gives Llama 2 7B's 6,738,415,616 and equals `sum(p.numel())` for every variant.
- On one CPU core, 300 steps on Python's documentation bring the held-out loss (unseen topics) well below the byte-frequency baseline, and the samples from noise to documentation-like English.
- One block keeps, per token, $(6h + 2h_{kv})p + 4fp$ bytes plus float32 statistics, and naive attention adds $a\,s\,p$: Korthikanti et al.'s $sbh(34 + 5as/h)$ without dropout, with RMSNorm and SwiGLU. `SavedTensorMeter` agrees to the byte for naive and SDPA attention, float32 and bf16, grouped-query attention, and the whole model with its loss. For Llama 2 7B the $s^2$ term overtakes the rest at 2,400 tokens.
- Selective recomputation of attention proper removes the $s^2$ term for one more $qk^\top$ and softmax per layer; full checkpointing keeps one width-$h$ tensor per token and block for one more forward of every block (minus its last product: the non-reentrant `checkpoint` stops recomputing once it has what backward needs). `FlopCounterMode` prices both exactly.
- Training costs $6N + 12Lhs$ FLOPs per token; `FlopCounterMode` confirms it with naive attention, and shows that on the CPU it does not count SDPA at all. MFU = tokens/s × FLOPs per token / peak; Llama 2 7B's published numbers imply about 45 % on A100s.
- FlashAttention is the online softmax tiled over queries and keys, keeping $O$ and the log-sum-exp instead of $P$ and recomputing $P$ tile by tile in backward: O(s) bytes instead of O(s²), 2.5× instead of 2× the forward's FLOPs in backward. It is checkpointing inside one operation, written as a custom `autograd.Function`. The merge of partial results is in `course_lib.attention` for ring attention (notebook 18).
"""

# %% [markdown] slideshow={"slide_type": "slide"}
"""
## Exercises

**1. Count the parameters.** Write `n_params(config)` for any `TransformerConfig` from its fields (`vocab_size`, `d_model`, `n_layers`, `n_heads`, `kv_heads`, `head_dim`, `d_ff`, `max_seq_len`, `tie_embeddings`, `mlp`, `positions`). The check tries the presets and variants of them (untied, GELU, learned positions, grouped-query attention); `param_count` is the answer key, so do not call it.
"""

# %% slideshow={"slide_type": "fragment"}
from course_lib.exercises.transformer import check_merge, check_param_count, check_saved_bytes


def n_params(config):
    raise NotImplementedError("your code here")


check_param_count(n_params)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**2. The bytes a block keeps.** Write `saved_bytes(config, seq_len, attention, p)`: the bytes one block of `Transformer(config)` keeps for backward for **one** sequence of `seq_len` tokens, with activations of `p` bytes per element (2 for bf16, 4 for float32) and statistics (1/rms, the log-sum-exp) in float32, for `attention` `"sdpa"` or `"naive"`, without checkpointing. The check compares with the measured formula on the tiny model, Llama 2 7B and Llama 3 8B (grouped-query attention) at several lengths.
"""


# %% slideshow={"slide_type": "fragment"}
def saved_bytes(config, seq_len, attention, p):
    raise NotImplementedError("your code here")


check_saved_bytes(saved_bytes)

# %% [markdown] slideshow={"slide_type": "subslide"}
"""
**3. Merge two partial results.** Write `merge(out1, lse1, out2, lse2)` returning `(out, lse)`: given attention outputs and log-sum-exps of the same queries over two disjoint blocks of keys, return those over both. It must also handle a side that saw no key at all (`lse = -inf`, `out = 0`, as a causal mask gives), without producing NaN. Use `torch.logaddexp` or write it from the maximum; `merge_attention` is the answer key.
"""


# %% slideshow={"slide_type": "fragment"}
def merge(out1, lse1, out2, lse2):
    raise NotImplementedError("your code here")


check_merge(merge)

# %% [markdown] slideshow={"slide_type": "slide"}
r"""
## References

- V. Korthikanti et al., [Reducing Activation Recomputation in Large Transformer Models](https://arxiv.org/abs/2205.05198) (2022) — the per-block activation count $sbh(34 + 5as/h)$, selective recomputation, and hardware vs model FLOPs.
- T. Dao et al., [FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness](https://arxiv.org/abs/2205.14135) (2022); T. Dao, [FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning](https://arxiv.org/abs/2307.08691) (2023).
- M. Milakov, N. Gimelshein, [Online normalizer calculation for softmax](https://arxiv.org/abs/1805.02867) (2018).
- A. Chowdhery et al., [PaLM: Scaling Language Modeling with Pathways](https://arxiv.org/abs/2204.02311) (2022) — appendix B: FLOPs per token and MFU.
- J. Kaplan et al., [Scaling Laws for Neural Language Models](https://arxiv.org/abs/2001.08361) (2020) — $C \approx 6N$ per token.
- H. Touvron et al., [Llama 2: Open Foundation and Fine-Tuned Chat Models](https://arxiv.org/abs/2307.09288) (2023) — architecture, 2.0T tokens, 184,320 A100 GPU-hours for 7B (table 2); Llama Team, [The Llama 3 Herd of Models](https://arxiv.org/abs/2407.21783) (2024) — grouped-query attention, 38–43 % MFU (table 4).
- T. Brown et al., [Language Models are Few-Shot Learners](https://arxiv.org/abs/2005.14165) (2020) — GPT-3's shapes.
- J. Su et al., [RoFormer: Enhanced Transformer with Rotary Position Embedding](https://arxiv.org/abs/2104.09864) (2021); B. Zhang, R. Sennrich, [Root Mean Square Layer Normalization](https://arxiv.org/abs/1910.07467) (2019); N. Shazeer, [GLU Variants Improve Transformer](https://arxiv.org/abs/2002.05202) (2020); J. Ainslie et al., [GQA](https://arxiv.org/abs/2305.13245) (2023).
- NVIDIA [A100](https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf) and [H100](https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet) datasheets — dense bf16 tensor-core peaks of 312 and 989 TFLOP/s.
- Hugging Face, [The Ultra-Scale Playbook](https://huggingface.co/spaces/nanotron/ultrascale-playbook) (2025) — the same arithmetic, from one GPU to thousands; PyTorch documentation: [`scaled_dot_product_attention`](https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html), [`torch.utils.flop_counter`](https://pytorch.org/docs/stable/generated/torch.utils.flop_counter.FlopCounterMode.html).
"""
