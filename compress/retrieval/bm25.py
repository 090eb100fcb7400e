"""The BM25 baseline through ``bm25s`` (Lucene-style BM25, English stop words, no stemming)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bm25_order(questions: Sequence[str], sentences: Sequence[str], k: int | None = None,
               k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Candidate indices ranked by BM25 for each question: (n_questions, k), k = all by default."""
    import bm25s

    k = len(sentences) if k is None else min(k, len(sentences))
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(bm25s.tokenize(list(sentences), stopwords="en", show_progress=False),
                    show_progress=False)
    q_tokens = bm25s.tokenize(list(questions), stopwords="en", show_progress=False)
    docs, _ = retriever.retrieve(q_tokens, k=k, show_progress=False, n_threads=1)
    return np.asarray(docs, dtype=np.int64)
