"""Cross-attention supervised data augmentation for ReQA (the seed paper "Neural Retrieval for
Question Answering with Cross-Attention Supervised Data Augmentation").

1. A cross-encoder (a BERT sequence classifier on "question [SEP] sentence", labels
   irrelevant/relevant) is trained on the gold pairs of the train split with negatives 1:1: each
   positive gets one negative, drawn in turn from the question's BM25 top-10, from other sentences
   of the same document, and from random sentences of the split.
2. It scores the BM25 top-k candidates (k = 10) of the training questions; a non-gold candidate with
   p(relevant) >= 0.5 becomes an extra positive of weight w = p^2 (gold pairs weigh 1).
3. The dual encoder is trained with the weighted in-batch softmax on gold + mined pairs.

``compress distill --task reqa --student dual-encoder --teacher CROSS_ENCODER`` runs
``run_reqa_mining_distill``. CROSS_ENCODER is a cross-encoder saved by an earlier run (its
compress.json says task 'reqa-cross-encoder'), used as is; any other model (e.g. 'minilm') is first
fine-tuned as the cross-encoder, and saved in the run folder under teacher/.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from compress.api.finetuning import FinetuneConfig
from compress.core.config import check_choice, check_range, option, option_like
from compress.core.errors import UsageError
from compress.models.loading import load_classifier, read_meta, resolve_model
from compress.report.saving import save_model
from compress.retrieval.bm25 import bm25_order
from compress.retrieval.finetuning import gold_pairs, load_reqa_data, train_and_save_dual_encoder
from compress.tasks.base import TextDataset
from compress.tasks.retrieval import ReQADataset
from compress.training.loop import encode, make_collate, predict, train

CROSS_TASK = "reqa-cross-encoder"
CROSS_LABELS = ("irrelevant", "relevant")
STUDENTS = ("dual-encoder",)


@dataclass(frozen=True)
class ReQAMiningConfig(FinetuneConfig):
    """FinetuneConfig (``model`` = the dual encoder's starting encoder) plus the teacher's options."""

    task: str = option_like(FinetuneConfig, "task", "reqa")
    student: str = option("dual-encoder", choices=STUDENTS, help="the retrieval student")
    teacher: str = option("minilm", help="the cross-encoder: a run fine-tuned on reqa pairs, or "
                                         "'minilm' to fine-tune one first")
    teacher_epochs: float = option(3.0, help="epochs when fine-tuning the cross-encoder first")
    teacher_lr: float = option(5e-5, help="learning rate when fine-tuning the cross-encoder first")
    teacher_train_limit: int | None = option(None, help="train the cross-encoder on the first N "
                                                        "training questions only")
    mining_top_k: int = option(10, help="BM25 candidates per question that the cross-encoder scores")
    mining_threshold: float = option(0.5, help="a candidate with p(relevant) >= this becomes a "
                                               "positive of weight p^2")
    # 0: mine the labeled questions only
    unlabeled_questions: int = option(0, help="N more training questions after --train-limit whose "
                                              "gold stays hidden: only mined pairs speak for them")

    def __post_init__(self):
        FinetuneConfig.__post_init__(self)
        if self.task != "reqa":
            raise UsageError(f"cross-attention mining works on --task reqa, got '{self.task}'")
        check_choice("student", self.student, STUDENTS)
        check_range("teacher_epochs", self.teacher_epochs, 0, lo_open=True)
        check_range("teacher_lr", self.teacher_lr, 0, lo_open=True)
        check_range("mining_top_k", self.mining_top_k, 1)
        check_range("mining_threshold", self.mining_threshold, 0, 1)
        if self.teacher_train_limit is not None:
            check_range("teacher_train_limit", self.teacher_train_limit, 1)
        check_range("unlabeled_questions", self.unlabeled_questions, 0)
        if self.unlabeled_questions and self.train_limit is None:
            raise UsageError("--unlabeled-questions takes the questions after the first --train-limit; "
                             "add --train-limit N")


def _sentences_by_context(ds: ReQADataset) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for j, c in enumerate(ds.sentence_context):
        out.setdefault(c, []).append(j)
    return out


def cross_encoder_examples(ds: ReQADataset, bm25: np.ndarray, seed: int = 0,
                           n_questions: int | None = None) -> tuple[TextDataset, list[str]]:
    """Gold pairs (label 1) and one negative per positive (label 0), the negative's source cycling
    bm25 -> same document -> random. Returns the pair dataset and the source of each row."""
    rng = random.Random(seed)
    by_ctx = _sentences_by_context(ds)
    texts, pairs, labels, sources = [], [], [], []
    turn = 0
    for i in range(min(len(ds), n_questions or len(ds))):
        gold = set(ds.gold[i])
        for g in ds.gold[i]:
            texts.append(ds.questions[i])
            pairs.append(ds.sentences[g])
            labels.append(1)
            sources.append("gold")
            pools = {"bm25": [j for j in bm25[i][:10].tolist() if j not in gold],
                     "same_document": [j for j in by_ctx[ds.sentence_context[g]] if j not in gold],
                     "random": None}
            order = ("bm25", "same_document", "random")
            for k in range(3):  # the next source in turn that has a candidate
                src = order[(turn + k) % 3]
                pool = pools[src]
                if pool is None:
                    if len(ds.sentences) <= len(gold):
                        continue
                    j = rng.randrange(len(ds.sentences))
                    while j in gold:
                        j = rng.randrange(len(ds.sentences))
                elif pool:
                    j = rng.choice(pool)
                else:
                    continue
                texts.append(ds.questions[i])
                pairs.append(ds.sentences[j])
                labels.append(0)
                sources.append(src)
                break
            turn += 1
    return TextDataset(texts, labels, CROSS_LABELS, pairs), sources


def relevance_probabilities(model, tokenizer, questions: Sequence[str], sentences: Sequence[str],
                            max_length: int, batch_size: int) -> np.ndarray:
    """p(relevant) of each (question, sentence) pair under the cross-encoder."""
    ds = TextDataset(list(questions), [0] * len(questions), CROSS_LABELS, list(sentences))
    logits = predict(model, encode(tokenizer, ds, max_length), make_collate(tokenizer), batch_size)
    return torch.softmax(torch.from_numpy(logits), dim=-1)[:, 1].numpy()


def mine_pairs(model, tokenizer, ds: ReQADataset, bm25: np.ndarray, top_k: int, threshold: float,
               max_length: int, batch_size: int) -> list[tuple[int, int, float]]:
    """(question, sentence, weight p^2) for non-gold BM25 top-k candidates with p >= threshold."""
    cand = [(i, int(j)) for i in range(len(ds)) for j in bm25[i][:top_k] if int(j) not in ds.gold[i]]
    if not cand:
        return []
    p = relevance_probabilities(model, tokenizer, [ds.questions[i] for i, _ in cand],
                                [ds.sentences[j] for _, j in cand], max_length, batch_size)
    return [(i, j, float(pi) ** 2) for (i, j), pi in zip(cand, p) if pi >= threshold]


def teacher_accuracy(model, tokenizer, ds: ReQADataset, cfg, n_questions: int = 200) -> float:
    """Accuracy of the cross-encoder at p >= threshold on held-out pairs built like its training
    pairs (gold + one negative each): a teacher near 0.5 would mine noise."""
    bm25 = bm25_order(ds.questions[:n_questions], ds.sentences, k=10)
    pairs, _ = cross_encoder_examples(ds.subset(n_questions), bm25, cfg.seed)
    p = relevance_probabilities(model, tokenizer, pairs.texts, pairs.pairs, cfg.max_length,
                                cfg.eval_batch_size)
    return float(np.mean((p >= cfg.mining_threshold) == (np.array(pairs.labels) == 1)))


def _teacher(cfg: ReQAMiningConfig, ds: ReQADataset, bm25: np.ndarray):
    """A ready cross-encoder, or one fine-tuned now from ``cfg.teacher``; returns (model, tok, info)."""
    meta = read_meta(resolve_model(cfg.teacher))
    if meta.get("task") == CROSS_TASK:
        model, tok, _ = load_classifier(cfg.teacher, CROSS_LABELS, strict_labels=True)
        return model, tok, {"teacher": cfg.teacher, "teacher_trained_here": False}
    pairs, sources = cross_encoder_examples(ds, bm25, cfg.seed, cfg.teacher_train_limit)
    model, tok, _ = load_classifier(cfg.teacher, CROSS_LABELS)
    tcfg = replace(cfg, epochs=cfg.teacher_epochs, max_steps=None, lr=cfg.teacher_lr)
    result = train(model, tok, encode(tok, pairs, cfg.max_length), tcfg)
    counts = {s: sources.count(s) for s in ("gold", "bm25", "same_document", "random")}
    return model, tok, {"teacher": cfg.teacher, "teacher_trained_here": True, "teacher_lr": tcfg.lr,
                        "teacher_pairs": counts, "teacher_steps": result["steps"]}


def hide_gold(ds: ReQADataset, n_labeled: int) -> ReQADataset:
    """The same questions with the gold of every question from ``n_labeled`` on removed."""
    return replace(ds, gold=[g if i < n_labeled else () for i, g in enumerate(ds.gold)])


def run_reqa_mining_distill(cfg: ReQAMiningConfig, command: str = "distill") -> Path:
    """Teacher cross-encoder -> mined pairs -> dual encoder on gold + mined; returns the run folder.

    With ``unlabeled_questions`` N the train split's first ``train_limit`` questions keep their gold
    and the next N are unlabeled: only the cross-encoder's mined pairs speak for them.
    """
    pool = None if cfg.train_limit is None else cfg.train_limit + cfg.unlabeled_questions
    data = load_reqa_data(replace(cfg, train_limit=pool))
    n_labeled = min(len(data["train"]), cfg.train_limit or len(data["train"]))
    train_ds = data["train"] = hide_gold(data["train"], n_labeled)
    bm25 = bm25_order(train_ds.questions, train_ds.sentences, k=max(10, cfg.mining_top_k))
    teacher, tok, info = _teacher(cfg, train_ds.subset(n_labeled), bm25)
    info["teacher_dev_accuracy"] = teacher_accuracy(teacher, tok, data["dev"], cfg)
    print(f"reqa cross-encoder: pair accuracy {info['teacher_dev_accuracy']:.4f} on held-out questions "
          f"(gold + one negative each, p >= {cfg.mining_threshold})", flush=True)
    mined = mine_pairs(teacher, tok, train_ds, bm25, cfg.mining_top_k, cfg.mining_threshold,
                       cfg.max_length, cfg.eval_batch_size)
    gold = gold_pairs(train_ds)
    n_cand = sum(1 for i in range(len(train_ds)) for j in bm25[i][:cfg.mining_top_k]
                 if int(j) not in train_ds.gold[i])
    info.update({"mined_pairs": len(mined), "gold_pairs": len(gold), "mining_candidates": n_cand,
                 "mined_weight_mean": float(np.mean([w for _, _, w in mined])) if mined else None,
                 "labeled_questions": n_labeled, "unlabeled_questions": len(train_ds) - n_labeled,
                 "mined_pairs_unlabeled": sum(1 for i, _, _ in mined if i >= n_labeled)})

    def write_extra(folder: Path) -> None:
        if info["teacher_trained_here"]:
            save_model(teacher, tok, folder / "teacher",
                       {"task": CROSS_TASK, "label_names": list(CROSS_LABELS), "max_length": cfg.max_length,
                        "base_model": cfg.teacher})
        with open(folder / "mined_pairs.jsonl", "w", encoding="utf-8") as fh:
            for i, j, w in mined:
                fh.write(json.dumps({"qid": train_ds.qids[i], "question": train_ds.questions[i],
                                     "sentence": train_ds.sentences[j], "weight": w,
                                     "labeled_question": i < n_labeled}) + "\n")

    return train_and_save_dual_encoder(cfg, data, gold + mined, command, cfg.name or "reqa-mined",
                                       extra_meta={"teacher": cfg.teacher, "mined_pairs": len(mined)},
                                       extra_summary={"mining": info}, extra_files=write_extra)
