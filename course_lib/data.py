"""Small real datasets that ship with installed packages: no downloads, ever.

The course trains on scikit-learn's handwritten digits (1,797 greyscale 8x8 images, 10 classes),
which are inside the scikit-learn wheel. :func:`digits` returns them as tensors with a fixed,
seeded train/test split, so every notebook and every process sees the same data. It reads the wheel's
``datasets/data/digits.csv.gz`` directly, as ``sklearn.datasets.load_digits`` does, without importing
scikit-learn and SciPy: that import costs about a second on an idle machine and more on a busy one, in every
rank of every launch (a test checks that the two agree).

The transformer notebooks train on text that ships with Python itself: the English documentation
topics of the standard library's ``pydoc_data`` (what ``help("assert")`` prints), about 460 KB.
:func:`text_corpus` returns them as UTF-8 bytes (a vocabulary of 256, no tokenizer to train) with
whole topics held out; :func:`text_batch` draws seeded ``(inputs, targets)`` windows;
:func:`encode` and :func:`decode` convert between text and byte ids. The text differs slightly
between Python releases (the topics are regenerated for each one), so its exact size is not a
constant of the course.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy
import torch

from .validation import check_int, check_number

__all__ = ["Split", "TextSplit", "decode", "digits", "digits_datasets", "encode", "text_batch", "text_corpus"]


@dataclass(frozen=True)
class Split:
    """Images ``x`` (float32, ``N x 1 x 8 x 8``, scaled to mean 0 / std 1) and labels ``y`` (int64)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def flat(self) -> torch.Tensor:
        """The images as ``N x 64`` vectors, for MLPs."""
        return self.x.reshape(len(self.y), -1)


def _digits_arrays() -> tuple[numpy.ndarray, numpy.ndarray]:
    """scikit-learn's digits as ``(images N x 8 x 8, labels N)``, read from the file its wheel ships."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits ship with scikit-learn: pip install scikit-learn (requirements.lock)")
    table = numpy.loadtxt(
        Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=","
    )
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(numpy.int64)


@lru_cache(maxsize=4)
def _load(test_fraction: float, seed: int) -> tuple[Split, Split]:
    images, labels = _digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1)  # N x 1 x 8 x 8, values 0..16
    y = torch.tensor(labels, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y), generator=g)
    n_test = int(round(len(y) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]
    mean, std = x[train_idx].mean(), x[train_idx].std()  # statistics of the training split only
    x = (x - mean) / std
    return Split(x[train_idx].contiguous(), y[train_idx].contiguous()), Split(
        x[test_idx].contiguous(), y[test_idx].contiguous()
    )


def digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[Split, Split]:
    """The digits dataset as ``(train, test)`` splits, identical on every call with the same arguments.

    >>> train, test = digits()
    >>> len(train), len(test), tuple(train.x.shape[1:])
    (1438, 359, (1, 8, 8))
    """
    check_number("test_fraction", test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be strictly between 0 and 1, got {test_fraction}")
    check_int("seed", seed, minimum=0)
    train, test = _load(float(test_fraction), seed)
    # Return fresh tensors so that a caller modifying them in place cannot corrupt the cache.
    return Split(train.x.clone(), train.y.clone()), Split(test.x.clone(), test.y.clone())


def digits_datasets(
    test_fraction: float = 0.2, seed: int = 0
) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """:func:`digits` wrapped as ``TensorDataset``s, ready for a ``DataLoader`` or a ``DistributedSampler``."""
    train, test = digits(test_fraction, seed)
    return torch.utils.data.TensorDataset(train.x, train.y), torch.utils.data.TensorDataset(test.x, test.y)


# ---- text: Python's own documentation, as bytes ---------------------------------------------------


@dataclass(frozen=True)
class TextSplit:
    """UTF-8 bytes of the training and held-out text (``uint8`` tensors), and the topics held out."""

    train: torch.Tensor
    held_out: torch.Tensor
    held_out_topics: tuple[str, ...]
    vocab_size: int = 256


@lru_cache(maxsize=4)
def _text(held_out_fraction: float) -> TextSplit:
    from pydoc_data.topics import topics

    names = sorted(topics)
    pieces = [topics[name].strip().encode("utf-8") + b"\n\n" for name in names]
    total = sum(len(p) for p in pieces)
    held, n_held = 0, 0
    while n_held < len(pieces) - 1 and held < held_out_fraction * total:  # whole topics, from the end
        n_held += 1
        held += len(pieces[-n_held])
    cut = len(pieces) - n_held

    def as_tensor(chunks: list[bytes]) -> torch.Tensor:
        return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()

    return TextSplit(as_tensor(pieces[:cut]), as_tensor(pieces[cut:]), tuple(names[cut:]))


def text_corpus(held_out_fraction: float = 0.1) -> TextSplit:
    """Python's documentation topics (``pydoc_data.topics``) as bytes: training text and held-out topics.

    The topics are joined in alphabetical order; the last ones, at least ``held_out_fraction`` of the
    bytes, are held out whole, so the held-out loss measures text the model never saw.

    >>> corpus = text_corpus()
    >>> corpus.train.dtype, corpus.vocab_size, len(corpus.held_out) >= 0.1 * (len(corpus.train) + len(corpus.held_out))
    (torch.uint8, 256, True)
    """
    check_number("held_out_fraction", held_out_fraction)
    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be strictly between 0 and 1, got {held_out_fraction}")
    split = _text(float(held_out_fraction))
    return TextSplit(split.train.clone(), split.held_out.clone(), split.held_out_topics)


def text_batch(
    data: torch.Tensor, batch: int, seq_len: int, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``data``: inputs ``(batch, seq_len)`` and the next bytes as targets (int64).

    The windows' starts come from ``generator``, so a seeded generator gives the same batches on
    every machine. Both tensors are new and contiguous (a target that were a view of a longer tensor
    would keep all of it alive, and the memory counts of notebook 16 would include it).

    >>> x, y = text_batch(torch.arange(10, dtype=torch.uint8), 2, 4, generator=torch.Generator().manual_seed(0))
    >>> bool((y[:, :-1] == x[:, 1:]).all()), x.dtype
    (True, torch.int64)
    """
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        raise TypeError("data must be a 1-D tensor of token ids")
    if data.is_floating_point() or data.is_complex() or data.dtype == torch.bool:
        raise TypeError(f"data must hold integer token ids, got {data.dtype}")
    if len(data) and int(data.min()) < 0:
        raise ValueError(f"data must hold token ids >= 0, got {int(data.min())}")
    batch = check_int("batch", batch, minimum=1)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if len(data) < seq_len + 1:
        raise ValueError(f"data has {len(data)} tokens, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(0, len(data) - seq_len, (batch,), generator=generator)
    windows = torch.stack([data[int(s) : int(s) + seq_len + 1] for s in starts]).long()
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def encode(text: str) -> torch.Tensor:
    """The UTF-8 bytes of ``text`` as int64 ids.

    >>> encode("hé").tolist()
    [104, 195, 169]
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)


def decode(ids: torch.Tensor) -> str:
    """Byte ids back to text; a byte sequence that is not valid UTF-8 shows as U+FFFD.

    >>> decode(encode("hé")), decode(torch.tensor([104, 195]))
    ('hé', 'h\ufffd')
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point():
        raise TypeError("ids must be a 1-D integer tensor of byte ids")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > 255):
        raise ValueError("byte ids must be in [0, 255]")
    return bytes(ids.tolist()).decode("utf-8", errors="replace")
