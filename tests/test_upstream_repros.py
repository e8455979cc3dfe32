"""The minimal reproductions in docs/upstream/ still reproduce here, or say which workaround can go."""

from __future__ import annotations

import pytest

from course_lib.launch import run_torchrun
from course_lib.manifest import ROOT

UPSTREAM = ROOT / "docs" / "upstream"


@pytest.mark.slow
def test_dtensor_caches_still_hold_the_group_until_emptied() -> None:
    out = run_torchrun("dtensor_caches_hold_the_group.py", cwd=UPSTREAM, timeout=240, echo="none")
    for rank in (0, 1):
        text = out.output(rank)
        assert "after destroy_process_group(): freed: False" in text, (
            "destroy_process_group() now frees the group after a DTensor operation: "
            "course_lib.torch_private.clear_dtensor_caches can go (docs/upstream/README.md, report 1)\n" + text
        )
        assert "after emptying DTensor's caches: freed: True, threads: 1" in text, text


@pytest.mark.slow
def test_a_comm_hook_bound_to_its_module_is_still_never_freed() -> None:
    out = run_torchrun("comm_hook_state_cycle.py", cwd=UPSTREAM, timeout=240, echo="none")
    for rank in (0, 1):
        text = out.output(rank)
        assert "plain hook: freed: True" in text, text
        assert "bound-method hook: freed: False" in text, (
            "DDP's Reducer now lets the collector free a hook that refers to its module: notebook 14's note on "
            "communication hooks can say so (docs/upstream/README.md, report 2)\n" + text
        )
