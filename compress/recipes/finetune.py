"""Fine-tune a task head end to end, evaluate it, and record the run; re-evaluate saved models."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from compress.core.config import option, to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir, launch_rank
from compress.distill.teacher_kd import TeacherKDOptions, load_teacher, teacher_summary, teacher_training
from compress.models.loading import load_classifier
from compress.qa.options import QAOptions
from compress.recipes.embedding import eval_embedding
from compress.recipes.qa import eval_qa, finetune_qa
from compress.recipes.retrieval import eval_reqa, finetune_reqa
from compress.recipes.saving import save_run_model
from compress.tasks import DataOptions, TaskSpec, data_dir_from_env, get_task, load_split, task_choices
from compress.tasks.base import TextDataset
from compress.training.loop import TrainConfig, TrainHook, encode, set_seed, train
from compress.training.trackers import start_tracking


@dataclass(frozen=True)
class TaskDataConfig:
    """Which task, which data and which model; shared by every command that trains or evaluates."""

    task: str = option("sample", choices=task_choices,
                       help="the task to train or evaluate on")
    model: str = option("minilm", help="minilm (the packaged default), a model folder, a run folder "
                                       "or a hub name")
    data_dir: str | None = option(None, help="folder holding the task's files (else "
                                             "$COMPRESS_DATA_DIR, else the hub)")
    text_column: str = option("text", help="csv/jsonl: the column holding the text")
    text_pair_column: str | None = option(None, help="csv/jsonl: the column holding the second "
                                                     "text of a pair task")
    label_column: str = option("label", help="csv/jsonl: the column holding the label")
    train_limit: int | None = option(None, help="use only the first N training examples")
    eval_limit: int | None = option(None, help="score only the first N eval examples")
    out: str | None = option(None, help="run folder to create (default: "
                                        "artifacts/<command>/<time>-<name>)")
    name: str | None = option(None, help="name of the run folder under artifacts/<command>/ "
                                         "(default: from the task and options)")

    def data_options(self) -> DataOptions:
        return DataOptions(data_dir_from_env(self.data_dir), self.text_column,
                           self.text_pair_column, self.label_column)


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


def load_task_data(cfg: TaskDataConfig, splits: tuple[str, ...] = ("train", "eval")
                   ) -> tuple[TaskSpec, dict[str, TextDataset]]:
    """Validate the task and load its splits before anything is written."""
    spec = get_task(cfg.task)
    if spec.family not in ("classification", "multilabel"):
        raise UsageError(f"task '{spec.name}' ({spec.family}) is not a classification task")
    opts = cfg.data_options()
    out = {}
    for s in splits:
        split = spec.train_split if s == "train" else spec.eval_split
        ds = load_split(spec, opts, split)
        out[s] = ds.subset(cfg.train_limit if s == "train" else cfg.eval_limit)
    return spec, out


def evaluate_classifier(model, tokenizer, spec: TaskSpec, ds: TextDataset, max_length: int,
             batch_size: int = 128) -> dict[str, float]:
    """Metrics of a PyTorch ``model`` on ``ds`` (``compress.training.evaluation.evaluate``, as onnxruntime's
    are); the task's primary metric is also under ``'score'``."""
    from compress.training.evaluation import evaluate as evaluate_fn
    from compress.training.evaluation import torch_logits_fn

    return evaluate_fn(torch_logits_fn(model), tokenizer, spec, ds, max_length, batch_size)


HookFactory = Callable[[object], list[TrainHook]]
DISTILLABLE_FAMILIES = ("classification", "multilabel", "qa")  # the families --teacher applies to


def run_finetune(cfg: FinetuneConfig, command: str = "finetune",
                 hook_factory: HookFactory | None = None, extra_meta: dict | None = None) -> Path:
    """Fine-tune ``cfg.model`` on ``cfg.task``; returns the finished run folder.

    The task's family picks the workflow from ``FINETUNE_FAMILIES`` (QA and retrieval register
    theirs there). ``hook_factory(model)`` adds training hooks (pruning, kept masks) without
    changing the loop.
    """
    family = get_task(cfg.task).family
    if family not in FINETUNE_FAMILIES:
        known = ", ".join(FINETUNE_FAMILIES)
        raise UsageError(f"task family '{family}' cannot be fine-tuned; known: {known}")
    if getattr(cfg, "teacher", None) and family not in DISTILLABLE_FAMILIES:
        raise UsageError(f"--teacher distils classification or span logits; '{cfg.task}' is a {family} "
                         "task, which does not support it yet (drop --teacher)")
    return FINETUNE_FAMILIES[family](cfg, command, hook_factory, extra_meta)


def label_prior_logits(ds: TextDataset) -> torch.Tensor:
    """Log-odds of each label's training frequency, clipped away from 0 and 1 by half a document."""
    n = len(ds)
    counts = torch.zeros(len(ds.label_names), dtype=torch.float64)
    for y in ds.labels:
        counts[list(y)] += 1
    p = ((counts + 0.5) / (n + 1.0)).clamp(1e-6, 1 - 1e-6)
    return torch.log(p / (1 - p)).float()


def classifier_output_layer(model) -> torch.nn.Linear:
    """The Linear layer that makes a sequence classifier's logits: ``classifier`` itself (BERT,
    DistilBERT, DeBERTa, ModernBERT) or the last Linear inside it (RoBERTa's and ELECTRA's
    ``classifier.out_proj``)."""
    head = model.classifier
    layers = [head] if isinstance(head, torch.nn.Linear) else [
        m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and layers[-1].out_features == model.config.num_labels, type(head).__name__
    return layers[-1]


def init_bias_to_prior(head: torch.nn.Linear, ds: TextDataset) -> None:
    """Start a fresh multi-label head at the label prior (bias = log-odds of each label's frequency).

    With zero biases every one of Reuters' 90 sigmoids starts at 0.5 and the first hundreds of
    steps only push them down to the label frequencies; runs of 1-2 epochs then ended on a constant
    output (micro-F1 0). Starting at the prior is the usual remedy for rare positive classes
    (Lin et al. 2017, "Focal loss", section 3.3).
    """
    with torch.no_grad():
        head.bias.copy_(label_prior_logits(ds).to(head.bias.dtype))


def finetune_classifier(cfg: FinetuneConfig, command: str = "finetune",
                        hook_factory: HookFactory | None = None, extra_meta: dict | None = None) -> Path:
    """The classification/multi-label workflow of ``run_finetune``."""
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


FINETUNE_FAMILIES: dict[str, Callable[..., Path]] = {
    "classification": finetune_classifier,
    "multilabel": finetune_classifier,
    "qa": finetune_qa,
    "retrieval": finetune_reqa,
}


@dataclass(frozen=True)
class EvalConfig(TaskDataConfig, QAOptions):
    max_length: int | None = option(None, help="tokens per example (default: the model's own, "
                                               "from its run)")
    batch_size: int = option(128, help="examples per batch")


def run_eval(cfg: EvalConfig) -> dict:
    """Re-evaluate a saved model on the task's eval split; writes an eval run folder."""
    family = get_task(cfg.task).family
    if family in EVAL_FAMILIES:  # qa, retrieval, embedding
        return EVAL_FAMILIES[family](cfg)
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


# Families whose evaluation differs from classification (run_eval handles the classification ones).
EVAL_FAMILIES: dict[str, Callable[..., dict]] = {
    "qa": eval_qa,
    "retrieval": eval_reqa,
    "embedding": eval_embedding,
}
