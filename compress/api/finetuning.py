"""Fine-tune a sequence classifier end to end into a run folder (``finetune_classifier``) and the
config of every fine-tuning (``FinetuneConfig``): what ``compress finetune`` runs on a classification
or multi-label task, and what ``compress distill`` runs to fine-tune its teacher. Not re-exported by
``import compress``; the recipes call it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from compress.core.config import option, to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir, launch_rank
from compress.distill.teacher_kd import TeacherKDOptions, load_teacher, teacher_summary, teacher_training
from compress.models.loading import load_classifier
from compress.qa.options import QAOptions
from compress.report.saving import save_run_model
from compress.tasks.task_data import TaskDataConfig, load_task_data
from compress.training.classifier import classifier_output_layer, evaluate_classifier, init_bias_to_prior
from compress.training.loop import TrainConfig, TrainHook, encode, set_seed, train
from compress.training.trackers import start_tracking


@dataclass(frozen=True)
class FinetuneConfig(TrainConfig, TaskDataConfig, QAOptions, TeacherKDOptions):
    # QAOptions: --doc-stride, --n-best, --split-by-article, --objective, ... (squad/reqa only).
    # TeacherKDOptions: --teacher, --kd-lambda, --temperature, --kd-hidden, --kd-layers (e.g. a
    # pruned model recovering from its dense original).
    resume: bool = option(False, help="continue an interrupted run in --out from its last "
                                      "checkpoint (same options; save checkpoints with "
                                      "--checkpoint-every N)")
    # the information-deletion control of Gordon et al. 2020
    information_deletion: bool = option(False, help="fine-tuning a pruned model: zero its pruned "
                                                    "weights once and let them regrow (Gordon et "
                                                    "al.'s control) instead of keeping the masks")

    def __post_init__(self):
        TrainConfig.__post_init__(self)
        QAOptions.__post_init__(self)
        TeacherKDOptions.__post_init__(self)
        for lim in ("train_limit", "eval_limit"):
            v = getattr(self, lim)
            if v is not None and v < 1:
                raise UsageError(f"--{lim.replace('_', '-')} must be >= 1, got {v}")


HookFactory = Callable[[object], list[TrainHook]]


def finetune_classifier(cfg: FinetuneConfig, command: str = "finetune",
                        hook_factory: HookFactory | None = None, extra_meta: dict | None = None) -> Path:
    """Fine-tune ``cfg.model`` on a classification/multi-label ``cfg.task``; returns the finished run
    folder. ``hook_factory(model)`` adds training hooks (pruning, kept masks) without changing the loop."""
    spec, data = load_task_data(cfg)
    labels = data["train"].label_names
    set_seed(cfg.seed)  # the fresh task head is initialised from the global RNG
    multilabel = data["train"].multilabel
    model, tokenizer, meta = load_classifier(cfg.model, labels, multilabel=multilabel)
    if multilabel and tuple(meta.get("label_names") or ()) != tuple(labels):
        init_bias_to_prior(classifier_output_layer(model), data["train"])
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel, student=model) if cfg.teacher
                            else (None, None))  # refused here, before any folder exists, if unfit
    # A pruned model (model/masks.safetensors) keeps its zeros unless --information-deletion.
    from compress.models.loading import resolve_model
    from compress.pruning.pruner import fine_tuning_hooks

    hooks = fine_tuning_hooks(model, resolve_model(cfg.model), getattr(cfg, "information_deletion", False),
                              hook_factory)
    name = cfg.name or f"{spec.name}"
    with RunDir(command, name=name, out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), command, hooks)
        t0 = time.time()
        feats = encode(tokenizer, data["train"], cfg.max_length)
        kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], feats, multilabel, run)
        result = train(model, tokenizer, kd.pop("feats"), cfg, hooks, log=run.log_metrics,
                       checkpoint_dir=run.checkpoint_dir, resume=cfg.resume, **kd)
        train_s = time.time() - t0
        metrics = evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                      cfg.eval_batch_size)
        run.log_metrics({"step": result["steps"], "eval": metrics})
        new_meta = {"task": spec.name, "label_names": list(labels),
                    "multilabel": multilabel, "max_length": cfg.max_length,
                    "base_model": cfg.model, **(extra_meta or {})}
        save_run_model(run, model, tokenizer, new_meta, hooks)
        summary = {"command": command, "task": spec.name, "model": cfg.model,
                   "train_examples": len(data["train"]), "eval_examples": len(data["eval"]),
                   "steps": result["steps"], "train_seconds": round(train_s, 1),
                   "metric": spec.metric, "eval": metrics}
        if teacher is not None:
            summary["distillation"] = teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"],
                                                      multilabel)
        run.write_summary(summary)
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    if launch_rank()[0] == 0:
        print(f"{spec.name}: {spec.metric} = {metrics['score']:.4f} on {metrics['n']} {spec.eval_split} "
              f"examples ({result['steps']} steps, {train_s:.0f}s) -> {run.path}")
    return run.path
