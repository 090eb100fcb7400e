"""Pieces of ``compress prune --stage post-training`` (``compress.recipes.prune``) kept beside it:
the flags it refuses before anything loads, the ``--calibration-data`` text read before any model is
scored, and what its ``summary.json`` says was pruned. ``cfg`` is the stage's ``PruneConfig`` (typed
``Any`` here: this module is imported by the one defining it)."""

from __future__ import annotations

from typing import Any

from compress.core.errors import UsageError
from compress.tasks import get_task


def refuse_post_training_flags(cfg: Any) -> None:
    """What --stage post-training would ignore or contradict, refused before anything loads."""
    if cfg.teacher is not None and not cfg.recovery_steps:
        raise UsageError("--teacher distils during the --recovery-steps training, and without it "
                         "--stage post-training trains nothing; add --recovery-steps N or drop --teacher")
    if cfg.checkpoint_every:
        raise UsageError("--stage post-training does not resume, so its checkpoints would never be read; "
                         "drop --checkpoint-every")
    if cfg.calibration_data is not None and get_task(cfg.task).family == "qa":
        raise UsageError(f"--calibration-data is plain text, and --task {cfg.task} calibrates on its "
                         "training windows (question + context); drop --calibration-data and set "
                         "--calibration-samples")


def read_calibration_text(cfg: Any) -> list[str] | None:
    """The lines of ``--calibration-data`` (None without it), read before any model is scored."""
    if cfg.calibration_data is None:
        return None
    from compress.pruning.mlm import read_corpus

    return read_corpus((cfg.calibration_data,), "--calibration-data")


def post_training_target(cfg: Any, structured: dict | None) -> dict:
    """``sparsity_target`` (and ``pattern``) of an unstructured prune; ``removed`` (heads, FFN
    neurons, and with fisher the encoder FLOPs reduction) of a structured one."""
    if structured is None:
        return {"sparsity_target": cfg.sparsity, **({"pattern": cfg.pattern} if cfg.pattern else {})}
    removed = {"heads": structured.get("heads_removed"), "ffn_neurons": structured.get("ffn_removed")}
    if "flops_reduction" in structured:
        removed["flops_reduction"] = structured["flops_reduction"]
    if "flops_reduction_requested" in structured:
        removed["flops_reduction_target"] = structured["flops_reduction_requested"]
    if "speedup_requested" in structured:
        removed.update(attention_blocks=structured.get("attention_blocks_removed"),
                       ffn_blocks=structured.get("ffn_blocks_removed"),
                       layers=structured.get("layers_removed"),
                       speedup_target=structured["speedup_requested"],
                       predicted_speedup=structured["predicted_speedup"],
                       latency_runtime=structured.get("latency_runtime"),
                       latency_shape=structured.get("latency_shape"))
    return {"removed": removed}
