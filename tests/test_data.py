from __future__ import annotations

import pytest
import torch

from course_lib.data import decode, digits, digits_datasets, encode, text_batch, text_corpus


def test_digits_shapes_and_split() -> None:
    train, test = digits()
    assert (len(train), len(test)) == (1438, 359)
    assert train.x.shape == (1438, 1, 8, 8) and train.x.dtype == torch.float32
    assert train.y.dtype == torch.int64 and set(train.y.tolist()) == set(range(10))
    assert train.flat().shape == (1438, 64)
    assert abs(float(train.x.mean())) < 1e-4 and abs(float(train.x.std()) - 1) < 1e-3


def test_digits_are_scikit_learns_without_importing_it() -> None:
    """The file read directly holds what ``load_digits`` returns, in order; reading it imports no scikit-learn."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from course_lib.data import _digits_arrays

    images, labels = _digits_arrays()
    bunch = load_digits()
    assert images.shape == bunch.images.shape == (1797, 8, 8)
    assert (images == bunch.images).all() and (labels == bunch.target).all() and labels.dtype == bunch.target.dtype
    code = (
        "import sys, course_lib.data as d; d.digits(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_digits_is_deterministic_and_seed_changes_the_split() -> None:
    a, _ = digits()
    b, _ = digits()
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    c, _ = digits(seed=1)
    assert not torch.equal(a.y, c.y)


def test_callers_cannot_corrupt_the_cache() -> None:
    a, _ = digits()
    a.x.zero_()
    b, _ = digits()
    assert b.x.abs().sum() > 0


def test_datasets_wrap_the_same_tensors() -> None:
    train_ds, test_ds = digits_datasets()
    x, y = train_ds[0]
    train, _ = digits()
    assert torch.equal(x, train.x[0]) and int(y) == int(train.y[0])
    assert len(test_ds) == 359


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1])
def test_bad_fraction(bad: float) -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        digits(test_fraction=bad)


def test_bad_types() -> None:
    with pytest.raises(TypeError):
        digits(test_fraction="0.2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        digits(seed=-1)


def test_text_corpus_holds_out_whole_topics() -> None:
    from pydoc_data.topics import topics

    corpus = text_corpus()
    total = sum(len(t.strip().encode("utf-8")) + 2 for t in topics.values())
    assert len(corpus.train) + len(corpus.held_out) == total
    assert 0.1 * total <= len(corpus.held_out) < 0.2 * total
    assert corpus.held_out_topics == tuple(sorted(topics))[-len(corpus.held_out_topics) :]
    first_held = topics[corpus.held_out_topics[0]].strip().encode("utf-8")
    assert bytes(corpus.held_out[: len(first_held)].tolist()) == first_held
    assert corpus.train.dtype == torch.uint8 and corpus.vocab_size == 256
    corpus.train.zero_()  # callers get copies
    assert text_corpus().train.sum() > 0
    assert len(text_corpus(0.5).held_out) > len(corpus.held_out)


def test_text_batch() -> None:
    data = torch.arange(100, dtype=torch.uint8)
    x, y = text_batch(data, 4, 10, generator=torch.Generator().manual_seed(0))
    x2, y2 = text_batch(data, 4, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (4, 10) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1) and x.is_contiguous() and y.untyped_storage().nbytes() == 4 * 10 * 8
    with pytest.raises(ValueError, match="fewer than seq_len"):
        text_batch(data[:5], 1, 10, generator=torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        text_batch(data, 1, 4, generator=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="1-D"):
        text_batch(data.reshape(10, 10), 1, 4, generator=torch.Generator())
    with pytest.raises(ValueError, match="batch"):
        text_batch(data, 0, 4, generator=torch.Generator())


def test_encode_decode() -> None:
    assert decode(encode("Python's «docs»")) == "Python's «docs»"
    assert decode(torch.tensor([0xE2, 0x82])) == "\ufffd"
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        decode(torch.tensor([256]))
    with pytest.raises(TypeError):
        decode(torch.tensor([1.0]))
    with pytest.raises(TypeError):
        encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strictly between"):
        text_corpus(1.0)
