"""Argument checks of the Python API (``compress.api.functions``): a wrong type or value fails at the call in
one UsageError line naming the argument, what it got and the fix, instead of deep inside torch.

Python's duck typing lets a string through where a number or a list of patterns is meant: '0.4'
compares with floats nowhere and 'pooler' iterates as seven one-letter patterns, so both are
refused here, as is a bool where a number is meant (True == 1).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

from compress.core.errors import UsageError


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_module(name: str, value: Any, paths_too: bool = False) -> None:
    """A ``torch.nn.Module`` (or, with ``paths_too``, a str/PathLike naming a model)."""
    import torch

    if isinstance(value, torch.nn.Module) or (paths_too and isinstance(value, (str, os.PathLike))):
        return
    also = " or a model/run folder path" if paths_too else ""
    raise UsageError(f"{name} must be a torch.nn.Module{also}, got {_got(value)[:120]}; pass the model "
                     "itself (e.g. AutoModelForSequenceClassification.from_pretrained(...))")


def check_real(name: str, value: Any, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False) -> None:
    """A finite real number (not a bool, not a numeric string) in [lo, hi] ((lo, hi] with lo_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = f"{name}={float(value)}" if _numeric_text(value) else f"{name}=<a number>"
        raise UsageError(f"{name} must be a real number, got {_got(value)}; pass e.g. {hint}")
    bad = (not math.isfinite(value) or (lo is not None and (value < lo or (lo_open and value == lo)))
           or (hi is not None and value > hi))
    if bad:
        left, right = "(" if lo_open else "[", "]"
        raise UsageError(f"{name} must be in {left}{'-inf' if lo is None else lo}, "
                         f"{'inf' if hi is None else hi}{right}, got {value!r}")


def check_int(name: str, value: Any, lo: int, optional: bool = False) -> None:
    """An int (not a bool, not a float, not a numeric string) >= ``lo``; None too with ``optional``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = f"{name}={int(float(value))}" if _numeric_text(value) else f"{name}=<an integer>"
        raise UsageError(f"{name} must be an int, got {_got(value)}; pass e.g. {hint}")
    if value < lo:
        raise UsageError(f"{name} must be an int >= {lo}, got {value}")


def check_path(name: str, value: Any) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{name} must be a path (str or os.PathLike), got {_got(value)[:120]}; "
                         f"pass e.g. {name}='out/model'")


def check_patterns(name: str, value: Any) -> None:
    """A sequence of pattern strings; a bare string is refused (it would iterate letter by letter)."""
    if isinstance(value, (str, bytes)):
        raise UsageError(f"{name}={value!r} is a single string, not a sequence of patterns; pass "
                         f"{name}=({value!r},)")
    if not isinstance(value, Sequence) and not isinstance(value, (set, frozenset)):
        raise UsageError(f"{name} must be a sequence of pattern strings, got {_got(value)[:120]}; "
                         f"pass e.g. {name}=('role:query',)")
    for item in value:
        if not isinstance(item, str):
            raise UsageError(f"{name} holds {_got(item)}, not a pattern string; pass strings such as "
                             "'role:query', 're:REGEX' or a glob")


def check_shapes(value: Any) -> None:
    """``shapes``: a sequence of (batch, length) pairs of positive ints."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise UsageError(f"shapes must be a non-empty sequence of (batch, length) pairs, got "
                         f"{_got(value)[:120]}; pass e.g. shapes=[(1, 8), (2, 16)]")
    for s in value:
        ok = (isinstance(s, Sequence) and not isinstance(s, (str, bytes)) and len(s) == 2
              and all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1 for n in s))
        if not ok:
            raise UsageError(f"shapes entry {s!r} is not a (batch, length) pair of positive ints; pass "
                             "e.g. shapes=[(1, 8), (2, 16)]")


def _numeric_text(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
