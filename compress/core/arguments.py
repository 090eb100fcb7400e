"""Argument checks shared by the Python API and the library functions it re-exports: a wrong type
or value fails at the call in one UsageError line naming the argument, what it got and the fix,
instead of deep inside torch.

Python's duck typing lets a string through where a number is meant ('0.4' compares with floats
nowhere, '16' fails inside a range check), so both are refused here, as is a bool where a number is
meant (True == 1).
"""

from __future__ import annotations

import math
import numbers
import os
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


def _numeric_text(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def check_tokenizer(name: str, value: Any) -> None:
    """A Hugging Face tokenizer (``PreTrainedTokenizerBase``: what ``AutoTokenizer.from_pretrained``
    returns), the one the model was trained with."""
    from transformers import PreTrainedTokenizerBase

    if not isinstance(value, PreTrainedTokenizerBase):
        raise UsageError(f"{name} must be a Hugging Face tokenizer, got {_got(value)[:120]}; pass the "
                         "model's own, e.g. AutoTokenizer.from_pretrained(<model folder>)")


def check_labels(name: str, labels: Any, n_labels: int | None, rows: int) -> None:
    """Single-label class ids: an integer tensor ``[rows]`` with every id in ``[0, n_labels)``
    (``n_labels`` None: not checked against a head); multi-hot float ``[rows, n_labels]`` passes."""
    import torch

    if not isinstance(labels, torch.Tensor):
        raise UsageError(f"{name} must be a tensor of class ids, got {_got(labels)[:120]}")
    if labels.is_floating_point():
        if labels.dim() == 2 and labels.shape[0] == rows and n_labels in (None, labels.shape[1]):
            return  # multi-hot targets of a multi-label head
        raise UsageError(f"{name} is a float tensor of shape {list(labels.shape)}; pass class ids (int, "
                         f"[{rows}]) or multi-hot targets [{rows}, {n_labels}]")
    if labels.dim() != 1 or labels.shape[0] != rows:
        raise UsageError(f"{name} has shape {list(labels.shape)}; one class id per row is [{rows}]")
    if labels.numel() and n_labels is not None and (int(labels.min()) < 0 or int(labels.max()) >= n_labels):
        raise UsageError(f"{name} holds class ids from {int(labels.min())} to {int(labels.max())}, outside "
                         f"the {n_labels} labels [0, {n_labels}); map the labels to 0..{n_labels - 1}")
