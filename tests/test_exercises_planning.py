from __future__ import annotations

from checks import assert_check
from course_lib.exercises.planning import check_pipeline_step_time, check_tp_rank_params
from course_lib.transformer import param_counts


def _split(config, n):
    parts = param_counts(config)
    return (parts["attention"] + parts["mlp"] + parts["embedding"] + parts["head"]) // n + parts["norms"]


def test_tp_rank_params_check() -> None:
    assert_check(
        check_tp_rank_params,
        right=[_split],
        not_done=[...],
        wrong=[
            (lambda c, n: sum(param_counts(c).values()) // n, "norms"),
            (
                lambda c, n: (
                    (param_counts(c)["attention"] + param_counts(c)["mlp"]) // n
                    + param_counts(c)["norms"]
                    + param_counts(c)["embedding"]
                    + param_counts(c)["head"]
                ),
                "vocabulary",
            ),
            (lambda c, n: float(_split(c, n)), ""),
        ],
    )


def test_pipeline_step_time_check() -> None:
    def right(stages, m, v):  # type: ignore[no-untyped-def]
        return max(stages) * (m + (len(stages) - 1) / v)

    def blank(stages, m, v):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    assert_check(
        check_pipeline_step_time,
        right=[right, lambda s, m, v: max(s) * m * (1 + (len(s) - 1) / (v * m))],
        right_says="slowest stage",
        not_done=[..., blank],
        wrong=[
            (lambda s, m, v: sum(s) / len(s) * (m + (len(s) - 1) / v), "slowest stage"),
            (lambda s, m, v: max(s) * (m + len(s) - 1), "(p - 1)/v"),
            (lambda s, m, v: sum(s) * m, "same time"),
            (lambda s, m, v: max(s) * m, "bubble"),
            (lambda s, m, v: "1.0", "number"),
        ],
    )
