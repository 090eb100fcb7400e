"""How every recipe ends: the model folder (``compress.models.loading.save_model``: weights, tokenizer,
``compress.json``) and its ``README.md`` model card (``compress.report.modelcard``). The card is written
here and by the Python API's ``compress.save_model``, never by the model loader, which stays below
the measurement blocks the card reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.models import loading as models
from compress.report.modelcard import write_model_card


def save_model(model, tokenizer, folder: Path, meta: dict[str, Any]) -> None:
    """``compress.models.loading.save_model``, then the model card from the model in memory (sparsity,
    FLOPs), ``meta`` and, inside a run folder, the run's config and last evaluation."""
    models.save_model(model, tokenizer, folder, meta)
    write_model_card(folder, model, meta=meta)


def save_run_model(run, model, tokenizer, meta: dict[str, Any], hooks=()) -> None:
    """A training run's ``model/`` folder with its card (``save_model``), then what each hook with a
    ``save(run_path)`` adds to it (masks, pruning metadata). In a multi-process launch rank 0 alone
    writes them: ``save_pretrained`` writes the weights on rank 0 only, so another rank's folder
    could not be read back, and every rank holds the same weights and masks."""
    if run.rank > 0:
        return
    save_model(model, tokenizer, run.path / "model", meta)
    for h in hooks:
        if hasattr(h, "save"):
            h.save(run.path)
