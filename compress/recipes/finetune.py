"""Fine-tune a classification or multi-label task head end to end, evaluate it, and record the run
(``compress.api.finetuning``); re-evaluate saved classifiers. The other families' fine-tuning and
evaluation are their own recipes (``qa``, ``retrieval``, ``embedding``); the CLI's family tables
(``compress.cli.finetune``, ``compress.cli.eval``) pick the recipe of a task."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compress.api.finetuning import FinetuneConfig, HookFactory, finetune_classifier
from compress.core.config import option, to_dict
from compress.core.runs import RunDir
from compress.models.loading import load_classifier
from compress.qa.options import QAOptions
from compress.tasks.task_data import TaskDataConfig, load_task_data
from compress.training.classifier import evaluate_classifier


def run_finetune(cfg: FinetuneConfig, command: str = "finetune",
                 hook_factory: HookFactory | None = None, extra_meta: dict | None = None) -> Path:
    """Fine-tune ``cfg.model`` on the classification or multi-label ``cfg.task``; returns the finished
    run folder. ``hook_factory(model)`` adds training hooks (pruning, kept masks) without changing the
    loop."""
    return finetune_classifier(cfg, command, hook_factory, extra_meta)


@dataclass(frozen=True)
class EvalConfig(TaskDataConfig, QAOptions):
    max_length: int | None = option(None, help="tokens per example (default: the model's own, "
                                               "from its run)")
    batch_size: int = option(128, help="examples per batch")


def run_eval(cfg: EvalConfig) -> dict:
    """Re-evaluate a saved classifier on the task's eval split; writes an eval run folder."""
    spec, data = load_task_data(cfg, ("eval",))
    ds = data["eval"]
    model, tokenizer, meta = load_classifier(cfg.model, ds.label_names, ds.multilabel,
                                             strict_labels=True)
    max_length = cfg.max_length or meta.get("max_length", 128)
    with RunDir("eval", name=spec.name, out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        metrics = evaluate_classifier(model, tokenizer, spec, ds, max_length, cfg.batch_size)
        run.write_summary({"command": "eval", "task": spec.name, "model": cfg.model,
                           "metric": spec.metric, "eval": metrics})
    print(f"{spec.name}: {spec.metric} = {metrics['score']:.4f} on {metrics['n']} examples "
          f"-> {run.path}")
    return metrics
