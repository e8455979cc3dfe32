"""compare_gradients: it accepts a right run, sees a gradient-scale bug that Adam's losses hide, and checks inputs."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.equivalence import compare_gradients, global_norm


def _grads(scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(4, 3, generator=g) * scale, "b": torch.randn(3, generator=g) * scale}


def test_equal_gradients_match_and_rounding_is_tolerated() -> None:
    ref = _grads()
    assert compare_gradients(ref, ref)
    noisy = {k: v * (1 + 1e-7) for k, v in ref.items()}
    match = compare_gradients(noisy, ref, tolerance=1e-6)
    assert match and match.max_rel_error < 1e-6 and abs(match.norm_ratio - 1) < 1e-6
    assert "within 1e-06" in str(match)


@pytest.mark.parametrize(
    ("scale", "kwargs", "says"),
    [
        (2.0, {"world_size": 2}, "summed over the ranks"),
        (0.5, {"world_size": 2}, "divided by the world size twice"),
        (4.0, {"world_size": 2, "micro_batches": 4}, "without dividing each loss"),
        (0.25, {"micro_batches": 4}, "number of micro-batches twice"),
        (3.0, {}, "3 x the reference's in norm"),
    ],
)
def test_a_clean_scale_factor_is_named(scale: float, kwargs: dict, says: str) -> None:
    ref = _grads()
    match = compare_gradients(_grads(scale), ref, **kwargs)
    assert not match and says in match.diagnosis, match
    assert math.isclose(match.norm_ratio, scale, rel_tol=1e-6)


def test_adam_losses_hide_a_doubled_gradient_and_the_gradients_do_not() -> None:
    """The negative control: 3 Adam steps with every gradient x2 give the same losses; the first gradients differ."""

    def run(scale: float) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.randn(32, 1)
        losses, first = [], []
        for step in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss * scale).backward()  # the bug: every gradient multiplied by a constant
            if step == 0:
                first = [p.grad.clone() for p in model.parameters()]
            opt.step()
            losses.append(loss.item())
        return losses, first

    right, right_grads = run(1.0)
    buggy, buggy_grads = run(2.0)
    assert max(abs(a - b) for a, b in zip(right, buggy)) < 1e-5  # the loss check passes the bug
    match = compare_gradients(buggy_grads, right_grads, world_size=2)
    assert not match and "summed over the ranks" in match.diagnosis


def test_global_norm_and_a_non_finite_gradient() -> None:
    assert global_norm({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}) == 5.0
    bad = {"w": torch.tensor([math.nan, 1.0]), "b": torch.tensor([1.0])}
    match = compare_gradients(bad, {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([1.0])})
    assert not match and "inf or NaN" in match.diagnosis


def test_inputs_are_checked() -> None:
    ref = _grads()
    with pytest.raises(ValueError, match="different tensors"):
        compare_gradients({"w": ref["w"]}, ref)
    with pytest.raises(ValueError, match="shape"):
        compare_gradients({"w": ref["w"][:2], "b": ref["b"]}, ref)
    with pytest.raises(ValueError, match="empty"):
        compare_gradients([], [])
    with pytest.raises(TypeError, match="tensor"):
        compare_gradients([1.0], [torch.tensor(1.0)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="both be mappings"):
        compare_gradients(list(ref.values()), ref)
    with pytest.raises(ValueError, match="tolerance"):
        compare_gradients(ref, ref, tolerance=-1)
    with pytest.raises(ValueError, match="tolerance"):
        compare_gradients(ref, ref, tolerance=math.inf)
    with pytest.raises(ValueError, match="world_size"):
        compare_gradients(ref, ref, world_size=0)
    with pytest.raises(ValueError, match="2 tensors"):
        compare_gradients([ref["w"], ref["b"]], [ref["w"]])
