"""Checks for notebook 15 (FSDP2, DTensor and distributed checkpoints)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from .core import NotDone, Wrong, as_number, call_learner, dict_answer, exercise, is_placeholder

__all__ = [
    "COLLECTIVES",
    "REDISTRIBUTIONS",
    "check_fsdp2_step",
    "check_local_shape",
    "check_redistribute_collectives",
]

# -- A. The local shape of a DTensor -------------------------------------------------------------------------------

Placements = tuple[str | int, ...]  # one per mesh dimension: "R" (Replicate) or d (Shard(d))

# (global shape, mesh shape, placements, this rank's coordinate on the mesh), in the order the check asks them
LOCAL_SHAPE_CASES: list[tuple[tuple[int, ...], tuple[int, ...], Placements, tuple[int, ...]]] = [
    ((8, 4), (4,), (0,), (1,)),  # even
    ((10, 3), (4,), (0,), (0,)),  # 3, 3, 3, 1: the first pieces are ceil(10 / 4)
    ((10, 3), (4,), (0,), (3,)),  # ... and the last one what is left
    ((10, 3), (4,), (0,), (2,)),
    ((5,), (4,), (0,), (3,)),  # 2, 2, 1, 0: an empty piece
    ((3, 7, 2), (4,), (1,), (3,)),  # Shard(1)
    ((4, 4), (4,), ("R",), (2,)),  # Replicate: the whole tensor
    ((10, 8), (2, 4), ("R", 0), (1, 3)),  # HSDP's layout: replicated on one mesh dim, sharded on the other
    ((6, 5), (2, 2), (0, 1), (1, 1)),  # two mesh dims, two tensor dims
    ((10, 4), (2, 3), (0, 0), (1, 2)),  # two mesh dims, one tensor dim: 10 -> 5 -> 2, 2, 1
    ((7, 6), (2, 4), ("R", 1), (1, 3)),
    ((64, 64), (2, 2), (0, 0), (1, 0)),  # §2's 2-D mesh: 4 row blocks of 16
]

Split = Callable[[int, int, int], int]  # (size, pieces, index) -> the size of piece `index`


def _chunk(n: int, k: int, i: int) -> int:
    """torch.chunk's (and DTensor's) piece ``i`` of ``n`` in ``k``: ceil(n / k) each, the last ones smaller or 0."""
    step = -(-n // k)
    return max(0, min(n, (i + 1) * step) - i * step)


def _tensor_split(n: int, k: int, i: int) -> int:
    return n // k + (1 if i < n % k else 0)


def _floor(n: int, k: int, i: int) -> int:
    return n // k


def _remainder_last(n: int, k: int, i: int) -> int:
    return n // k + (n % k if i == k - 1 else 0)


def _local_shape(
    shape: Sequence[int],
    mesh: Sequence[int],
    placements: Placements,
    coord: Sequence[int],
    split: Split = _chunk,
    replicate_as: int | None = None,
    same_dim: str = "sequential",
) -> tuple[int, ...]:
    """The local shape; the keyword arguments plant the mistakes the check recognises."""
    local = list(shape)
    flat: dict[int, tuple[int, int]] = {}  # for same_dim="flat": tensor dim -> (index, pieces) over all its mesh dims
    for k, p, c in zip(mesh, placements, coord):
        d = replicate_as if p == "R" else p
        if not isinstance(d, int):
            continue
        if same_dim == "flat":
            index, pieces = flat.get(d, (0, 1))
            flat[d] = (index * k + c, pieces * k)
            local[d] = split(shape[d], flat[d][1], flat[d][0])
        else:
            local[d] = split(shape[d] if same_dim == "global" else local[d], k, c)
    return tuple(local)


_SHAPE_MISTAKES: list[tuple[dict[str, Any], str]] = [
    (
        {"split": _tensor_split},
        "that is torch.tensor_split, which gives the remainder to the first ranks (10 over 4: 3, 3, 2, 2); DTensor "
        "splits like torch.chunk: pieces of ceil(n / k), the last ones smaller (10 over 4: 3, 3, 3, 1)",
    ),
    (
        {"split": _floor},
        "n // k rounds down, and the rows left over belong to nobody; DTensor splits like torch.chunk: pieces of "
        "ceil(n / k), the last ones smaller (10 over 4: 3, 3, 3, 1)",
    ),
    (
        {"split": _remainder_last},
        "that gives the remainder to the last rank; DTensor splits like torch.chunk: pieces of ceil(n / k), the last "
        "ones smaller (10 over 4: 3, 3, 3, 1)",
    ),
    (
        {"replicate_as": 0},
        'Replicate ("R") splits nothing: every rank on that mesh dimension holds the whole tensor; only Shard(d) '
        "divides dimension d",
    ),
    (
        {"same_dim": "global"},
        "two mesh dimensions shard the same tensor dimension one after the other: the second splits the first's "
        "piece, not the global size (10 rows on a 2 x 3 mesh: 5 per row of the mesh, then 2, 2, 1)",
    ),
    (
        {"same_dim": "flat"},
        "DTensor splits in two steps, first over mesh dim 0, then that piece over mesh dim 1 (10 rows on a 2 x 3 "
        "mesh: 5, then 2, 2, 1), not once over all the ranks",
    ),
]


def _as_shape(value: Any, call: str) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):  # torch.Size is a tuple
        try:
            if not any(isinstance(x, bool) for x in value):
                return tuple(operator.index(x) for x in value)
        except TypeError:
            pass
    raise Wrong(f"{call} should return a tuple of ints such as (3, 4), got {value!r}")


@exercise(
    "a DTensor's local shape",
    todo="write local_shape(global_shape, mesh_shape, placements, coordinate): the shape of this rank's piece",
)
def check_local_shape(local_shape: Any) -> str:
    if is_placeholder(local_shape):
        raise NotDone
    calls, answers = [], []
    for shape, mesh, placements, coord in LOCAL_SHAPE_CASES:
        calls.append(f"local_shape({shape}, {mesh}, {placements}, {coord})")
        answers.append(_as_shape(call_learner(local_shape, shape, mesh, placements, coord), calls[-1]))
    for call, got, (shape, mesh, placements, coord) in zip(calls, answers, LOCAL_SHAPE_CASES):
        want = _local_shape(shape, mesh, placements, coord)
        if got == want:
            continue
        if len(got) != len(shape):
            raise Wrong(f"{call} returned {got}: a piece has as many dimensions as the tensor ({len(shape)})")
        if any(x < 0 for x in got):
            raise Wrong(f"{call} returned {got}: a piece can be empty (size 0) but not negative; clamp at 0")
        # the mistake that explains every answer, else the one that explains this answer
        everywhere = [h for m, h in _SHAPE_MISTAKES if answers == [_local_shape(*c, **m) for c in LOCAL_SHAPE_CASES]]
        here = [h for m, h in _SHAPE_MISTAKES if got == _local_shape(shape, mesh, placements, coord, **m)]
        if everywhere or here:
            raise Wrong(f"{call} returned {got}, DTensor gives {want}: {(everywhere + here)[0]}")
        raise Wrong(
            f"{call} returned {got}, DTensor gives {want}: for each mesh dimension that is Shard(d), take piece "
            "`coordinate` of dimension d cut like torch.chunk (ceil(n / k) each, the last ones smaller or empty)"
        )
    return (
        "DTensor cuts like torch.chunk: 10 rows over 4 ranks are 3, 3, 3, 1 and 5 over 4 are 2, 2, 1, 0 (an empty "
        "piece); Replicate keeps a dimension whole, and a second Shard of the same dimension cuts the first's piece"
    )


# -- B. The collective behind each redistribute -------------------------------------------------------------------

COLLECTIVES: tuple[str, ...] = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "none")

# the truth on a 1-D mesh, and why: tests/test_exercises_fsdp2_dtensor.py runs each one under CommDebugMode
_REDISTRIBUTE: dict[str, tuple[str, str]] = {
    "Shard(0) -> Replicate()": (
        "all_gather",
        "each rank holds different rows and needs all of them: an all-gather (nothing is added up)",
    ),
    "Partial() -> Replicate()": (
        "all_reduce",
        "each rank holds a summand of the whole tensor; the sum, on every rank, is an all-reduce",
    ),
    "Partial() -> Shard(0)": (
        "reduce_scatter",
        "each rank needs only its rows of the sum: a reduce-scatter, half an all-reduce's bytes",
    ),
    "Replicate() -> Shard(0)": (
        "none",
        "no communication: every rank already holds the whole tensor and keeps its own chunk",
    ),
    "Shard(0) -> Shard(1)": (
        "all_to_all",
        "an all-to-all: rank i sends rank j the columns j will own from the rows i holds, 1/N of its piece to each. "
        "(On a CPU mesh, DTensor 2.13 falls back to an all-gather and keeps a chunk, N times the bytes, although gloo "
        "runs all_to_all_single, as notebook 18's experts do; on GPUs it runs the all-to-all)",
    ),
    "Replicate() -> Partial()": (
        "none",
        "no communication: for Partial(sum) each rank divides its copy by N, and the N summands add up to the value "
        "(DTensor's operators do it locally; redistribute() itself refuses a target of Partial)",
    ),
}
REDISTRIBUTIONS: tuple[str, ...] = tuple(_REDISTRIBUTE)

_ALIASES = {"allgather": "all_gather", "allreduce": "all_reduce", "reducescatter": "reduce_scatter"}
_ALIASES |= {"alltoall": "all_to_all", "no_communication": "none", "nothing": "none"}


def _collective(value: Any, key: str) -> str:
    name = value.strip().lower().replace("-", "_").replace(" ", "_") if isinstance(value, str) else None
    name = _ALIASES.get(name or "", name)
    if name not in COLLECTIVES:
        raise Wrong(f"answer[{key!r}]: give one of {', '.join(map(repr, COLLECTIVES))}, not {value!r}")
    return name


@exercise(
    "the collective behind redistribute",
    todo="fill `answer`: for each placement change of REDISTRIBUTIONS, the collective it runs (one of COLLECTIVES)",
)
def check_redistribute_collectives(answer: Any) -> str:
    answer = dict_answer(answer, REDISTRIBUTIONS, name="answer")
    blank = [key for key in REDISTRIBUTIONS if is_placeholder(answer[key])]
    for key in REDISTRIBUTIONS:
        if key in blank:
            continue
        got = _collective(answer[key], key)
        want, why = _REDISTRIBUTE[key]
        if got != want:
            raise Wrong(f"{key}: not {got!r} but {want!r}: {why}")
    if blank:
        done = f"{len(REDISTRIBUTIONS) - len(blank)} of {len(REDISTRIBUTIONS)}"
        raise Wrong(f"{done} answered, all right so far; still to answer: {', '.join(map(repr, blank))}")
    return (
        "Shard -> Replicate all-gathers, Partial -> Replicate all-reduces, Partial -> Shard reduce-scatters, "
        "Shard(0) -> Shard(1) is an all-to-all, and going to Shard or Partial from Replicate is local: no bytes move"
    )


# -- C. One FSDP2 training step, counted ---------------------------------------------------------------------------

_STEP_KEYS = ("all_gather", "reduce_scatter", "sent_bytes", "peak_gathered_bytes")

# (parameters of each unit, world size, reshard_after_forward, param_bytes, grad_bytes; None: the defaults, 2 and 4)
STEP_CASES: list[tuple[list[int], int, bool, int | None, int | None]] = [
    ([1000, 1000, 1000, 1000], 2, True, None, None),
    ([1000, 1000, 1000, 1000], 2, False, None, None),
    ([300, 1200, 600], 4, True, 2, 2),
    ([300, 1200, 600], 4, False, 4, 4),
    ([262_144, 1_048_576, 262_144], 8, True, 2, 4),
    ([5000], 3, False, 2, 4),
    ([1000, 2000], 1, True, 2, 4),
    ([1000, 2000], 1, False, 2, 4),
]


def _step(units: Sequence[int], n: int, reshard: bool, pb: int = 2, gb: int = 4) -> list[float]:
    """[all-gathers, reduce-scatters, bytes one rank sends, peak bytes of gathered parameters] of one step."""
    if n == 1:  # FSDP2 runs no collective on one rank: it copies the whole shard into the unsharded parameter
        gathers = reduces = 0
    else:
        gathers, reduces = len(units) * (2 if reshard else 1), len(units)
    sent = (n - 1) / n * ((2 if reshard else 1) * pb + gb) * sum(units)
    return [gathers, reduces, sent, pb * (max(units) if reshard else sum(units))]


Case = tuple[list[int], int, bool, int, int]  # units, world size, reshard_after_forward, param_bytes, grad_bytes


def _gathers(reshard: bool) -> int:
    return 2 if reshard else 1


# bytes one rank sends, as the usual mistakes count them (u: units, n: world size, r: reshard, p/g: param/grad bytes)
_SENT_MISTAKES: list[tuple[Callable[[list[int], int, bool, int, int], float], str]] = [
    (
        lambda u, n, r, p, g: (_gathers(r) * p + g) * sum(u),
        "a ring all-gather or reduce-scatter of S bytes sends (N-1)/N of S per rank",
    ),
    (
        lambda u, n, r, p, g: (n - 1) / n * (_gathers(r) * g + g) * sum(u),
        "the all-gathers move parameters: count them in param_bytes",
    ),
    (
        lambda u, n, r, p, g: (n - 1) / n * (_gathers(r) * p + p) * sum(u),
        "the reduce-scatters move gradients: count them in grad_bytes",
    ),
    (lambda u, n, r, p, g: (n - 1) / n * (p + g) * sum(u), "count 2 all-gathers per unit with True, 1 with False"),
    (lambda u, n, r, p, g: (n - 1) / n * (2 * p + g) * sum(u), "count 2 all-gathers per unit with True, 1 with False"),
    (
        lambda u, n, r, p, g: (n - 1) / n * (_gathers(r) + 1) * sum(u),
        "count bytes, not parameters: param_bytes and grad_bytes per parameter",
    ),
]


def _sent_hint(got: float, case: Case, every: list[tuple[Case, float]]) -> str:
    """The mistake that explains every answer the learner gave for the bytes sent, else the one that explains this."""
    if case[1] == 1:
        return "with one rank there is nobody to send to: (N-1)/N = 0"
    for cases in (every, [(case, got)]):
        for model, hint in _SENT_MISTAKES:
            if all(math.isclose(value, model(*c), rel_tol=1e-6) for c, value in cases):
                return hint
    return (
        "per unit of S parameters each all-gather sends (N-1)/N · S · param_bytes, and the reduce-scatter "
        "(N-1)/N · S · grad_bytes"
    )


def _count_hint(key: str, got: float, want: float, case: Case) -> str:
    units, n, reshard = case[:3]
    if n == 1:
        return (
            "on one rank FSDP2 runs no collective at all: it copies the (whole) shard into the unsharded parameter; "
            "0 all-gathers and 0 reduce-scatters"
        )
    if key == "all_gather" and reshard and got == len(units):
        return (
            "with reshard_after_forward=True each unit is freed after its forward and all-gathered again for its "
            "backward: 2 per unit"
        )
    if key == "all_gather" and not reshard and got == 2 * len(units):
        return "with reshard_after_forward=False a unit stays gathered from its forward to its backward: 1 per unit"
    if got in (want + 1, want + 2):
        return "the root holds no parameters (every layer is a unit): it gathers and reduces nothing"
    if key == "reduce_scatter":
        return "each unit's gradients are reduce-scattered once per step, in its backward: 1 per unit"
    return "count the all-gathers of each unit: in its forward, and again in its backward if it was resharded"


def _peak_hint(got: float, want: float, case: Case) -> str:
    units, n, reshard, pb, gb = case
    if not reshard and math.isclose(got, pb * max(units)):
        return (
            "with reshard_after_forward=False every unit keeps its gathered parameters from its forward to its "
            "backward: at the end of the forward all of them are gathered, the sum of the units"
        )
    if reshard and math.isclose(got, pb * sum(units)):
        return (
            "with reshard_after_forward=True each unit is freed after its forward (and its backward): without "
            "prefetch one unit is gathered at a time, so the largest unit's"
        )
    if n == 1 and got == 0:
        return "on one rank FSDP2 still builds the unsharded parameters (a copy of the shard): the same peak"
    if math.isclose(got, want / pb * gb) and pb != gb:
        return "the gathered parameters are in param_bytes, not grad_bytes"
    if math.isclose(got, want / pb) or math.isclose(got, want / n):
        return "count bytes of whole (unsharded) parameters: parameters × param_bytes, not divided by N"
    return "count the gathered parameters alive at once, in param_bytes"


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if math.isfinite(x) and x == int(x) else f"{x:,.6g}"


def _call(units: list[int], n: int, reshard: bool, pb: int | None, gb: int | None) -> tuple[str, dict[str, int]]:
    sizes = {k: v for k, v in (("param_bytes", pb), ("grad_bytes", gb)) if v is not None}
    return f"fsdp2_step({units}, {n}, {reshard}" + "".join(f", {k}={v}" for k, v in sizes.items()) + ")", sizes


@exercise(
    "one FSDP2 step, counted",
    todo="write fsdp2_step(unit_params, world_size, reshard_after_forward, param_bytes=2, grad_bytes=4)",
)
def check_fsdp2_step(fsdp2_step: Any) -> str:
    if is_placeholder(fsdp2_step):
        raise NotDone
    answers: list[list[float]] = []
    for units, n, reshard, pb, gb in STEP_CASES:
        call, sizes = _call(units, n, reshard, pb, gb)
        got = call_learner(fsdp2_step, list(units), n, reshard, **sizes)
        if not isinstance(got, dict):
            raise Wrong(f"{call} should return a dict with keys {', '.join(map(repr, _STEP_KEYS))}")
        missing = [k for k in _STEP_KEYS if k not in got]
        if missing:
            raise Wrong(f"{call} returned no {', '.join(map(repr, missing))}")
        answers.append([as_number(got[key], f"{call}[{key!r}]") for key in _STEP_KEYS])
    cases: list[Case] = [(u, n, r, pb or 2, gb or 4) for u, n, r, pb, gb in STEP_CASES]
    for (units, n, reshard, pb, gb), case, answer in zip(STEP_CASES, cases, answers):
        for i, (key, value, want) in enumerate(zip(_STEP_KEYS, answer, _step(*case))):
            if math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-6):
                continue
            if key == "sent_bytes":
                hint = _sent_hint(value, case, [(c, a[i]) for c, a in zip(cases, answers) if c[1] > 1])
            else:
                hint = _peak_hint(value, want, case) if i == 3 else _count_hint(key, value, want, case)
            call = _call(units, n, reshard, pb, gb)[0]
            raise Wrong(f"{call}[{key!r}] = {_fmt(value)}, expected {_fmt(want)}: {hint}")
    big = [250_000_000] * 32  # 8B parameters in 32 units on 8 ranks, bf16 parameters and fp32 gradients
    on, off = _step(big, 8, True), _step(big, 8, False)
    return (
        f"2 all-gathers and 1 reduce-scatter per unit with reshard_after_forward=True, 1 and 1 with False: for 8B "
        f"parameters in 32 units on 8 ranks, {on[2] / 1e9:.0f} GB against {off[2] / 1e9:.0f} GB sent per step and "
        f"rank, for a peak of gathered parameters of {on[3] / 1e9:.1f} GB against {off[3] / 1e9:.0f} GB"
    )
