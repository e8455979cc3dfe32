from __future__ import annotations

import pytest
import torch

from course_lib.data import digits, digits_datasets


def test_digits_shapes_and_split() -> None:
    train, test = digits()
    assert (len(train), len(test)) == (1438, 359)
    assert train.x.shape == (1438, 1, 8, 8) and train.x.dtype == torch.float32
    assert train.y.dtype == torch.int64 and set(train.y.tolist()) == set(range(10))
    assert train.flat().shape == (1438, 64)
    assert abs(float(train.x.mean())) < 1e-4 and abs(float(train.x.std()) - 1) < 1e-3


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
