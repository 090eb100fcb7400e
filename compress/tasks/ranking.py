"""ReQA metrics. P@N follows ReQA (Ahmad et al. 2019): the share of questions with a correct
sentence among the top N (one target per question, so it equals recall@N); MRR is the mean over
questions of 1 / rank of the first correct sentence (0 when none is ranked)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def first_gold_ranks(order: np.ndarray, gold: Sequence[Sequence[int]]) -> np.ndarray:
    """1-based rank of the first gold candidate in each row of ``order`` (n_q, k); inf if absent."""
    ranks = np.full(len(gold), np.inf)
    for i, g in enumerate(gold):
        hit = np.flatnonzero(np.isin(order[i], list(g)))
        if hit.size:
            ranks[i] = hit[0] + 1
    return ranks


def retrieval_metrics(order: np.ndarray, gold: Sequence[Sequence[int]], ks: Sequence[int] = (1, 5, 10)
                      ) -> dict[str, float]:
    ranks = first_gold_ranks(order, gold)
    out = {f"p@{k}": float(np.mean(ranks <= k)) for k in ks}
    out["mrr"] = float(np.mean(np.where(np.isfinite(ranks), 1.0 / ranks, 0.0)))
    out["n"] = len(gold)
    return out


def order_from_scores(scores: np.ndarray) -> np.ndarray:
    """Candidate indices by decreasing score, ties broken by index (stable)."""
    return np.argsort(-scores, axis=1, kind="stable")
