"""``compress prune --stage post-training``: prune a fine-tuned model once, from calibration data.

Reads top to bottom: check the config (``compress.api.prune_stages.PruneConfig``) -> read the
``--calibration-data`` text and the task data -> load the fine-tuned ``--model`` and refuse
non-finite weights -> choose the matrices to prune, keeping the zeros of an already pruned model ->
open the run folder -> score the dense model, prune it once (``prune_once``: the calibrated
criterion, or whole heads / FFN neurons with --structured), score it again -> optionally train
``--recovery-steps`` with the masks kept -> save the model, masks and report (the shared pieces
of ``compress.api.prune_stages``; the prune itself: ``compress.api.post_training``).
``prune_post_training`` runs classification tasks,
``prune_post_training_qa`` squad; ``compress.recipes.speed_family`` runs the first once per
``--speedup`` target.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from compress.api.post_training import (
    load_post_training_data,
    post_training_meta,
    post_training_summary,
    post_training_targets,
    prune_classifier_once,
    score_prune_score,
)
from compress.api.prune_stages import PruneConfig, check_latency_shape_fits, prune_run_name, save_pruned
from compress.core.config import to_dict
from compress.core.runs import RunDir
from compress.distill.teacher_kd import SpanDistillation
from compress.pruning.calibration import calibration_sample
from compress.pruning.integrity import check_finite_parameters
from compress.training.loop import set_seed, train


def prune_post_training(cfg: PruneConfig, fisher=None, dense_sizes=None) -> Path:
    """Prune a model already fine-tuned on the task, once, with masks chosen from calibration data,
    then optionally train ``--recovery-steps`` with the masks kept (``prune_classifier_once``);
    ``fisher`` and ``dense_sizes`` as there."""
    check_latency_shape_fits(cfg)
    task = load_post_training_data(cfg)
    return prune_classifier_once(cfg, task, fisher, dense_sizes)


def prune_post_training_qa(cfg: PruneConfig) -> Path:
    """squad: the post-training prune of a model fine-tuned on squad, calibrated on training
    windows, scored by EM/F1 before and after; ``--recovery-steps`` train on the span loss (with
    ``--teacher``, plus KD on the start/end logits) with the masks kept."""
    from compress.distill.teacher_kd import load_span_teacher
    from compress.pruning.pruner import KeepMasksHook
    from compress.qa.evaluation import QA_TASK, evaluate_qa, load_qa_data, load_qa_model
    from compress.qa.features import collate_features, prepare_train_features
    from compress.qa.objectives import make_objective
    from compress.qa.options import effective_doc_stride

    doc_stride = effective_doc_stride(cfg, cfg.max_length)
    data = load_qa_data(cfg)
    set_seed(cfg.seed)
    model, tokenizer, _ = load_qa_model(cfg.model, require_finetuned=True)
    check_finite_parameters(model, cfg.model)
    targets, initial = post_training_targets(cfg, model)
    teacher = load_span_teacher(cfg, tokenizer) if cfg.teacher else None
    with RunDir("prune", name=prune_run_name(cfg, QA_TASK), out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        t0 = time.time()

        def score() -> dict:
            return evaluate_qa(model, tokenizer, data["dev"], cfg.max_length, doc_stride, cfg.n_best,
                               cfg.max_answer_length, cfg.eval_batch_size)[0]

        def calibration_set(feats: list) -> list[dict]:
            chosen = [feats[i] for i in calibration_sample(len(feats), cfg.calibration_samples, cfg.seed)]
            return [collate_features(tokenizer, chosen[i:i + cfg.batch_size])
                    for i in range(0, len(chosen), cfg.batch_size)]

        once = score_prune_score(cfg, model, targets, initial, run, score, lambda: prepare_train_features(
            tokenizer, data["train"].examples, cfg.max_length, doc_stride), calibration_set)
        metrics, steps = once.pruned, 0
        if cfg.recovery_steps:
            objective = (SpanDistillation(teacher, cfg.lambda_for(False), cfg.temperature) if teacher
                         else make_objective("plain", model, cfg))
            hooks = [KeepMasksHook(model, once.masks, {})] if once.masks else []
            steps = train(model, tokenizer, once.feats, replace(cfg, max_steps=cfg.recovery_steps), hooks,
                          log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                          checkpoint_dir=run.checkpoint_dir, collate=partial(collate_features, tokenizer),
                          loss_fn=objective.loss, extra_modules=[objective])["steps"]
            metrics = score()
            run.log_metrics({"phase": "recovery", "step": steps, "eval": metrics})
        meta = {"task": QA_TASK, "head": "question-answering", "max_length": cfg.max_length,
                "doc_stride": doc_stride, "n_best": cfg.n_best, "max_answer_length": cfg.max_answer_length,
                "base_model": cfg.model, "pruning": post_training_meta(cfg, once.masks, once.structured)}
        save_pruned(run, model, tokenizer, once.masks, meta,
                    post_training_summary(cfg, QA_TASK, "f1", once, metrics, steps, t0))
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path

