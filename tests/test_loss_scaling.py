"""course_lib.loss_scaling: the update rule and the dynamic loss scaler, checked against GradScaler."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.loss_scaling import DynamicLossScaler, update_scale


def test_update_scale_rule() -> None:
    assert update_scale(1024.0, 5, True) == (512.0, 0)
    assert update_scale(1024.0, 0, False, growth_interval=3) == (1024.0, 1)
    assert update_scale(1024.0, 2, False, growth_interval=3) == (2048.0, 0)
    assert update_scale(1024.0, 0, True, backoff_factor=0.25) == (256.0, 0)
    big = torch.finfo(torch.float32).max
    assert update_scale(big, 0, False, growth_interval=1) == (big, 0)  # growth that would overflow fp32 is dropped


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"init_scale": 0.0}, ValueError, "positive"),
        ({"init_scale": -1.0}, ValueError, "positive"),
        ({"init_scale": math.inf}, ValueError, "finite"),
        ({"growth_factor": 1.0}, ValueError, "> 1"),
        ({"growth_factor": 0.5}, ValueError, "> 1"),
        ({"backoff_factor": 1.0}, ValueError, "between 0 and 1"),
        ({"backoff_factor": 0.0}, ValueError, "between 0 and 1"),
        ({"growth_interval": 0}, ValueError, ">= 1"),
        ({"growth_interval": 2.5}, TypeError, "int"),
        ({"init_scale": "big"}, TypeError, "number"),
    ],
)
def test_scaler_rejects_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DynamicLossScaler(**kwargs)


def test_update_scale_validates() -> None:
    with pytest.raises(ValueError, match="positive"):
        update_scale(-1.0, 0, False)
    with pytest.raises(ValueError, match="growth_tracker"):
        update_scale(1.0, -1, False)
    with pytest.raises(TypeError, match="bool"):
        update_scale(1.0, 0, 1)  # type: ignore[arg-type]


def test_defaults_match_grad_scaler() -> None:
    ours = DynamicLossScaler().state_dict()
    theirs = torch.amp.GradScaler("cpu").state_dict()
    assert ours == theirs


def _train(scaler, inject: set[int], steps: int = 16):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    trace = []
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if i in inject:
            model.bias.grad[1] = math.nan if i % 2 else math.inf
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        before = model.weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        trace.append((scaler.get_scale(), not torch.equal(before, model.weight)))
    return trace, [p.detach().clone() for p in model.parameters()]


def test_scaler_matches_grad_scaler_step_by_step() -> None:
    inject = {1, 2, 7, 12}
    ours, p_ours = _train(DynamicLossScaler(2.0**10, growth_interval=3), inject)
    theirs, p_theirs = _train(torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3), inject)
    assert ours == theirs
    assert [s for s, stepped in ours if not stepped] == [512.0, 256.0, 256.0, 256.0]
    assert all(torch.equal(a, b) for a, b in zip(p_ours, p_theirs))


def test_scaler_history_and_step_result() -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=1.0)
    s = DynamicLossScaler(8.0, growth_interval=1)
    s.scale((w * 2).sum()).backward()
    assert torch.equal(w.grad, torch.full((3,), 16.0))  # scaled gradient
    assert s.step(opt) is True
    assert torch.equal(w.detach(), torch.full((3,), -1.0))  # true gradient 2 was applied
    s.update()
    assert s.get_scale() == 16.0
    opt.zero_grad()
    s.scale((w * math.inf).sum()).backward()
    assert s.step(opt) is False
    s.update()
    assert s.history == [(8.0, True), (16.0, False)] and s.get_scale() == 8.0
    assert "scale=8" in repr(s)


def test_scaler_misuse_raises() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    s = DynamicLossScaler()
    with pytest.raises(RuntimeError, match="needs a step"):
        s.update()
    s.scale(w.sum()).backward()
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        s.unscale_(opt)
    with pytest.raises(TypeError, match="Optimizer"):
        DynamicLossScaler().unscale_([w])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loss tensor"):
        s.scale(1.0)  # type: ignore[arg-type]


def test_a_saved_and_resumed_scaler_continues_as_grad_scaler_does() -> None:
    """Train 8 steps, save both scalers' state, resume into new scalers (ours from GradScaler's state too), train on."""
    inject = {1, 2, 7, 12}
    ours, theirs = (
        DynamicLossScaler(2.0**10, growth_interval=3),
        torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3),
    )
    first_ours, _ = _train(ours, {i for i in inject if i < 8}, steps=8)
    first_theirs, _ = _train(theirs, {i for i in inject if i < 8}, steps=8)
    assert first_ours == first_theirs and ours.state_dict() == theirs.state_dict()
    resumed_ours, resumed_theirs = DynamicLossScaler(), torch.amp.GradScaler("cpu")
    resumed_ours.load_state_dict(theirs.state_dict())  # the same keys: one format for both
    resumed_theirs.load_state_dict(theirs.state_dict())
    rest_ours, _ = _train(resumed_ours, {i - 8 for i in inject if i >= 8}, steps=8)
    rest_theirs, _ = _train(resumed_theirs, {i - 8 for i in inject if i >= 8}, steps=8)
    assert rest_ours == rest_theirs and resumed_ours.state_dict() == resumed_theirs.state_dict()


def test_update_never_reads_a_value_back_from_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """unscale_() and update() only launch tensor operations: no .item(), bool() or float() of a tensor."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    s = DynamicLossScaler(8.0, growth_interval=1)
    s.scale((w * 2).sum()).backward()

    def no_read(*args: object, **kwargs: object) -> object:
        raise AssertionError("a tensor's value was read back on the host")

    with monkeypatch.context() as m:
        for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
            m.setattr(torch.Tensor, name, no_read)
        s.unscale_(opt)
    assert s.step(opt) is True  # the step's decision: the one read, as in GradScaler
    with monkeypatch.context() as m:
        for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
            m.setattr(torch.Tensor, name, no_read)
        s.update()
    assert s.get_scale() == 16.0 and s.growth_tracker == 0


@pytest.mark.parametrize(
    ("state", "error", "match"),
    [
        ([1.0], TypeError, "state_dict"),
        ({"scale": 1.0}, ValueError, "missing"),
        (
            {"scale": -1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "_growth_tracker": 0},
            ValueError,
            "positive",
        ),
        (
            {"scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "_growth_tracker": -1},
            ValueError,
            "_growth_tracker",
        ),
    ],
)
def test_load_state_dict_refuses_a_bad_state(state: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        DynamicLossScaler().load_state_dict(state)  # type: ignore[arg-type]


@pytest.mark.parametrize("scale", [1e300, 1e-50])
def test_a_scale_fp32_cannot_hold_is_refused(scale: float) -> None:
    with pytest.raises(ValueError, match="not representable in fp32"):
        DynamicLossScaler(init_scale=scale)
    with pytest.raises(ValueError, match="scale=.*not representable"):
        update_scale(scale, 0, False)
