"""course_lib.precision: the old import path re-exports the float-format, loss-scaling and cast-copy helpers."""

from __future__ import annotations

import course_lib.float_formats as float_formats
import course_lib.loss_scaling as loss_scaling
import course_lib.precision as precision
import course_lib.saved_tensors as saved_tensors


def test_precision_re_exports_the_same_objects() -> None:
    homes = {
        **{n: float_formats for n in float_formats.__all__},
        **{n: loss_scaling for n in loss_scaling.__all__},
        "saved_cast_copy_bytes": saved_tensors,
    }
    assert sorted(precision.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(precision, name) is getattr(home, name), name
