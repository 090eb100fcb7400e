"""Distil a sentence-embedding teacher into static token vectors (Model2Vec's recipe, Tulkens & van
Dongen 2024): no training, three steps.

1. **Token pass**: every vocabulary token except the special ones goes through the teacher alone,
   as ``[CLS] token [SEP]``; its vector is the teacher's pooled output of that input (its own
   pooling mode, before normalisation).
2. **PCA** to ``dims`` dimensions (scikit-learn), which also centres the vectors: the shared
   direction every output of an encoder carries would otherwise dominate every mean.
3. **Frequency weighting** (SIF, Arora et al. 2017): each vector is scaled by ``a / (a + p(token))``
   so frequent, uninformative tokens count less in a sentence's mean. ``p`` is counted on
   unlabelled text (``weighting="text"``, add-one smoothed) or, as Model2Vec does, taken from
   Zipf's law on the vocabulary order (``weighting="zipf"``: ``p`` proportional to ``1 / rank``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from compress.core.errors import UsageError
from compress.embedding.model import SentenceEncoder, pool
from students.static_embedding import StaticEmbeddingConfig, StaticEmbeddingStudent

WEIGHTINGS = ("text", "zipf")
SIF_COEFFICIENT = 1e-4
DEFAULT_DIMS = 256


def special_ids(tokenizer) -> list[int]:
    """Ids of the tokenizer's special tokens other than the unknown token (a word the vocabulary
    lacks still says something)."""
    return sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})


@torch.no_grad()
def token_vectors(teacher: SentenceEncoder, tokenizer, batch_size: int = 512) -> torch.Tensor:
    """(vocab, hidden): each token's teacher output alone between the tokenizer's own special
    tokens (step 1); special tokens get zeros."""
    teacher.eval()
    device = next(teacher.parameters()).device
    vocab = teacher.config.vocab_size
    specials = set(special_ids(tokenizer))
    ids = [i for i in range(min(vocab, len(tokenizer))) if i not in specials]
    plain = tokenizer("word", add_special_tokens=False)["input_ids"]
    full = tokenizer("word")["input_ids"]
    at = full.index(plain[0])
    wrapped = full[:at] + [ids[0]] + full[at + len(plain):]  # the tokenizer's own special tokens
    out = torch.zeros(vocab, teacher.config.hidden_size)
    for i in range(0, len(ids), batch_size):
        chunk = torch.tensor(ids[i:i + batch_size])
        x = torch.tensor(wrapped).repeat(len(chunk), 1)
        x[:, at] = chunk
        mask = torch.ones_like(x)
        hidden = teacher.encoder(input_ids=x.to(device), attention_mask=mask.to(device)).last_hidden_state
        out[chunk] = pool(hidden, mask.to(device), teacher.pooling.mode).float().cpu()
    return out


def zipf_probabilities(vocab: int) -> np.ndarray:
    """p(token of id i) proportional to 1 / (i + 2): Model2Vec's assumption that ids follow frequency."""
    inv = 1.0 / np.arange(2, vocab + 2)
    return inv / inv.sum()


def text_probabilities(tokenizer, texts: Sequence[str], vocab: int) -> np.ndarray:
    """p(token) counted on ``texts`` (no special tokens), add-one smoothed over the vocabulary."""
    counts = np.ones(vocab)
    for i in range(0, len(texts), 2000):
        for row in tokenizer(list(texts[i:i + 2000]), add_special_tokens=False, verbose=False)["input_ids"]:
            np.add.at(counts, np.asarray(row, dtype=np.int64), 1)
    return counts / counts.sum()


def sif_weights(p: np.ndarray, a: float = SIF_COEFFICIENT) -> np.ndarray:
    return a / (a + p)


def distil_static(teacher: SentenceEncoder, tokenizer, dims: int = DEFAULT_DIMS, weighting: str = "text",
                  texts: Sequence[str] = (), sif_coefficient: float = SIF_COEFFICIENT, seed: int = 0
                  ) -> tuple[StaticEmbeddingStudent, dict]:
    """The student and a report (explained variance of the PCA, the weighting and its source)."""
    from sklearn.decomposition import PCA

    if weighting not in WEIGHTINGS:
        raise UsageError(f"unknown weighting '{weighting}'; choose one of: {', '.join(WEIGHTINGS)}")
    if weighting == "text" and not texts:
        raise UsageError("weighting 'text' counts token frequencies on unlabelled text, and none was given; "
                         "pass text or use weighting 'zipf'")
    vectors = token_vectors(teacher, tokenizer)
    vocab, hidden = vectors.shape
    if not 1 <= dims <= hidden:
        raise UsageError(f"--dims {dims}: the static vectors keep between 1 and the teacher's {hidden} "
                         "dimensions")
    skip = special_ids(tokenizer)
    rows = np.setdiff1d(np.arange(vocab), skip)
    pca = PCA(n_components=dims, random_state=seed)
    reduced = np.zeros((vocab, dims), dtype=np.float32)
    reduced[rows] = pca.fit_transform(vectors[rows].numpy())
    p = text_probabilities(tokenizer, texts, vocab) if weighting == "text" else zipf_probabilities(vocab)
    reduced *= sif_weights(p, sif_coefficient)[:, None].astype(np.float32)
    config = StaticEmbeddingConfig(vocab, dims, teacher.pooling.normalize, tuple(skip))
    report = {"recipe": "token pass, PCA, SIF frequency weighting (Model2Vec)", "dims": dims,
              "pca_explained_variance": float(pca.explained_variance_ratio_.sum()), "weighting": weighting,
              "sif_coefficient": sif_coefficient, "vocab": vocab, "special_tokens_skipped": len(skip),
              **({"frequency_texts": len(texts)} if weighting == "text" else {})}
    return StaticEmbeddingStudent(config, torch.from_numpy(reduced)), report
