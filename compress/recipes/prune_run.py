"""``compress prune``: which function runs a ``PruneConfig``: the stage's (``STAGE_RUNS``), squad's
post-training stage, the task's own fine-tuning workflow for squad / reqa, or a family of
``--speedup`` targets. Kept apart from the config and the stages so that each of them is imported
here and none imports this module."""

from __future__ import annotations

from pathlib import Path

from compress.recipes.embedding_prune import prune_post_training_embedding
from compress.recipes.post_training import prune_post_training, prune_post_training_qa
from compress.recipes.prune import (
    OTHER_FAMILIES,
    STAGES,
    PruneConfig,
    prune_after_finetune,
    prune_finetune,
    prune_finetune_workflow,
    prune_pretrain,
)
from compress.recipes.speed_family import run_speed_family
from compress.tasks import get_task

STAGE_RUNS = {"pretrain": prune_pretrain, "finetune": prune_finetune, "after-finetune": prune_after_finetune,
              "post-training": prune_post_training}
assert tuple(STAGE_RUNS) == STAGES


def run_prune(cfg: PruneConfig) -> Path:
    """Run the configured stage; returns the finished run folder."""
    family = get_task(cfg.task).family
    if len(cfg.speedup) > 1:
        return run_speed_family(cfg)
    if family == "embedding":
        return prune_post_training_embedding(cfg)
    if cfg.stage == "post-training" and family == "qa":
        return prune_post_training_qa(cfg)
    if cfg.stage != "pretrain" and family in OTHER_FAMILIES:
        return prune_finetune_workflow(cfg, family)
    return STAGE_RUNS[cfg.stage](cfg)
