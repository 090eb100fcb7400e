"""``compress prune``: the stages that prune while training: magnitude pruning during pre-training,
fine-tuning, or after fine-tuning. The pieces they share with the post-training stage are library
functions (``compress.api.prune_stages``:
the config, the pruner and its hook, structured removal, the pruning record, the saved model with its
masks and sparsity). ``compress.cli.prune.run_prune`` picks the stage's function.

Each stage reads top to bottom: validate everything (config, data, model, targets) -> open the run
folder -> train with the pruning hook -> finalize masks -> evaluate -> save model, masks, report.
Nothing is written before validation passes, so bad input leaves no run folder.

``--resume`` continues an interrupted run from its checkpoints (``--checkpoint-every``). The
stages of several training phases (pretrain: dense baseline, then pruning; after-finetune: dense
fine-tuning, then pruning and recovery) checkpoint each phase in its own folder and record it once
finished (``RunDir.finish_phase``), so a resumed run skips the finished phases and continues the
interrupted one; the finished run equals an uninterrupted one with the same seed.
"""

from __future__ import annotations

import copy
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from compress.api.prune_stages import (
    PruneConfig,
    make_pruner,
    prune_run_name,
    pruning_meta,
    save_pruned,
    structured_prune,
    total_steps,
    write_masks_and_sparsity,
)
from compress.core.config import to_dict
from compress.core.errors import DataError, UsageError
from compress.core.runs import RunDir
from compress.distill.teacher_kd import (
    TEACHER_SELF,
    load_teacher,
    teacher_summary,
    teacher_training,
)
from compress.models.loading import (
    load_classifier,
    load_pretrained,
    load_tokenizer,
    resolve_model,
)
from compress.pruning.pruner import (
    ScheduledPruner,
    add_meta,
)
from compress.tasks.task_data import load_task_data
from compress.training.classifier import evaluate_classifier
from compress.training.loop import TrainHook, encode, set_seed, train
from compress.training.trackers import start_tracking

# ---------------------------------------------------------------------------------------------
# stages


def prune_finetune(cfg: PruneConfig) -> Path:
    """Prune while fine-tuning on a task: masks follow the schedule, then stay fixed."""
    spec, data = load_task_data(cfg)
    labels = data["train"].label_names
    set_seed(cfg.seed)  # a fresh task head is initialised here: same seed, same run
    multilabel = data["train"].multilabel
    model, tokenizer, _ = load_classifier(cfg.model, labels, multilabel=multilabel)
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel, student=model) if cfg.teacher
                            else (None, None))
    n_steps = total_steps(cfg, len(data["train"]))
    pruner, hooks = None, []
    if not cfg.structured:
        pruner, hook = make_pruner(cfg, model, resolve_model(cfg.model), n_steps)
        hooks = [hook]
    with RunDir("prune", name=prune_run_name(cfg, spec.name), out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
        t0 = time.time()
        structured = structured_prune(model, cfg) if cfg.structured else None
        feats = encode(tokenizer, data["train"], cfg.max_length)
        kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], feats, multilabel, run)
        result = train(model, tokenizer, kd.pop("feats"), cfg, hooks, log=run.log_metrics,
                       checkpoint_dir=run.checkpoint_dir, resume=cfg.resume, **kd)
        masks = pruner.finalize() if pruner else None
        metrics = evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                      cfg.eval_batch_size)
        run.log_metrics({"step": result["steps"], "eval": metrics})
        distill = (teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"], multilabel)
                   if teacher is not None else None)
        meta = {"task": spec.name, "label_names": list(labels), "multilabel": multilabel,
                "max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": pruning_meta(cfg, pruner, structured)}
        save_pruned(run, model, tokenizer, masks, meta, {
            "command": "prune", "stage": cfg.stage, "task": spec.name, "model": cfg.model,
            "steps": result["steps"], "train_seconds": round(time.time() - t0, 1),
            "metric": spec.metric, "eval": metrics, "structured": structured, "distillation": distill,
            "prune_history": pruner.history if pruner else None})
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


def prune_after_finetune(cfg: PruneConfig) -> Path:
    """Fine-tune dense, prune (oneshot or gradual), keep training with masks to recover."""
    spec, data = load_task_data(cfg)
    labels = data["train"].label_names
    set_seed(cfg.seed)  # a fresh task head is initialised here: same seed, same run
    multilabel = data["train"].multilabel
    model, tokenizer, _ = load_classifier(cfg.model, labels, multilabel=multilabel)
    # an external teacher is loaded and checked before the run folder exists; 'self' after phase 1
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel, student=model)
                            if cfg.teacher and cfg.teacher != TEACHER_SELF else (None, None))
    n_dense = total_steps(cfg, len(data["train"]))
    n_recover = cfg.recovery_steps or n_dense
    pruner, hooks = None, []
    if not cfg.structured:
        pruner, hook = make_pruner(cfg, model, resolve_model(cfg.model), n_recover)
        hooks = [hook]
    with RunDir("prune", name=prune_run_name(cfg, spec.name), out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
        t0 = time.time()
        feats = encode(tokenizer, data["train"], cfg.max_length)
        # Phase 1, dense fine-tuning; its last step is checkpointed too, so that once it is finished a
        # resumed run restores its weights without training (and logs nothing again).
        dense = run.phase_results("dense")
        steps = train(model, tokenizer, feats, cfg, [], log=None if dense else run.log_metrics,
                      checkpoint_dir=run.phase_checkpoint_dir("dense"), resume=cfg.resume,
                      checkpoint_last=True)["steps"]
        if dense is None:
            dense = {"steps": steps,
                     "eval": evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                                 cfg.eval_batch_size)}
            run.finish_phase("dense", dense, [{"phase": "dense", "step": dense["steps"],
                                               "eval": dense["eval"]}])
        if cfg.teacher == TEACHER_SELF:  # the dense model, before any weight is pruned
            teacher, teacher_dir = load_teacher(cfg, labels, tokenizer, multilabel, dense=model)
        # Pruning the dense model is deterministic and cheap, so a resumed run redoes it (the
        # recovery checkpoints hold the structured model's shapes and the masks); its score is kept.
        structured, before_recovery = None, None
        # A one-shot prune at step 0 happens now, so the unrecovered model can be scored; with
        # --prune-start N > 0 it happens N recovery steps in, and there is no such score (None).
        oneshot_now = cfg.schedule == "oneshot" and not cfg.prune_start
        if cfg.structured:
            structured = structured_prune(model, cfg)
        elif oneshot_now:
            hooks[0].on_train_begin(model, n_recover)
        if cfg.structured or oneshot_now:
            pruned = run.phase_results("pruned")
            if pruned is None:
                pruned = {"eval": evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                                      cfg.eval_batch_size)}
                run.finish_phase("pruned", pruned)
            before_recovery = pruned["eval"]
        # Phase 2, recovery with the masks (and the teacher's KD term, with --teacher).
        recover_cfg = replace(cfg, max_steps=n_recover)
        kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], feats, multilabel, run)
        rec = train(model, tokenizer, kd.pop("feats"), recover_cfg, hooks,
                    log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                    checkpoint_dir=run.phase_checkpoint_dir("recovery"), resume=cfg.resume, **kd)
        masks = pruner.finalize() if pruner else None
        metrics = evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                      cfg.eval_batch_size)
        run.log_metrics({"phase": "recovery", "step": rec["steps"], "eval": metrics})
        distill = (teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"], multilabel)
                   if teacher is not None else None)
        meta = {"task": spec.name, "label_names": list(labels), "multilabel": multilabel,
                "max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": pruning_meta(cfg, pruner, structured)}
        save_pruned(run, model, tokenizer, masks, meta, {
            "command": "prune", "stage": cfg.stage, "task": spec.name, "model": cfg.model,
            "dense_steps": dense["steps"], "recovery_steps": rec["steps"],
            "train_seconds": round(time.time() - t0, 1), "metric": spec.metric,
            "eval_dense": dense["eval"], "eval_pruned_before_recovery": before_recovery,
            "eval": metrics, "structured": structured, "distillation": distill,
            "prune_history": pruner.history if pruner else None})
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


def prune_pretrain(cfg: PruneConfig) -> Path:
    """Continued masked-LM pre-training with pruning, then recovery; held-out MLM loss of the dense
    model (same steps, same seed, same batches) beside the pruned one."""
    from transformers import AutoModel

    from compress.pruning.mlm import (
        HEAD_NOTES,
        MaskedLMObjective,
        build_mlm_model,
        heldout_loss,
        make_blocks,
        mask_heldout,
        pretrained_head,
        read_corpus,
        save_head,
        split_heldout,
    )

    lines = read_corpus(cfg.corpus)
    train_lines, held_lines = split_heldout(lines, cfg.heldout_fraction)
    model_dir = resolve_model(cfg.model)
    tokenizer = load_tokenizer(cfg.model)
    encoder = load_pretrained(AutoModel, cfg.model, model_dir, "an encoder")
    need = cfg.max_steps * cfg.batch_size if cfg.max_steps else None
    blocks = make_blocks(tokenizer, train_lines, cfg.max_length, max_blocks=need)
    held = mask_heldout(tokenizer, make_blocks(tokenizer, held_lines, cfg.max_length, cfg.heldout_blocks),
                        cfg.seed, cfg.mlm_probability)
    if not blocks or not held:
        raise DataError(f"the corpus is too small: {len(blocks)} training and {len(held)} held-out "
                        f"blocks of {cfg.max_length} tokens; add text or lower --max-length")
    n_steps = total_steps(cfg, len(blocks))
    head, head_source = pretrained_head(model_dir)
    dense_encoder = copy.deepcopy(encoder) if not cfg.no_dense_baseline else None
    objective = MaskedLMObjective(build_mlm_model(encoder, head), tokenizer, cfg.mlm_probability)
    pruner, hooks = None, []
    if not cfg.structured:
        pruner, hook = make_pruner(cfg, objective.mlm, model_dir, n_steps)
        hooks = [hook]
    with RunDir("prune", name=prune_run_name(cfg, "mlm"), out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
        t0 = time.time()
        before = run.phase_results("before")
        if before is None:
            before = {"loss": heldout_loss(objective, tokenizer, held, cfg.eval_batch_size)}
            run.finish_phase("before", before)
        loss_dense = None
        if dense_encoder is not None:  # phase 1, the dense baseline: only its loss is kept
            baseline = run.phase_results("dense")
            if baseline is None:
                dense = MaskedLMObjective(build_mlm_model(dense_encoder, head), tokenizer,
                                          cfg.mlm_probability)
                train(dense, tokenizer, blocks, cfg, [],
                      log=lambda r: run.log_metrics({"phase": "dense", **r}),
                      checkpoint_dir=run.phase_checkpoint_dir("dense"), resume=cfg.resume)
                baseline = {"loss": heldout_loss(dense, tokenizer, held, cfg.eval_batch_size)}
                run.finish_phase("dense", baseline)
                del dense
            loss_dense = baseline["loss"]
            del dense_encoder
        structured = None
        if cfg.structured:
            structured = structured_prune(encoder, cfg)
            objective = MaskedLMObjective(build_mlm_model(encoder, head), tokenizer, cfg.mlm_probability)
        result = train(objective, tokenizer, blocks, cfg, hooks,  # phase 2, pruning
                       log=lambda r: run.log_metrics({"phase": "pruned", **r}),
                       checkpoint_dir=run.phase_checkpoint_dir("pruned"), resume=cfg.resume)
        masks = pruner.finalize() if pruner else None
        loss_pruned = heldout_loss(objective, tokenizer, held, cfg.eval_batch_size)
        mlm_loss = {"before": before["loss"], "dense_after": loss_dense, "pruned_after": loss_pruned,
                    "heldout_blocks": len(held),
                    "heldout_tokens_scored": sum(sum(t != -100 for t in b["mlm_labels"]) for b in held),
                    "head": head_source, "note": HEAD_NOTES[head_source]}
        run.log_metrics({"step": result["steps"], "mlm_loss": mlm_loss})
        meta = {"max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": pruning_meta(cfg, pruner, structured)}
        save_pruned(run, encoder, tokenizer, masks, meta, {
            "command": "prune", "stage": cfg.stage, "model": cfg.model,
            "corpus": [str(c) for c in cfg.corpus], "train_blocks": len(blocks),
            "steps": result["steps"], "train_seconds": round(time.time() - t0, 1),
            "mlm_loss": mlm_loss, "structured": structured,
            "prune_history": pruner.history if pruner else None})
        save_head(objective.mlm, run.path / "model")
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


# Task families whose fine-tuning recipe lives with the task (compress.cli.finetune.FINETUNE_FAMILIES):
# pruning rides on it as a hook instead of a loop of its own.
OTHER_FAMILIES = ("qa", "retrieval")


class _FinalizeAndWrite(TrainHook):
    """Fixes the masks at the last step (before the workflow evaluates and saves the model), then
    writes them, the pruning metadata and ``sparsity.json`` into the run folder before it is renamed."""

    def __init__(self, pruner: ScheduledPruner, cfg: PruneConfig):
        self.pruner, self.cfg, self.total, self.masks = pruner, cfg, None, None

    def on_train_begin(self, model, total_steps: int) -> None:
        self.total = total_steps

    def on_step_end(self, model, step: int) -> None:
        if step == self.total:
            self.masks = self.pruner.finalize()

    def save(self, run_path: Path) -> None:
        add_meta(Path(run_path) / "model", {"pruning": pruning_meta(self.cfg, self.pruner, None)})
        write_masks_and_sparsity(Path(run_path), self.masks)


def finetune_workflow_hooks(cfg: PruneConfig, family: str) -> Callable[[torch.nn.Module], list[TrainHook]]:
    """squad / reqa: the pruning hooks for the task's own fine-tuning recipe (``compress.cli.prune``
    runs it with them, through ``compress.cli.finetune.FINETUNE_FAMILIES``)."""
    if cfg.structured:
        raise UsageError(f"--structured supports classification tasks; '{cfg.task}' is a {family} task "
                         "(leave --structured unset)")
    if cfg.stage != "finetune":
        raise UsageError(f"--task {cfg.task} is pruned with --stage finetune (or --stage pretrain, then "
                         f"'compress finetune --task {cfg.task}' on the pruned model)")

    def hooks(module: torch.nn.Module) -> list[TrainHook]:
        # the schedule is rebuilt from the loop's real step count when training begins
        pruner, hook = make_pruner(cfg, module, resolve_model(cfg.model), cfg.max_steps or 10**6)
        return [hook, _FinalizeAndWrite(pruner, cfg)]

    return hooks
