"""compress: magnitude pruning, distillation, measurement and export for BERT-family encoders.

The public Python API (listed in ``__all__``; README "Python API") is imported lazily: ``import
compress`` loads neither torch nor transformers until a name is used.

- pruning: ``make_pruner``, ``prune_model``, ``prune_structured_model``, ``stock_copy``,
  ``prunable_targets``, ``save_model``, ``verify_masks``, ``ScheduledPruner``, ``OneShotSchedule``,
  ``GradualSchedule``;
- ``transformers.Trainer``: ``PruningCallback``, ``DistillationTrainer``;
- distillation: ``kd_loss``;
- embedding models: ``load_embedding_model``, ``embed_texts``, ``prune_embedding_model``,
  ``distil_embedding_model``, ``save_embedding_model``;
- measurement and export: ``measure_model``, ``export_onnx``, ``sparsity_report``,
  ``format_sparsity_table``, ``write_model_card``;
- errors: ``CompressError``, ``UsageError``, ``DataError``, ``ModelError``, ``IntegrityError``,
  ``ParityError``, ``PrunerStateError``, ``TrainingDivergedError``.
"""

from __future__ import annotations

from importlib import import_module

from compress.core.version import __version__  # noqa: F401 - re-exported

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "make_pruner": "compress.api.functions",
    "prune_model": "compress.api.functions",
    "prune_structured_model": "compress.api.structured",
    "stock_copy": "compress.pruning.stock_copy",
    "prunable_targets": "compress.api.functions",
    "save_model": "compress.api.functions",
    "verify_masks": "compress.api.functions",
    "kd_loss": "compress.api.functions",
    "measure_model": "compress.api.functions",
    "export_onnx": "compress.api.functions",
    "load_embedding_model": "compress.api.embedding",
    "embed_texts": "compress.api.embedding",
    "prune_embedding_model": "compress.api.embedding",
    "distil_embedding_model": "compress.api.embedding",
    "save_embedding_model": "compress.api.embedding",
    "PruningCallback": "compress.integrations.hf_trainer",
    "DistillationTrainer": "compress.integrations.hf_trainer",
    "ScheduledPruner": "compress.pruning.pruner",
    "MagnitudePruner": "compress.pruning.pruner",
    "PrunerStateError": "compress.pruning.pruner",
    "OneShotSchedule": "compress.pruning.schedules",
    "GradualSchedule": "compress.pruning.schedules",
    "sparsity_report": "compress.measure.sparsity",
    "format_sparsity_table": "compress.measure.sparsity",
    "write_model_card": "compress.report.modelcard",
    "CompressError": "compress.core.errors",
    "UsageError": "compress.core.errors",
    "DataError": "compress.core.errors",
    "ModelError": "compress.core.errors",
    "IntegrityError": "compress.core.errors",
    "ParityError": "compress.core.errors",
    "TrainingDivergedError": "compress.core.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'compress' has no attribute '{name}'")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


# Structured-pruned folders (model type compress_<type>) load with plain Auto*.from_pretrained once
# compress is imported; registered when transformers is imported, so this import stays light.
from compress.models import autoregister as _autoregister  # noqa: E402

_autoregister.install()
