"""SQuAD's model and data for a run: the span model (``load_qa_model``), the limited splits
(``load_qa_data``) and the official EM/F1 of a model on a split (``evaluate_qa``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compress.core.errors import ModelError
from compress.models.loading import (
    announce_new_head,
    load_pretrained,
    load_tokenizer,
    match_tokenizer_inputs,
    read_meta,
    resolve_model,
)
from compress.qa.features import collate_features, prepare_eval_features
from compress.qa.postprocess import postprocess_predictions
from compress.qa.squad_metric import squad_scores
from compress.tasks.qa import QADataset, load_squad_split

QA_TASK = "squad"


def load_qa_model(spec: str, require_finetuned: bool = False):
    """``AutoModelForQuestionAnswering`` (outputs start_logits/end_logits); a fresh span head on a
    plain encoder. ``require_finetuned`` refuses a model that was not fine-tuned on squad."""
    from transformers import AutoModelForQuestionAnswering

    path = resolve_model(spec)
    meta = read_meta(path)
    if require_finetuned and meta.get("task") != QA_TASK:
        raise ModelError(f"model '{spec}' was not fine-tuned on squad (its task is "
                         f"{meta.get('task')!r}); pass a run folder of 'compress finetune --task squad'")
    model = load_pretrained(AutoModelForQuestionAnswering, spec, path, "a question-answering model")
    if meta.get("task") != QA_TASK:
        announce_new_head("span start/end (qa_outputs)")
    return model, match_tokenizer_inputs(load_tokenizer(spec), model), meta


def load_qa_data(cfg, splits: Sequence[str] = ("train", "dev")) -> dict[str, QADataset]:
    """The requested splits, limited by --train-limit/--eval-limit (questions)."""
    opts = cfg.data_options()
    out = {}
    for s in splits:
        ds = load_squad_split(opts, s, cfg.split_by_article, cfg.skip_bad_examples)
        ds = ds.subset(cfg.train_limit if s == "train" else cfg.eval_limit)
        if len(ds) == 0:
            from compress.core.errors import DataError

            raise DataError(f"squad: split '{s}' has no questions")
        out[s] = ds
    return out


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def predict_spans(model, tokenizer, feats: list[dict], batch_size: int) -> tuple[list, list]:
    """Start and end logits per window, each trimmed to the window's length."""
    model.eval()
    device = _device(model)
    starts, ends = [], []
    for i in range(0, len(feats), batch_size):
        rows = feats[i:i + batch_size]
        batch = {k: v.to(device) for k, v in collate_features(tokenizer, rows).items()}
        out = model(**batch)
        s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
        for j, r in enumerate(rows):
            n = len(r["input_ids"])
            starts.append(s[j, :n])
            ends.append(e[j, :n])
    return starts, ends


def evaluate_qa(model, tokenizer, ds: QADataset, max_length: int, doc_stride: int, n_best: int = 20,
                max_answer_length: int = 30, batch_size: int = 64) -> tuple[dict, dict[str, str]]:
    """Official EM/F1 (percent, as the SQuAD script reports them) of ``model`` on ``ds``; ``score``
    is F1 as a fraction, the scale of every other task's score (reports and sweeps multiply by
    100). Returns (metrics, predictions)."""
    feats = prepare_eval_features(tokenizer, ds.examples, max_length, doc_stride)
    starts, ends = predict_spans(model, tokenizer, feats, batch_size)
    preds = postprocess_predictions(ds.examples, feats, starts, ends, n_best, max_answer_length)
    refs = {e.qid: list(e.answers) for e in ds.examples}
    m = squad_scores(preds, refs)
    m.update({"score": m["f1"] / 100.0, "n": len(ds), "windows": len(feats)})
    return m, preds
