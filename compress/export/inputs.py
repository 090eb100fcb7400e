"""The inputs a model is exported and checked with: their names per model kind, random example
values, and the (batch, length) shapes of the parity check.

BERT classifiers take ``input_ids, attention_mask, token_type_ids``; students and other modules with
the ``forward(input_ids, attention_mask=None)`` contract take the first two. Hugging Face encoders
take those ``forward`` accepts, with ``token_type_ids`` only where the model has a segment table of
two or more rows (``declared_inputs``): RoBERTa, XLM-R, DistilBERT, DeBERTa-v3 and ModernBERT
export ``input_ids, attention_mask``.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch

from compress.core.errors import UsageError

# Lengths 1 and 3 reach what shorter inputs do differently (KimCNN's windows wider than the
# text, logreg's bigrams of one token), which a graph traced at length 16 must still compute.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((1, 8), (2, 16), (3, 37), (1, 1), (2, 3))
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
STUDENT_INPUTS = ("input_ids", "attention_mask")


class Declared(Protocol):
    """What example inputs are made from: a ``compress.export.loading.LoadedModel``."""

    input_names: tuple[str, ...]
    vocab_size: int


def declared_inputs(model: torch.nn.Module) -> tuple[str, ...]:
    """The inputs a Hugging Face encoder is exported and measured with, in ``BERT_INPUTS`` order.

    ``forward`` must accept the name; ``token_type_ids`` also needs a segment table of at least two
    rows (``type_vocab_size``): RoBERTa and XLM-R (one row, every id 0) and DeBERTa-v3 (none) accept
    the argument but their tokenizers never produce it, and an id of 1 would index past the table.
    """
    params = inspect.signature(model.forward).parameters
    names = [n for n in BERT_INPUTS if n in params]
    types = getattr(getattr(model, "config", None), "type_vocab_size", None)
    if "token_type_ids" in names and types is not None and types < 2:
        names.remove("token_type_ids")
    return tuple(names)


def example_inputs(loaded: Declared, batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids; rows after the first are right-padded so the mask matters."""
    g = torch.Generator().manual_seed(seed + 1000 * batch + length)
    low = min(100, loaded.vocab_size - 1)
    ids = torch.randint(low, loaded.vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        keep = max(1, length - (row * length) // (batch + 1))
        mask[row, keep:] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in loaded.input_names:
        # TAPAS reads one id per token for each of its token types (segment, column, row, ...)
        kinds = getattr(getattr(getattr(loaded, "model", None), "config", None), "type_vocab_sizes", None)
        tt = torch.zeros(batch, length, *([len(kinds)] if isinstance(kinds, (list, tuple)) else []),
                         dtype=torch.long)
        tt[:, length // 2:] = 1  # the second segment (TAPAS: every kind's id 1, in range of each)
        out["token_type_ids"] = tt
    return {k: v for k, v in out.items() if k in loaded.input_names}


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """'1x8,2x16' -> ((1, 8), (2, 16)); errors name the bad item."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        try:
            b, n = (int(x) for x in parts)
        except ValueError:
            raise UsageError(f"--shapes item '{item}' is not BATCHxLENGTH (e.g. 2x16)") from None
        if b < 1 or n < 1:
            raise UsageError(f"--shapes item '{item}' must have batch and length >= 1")
        out.append((b, n))
    return tuple(out)
