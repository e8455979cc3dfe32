"""Property-based tests of course_lib's public API (Hypothesis): bad input gets a clear error, never a hang.

Two sweeps over every public function and class of ``course_lib`` outside ``exercises`` and ``labs`` (their checks
take a learner's answer, which may be anything, and say what is wrong with it in their verdict):

1. **Wrong types.** Each call gives every required parameter a value of a type its annotation rules out (a string
   for an ``int``, a list for a ``Tensor``, ``None`` where ``None`` is not allowed...). It must raise ``TypeError``
   or ``ValueError`` whose message names one of the function's parameters, within :data:`LIMIT_S`.
2. **Bad values, one at a time.** Each call of a function's own doctest examples is replayed with one argument
   replaced: a wrong type (must raise ``TypeError``/``ValueError`` naming that parameter), or an out-of-range value
   (0, negative, huge, NaN, inf, an empty or wrongly typed tensor: must raise ``TypeError``/``ValueError``, or
   return). Nothing else may escape: no ``IndexError`` from deep in torch, no ``ZeroDivisionError``, no hang.

A function that needs a process group may say so with ``RuntimeError`` (it names the process group).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import math
import pkgutil
import resource
import signal
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib

LIMIT_S = 10  # a call with a bad argument must be refused well within this
HEADROOM = 4 * 2**30  # address space a call may add: a huge size must be refused, not allocated
SKIPPED_PACKAGES = (".exercises", ".labs")
NOT_CALLED = {  # public callables a sweep must not call, with the reason
    "course_lib.launch.guardian.guard": "registers a process to kill with this test process",
}
# Records: frozen dataclasses (and an exception) that the library builds and returns, never from a learner's
# arguments; their constructors hold what they are given. test_records_are_plain_records checks each one is that.
RECORDS = {
    f"course_lib.{name}"
    for name in (
        "allreduce_sim.Transfer allreduce_sim.Snapshot allreduce_sim.AllReduceResult counted_collectives.CommRecord "
        "data.Split data.TextSplit device.EnvironmentReport equivalence.GradientMatch "
        "facts.Correction float_formats.FloatFormat launch.results.LaunchError launch.results.LaunchResult "
        "manifest.Lab manifest.Notebook moe.Routing planner_layout.Prediction published_runs.Comparison "
        "published_runs.PublishedRun "
        "saved_tensors.SavedRecord sharding.StateBytes"
    ).split()
}
# Validators: their job is to judge any value and raise an error naming the *caller's* argument (``name``), so
# their messages cannot name their own parameters; test_validators_name_the_callers_argument checks them instead.
VALIDATORS = {
    f"course_lib.{name}"
    for name in (
        "validation.is_int validation.is_number validation.check_int validation.check_number validation.check_bool "
        "validation.check_instance validation.check_items transformer_config.check_choice"
    ).split()
}


def _all_public() -> dict[str, Callable[..., Any]]:
    """Every callable in a ``__all__`` of course_lib outside the skipped packages, by qualified name."""
    found = {}
    for info in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        if any(part in info.name for part in SKIPPED_PACKAGES) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if callable(obj) and getattr(obj, "__module__", "") == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


EVERY_PUBLIC = _all_public()
PUBLIC = [(name, obj) for name, obj in EVERY_PUBLIC.items() if name not in RECORDS | VALIDATORS | set(NOT_CALLED)]


class _Timeout(Exception):
    pass


@contextmanager
def _limit(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise _Timeout

    old = signal.signal(signal.SIGALRM, fire)
    old_as = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + HEADROOM, old_as[1]))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, old_as)
        signal.signal(signal.SIGALRM, old)


def _address_space() -> int:
    """This process's virtual size now, in bytes (Linux's /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _signature(obj: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _hints(obj: Callable[..., Any]) -> dict[str, Any]:
    target = obj.__init__ if inspect.isclass(obj) else obj  # type: ignore[misc]
    try:
        return typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve: no hints, no sweep of that function
        return {}


def _types_of(hint: Any) -> tuple[set[type], bool]:
    """The runtime types an annotation allows, and whether it allows None; empty when it allows anything."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is inspect.Parameter.empty or isinstance(hint, typing.TypeVar):
        return set(), True
    if origin in (typing.Union, types.UnionType):
        allowed: set[type] = set()
        optional = False
        for arg in typing.get_args(hint):
            if arg is type(None):
                optional = True
                continue
            sub, sub_optional = _types_of(arg)
            if not sub:
                return set(), True
            allowed |= sub
            optional |= sub_optional
        return allowed, optional
    if origin is typing.Literal:
        return {type(v) for v in typing.get_args(hint)}, False
    if origin is not None:
        return ({origin} if isinstance(origin, type) else set()), False
    if isinstance(hint, type):
        return {hint}, False
    return set(), True


# Values of clearly different types; for a parameter, those whose type its annotation does not allow
WRONG_TYPES: list[Any] = ["nonsense", 2.5, [1, 2], object(), torch.ones(2, 3), None]


def _wrong_values(hint: Any) -> list[Any]:
    allowed, optional = _types_of(hint)
    if not allowed:
        return []
    numeric = {int, float, complex, bool} & allowed
    out = []
    for value in WRONG_TYPES:
        if value is None:
            if not optional:
                out.append(value)
            continue
        if isinstance(value, tuple(allowed)):
            continue
        if isinstance(value, float) and numeric:
            continue  # a float where an int is allowed is a value question (2.5 steps), asked below
        if any(isinstance(value, a) or issubclass(a, type(value)) for a in allowed if isinstance(a, type)):
            continue
        if any(a in (object, typing.Sequence, typing.Iterable) or not isinstance(a, type) for a in allowed):
            return []
        out.append(value)
    return out


def _acceptable(error: BaseException, names: list[str]) -> bool:
    """A clear refusal: TypeError/ValueError naming a parameter, or a process group asked for."""
    message = str(error)
    if isinstance(error, RuntimeError) and "process group" in message:
        return True
    if not isinstance(error, (TypeError, ValueError)):
        return False
    return any(name in message for name in names)


def _call(obj: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> BaseException | None:
    try:
        with _limit(LIMIT_S):
            obj(*args, **kwargs)
    except _Timeout:
        pytest.fail(f"{obj!r} did not return within {LIMIT_S} s for args={args!r} kwargs={kwargs!r}")
    except BaseException as error:  # noqa: BLE001 (the test judges what escaped)
        return error
    return None


SWEPT = []
for _name, _obj in PUBLIC:
    _sig = _signature(_obj)
    if _sig is None:
        continue
    _hint = _hints(_obj)
    _required = [
        p
        for p in _sig.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
    ]
    if _required and all(_wrong_values(_hint.get(p.name, Any)) for p in _required):
        SWEPT.append((_name, _obj, [(p.name, p.kind, _wrong_values(_hint[p.name])) for p in _required]))


@pytest.mark.parametrize("name, obj, params", SWEPT, ids=[s[0].removeprefix("course_lib.") for s in SWEPT])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data())
def test_a_wrong_type_is_refused_by_name(name: str, obj: Callable[..., Any], params: list[Any], data: Any) -> None:
    args, kwargs = [], {}
    for param, kind, values in params:
        value = data.draw(st.sampled_from(values), label=param)
        if kind == inspect.Parameter.KEYWORD_ONLY:
            kwargs[param] = value
        else:
            args.append(value)
    error = _call(obj, args, kwargs)
    assert error is not None, f"{name}({args!r}, {kwargs!r}) accepted values of the wrong type"
    names = [p[0] for p in params] + list((_signature(obj) or inspect.Signature()).parameters)
    assert _acceptable(error, names), f"{name}: {type(error).__name__}: {error}"


# -- 2: the doctests' calls, one argument at a time -------------------------------------------------------------------

OUT_OF_RANGE: list[Any] = [0, -1, -(10**6), 10**15, math.nan, math.inf, -math.inf, -0.5, 1e300]
BAD_TENSORS: list[Any] = [torch.empty(0), torch.ones(2, dtype=torch.bool), torch.full((3,), math.nan)]


def _examples() -> list[tuple[str, Callable[..., Any], str, dict[str, Any]]]:
    """(name, callable, the call's source, the globals to evaluate its arguments in), from the doctests."""
    found = []
    for name, obj in PUBLIC:
        doc = inspect.getdoc(obj) or ""
        module = importlib.import_module(obj.__module__)
        short = name.rsplit(".", 1)[1]
        for example in doctest.DocTestParser().get_examples(doc):
            try:
                tree = ast.parse(example.source)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == short:
                    if node.args or node.keywords:
                        found.append((name, obj, ast.unparse(node), vars(module)))
                    break
    return found


EXAMPLES = _examples()


def _bind(obj: Callable[..., Any], call: str, scope: dict[str, Any]) -> inspect.BoundArguments | None:
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call)
    env = dict(scope)
    try:
        args = [eval(compile(ast.Expression(a), "<doctest>", "eval"), env) for a in node.args]  # noqa: S307
        kwargs = {k.arg: eval(compile(ast.Expression(k.value), "<doctest>", "eval"), env) for k in node.keywords}  # noqa: S307
        sig = _signature(obj)
        return sig.bind(*args, **kwargs) if sig else None
    except Exception:  # an example that needs names from earlier lines: skipped
        return None


@pytest.mark.parametrize(
    "name, obj, call, scope", EXAMPLES, ids=[f"{e[0].removeprefix('course_lib.')}:{i}" for i, e in enumerate(EXAMPLES)]
)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data())
def test_one_bad_argument_is_refused_or_answered(
    name: str, obj: Callable[..., Any], call: str, scope: dict[str, Any], data: Any
) -> None:
    bound = _bind(obj, call, scope)
    if bound is None or not bound.arguments:
        return
    param = data.draw(st.sampled_from(sorted(bound.arguments)), label="parameter")
    hint = _hints(obj).get(param, Any)
    wrong = _wrong_values(hint)
    original = bound.arguments[param]
    if isinstance(original, torch.Tensor):
        candidates = BAD_TENSORS + wrong
    elif isinstance(original, (int, float)) and not isinstance(original, bool):
        candidates = OUT_OF_RANGE + wrong
    else:
        candidates = wrong
    if not candidates:
        return
    value = data.draw(st.sampled_from(candidates), label=param)
    bound.arguments[param] = value
    error = _call(obj, list(bound.args), dict(bound.kwargs))
    is_wrong_type = any(value is w for w in wrong)
    if error is None:
        assert not is_wrong_type, f"{name}: {param}={value!r} (a wrong type) was accepted"
        return
    if is_wrong_type:
        assert _acceptable(error, [param]), f"{name}({param}={value!r}): {type(error).__name__}: {error}"
    else:
        assert _acceptable(error, list(bound.signature.parameters)), (
            f"{name}({param}={value!r}): {type(error).__name__}: {error}"
        )


def test_the_sweeps_cover_most_of_the_public_api() -> None:
    swept = {s[0] for s in SWEPT} | {e[0] for e in EXAMPLES}
    print(
        f"{len(PUBLIC)} public callables: {len(SWEPT)} in the wrong-type sweep, "
        f"{len({e[0] for e in EXAMPLES})} with doctest calls replayed; {len(swept)} covered"
    )
    assert len(swept) >= 0.6 * len(PUBLIC)


def test_records_are_plain_records() -> None:
    """Each exempted record is what the exemption says: a frozen dataclass (or an exception) with no behaviour."""
    import dataclasses

    assert RECORDS <= set(EVERY_PUBLIC), sorted(RECORDS - set(EVERY_PUBLIC))
    for name in sorted(RECORDS):
        obj = EVERY_PUBLIC[name]
        if issubclass(obj, Exception):
            continue
        assert dataclasses.is_dataclass(obj), f"{name} is not a dataclass: it needs the sweeps, not an exemption"
        assert not hasattr(obj, "__post_init__"), f"{name} checks its fields: take it off RECORDS"


PREDICATES = {"course_lib.validation.is_int", "course_lib.validation.is_number"}


@pytest.mark.parametrize("name", sorted(VALIDATORS - PREDICATES))
def test_validators_name_the_callers_argument(name: str) -> None:
    check = EVERY_PUBLIC[name]
    wrong = {
        "check_int": ("steps", "3"),
        "check_number": ("lr", "0.1"),
        "check_bool": ("bias", 1),
        "check_instance": ("steps", "3", int),
        "check_items": ("numels", [1, "2"], int, "a list of ints"),
        "check_choice": ("activation", 3, ("tanh", "relu")),
    }[name.rsplit(".", 1)[1]]
    with pytest.raises(TypeError, match=wrong[0]):
        check(*wrong)


@pytest.mark.parametrize("value", [1, 0, 2**70, -3, True, 1.0, "1", None, [1], torch.tensor(1)])
def test_the_predicates_answer_for_any_value(value: Any) -> None:
    from course_lib.validation import is_int, is_number

    assert is_int(value) is (type(value) is int)
    assert is_number(value) is (type(value) in (int, float))
