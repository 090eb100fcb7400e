"""Argument checks of the Python API (``compress.api.functions``): a wrong type or value fails at the call in
one UsageError line naming the argument, what it got and the fix, instead of deep inside torch.

Python's duck typing lets a string through where a number or a list of patterns is meant: '0.4'
compares with floats nowhere and 'pooler' iterates as seven one-letter patterns, so both are
refused here, as is a bool where a number is meant (True == 1).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from compress.core.arguments import (  # noqa: F401 (the API's checks, re-exported)
    _got,
    _numeric_text,
    check_int,
    check_labels,
    check_module,
    check_path,
    check_real,
    check_tokenizer,
)
from compress.core.errors import UsageError


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


def check_calibration(value: Any, model: Any) -> list[dict]:
    """``calibration``: a non-empty sequence of batches, each a dict of tensors with ``input_ids``
    (integer, ``[batch, length]``, ``length >= 1``, ids inside the model's vocabulary, ``length`` at
    most its position table) and optionally an ``attention_mask`` of the same shape with at least one
    1 per row, and optionally ``labels`` (class ids inside the model's head, one per row); returns
    the batches as plain dicts. Checked before the model is touched."""
    import torch

    example = "e.g. [dict(tokenizer(texts, padding=True, return_tensors='pt'))]"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or isinstance(value, dict):
        raise UsageError(f"calibration must be a list of input batches (dicts of tensors), got "
                         f"{type(value).__name__}; {example}")
    if not value:
        raise UsageError(f"calibration is empty; pass at least one batch, {example}")
    vocab, max_len = _vocab_size(model), _max_positions(model)
    batches = []
    for i, batch in enumerate(value):
        where = f"calibration[{i}]"
        if not hasattr(batch, "keys") or not hasattr(batch, "__getitem__"):
            raise UsageError(f"{where} is a {type(batch).__name__}, not a dict of tensors; {example}")
        batch = dict(batch)
        for key, t in batch.items():
            if not isinstance(t, torch.Tensor):
                raise UsageError(f"{where}['{key}'] is a {type(t).__name__}, not a tensor; pass "
                                 "return_tensors='pt' to the tokenizer")
        ids = batch.get("input_ids")
        if ids is None:
            raise UsageError(f"{where} has no 'input_ids' (keys: {', '.join(map(str, batch)) or 'none'}); "
                             f"{example}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise UsageError(f"{where}['input_ids'] has dtype {ids.dtype}; token ids are integers "
                             "(torch.long)")
        if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise UsageError(f"{where}['input_ids'] has shape {list(ids.shape)}; a batch is [batch, "
                             "length] with at least one row and one token")
        if vocab is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise UsageError(f"{where}['input_ids'] holds ids from {int(ids.min())} to {int(ids.max())}, "
                             f"outside the model's vocabulary [0, {vocab}); tokenize with the model's "
                             "own tokenizer")
        if max_len is not None and ids.shape[1] > max_len:
            raise UsageError(f"{where}['input_ids'] has {ids.shape[1]} tokens per row, more than the "
                             f"model's {max_len} positions; tokenize with truncation=True, "
                             f"max_length={max_len}")
        mask = batch.get("attention_mask")
        if mask is not None:
            if tuple(mask.shape) != tuple(ids.shape):
                raise UsageError(f"{where}['attention_mask'] has shape {list(mask.shape)}, input_ids "
                                 f"{list(ids.shape)}; they must match")
            empty = (mask == 0).all(dim=1).nonzero().flatten().tolist()
            if empty:
                raise UsageError(f"{where}['attention_mask'] row {empty[0]} has no 1 (no token to "
                                 "calibrate on); drop the empty rows")
        if "labels" in batch:
            check_labels(f"{where}['labels']", batch["labels"], _num_labels(model), ids.shape[0])
        batches.append(batch)
    return batches


def check_initial_masks(value: Any, model: Any, what: str = "initial_masks") -> None:
    """``initial_masks`` (or the argument ``what`` names): None, or a dict of canonical parameter
    name -> bool tensor of that parameter's shape (True = kept), as ``prune_model`` and
    ``pruner.finalize()`` return."""
    if value is None:
        return
    import torch

    from compress.pruning.targets import named_weights

    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a dict of name -> bool tensor (what prune_model returns) "
                         f"or None, got {type(value).__name__}")
    params = named_weights(model)
    for name, m in value.items():
        if name not in params:
            raise UsageError(f"{what} names '{name}', no parameter of the model; names look like "
                             f"{', '.join(sorted(params)[:2])} (canonical, as prune_model returns them)")
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            kind = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
            raise UsageError(f"{what}['{name}'] is {kind}, not a bool tensor (True = kept); "
                             "pass mask.bool()")
        if tuple(m.shape) != tuple(params[name].shape):
            raise UsageError(f"{what}['{name}'] has shape {list(m.shape)}, the parameter "
                             f"{list(params[name].shape)}")


def _num_labels(model: Any) -> int | None:
    """The label count of ``model``'s classification head, None when it has none."""
    config = getattr(model, "config", None)
    head = any(hasattr(model, n) for n in ("classifier", "score", "logits_proj"))
    return getattr(config, "num_labels", None) if head else None


def _vocab_size(model: Any) -> int | None:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    n = getattr(emb, "num_embeddings", None)
    return n if n is not None else getattr(getattr(model, "config", None), "vocab_size", None)


def _max_positions(model: Any) -> int | None:
    """Tokens per row the model's absolute position table holds (RoBERTa-style tables start after
    the padding index), else ``config.max_position_embeddings`` when set."""
    import torch

    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            pad = module.padding_idx
            return module.num_embeddings - (pad + 1 if pad is not None else 0)
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)
