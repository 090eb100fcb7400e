"""ReQA workflows: fine-tune a dual encoder on gold (question, answer sentence) pairs of the train
split, then rank every candidate sentence of the eval split; BM25 is reported beside it.

``--model bm25`` in ``compress eval --task reqa`` evaluates the BM25 baseline alone.
"""

from __future__ import annotations

from pathlib import Path

import torch

from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir
from compress.retrieval.dual_encoder import REQA_TASK, load_dual_encoder
from compress.retrieval.finetuning import (
    _fmt,
    bm25_metrics,
    dual_encoder_metrics,
    gold_pairs,
    load_reqa_data,
    train_and_save_dual_encoder,
)
from compress.tasks import get_task

BM25_MODEL = "bm25"


def finetune_reqa(cfg, command: str = "finetune", hook_factory=None, extra_meta: dict | None = None) -> Path:
    if cfg.resume:
        raise UsageError("--resume is not supported for reqa yet; start a new run")
    get_task(cfg.task)
    data = load_reqa_data(cfg)
    return train_and_save_dual_encoder(cfg, data, gold_pairs(data["train"]), command,
                                       cfg.name or "reqa", hook_factory, extra_meta)


def eval_reqa(cfg) -> dict:
    """Evaluate a ReQA dual encoder (or ``--model bm25``) on the eval split."""
    data = load_reqa_data(cfg, ("dev",))
    ds = data["dev"]
    if cfg.model == BM25_MODEL:
        model = tokenizer = None
        max_length = None
    else:
        model, tokenizer, meta = load_dual_encoder(cfg.model, require_finetuned=True)
        max_length = cfg.max_length or meta.get("max_length", 128)
        if torch.cuda.is_available():
            model.to("cuda")
    with RunDir("eval", name=REQA_TASK, out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        if model is None:
            m = bm25_metrics(ds)
        else:
            m = dual_encoder_metrics(model, tokenizer, ds, max_length, cfg.batch_size)
        m["score"] = m["mrr"]
        run.write_summary({"command": "eval", "task": REQA_TASK, "model": cfg.model, "metric": "mrr",
                           "eval_candidates": len(ds.sentences), "eval": m})
    print(f"reqa ({cfg.model}): {_fmt(m)} on {m['n']} questions / {len(ds.sentences)} sentences "
          f"-> {run.path}")
    return m
