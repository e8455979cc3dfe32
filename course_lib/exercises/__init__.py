"""Exercise checks, one module per notebook topic, on the shared API in :mod:`.core`."""
from .core import CheckResult, NotDone, Wrong, as_number, call_learner, dict_answer, exercise, is_placeholder

__all__ = ["CheckResult", "NotDone", "Wrong", "as_number", "call_learner", "dict_answer", "exercise", "is_placeholder"]
