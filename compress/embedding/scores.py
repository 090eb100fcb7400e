"""Scores of a sentence-embedding model, from any ``encode(texts) -> (N, H)`` function (the PyTorch
model, an onnxruntime session, a static-embedding student, a peer library):

- ``reqa``: P@1/5/10 and MRR of ranking every candidate sentence by cosine to the question;
- ``pairs``: ROC-AUC of the cosine of each pair against its 0/1 label (MRPC), where pairs exist;
- ``cosine_to_reference``: mean and minimum over the held-out texts of the cosine between these
  embeddings and the reference model's (the uncompressed original), where a reference is given.

``score`` is ReQA P@1 (the task's primary metric). Each text is embedded once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from compress.tasks.embedding import EmbeddingEval
from compress.tasks.ranking import order_from_scores, retrieval_metrics

Encode = Callable[[Sequence[str]], torch.Tensor]
PRIMARY = "p@1"


def unit(x) -> torch.Tensor:
    return F.normalize(torch.as_tensor(np.asarray(x), dtype=torch.float32), dim=-1)


def heldout_embeddings(encode: Encode, data: EmbeddingEval) -> tuple[list[str], torch.Tensor]:
    """(texts, unit embeddings) of every distinct scored text."""
    texts = data.heldout_texts()
    return texts, unit(encode(texts))


def pair_auc(cos: np.ndarray, labels: Sequence[int]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.asarray(labels), cos))


def embedding_scores(encode: Encode, data: EmbeddingEval, reference: torch.Tensor | None = None
                     ) -> tuple[dict, torch.Tensor]:
    """(scores, the unit embeddings of ``data.heldout_texts()``; pass them as ``reference`` to score
    a compressed model against this one)."""
    texts, emb = heldout_embeddings(encode, data)
    row = {t: i for i, t in enumerate(texts)}

    def rows(ts):
        return emb[[row[t] for t in ts]]

    r = data.reqa
    ranked = order_from_scores((rows(r.questions) @ rows(r.sentences).T).numpy())
    out: dict = {"reqa": retrieval_metrics(ranked, r.gold)}
    out["reqa"]["candidates"] = len(r.sentences)
    if data.pairs is not None:
        cos = (rows(data.pairs.texts) * rows(data.pairs.pairs)).sum(-1).numpy()
        out["pairs"] = {"roc_auc": pair_auc(cos, data.pairs.labels), "n": len(cos)}
    if reference is not None:
        c = (emb * reference).sum(-1)
        out["cosine_to_reference"] = {"mean": float(c.mean()), "min": float(c.min()), "n": len(texts)}
    out["score"] = out["reqa"][PRIMARY]
    return out, emb


def brief(scores: dict) -> str:
    """One line: P@1, MRR, pair AUC and cosine to the reference where present."""
    parts = [f"ReQA P@1 {scores['reqa']['p@1']:.4f}", f"MRR {scores['reqa']['mrr']:.4f}"]
    if "pairs" in scores:
        parts.append(f"MRPC cosine AUC {scores['pairs']['roc_auc']:.4f}")
    if "cosine_to_reference" in scores:
        parts.append(f"cosine to original {scores['cosine_to_reference']['mean']:.4f}")
    return ", ".join(parts)
