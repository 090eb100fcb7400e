"""SQuAD fine-tuning and evaluation: load -> features -> train (objective plug-in) -> post-process
-> official EM/F1 -> save. Registered in ``compress.cli.finetune.FINETUNE_FAMILIES`` and
``compress.cli.eval.EVAL_FAMILIES``.

Training is the shared loop, ``compress.training.loop.train``: the objective computes the loss
(``loss_fn=objective.loss``) and is trained beside the model (``extra_modules``: PFA's perturbation
MLP is optimized and checkpointed with it), so checkpoints, ``--resume``, hooks and logging are
those of every other task.
"""

from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path

import torch

from compress.core.config import to_dict
from compress.core.runs import RunDir
from compress.distill.teacher_kd import SpanDistillation, answer_agreement, load_span_teacher
from compress.models.loading import resolve_model
from compress.pruning.pruner import fine_tuning_hooks
from compress.qa.evaluation import QA_TASK, evaluate_qa, load_qa_data, load_qa_model
from compress.qa.features import collate_features, prepare_train_features
from compress.qa.objectives import make_objective
from compress.qa.options import effective_doc_stride
from compress.report.saving import save_run_model
from compress.tasks import get_task
from compress.training.loop import set_seed, train
from compress.training.trackers import start_tracking


def finetune_qa(cfg, command: str = "finetune", hook_factory=None, extra_meta: dict | None = None) -> Path:
    """Fine-tune a span head on squad and evaluate it; returns the finished run folder."""
    spec = get_task(cfg.task)
    doc_stride = effective_doc_stride(cfg, cfg.max_length)
    data = load_qa_data(cfg)
    set_seed(cfg.seed)  # a fresh span head and the objective's layers start from the global RNG
    model, tokenizer, _ = load_qa_model(cfg.model)
    objective = make_objective(cfg.objective, model, cfg)
    teacher = load_span_teacher(cfg, tokenizer) if getattr(cfg, "teacher", None) else None
    if teacher is not None:  # distillation-aware pruning: span cross-entropy + KD on start/end logits
        objective = SpanDistillation(teacher, cfg.lambda_for(False), cfg.temperature)
    # A pruned encoder keeps its zeros on squad too, unless --information-deletion.
    hooks = fine_tuning_hooks(model, resolve_model(cfg.model), getattr(cfg, "information_deletion", False),
                              hook_factory)
    name = cfg.name or f"{spec.name}-{cfg.objective}"
    with RunDir(command, name=name, out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), command, hooks)
        t0 = time.time()
        feats = prepare_train_features(tokenizer, data["train"].examples, cfg.max_length, doc_stride)
        result = train(model, tokenizer, feats, cfg, hooks, log=run.log_metrics,
                       checkpoint_dir=run.checkpoint_dir, resume=cfg.resume,
                       collate=partial(collate_features, tokenizer), loss_fn=objective.loss,
                       extra_modules=[objective])
        train_s = time.time() - t0
        metrics, preds = evaluate_qa(model, tokenizer, data["dev"], cfg.max_length, doc_stride,
                                     cfg.n_best, cfg.max_answer_length, cfg.eval_batch_size)
        run.log_metrics({"step": result["steps"], "eval": metrics})
        meta = {"task": QA_TASK, "head": "question-answering", "max_length": cfg.max_length,
                "doc_stride": doc_stride, "n_best": cfg.n_best,
                "max_answer_length": cfg.max_answer_length, "base_model": cfg.model,
                "objective": cfg.objective, **(extra_meta or {})}
        save_run_model(run, model, tokenizer, meta, hooks)
        (run.path / "predictions.json").write_text(json.dumps(preds, indent=1) + "\n", encoding="utf-8")
        summary = {"command": command, "task": spec.name, "model": cfg.model, "objective": cfg.objective,
                   "train_questions": len(data["train"]), "train_windows": len(feats),
                   "train_articles": len(data["train"].articles),
                   "eval_questions": len(data["dev"]), "eval_articles": len(data["dev"].articles),
                   "skipped_bad_examples": data["train"].skipped, "steps": result["steps"],
                   "final_loss": result["final_loss"], "train_seconds": round(train_s, 1),
                   "metric": spec.metric, "eval": metrics}
        if teacher is not None:
            t_metrics, t_preds = evaluate_qa(teacher, tokenizer, data["dev"], cfg.max_length, doc_stride,
                                             cfg.n_best, cfg.max_answer_length, cfg.eval_batch_size)
            summary["distillation"] = {
                "teacher": cfg.teacher, "kd_lambda": cfg.lambda_for(False), "temperature": cfg.temperature,
                "kd_hidden": 0.0, "kd_layers": 0.0, "teacher_eval": t_metrics,
                "agreement_with_teacher": answer_agreement(preds, t_preds)}
        run.write_summary(summary)
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    if run.rank == 0:  # one line per run, not one per process
        print(f"{spec.name}: EM = {metrics['exact_match']:.2f}, F1 = {metrics['f1']:.2f} on "
              f"{metrics['n']} questions ({result['steps']} steps, {train_s:.0f}s) -> {run.path}")
    return run.path


def eval_qa(cfg) -> dict:
    """Re-evaluate a squad model on the eval split; writes an eval run folder."""
    spec = get_task(cfg.task)
    data = load_qa_data(cfg, ("dev",))
    model, tokenizer, meta = load_qa_model(cfg.model, require_finetuned=True)
    max_length = cfg.max_length or meta.get("max_length", 384)
    if cfg.doc_stride is not None:
        doc_stride = effective_doc_stride(cfg, max_length)
    else:  # the trained stride, unless a shorter --max-length leaves it no room (then the default)
        saved = meta.get("doc_stride")
        doc_stride = saved if saved is not None and saved < max_length // 2 else max_length // 3
    if torch.cuda.is_available():
        model.to("cuda")
    with RunDir("eval", name=spec.name, out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        metrics, preds = evaluate_qa(model, tokenizer, data["dev"], max_length, doc_stride, cfg.n_best,
                                     cfg.max_answer_length, cfg.batch_size)
        (run.path / "predictions.json").write_text(json.dumps(preds, indent=1) + "\n", encoding="utf-8")
        run.write_summary({"command": "eval", "task": spec.name, "model": cfg.model,
                           "metric": spec.metric, "skipped_bad_examples": data["dev"].skipped,
                           "eval": metrics})
    print(f"{spec.name}: EM = {metrics['exact_match']:.2f}, F1 = {metrics['f1']:.2f} on "
          f"{metrics['n']} questions -> {run.path}")
    return metrics


__all__ = ["evaluate_qa", "eval_qa", "finetune_qa", "load_qa_model"]
