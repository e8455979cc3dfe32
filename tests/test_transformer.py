from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from course_lib.saved_tensors import SavedTensorMeter
from course_lib.transformer import (
    ATTENTIONS,
    CHECKPOINTINGS,
    PRESETS,
    Transformer,
    TransformerConfig,
    block_saved_bytes,
    block_saved_terms,
    generate,
    matmul_params,
    mfu,
    model_saved_bytes,
    model_saved_terms,
    param_count,
    param_counts,
    rms_norm,
    training_flops_per_token,
)

NANO = PRESETS["nano"]


def _variants() -> list[TransformerConfig]:
    out = []
    for mlp, kv, tie, pos in itertools.product(("swiglu", "gelu"), (None, 1), (True, False), ("rope", "learned")):
        out.append(dataclasses.replace(NANO, mlp=mlp, n_kv_heads=kv, tie_embeddings=tie, positions=pos))
    return out


# ---- configuration --------------------------------------------------------------------------------------------


def test_config_properties_and_presets() -> None:
    c = PRESETS["llama3-8b"]
    assert (c.head_dim, c.kv_heads) == (128, 8)
    assert NANO.kv_heads == NANO.n_heads
    assert "8 kv heads" in c.describe() and "untied head" in c.describe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(d_model=0), ValueError, "d_model must be >= 1"),
        (dict(d_model=10.0), TypeError, "d_model must be an int"),
        (dict(n_heads=3), ValueError, "multiple of n_heads"),
        (dict(n_kv_heads=3), ValueError, "multiple of n_kv_heads"),
        (dict(n_kv_heads="2"), TypeError, "n_kv_heads"),
        (dict(tie_embeddings=1), TypeError, "tie_embeddings must be a bool"),
        (dict(mlp="relu"), ValueError, "mlp must be one of swiglu, gelu"),
        (dict(positions=None), TypeError, "positions must be a string"),
        (dict(attention="flash"), ValueError, "attention must be one of"),
        (dict(checkpointing="some"), ValueError, "checkpointing must be one of"),
        (dict(norm_eps=0.0), ValueError, "norm_eps must be > 0"),
        (dict(rope_theta=float("inf")), ValueError, "rope_theta must be finite"),
        (dict(d_model=36, n_heads=4), ValueError, "even head_dim"),
    ],
)
def test_config_validation(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        dataclasses.replace(NANO, **kwargs)


def test_odd_head_dim_is_fine_with_learned_positions() -> None:
    c = dataclasses.replace(NANO, d_model=36, n_heads=4, positions="learned")
    assert c.head_dim == 9


# ---- the model ------------------------------------------------------------------------------------------------


def test_module_names_follow_the_parallelism_conventions() -> None:
    names = {n for n, _ in Transformer(NANO).named_modules()}
    for name in ("embed", "layers", "layers.0.attn.q_proj", "layers.0.attn.k_proj", "layers.0.attn.v_proj"):
        assert name in names
    for name in ("layers.1.attn.o_proj", "layers.1.mlp.gate_proj", "layers.1.mlp.up_proj", "layers.1.mlp.down_proj"):
        assert name in names
    assert {"norm", "head", "layers.0.attn_norm", "layers.0.mlp_norm"} <= names
    assert isinstance(Transformer(NANO).layers, torch.nn.ModuleList)
    gelu = {n for n, _ in Transformer(dataclasses.replace(NANO, mlp="gelu")).named_modules()}
    assert "layers.0.mlp.gate_proj" not in gelu and "layers.0.mlp.up_proj" in gelu


def test_init_is_deterministic_and_tied_head_is_the_embedding() -> None:
    torch.manual_seed(123)
    a = Transformer(NANO, seed=3)
    torch.manual_seed(456)
    b = Transformer(NANO, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = Transformer(NANO, seed=4)
    assert not torch.equal(a.embed.weight, c.embed.weight)
    assert a.head.weight is a.embed.weight
    untied = Transformer(dataclasses.replace(NANO, tie_embeddings=False))
    assert untied.head.weight is not untied.embed.weight
    # residual projections are scaled down, norms start at one
    assert a.layers[0].attn.o_proj.weight.std() < 0.6 * a.layers[0].attn.q_proj.weight.std()
    assert torch.equal(a.norm.weight, torch.ones(NANO.d_model))


@pytest.mark.parametrize("config", _variants(), ids=lambda c: c.describe()[:60])
def test_parameter_count_equals_the_model(config: TransformerConfig) -> None:
    model = Transformer(config)
    assert sum(p.numel() for p in model.parameters()) == param_count(config)
    assert sum(param_counts(config).values()) == param_count(config)


def test_parameter_counts_of_published_models_on_meta() -> None:
    for name, want in (("llama2-7b", 6_738_415_616), ("llama3-8b", 8_030_261_248)):
        model = Transformer(PRESETS[name], device="meta")
        assert sum(p.numel() for p in model.parameters()) == param_count(PRESETS[name]) == want
        assert model.embed.weight.is_meta


def test_forward_shapes_causality_and_errors() -> None:
    model = Transformer(NANO)
    ids = torch.randint(0, NANO.vocab_size, (2, 12))
    logits = model(ids)
    assert logits.shape == (2, 12, NANO.vocab_size)
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % NANO.vocab_size
    with torch.no_grad():
        assert torch.allclose(model(ids)[:, :7], model(changed)[:, :7], atol=1e-6)
    with pytest.raises(TypeError, match="int64"):
        model(ids.int())
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, NANO.max_seq_len + 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="same shape"):
        model.loss(ids, ids[:, :3])


@pytest.mark.parametrize("kv", [None, 1])
def test_attentions_and_checkpointing_agree(kv: int | None) -> None:
    base = dataclasses.replace(NANO, n_kv_heads=kv)
    ids = torch.randint(0, NANO.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, NANO.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    results = []
    for attention, ckpt in itertools.product(ATTENTIONS, CHECKPOINTINGS):
        model = Transformer(dataclasses.replace(base, attention=attention, checkpointing=ckpt), seed=0)
        loss = model.loss(ids, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    ref_loss, ref_grads = results[0]
    for loss, grads in results[1:]:
        assert torch.allclose(loss, ref_loss, atol=1e-6)
        assert all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, ref_grads))


def test_loss_at_init_is_near_uniform_and_float32_in_bf16() -> None:
    model = Transformer(PRESETS["tiny"])
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    assert abs(model.loss(ids, targets).item() - math.log(256)) < 0.3
    bf16 = Transformer(PRESETS["tiny"]).to(torch.bfloat16)
    assert bf16(ids).dtype == torch.bfloat16 and bf16.loss(ids, ids).dtype == torch.float32


def test_rms_norm_matches_torch_and_gradcheck() -> None:
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(rms_norm(x, w, 1e-5), F.rms_norm(x, (8,), w, 1e-5))
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-5), (x, w))
    xb = torch.randn(4, 8, dtype=torch.bfloat16)
    assert rms_norm(xb, torch.ones(8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, torch.ones(7, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating-point"):
        rms_norm(torch.ones(2, 8, dtype=torch.int64), torch.ones(8))
    with pytest.raises(TypeError, match="tensors"):
        rms_norm([1.0], torch.ones(1))  # type: ignore[arg-type]


def test_rotary_scores_depend_on_distance_only() -> None:
    model = Transformer(PRESETS["tiny"])
    block = model.layers[0].attn
    x = torch.randn(1, 1, PRESETS["tiny"].d_model).expand(1, 100, -1).contiguous()  # the same token everywhere
    q = block.q_proj(x).view(1, 100, -1, 16).transpose(1, 2)
    k = block.k_proj(x).view(1, 100, -1, 16).transpose(1, 2)
    from course_lib.transformer import _apply_rope

    qr, kr = _apply_rope(q, model.rope_cos, model.rope_sin), _apply_rope(k, model.rope_cos, model.rope_sin)
    scores = qr @ kr.transpose(-2, -1)
    diagonal_5 = torch.diagonal(scores, offset=-5, dim1=-2, dim2=-1)  # query m, key m - 5
    assert torch.allclose(diagonal_5, diagonal_5[..., :1].expand_as(diagonal_5), atol=1e-5)


def test_generate() -> None:
    model = Transformer(NANO)
    prompt = torch.tensor([1, 2, 3])
    a = generate(model, prompt, 10, generator=torch.Generator().manual_seed(0))
    b = generate(model, prompt, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and len(a) == 13 and torch.equal(a[:3], prompt)
    greedy = generate(model, prompt, 5, temperature=0)
    assert torch.equal(greedy, generate(model, prompt, 5, temperature=0))
    long = generate(model, prompt, NANO.max_seq_len + 5, temperature=0)  # slides its window
    assert len(long) == NANO.max_seq_len + 8 and model.training
    with pytest.raises(TypeError, match="prompt"):
        generate(model, prompt.float(), 2)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt, 2, temperature=-1.0)
    with pytest.raises(TypeError, match="Transformer"):
        generate(torch.nn.Linear(2, 2), prompt, 2)  # type: ignore[arg-type]


# ---- the memory formula, to the byte ----------------------------------------------------------------------------


def _measure_block(c: TransformerConfig, seq_len: int, batch: int, dtype: torch.dtype) -> int:
    m = Transformer(c, seed=0).to(dtype)
    x = torch.randn(batch, seq_len, c.d_model, dtype=dtype, requires_grad=True)
    rope = (m.rope_cos, m.rope_sin) if c.positions == "rope" else None
    with SavedTensorMeter(exclude=[*m.parameters(), *m.buffers()]) as meter:
        if c.checkpointing == "full":
            checkpoint(m.layers[0], x, rope, use_reentrant=False, preserve_rng_state=False)
        else:
            m.layers[0](x, rope)
    return meter.bytes


CASES = list(
    itertools.product(
        ATTENTIONS, CHECKPOINTINGS, ("swiglu", "gelu"), (None, 1), (torch.float32, torch.bfloat16), ("rope", "learned")
    )
)


@pytest.mark.parametrize(("attention", "ckpt", "mlp", "kv", "dtype", "pos"), CASES)
def test_block_and_model_formulas_are_byte_exact(
    attention: str, ckpt: str, mlp: str, kv: int | None, dtype: torch.dtype, pos: str
) -> None:
    c = dataclasses.replace(NANO, attention=attention, checkpointing=ckpt, mlp=mlp, n_kv_heads=kv, positions=pos)
    assert _measure_block(c, 13, 3, dtype) == block_saved_bytes(c, 13, batch=3, dtype=dtype)
    m = Transformer(c, seed=0).to(dtype)
    ids = torch.randint(0, c.vocab_size, (3, 13))
    targets = torch.randint(0, c.vocab_size, (3, 13))
    with SavedTensorMeter(exclude=[*m.parameters(), *m.buffers()]) as meter:
        m.loss(ids, targets)
    assert meter.bytes == model_saved_bytes(c, 13, batch=3, dtype=dtype)


def test_float64_statistics_are_float64() -> None:
    c = dataclasses.replace(NANO, attention="sdpa")
    assert _measure_block(c, 9, 2, torch.float64) == block_saved_bytes(c, 9, batch=2, dtype=torch.float64)


def test_formula_terms() -> None:
    c = PRESETS["tiny"]
    naive = block_saved_terms(c, 100, attention="naive")
    sdpa = block_saved_terms(c, 100)
    assert naive["attention probabilities"] == 100 * 4 * 100 * 4
    assert sdpa["attention: log-sum-exp"] == 100 * 4 * 4
    assert set(naive) - set(sdpa) == {"attention probabilities"}
    assert block_saved_terms(c, 100, checkpointing="full") == {"block input": 100 * 64 * 4}
    selective = block_saved_terms(c, 100, attention="naive", checkpointing="selective")
    assert "attention probabilities" not in selective and "attention: log-sum-exp" not in selective
    # Korthikanti et al.'s count without dropout, plus the norms' statistics: GPT-style block, 16-bit
    s, b, h, a = 2048, 2, 1024, 16
    gpt = TransformerConfig(vocab_size=100, d_model=h, n_layers=1, n_heads=a, d_ff=4 * h, max_seq_len=s, mlp="gelu")
    assert block_saved_bytes(gpt, s, batch=b, dtype=torch.bfloat16, attention="naive") == (
        s * b * h * 32 + 2 * a * s * s * b + 8 * s * b
    )
    terms = model_saved_terms(c, 10, batch=2)
    assert terms["loss: log-probabilities"] == 20 * 256 * 4 and terms["position ids"] == 0
    assert model_saved_bytes(c, 10, batch=2) == sum(terms.values())


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: block_saved_bytes(NANO, 0), ValueError, "seq_len must be >= 1"),
        (lambda: block_saved_bytes(NANO, 4, batch=0), ValueError, "batch must be >= 1"),
        (lambda: block_saved_bytes(NANO, 4, dtype=torch.int32), TypeError, "floating-point torch.dtype"),
        (lambda: block_saved_bytes(NANO, 4, dtype="bf16"), TypeError, "floating-point torch.dtype"),
        (lambda: block_saved_bytes(NANO, 4, attention="flash"), ValueError, "attention must be one of"),
        (lambda: block_saved_bytes(NANO, 4, checkpointing=True), TypeError, "checkpointing must be a string"),
        (lambda: model_saved_bytes("tiny", 4), TypeError, "TransformerConfig"),
        (lambda: param_count(None), TypeError, "TransformerConfig"),
        (lambda: training_flops_per_token(NANO, 4, causal=1), TypeError, "causal must be a bool"),
        (lambda: training_flops_per_token(NANO, -1), ValueError, "seq_len"),
        (lambda: mfu(1.0, 1.0, 0.0), ValueError, "peak_flops must be > 0"),
        (lambda: mfu(-1.0, 1.0, 1.0), ValueError, "tokens_per_second must be >= 0"),
        (lambda: mfu("1", 1.0, 1.0), TypeError, "tokens_per_second must be a number"),
        (lambda: Transformer(NANO, seed=-1), ValueError, "seed"),
        (lambda: Transformer({"d_model": 4}), TypeError, "TransformerConfig"),  # type: ignore[arg-type]
    ],
)
def test_validation(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call()


# ---- FLOPs -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", _variants()[::3], ids=lambda c: c.describe()[:60])
def test_flops_match_the_counter_with_naive_attention(config: TransformerConfig) -> None:
    c = dataclasses.replace(config, attention="naive")
    m = Transformer(c)
    ids = torch.randint(0, c.vocab_size, (2, 16))
    with FlopCounterMode(display=False) as fwd:
        loss = m.loss(ids, ids)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    tokens = 32
    assert fwd.get_total_flops() == tokens * (2 * matmul_params(c) + 4 * c.n_layers * c.d_model * 16)
    assert fwd.get_total_flops() + bwd.get_total_flops() == tokens * training_flops_per_token(c, 16)


def test_flops_formula_values() -> None:
    llama = PRESETS["llama2-7b"]
    assert matmul_params(llama) == 6_607_077_376
    full = training_flops_per_token(llama, 4096)
    causal = training_flops_per_token(llama, 4096, causal=True)
    assert full - causal == 6 * 32 * 4096 * 4096
    assert math.isclose(mfu(1000.0, full, 1e15), 1000 * full / 1e15)


def test_meta_build_then_to_empty_then_init_equals_a_direct_build() -> None:
    for config in (NANO, dataclasses.replace(NANO, tie_embeddings=False, positions="learned")):
        meta = Transformer(config, device="meta")
        meta.to_empty(device="cpu")
        meta.init_weights(5)
        direct = Transformer(config, seed=5)
        assert (meta.head.weight is meta.embed.weight) == config.tie_embeddings
        for (name, a), b in zip(meta.state_dict().items(), direct.state_dict().values()):
            assert torch.equal(a, b), name
        if config.positions == "rope":
            assert torch.equal(meta.rope_cos, direct.rope_cos)


@pytest.mark.slow  # torch.compile: seconds of tracing on a loaded machine
def test_compiles_with_aot_eager() -> None:
    model = Transformer(dataclasses.replace(NANO, checkpointing="selective"), seed=0)
    ids = torch.randint(0, NANO.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    eager = model.loss(ids, ids)
    compiled = torch.compile(lambda i, t: model.loss(i, t), backend="aot_eager", fullgraph=True)(ids, ids)
    assert torch.allclose(eager, compiled)
