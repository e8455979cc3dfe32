from __future__ import annotations

import torch
import torch.nn.functional as F

from checks import assert_check
from course_lib.exercises.then_and_now import RunConfig, check_load_trusted, check_modern_step


def _step(*, autocast=True, scaler_used=True, unscale=True, update=True, clip=True, zero=True):  # type: ignore[no-untyped-def]
    def modern_step(model, opt, scaler, x, y, max_norm):  # type: ignore[no-untyped-def]
        if zero:
            opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = F.cross_entropy(model(x), y)
        if not scaler_used:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            return loss
        scaler.scale(loss).backward()
        if unscale:
            scaler.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        if update:
            scaler.update()
        return loss

    return modern_step


def _zero_after(model, opt, scaler, x, y, max_norm):  # type: ignore[no-untyped-def]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()  # zeroing after the step is as good as before the backward
    return loss.detach()


def test_modern_step_check() -> None:
    def blank(*args):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    assert_check(
        check_modern_step,
        right=[_step(), _zero_after],
        right_says="backed off",
        not_done=[..., blank],
        wrong=[
            (_step(autocast=False), "torch.autocast"),
            (_step(unscale=False), "unscale_"),
            (_step(scaler_used=False), "scaler.update()"),
            (_step(clip=False), "clip to max_norm"),
            (_step(zero=False), "zero the gradients"),
            (_step(update=False), "unscale_() is being called after step()"),
            (lambda *a: 1.0, "the loss"),
        ],
    )


def _trusting(path, trusted):  # type: ignore[no-untyped-def]
    with torch.serialization.safe_globals(trusted):
        return torch.load(path, weights_only=True)


def _forgiving(path, trusted):  # type: ignore[no-untyped-def]
    try:
        return _trusting(path, trusted)
    except Exception:
        return {"model": {}}  # a loader that hides the refusal


def test_load_trusted_check() -> None:
    before = torch.serialization.get_safe_globals()

    def everywhere(path, trusted):  # type: ignore[no-untyped-def]
        torch.serialization.add_safe_globals(trusted)
        return torch.load(path, weights_only=True)

    def blank(path, trusted):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    assert_check(
        check_load_trusted,
        right=[
            _trusting,
            lambda path, trusted: torch.load(path, weights_only=True) if "bad" in path else _trusting(path, trusted),
        ],
        right_says="hostile file is refused",
        not_done=[..., blank],
        wrong=[
            (everywhere, "safe_globals(trusted) context"),
            (lambda path, trusted: torch.load(path, weights_only=False), "ran its code"),
            (lambda path, trusted: torch.load(path), "was refused"),
            (lambda path, trusted: {"config": RunConfig(0.3, 7), "model": {"weight": torch.zeros(2, 3)}}, "differ"),
            (lambda path, trusted: {"config": None}, "RunConfig"),
            (_forgiving, "without an error"),
        ],
    )
    assert set(torch.serialization.get_safe_globals()) == set(before)  # the allowlist is left as it was
