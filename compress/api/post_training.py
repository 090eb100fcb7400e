"""The post-training prune, as library functions the recipes call: prune a fine-tuned model once from
calibration data (``prune_once``: the calibrated criterion, or whole heads / FFN neurons with
--structured), score it before and after (``score_prune_score``), and the whole prune of one
classifier from its task data loaded by the caller (``prune_classifier_once``: load the model ->
choose the matrices -> open the run folder -> score, prune, score -> optionally train
``--recovery-steps`` with the masks kept -> save). ``compress.recipes.post_training`` runs it once
per ``compress prune --stage post-training``; ``compress.recipes.speed_family`` once per
``--speedup`` target, on the data it loaded once. Not re-exported by ``import compress``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from compress.api.prune_stages import (
    PruneConfig,
    prune_run_name,
    pruning_meta,
    save_pruned,
    structured_prune,
)
from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir, write_json
from compress.distill.augment import AugmentConfig, mask_token_of, require_nltk_data
from compress.distill.teacher_kd import load_teacher, teacher_summary, teacher_training
from compress.distill.transfer import transfer_extras
from compress.models.loading import load_classifier, resolve_model
from compress.pruning.calibration import calibration_sample
from compress.pruning.integrity import MASKS_FILE, check_finite_parameters, load_masks
from compress.pruning.masks import NMPattern
from compress.pruning.pruner import check_pattern_fits, matching_masks
from compress.pruning.structured import check_removable
from compress.pruning.targets import select_targets
from compress.tasks.base import TaskSpec, TextDataset
from compress.tasks.task_data import load_task_data
from compress.training.balance import oversample_small_classes
from compress.training.classifier import evaluate_classifier
from compress.training.loop import encode, set_seed, train
from compress.training.trackers import start_tracking


def read_calibration_text(cfg: PruneConfig) -> list[str] | None:
    """The lines of ``--calibration-data`` (None without it), read before any model is scored."""
    if cfg.calibration_data is None:
        return None
    from compress.pruning.mlm import read_corpus

    return read_corpus((cfg.calibration_data,), "--calibration-data")


def post_training_target(cfg: PruneConfig, structured: dict | None) -> dict:
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


def calibration_batches(cfg: PruneConfig, tokenizer, feats: list[dict], lines: list[str] | None = None
                        ) -> list[dict]:
    """The calibration set, batched: ``--calibration-samples`` training examples drawn with
    ``--seed``, stratified by label (the dev split is never read here), or the ``lines`` of
    ``--calibration-data``, unlabelled (a loss that needs labels, Fisher's, then takes the model's
    own prediction; a made-up label would be wrong for every other class)."""
    from compress.training.loop import make_collate

    if lines is not None:
        enc = tokenizer(lines, truncation=True, max_length=cfg.max_length)
        texts = [{k: enc[k][i] for k in enc.keys()} for i in range(len(lines))]
        chosen = [texts[i] for i in calibration_sample(len(texts), cfg.calibration_samples, cfg.seed)]
        return [dict(tokenizer.pad(chosen[i:i + cfg.batch_size], return_tensors="pt"))
                for i in range(0, len(chosen), cfg.batch_size)]
    labels = [tuple(f["labels"]) if isinstance(f["labels"], list) else f["labels"] for f in feats]
    chosen = [feats[i] for i in calibration_sample(len(feats), cfg.calibration_samples, cfg.seed, labels)]
    collate = make_collate(tokenizer)
    return [collate(chosen[i:i + cfg.batch_size]) for i in range(0, len(chosen), cfg.batch_size)]


def prune_once(cfg: PruneConfig, model, targets: dict, batches: list[dict], initial: dict, run: RunDir,
               fisher=None, dense_sizes=None) -> tuple[dict | None, dict | None, dict | None]:
    """The post-training prune itself: whole heads / FFN neurons with --structured, else the
    calibrated criterion on ``targets``; returns (masks, calibration report, structured report) and
    writes ``calibration.json``."""
    from compress.pruning.calibration import prune_calibrated

    if cfg.structured:
        structured = structured_prune(model, cfg, batches, fisher, dense_sizes)
        if "latency_table" in structured:
            write_json(run.path / "latency_table.json", structured.pop("latency_table"))
        return None, None, structured
    pattern = NMPattern.parse(cfg.pattern) if cfg.pattern else None
    masks, calibration = prune_calibrated(model, targets, batches, cfg.criterion, cfg.sparsity, cfg.scope,
                                          pattern, initial, seed=cfg.seed)
    write_json(run.path / "calibration.json", calibration)
    return masks, calibration, None


def post_training_targets(cfg: PruneConfig, model) -> tuple[dict, dict]:
    """The matrices to prune (none with --structured; the word embeddings only where --include
    names them), checked against --pattern, and the masks of an already pruned ``--model`` (kept
    pruned, in every matrix); before any run folder exists."""
    if cfg.structured:
        check_removable(model, tuple(cfg.structured))
    targets = {} if cfg.structured else select_targets(model, cfg.include, cfg.exclude,
                                                       word_embeddings=False)
    if cfg.pattern is not None:
        check_pattern_fits(NMPattern.parse(cfg.pattern), targets, cfg.criterion, cfg.scope, cfg.sparsity)
    initial, model_dir = {}, Path(resolve_model(cfg.model))
    if (model_dir / MASKS_FILE).is_file():  # re-pruning a pruned model keeps its zeros
        initial, _ = matching_masks(model, load_masks(model_dir / MASKS_FILE))
        if cfg.structured:
            refuse_pruned_model(model_dir, initial)
    return targets, initial


def refuse_pruned_model(model_dir: Path, masks: dict | None = None) -> None:
    """UsageError when the model in ``model_dir`` is pruned (``masks``, else its masks file, hold a
    zero): --structured removes units and would not keep those zeros."""
    if masks is None:
        masks = load_masks(model_dir / MASKS_FILE) if (model_dir / MASKS_FILE).is_file() else {}
    if any(not m.all() for m in masks.values()):
        raise UsageError(f"--structured would not keep the zeros of {model_dir}, which is pruned "
                         f"({MASKS_FILE}); give --structured its dense original, or drop --structured")


def post_training_meta(cfg: PruneConfig, masks: dict | None, structured: dict | None) -> dict:
    """``compress.json``'s ``pruning``; a Fisher search records its FLOPs target, not the
    ``--sparsity`` it never reads."""
    meta = {**pruning_meta(cfg, None, structured), "schedule": "oneshot",
            "recovery_steps": cfg.recovery_steps or 0,
            **({"masks_file": MASKS_FILE, "targets": sorted(masks)} if masks else {})}
    if cfg.flops_reduction is not None:
        del meta["sparsity"]
        meta["flops_reduction"] = cfg.flops_reduction
    return meta


@dataclass
class OneShot:
    """What the post-training prune gave: the scores before and after it, the encoded training
    split (for a recovery), the masks or the structured report, and the prune's own seconds."""

    dense: dict
    pruned: dict
    feats: list
    masks: dict | None
    calibration: dict | None
    structured: dict | None
    seconds: float


def score_prune_score(cfg: PruneConfig, model, targets: dict, initial: dict, run: RunDir,
                      score: Callable[[], dict], encode_train: Callable[[], list],
                      calibration_set: Callable[[list], list[dict]], fisher=None, dense_sizes=None
                      ) -> OneShot:
    """Score the dense model, prune it once from calibration batches, score it again; both scores
    logged. The prune's seconds cover encoding the training split, drawing the calibration set and
    choosing the masks, not the evaluations."""
    dense = score()
    run.log_metrics({"phase": "dense", "eval": dense})
    t_prune = time.time()
    feats = encode_train()
    masks, calibration, structured = prune_once(cfg, model, targets, calibration_set(feats), initial, run,
                                                fisher, dense_sizes)
    seconds = round(time.time() - t_prune, 1)
    pruned = score()
    run.log_metrics({"phase": "pruned", "step": 0, "eval": pruned})
    return OneShot(dense, pruned, feats, masks, calibration, structured, seconds)


def post_training_summary(cfg: PruneConfig, task: str, metric: str, once: OneShot, metrics: dict,
                          steps: int, started: float) -> dict:
    """The summary fields both post-training stages (classification, squad) write: what was pruned
    (the sparsity target, or the structure removed), how, and the recovery steps (0: none);
    ``train_seconds`` only when a recovery trained."""
    return {"command": "prune", "stage": cfg.stage, "task": task, "model": cfg.model,
            "criterion": cfg.criterion, **post_training_target(cfg, once.structured),
            "recovery_steps": steps, "prune_seconds": once.seconds,
            **({"train_seconds": round(time.time() - started, 1)} if steps else {}), "metric": metric,
            "eval_dense": once.dense, "eval_pruned_before_recovery": once.pruned, "eval": metrics,
            "structured": once.structured,
            "calibration": {k: v for k, v in (once.calibration or {}).items() if k != "matrices"} or None}


@dataclass
class PostTrainingData:
    """What a post-training prune of a classifier reads, loaded once (``load_post_training_data``)
    for one prune or for every member of a ``--speedup`` family: the task, its ``train``/``eval``
    splits, the texts the teacher labels for the recovery (``--recovery-unlabeled``) and the
    ``--calibration-data`` lines."""

    spec: TaskSpec
    data: dict[str, TextDataset]
    unlabeled: TextDataset | None
    lines: list[str] | None


def load_post_training_data(cfg: PruneConfig) -> PostTrainingData:
    """Read the ``--calibration-data`` text and the task data (the training split's first
    ``--train-limit`` examples, and with ``--recovery-unlabeled`` the texts after them), before any
    model is loaded or scored."""
    lines = read_calibration_text(cfg)
    if cfg.recovery_augment:
        require_nltk_data()
    spec, data = load_task_data(replace(cfg, train_limit=cfg.train_limit + cfg.recovery_unlabeled)
                                if cfg.recovery_unlabeled else cfg)
    unlabeled = None
    if cfg.recovery_unlabeled:  # the texts after the first --train-limit: the teacher labels them
        pool = data["train"]
        data["train"] = pool.subset(cfg.train_limit)
        unlabeled = pool.select(list(range(len(data["train"]), len(pool))))
    return PostTrainingData(spec, data, unlabeled, lines)


def prune_classifier_once(cfg: PruneConfig, task: PostTrainingData, fisher=None, dense_sizes=None) -> Path:
    """Prune a model already fine-tuned on the task, once, with masks chosen from calibration data
    (``compress.pruning.calibration``; SparseGPT also rewrites the kept weights), then optionally
    train ``--recovery-steps`` with the masks kept (and the dense model as teacher with --teacher self).
    ``task``: its data, loaded by the caller (``load_post_training_data``). ``fisher``: the Fisher
    importance of the same dense model and calibration set, computed once for a family of
    ``--speedup`` targets (with ``--criterion obs``, its removal database); ``dense_sizes``: the
    unpruned model's heads and neurons per layer when ``--model`` is a member of a gradual family
    (the target is relative to them)."""
    from compress.pruning.pruner import KeepMasksHook

    spec, data, unlabeled, lines = task.spec, task.data, task.unlabeled, task.lines
    labels = data["train"].label_names
    multilabel = data["train"].multilabel
    set_seed(cfg.seed)
    model, tokenizer, _ = load_classifier(cfg.model, labels, multilabel=multilabel, strict_labels=True)
    check_finite_parameters(model, cfg.model)
    targets, initial = post_training_targets(cfg, model)
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel, student=model) if cfg.teacher
                            else (None, None))
    augment = (AugmentConfig(copies=cfg.recovery_augment, seed=cfg.seed,
                             mask_token=mask_token_of(tokenizer, "drop --recovery-augment"))
               if cfg.recovery_augment else None)
    extras = None
    with RunDir("prune", name=prune_run_name(cfg, spec.name), out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        t0 = time.time()

        def score() -> dict:
            return evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                       cfg.eval_batch_size)

        once = score_prune_score(cfg, model, targets, initial, run, score,
                                 lambda: encode(tokenizer, data["train"], cfg.max_length),
                                 lambda feats: calibration_batches(cfg, tokenizer, feats, lines), fisher,
                                 dense_sizes)
        metrics, steps = once.pruned, 0
        if cfg.recovery_steps:
            hooks = [KeepMasksHook(model, once.masks, {})] if once.masks else []
            hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
            extras = transfer_extras(data["train"], unlabeled, augment)
            if extras is not None:
                run.log_metrics({"phase": "recovery", "transfer_extras": extras.summary()})
            kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], once.feats, multilabel,
                                  run, extras)
            feats = kd.pop("feats")
            if not multilabel:  # a small class gets drawn again, so a fixed number of steps keeps it
                feats, balance = oversample_small_classes(feats, len(labels), cfg.recovery_class_floor,
                                                          cfg.seed)
                run.log_metrics({"phase": "recovery", "class_balance": balance})
            steps = train(model, tokenizer, feats, replace(cfg, max_steps=cfg.recovery_steps),
                          hooks, log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                          checkpoint_dir=run.checkpoint_dir, **kd)["steps"]
            metrics = score()
            run.log_metrics({"phase": "recovery", "step": steps, "eval": metrics})
        distill = (teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"], multilabel)
                   if teacher is not None and cfg.recovery_steps else None)
        meta = {"task": spec.name, "label_names": list(labels), "multilabel": multilabel,
                "max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": post_training_meta(cfg, once.masks, once.structured)}
        save_pruned(run, model, tokenizer, once.masks, meta, {
            **post_training_summary(cfg, spec.name, spec.metric, once, metrics, steps, t0),
            "distillation": distill, "transfer_extras": extras.summary() if extras is not None else None})
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path
