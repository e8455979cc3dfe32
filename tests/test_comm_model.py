"""course_lib.comm_model: the alpha-beta fit and the collectives' predicted times."""

from __future__ import annotations

import math

import pytest

from course_lib.comm_model import (
    ALGORITHMS,
    AlphaBeta,
    all_reduce_steps,
    fit_alpha_beta,
    predict_all_reduce,
    predict_buckets,
)


def test_fit_recovers_alpha_and_beta_exactly_and_with_noise() -> None:
    sizes = [4 * 4**i for i in range(11)]
    exact = fit_alpha_beta(sizes, [30e-6 + m / 3e9 for m in sizes])
    assert math.isclose(exact.alpha, 30e-6, rel_tol=1e-9) and math.isclose(exact.beta, 3e9, rel_tol=1e-9)
    assert exact.max_rel_error < 1e-9
    noisy = fit_alpha_beta(sizes, [(30e-6 + m / 3e9) * (1.2 if i % 2 else 0.85) for i, m in enumerate(sizes)])
    assert 0.7 < noisy.alpha / 30e-6 < 1.4 and 0.7 < noisy.beta / 3e9 < 1.4
    assert 0.1 < noisy.max_rel_error < 0.3


def test_fit_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="same length"):
        fit_alpha_beta([1, 2], [1.0])
    with pytest.raises(ValueError, match="two different"):
        fit_alpha_beta([8, 8], [1.0, 1.1])
    with pytest.raises(ValueError, match="> 0 seconds"):
        fit_alpha_beta([1, 2], [1.0, 0.0])
    with pytest.raises(ValueError, match=">= 0 bytes"):
        fit_alpha_beta([-1, 2], [1.0, 2.0])
    with pytest.raises(TypeError, match="sequence"):
        fit_alpha_beta("12", [1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not fit"):
        fit_alpha_beta([1, 10**6], [1.0, 1e-6])  # time falls with size: no latency-bandwidth line


def test_steps_of_each_algorithm() -> None:
    assert all_reduce_steps(1200, 3, "ring") == [400.0] * 4
    assert all_reduce_steps(1200, 5, "tree") == [1200.0] * 6  # ceil(log2 5) = 3 rounds each way
    assert all_reduce_steps(1200, 5, "parameter_server") == [1200.0] * 8
    assert all(all_reduce_steps(1200, 1, a) == [] for a in ALGORITHMS)
    with pytest.raises(ValueError, match="algorithm"):
        all_reduce_steps(1200, 3, "butterfly")
    with pytest.raises(ValueError, match="n must be >= 1"):
        all_reduce_steps(1200, 0)


def test_predictions_follow_the_formulas() -> None:
    link = AlphaBeta(alpha=5e-6, beta=50e9)
    s, n = 100e6, 8
    assert math.isclose(predict_all_reduce(link, s, n, "ring"), 2 * (n - 1) * 5e-6 + 2 * (n - 1) / n * s / 50e9)
    assert math.isclose(predict_all_reduce(link, s, n, "tree"), 6 * (5e-6 + s / 50e9))
    half_duplex = AlphaBeta(alpha=5e-6, beta=25e9)
    assert predict_all_reduce(link, s, n, "ring", exchange=half_duplex) > predict_all_reduce(link, s, n, "ring")
    assert predict_all_reduce(link, s, n, "tree", exchange=half_duplex) == predict_all_reduce(link, s, n, "tree")
    # many ranks, small tensor: latency decides and the tree wins; large tensor: the ring wins
    assert predict_all_reduce(link, 65536, 512, "tree") < predict_all_reduce(link, 65536, 512, "ring")
    assert predict_all_reduce(link, s, n, "ring") < predict_all_reduce(link, s, n, "tree")
    assert math.isclose(predict_buckets(link, [s / 2, s / 2], n), 2 * predict_all_reduce(link, s / 2, n))


def test_model_and_prediction_validation() -> None:
    with pytest.raises(ValueError, match="beta must be > 0"):
        AlphaBeta(alpha=1e-6, beta=0.0)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        AlphaBeta(alpha=-1e-6, beta=1e9)
    with pytest.raises(TypeError, match="alpha must be a number"):
        AlphaBeta(alpha="fast", beta=1e9)  # type: ignore[arg-type]
    link = AlphaBeta(alpha=1e-6, beta=1e9)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        link.time(-1)
    with pytest.raises(TypeError, match="link must be an AlphaBeta"):
        predict_all_reduce((1e-6, 1e9), 10, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exchange must be"):
        predict_all_reduce(link, 10, 2, exchange=(1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty"):
        predict_buckets(link, [], 2)
