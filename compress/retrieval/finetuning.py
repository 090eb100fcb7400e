"""ReQA's data for a run (``load_reqa_data``), its gold pairs and metrics, and the dual encoder's
training run (``train_and_save_dual_encoder``), shared by fine-tuning on gold pairs and the mining
distillation's gold + mined pairs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from compress.core.config import to_dict
from compress.core.errors import DataError
from compress.core.runs import RunDir
from compress.models.loading import resolve_model
from compress.pruning.pruner import fine_tuning_hooks
from compress.report.saving import save_run_model
from compress.retrieval.bm25 import bm25_order
from compress.retrieval.dual_encoder import (
    REQA_TASK,
    dual_encoder_order,
    load_dual_encoder,
    train_dual_encoder,
)
from compress.tasks.ranking import retrieval_metrics
from compress.tasks.retrieval import ReQADataset, load_reqa_split
from compress.training.trackers import start_tracking


def load_reqa_data(cfg, splits: Sequence[str] = ("train", "dev")) -> dict[str, ReQADataset]:
    opts = cfg.data_options()
    out = {}
    for s in splits:
        ds = load_reqa_split(opts, s, cfg.split_by_article, cfg.skip_bad_examples)
        ds = ds.subset(cfg.train_limit if s == "train" else cfg.eval_limit)
        if len(ds) == 0:
            raise DataError(f"reqa: split '{s}' has no questions")
        out[s] = ds
    return out


def gold_pairs(ds: ReQADataset) -> list[tuple[int, int, float]]:
    """(question, gold sentence, weight 1) for every gold sentence of every question."""
    return [(i, j, 1.0) for i, g in enumerate(ds.gold) for j in g]


def bm25_metrics(ds: ReQADataset) -> dict:
    return retrieval_metrics(bm25_order(ds.questions, ds.sentences), ds.gold)


def dual_encoder_metrics(model, tokenizer, ds: ReQADataset, max_length: int, batch_size: int) -> dict:
    return retrieval_metrics(dual_encoder_order(model, tokenizer, ds.questions, ds.sentences, max_length,
                                                batch_size), ds.gold)


def _fmt(m: dict) -> str:
    return ", ".join(f"{k} = {m[k]:.3f}" for k in ("p@1", "p@5", "p@10", "mrr"))


def train_and_save_dual_encoder(cfg, data: dict[str, ReQADataset], pairs, command: str, name: str,
                                hook_factory=None, extra_meta: dict | None = None,
                                extra_summary: dict | None = None,
                                extra_files: Callable[[Path], None] | None = None) -> Path:
    """Shared by fine-tuning (gold pairs) and mining distillation (gold + mined pairs)."""
    model, tokenizer, _ = load_dual_encoder(cfg.model)
    hooks = fine_tuning_hooks(model.encoder, resolve_model(cfg.model),
                              getattr(cfg, "information_deletion", False), hook_factory)
    with RunDir(command, name=name, out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), command, hooks)
        t0 = time.time()
        result = train_dual_encoder(model, tokenizer, pairs, data["train"].questions,
                                    data["train"].sentences, cfg, cfg.retrieval_scale, hooks,
                                    log=run.log_metrics)
        train_s = time.time() - t0
        de = dual_encoder_metrics(model, tokenizer, data["dev"], cfg.max_length, cfg.eval_batch_size)
        bm = bm25_metrics(data["dev"])
        run.log_metrics({"step": result["steps"], "eval": de})
        meta = {"task": REQA_TASK, "head": "dual-encoder", "pooling": "mean", "normalize": True,
                "max_length": cfg.max_length, "scale": cfg.retrieval_scale, "base_model": cfg.model,
                **(extra_meta or {})}
        save_run_model(run, model.encoder, tokenizer, meta, hooks)
        if extra_files:
            extra_files(run.path)
        summary = {"command": command, "task": REQA_TASK, "model": cfg.model,
                   "train_questions": len(data["train"]), "train_pairs": len(pairs),
                   "eval_questions": len(data["dev"]), "eval_candidates": len(data["dev"].sentences),
                   "steps": result["steps"], "final_loss": result["final_loss"],
                   "train_seconds": round(train_s, 1), "metric": "mrr",
                   "eval": {**de, "score": de["mrr"]}, "bm25": bm, **(extra_summary or {})}
        run.write_summary(summary)
    if run.rank == 0:  # one line per run, not one per process
        print(f"reqa dual encoder: {_fmt(de)} on {de['n']} questions / {len(data['dev'].sentences)} "
              f"sentences (BM25: {_fmt(bm)}) -> {run.path}")
    return run.path
