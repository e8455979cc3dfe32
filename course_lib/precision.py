"""Old import path, kept only until notebook 05 and ``benchmarks/mixed_precision.py`` are updated.

This module held three jobs, now one module each; import from those:

* :mod:`course_lib.float_formats` — ``FORMATS``, ``float_format``, ``bits_of``, ``from_bits``,
  ``round_to``, ``neighbors``, ``ulp``, ``classify``, ``describe``;
* :mod:`course_lib.loss_scaling` — ``update_scale``, ``DynamicLossScaler``;
* :mod:`course_lib.saved_tensors` — ``saved_cast_copy_bytes`` (next to ``SavedTensorMeter``).

It re-exports those names and nothing else; delete it once nothing imports ``course_lib.precision``.
"""

from __future__ import annotations

from .float_formats import (
    FORMATS,
    FloatFormat,
    bits_of,
    classify,
    describe,
    float_format,
    from_bits,
    neighbors,
    round_to,
    ulp,
)
from .loss_scaling import DynamicLossScaler, update_scale
from .saved_tensors import saved_cast_copy_bytes

__all__ = [
    "FORMATS",
    "FloatFormat",
    "float_format",
    "bits_of",
    "from_bits",
    "round_to",
    "neighbors",
    "ulp",
    "classify",
    "describe",
    "update_scale",
    "DynamicLossScaler",
    "saved_cast_copy_bytes",
]
