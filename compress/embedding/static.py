"""Distil a sentence-embedding teacher into static token vectors: Model2Vec's recipe (Tulkens & van
Dongen 2024) run by model2vec itself, then what this project adds.

1. **Model2Vec's distillation** (``model2vec.distill.distill_from_model``): every token of the
   teacher's vocabulary (``[unusedN]`` tokens dropped) goes through the teacher alone between its
   own special tokens and is pooled (the teacher's mean, or its first token for CLS pooling); PCA to
   ``dims`` dimensions; each vector scaled by ``a / (a + p(token))`` (SIF, Arora et al. 2017) with
   ``p`` from Zipf's law on the vocabulary order (``weighting="zipf"``).
2. Or ``p`` counted on unlabelled text (``weighting="text"``, add-one smoothed) with the student's
   own tokenizer.
3. **Teacher-aligned tuning** (``AlignConfig``, this project's addition): the teacher embeds the
   unlabelled text once, and the table is tuned so that the student's in-batch similarities follow
   the teacher's (``align_static``).

The result is a ``model2vec.StaticModel`` kept in float32 (``dtype="float16"`` halves the file and
rounds every embedding to float16), its unknown token's vector zero and no truncation of long texts
(both below), saved by model2vec: ``students.static_embedding``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from compress.core.errors import UsageError
from compress.embedding.model import SentenceEncoder

WEIGHTINGS = ("text", "zipf")
DTYPES = ("float32", "float16")
SIF_COEFFICIENT = 1e-4
DEFAULT_DIMS = 256
# the teacher's pooling -> model2vec's pooling of one token between the special tokens; model2vec
# has no max pooling, and the max over [CLS] token [SEP] is closest to their mean
TOKEN_POOLING = {"mean": "mean", "cls": "first", "max": "mean"}


def text_probabilities(model, texts: Sequence[str]) -> np.ndarray:
    """p(token) counted on ``texts`` with the student's tokenizer (model2vec's tokens), add-one
    smoothed over the vocabulary."""
    counts = np.ones(len(model.tokens))
    for i in range(0, len(texts), 2000):
        for row in model.tokenize(list(texts[i:i + 2000])):
            np.add.at(counts, np.asarray(row, dtype=np.int64), 1)
    return counts / counts.sum()


def sif_weights(p: np.ndarray, a: float = SIF_COEFFICIENT) -> np.ndarray:
    return a / (a + p)


def check_static_settings(dims: int, hidden: int, weighting: str, texts: Sequence[str], dtype: str) -> None:
    if weighting not in WEIGHTINGS:
        raise UsageError(f"unknown weighting '{weighting}'; choose one of: {', '.join(WEIGHTINGS)}")
    if weighting == "text" and not texts:
        raise UsageError("weighting 'text' counts token frequencies on unlabelled text, and none was given; "
                         "pass text or use weighting 'zipf'")
    if dtype not in DTYPES:
        raise UsageError(f"unknown dtype '{dtype}'; choose one of: {', '.join(DTYPES)}")
    if not 1 <= dims <= hidden:
        raise UsageError(f"--dims {dims}: the static vectors keep between 1 and the teacher's {hidden} "
                         "dimensions")


@dataclass(frozen=True)
class AlignConfig:
    """Teacher-aligned tuning of the static table (this project's addition to Model2Vec's recipe):
    over ``epochs`` passes of the unlabelled texts in batches of ``batch_size``, each row of the
    student's in-batch cosine matrix is pulled, as a softmax at ``temperature``, towards the
    teacher's row (KL divergence), Adam at ``lr``; every vector of a token the texts hold moves."""

    epochs: int = 8
    lr: float = 5e-3
    batch_size: int = 256
    temperature: float = 0.05
    seed: int = 0

    def __post_init__(self):
        for name in ("epochs", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UsageError(f"align {name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("lr", "temperature"):
            if not 0 < getattr(self, name) < float("inf"):
                raise UsageError(f"align {name} must be positive, got {getattr(self, name)!r}")


def align_static(student, texts: Sequence[str], targets: torch.Tensor, cfg: AlignConfig = AlignConfig()
                 ) -> dict:
    """Tune ``student``'s table in place so its in-batch similarities follow the teacher's on
    ``texts`` (``targets``: the teacher's (N, H) embeddings of them); returns the first and last
    epoch's mean loss. Texts without a known token are left out."""
    import torch.nn.functional as F

    if len(texts) != len(targets):
        raise UsageError(f"{len(texts)} texts but {len(targets)} teacher embeddings")
    ids = student.tokenize(list(texts))
    keep = [i for i, row in enumerate(ids) if row]
    if len(keep) < 2:
        raise UsageError("teacher alignment needs at least 2 unlabelled texts with known tokens")
    ids = [ids[i] for i in keep]
    y = F.normalize(torch.as_tensor(targets, dtype=torch.float32)[keep], dim=-1)
    table = torch.nn.Parameter(torch.tensor(np.asarray(student.embedding, dtype=np.float32)))
    opt = torch.optim.Adam([table], lr=cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed)
    size = min(cfg.batch_size, len(ids))
    losses = []
    for _ in range(cfg.epochs):
        order = torch.randperm(len(ids), generator=g).tolist()
        total, steps = 0.0, 0
        for b in range(0, len(order) - size + 1, size):
            batch = order[b:b + size]
            flat = torch.tensor([t for i in batch for t in ids[i]])
            offsets = torch.tensor([0] + [len(ids[i]) for i in batch[:-1]]).cumsum(0)
            s = F.normalize(F.embedding_bag(flat, table, offsets, mode="mean"), dim=-1)
            t = y[batch]
            loss = F.kl_div(F.log_softmax(s @ s.T / cfg.temperature, -1),
                            F.log_softmax(t @ t.T / cfg.temperature, -1), log_target=True,
                            reduction="batchmean")
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        losses.append(total / max(steps, 1))
    student.embedding = table.detach().numpy().astype(student.embedding.dtype)
    return {"texts": len(ids), "epochs": cfg.epochs, "lr": cfg.lr, "batch_size": size,
            "temperature": cfg.temperature, "loss_first_epoch": losses[0], "loss_last_epoch": losses[-1]}


def distil_static(teacher: SentenceEncoder, tokenizer, dims: int = DEFAULT_DIMS, weighting: str = "zipf",
                  texts: Sequence[str] = (), sif_coefficient: float = SIF_COEFFICIENT,
                  dtype: str = "float32", align: AlignConfig | None = None, batch_size: int = 128
                  ) -> tuple[Any, dict]:
    """(``model2vec.StaticModel``, report: the recipe, the vocabulary kept, the weighting, the
    tuning). ``texts``: the unlabelled text of ``weighting="text"`` and of the teacher-aligned
    tuning (``align``; None keeps Model2Vec's vectors), which the teacher embeds ``batch_size`` at
    a time with its default prompt."""
    from model2vec import StaticModel
    from model2vec.distill import distill_from_model

    check_static_settings(dims, teacher.config.hidden_size, weighting, texts, dtype)
    if align is not None and not texts:
        raise UsageError("teacher-aligned tuning needs unlabelled text, and none was given; pass text or "
                         "no align config")
    if not 0 < sif_coefficient < 1:
        raise UsageError(f"sif_coefficient {sif_coefficient}: a of the weights a/(a+p) lies in (0, 1)")
    device = str(next(teacher.parameters()).device)
    pooling = TOKEN_POOLING[teacher.pooling.mode]
    model = distill_from_model(teacher.encoder, tokenizer, device=device, pca_dims=dims,
                               sif_coefficient=sif_coefficient if weighting == "zipf" else None,
                               quantize_to="float32", pooling=pooling)
    vectors = np.asarray(model.embedding, dtype=np.float32)
    if weighting == "text":
        vectors = vectors * sif_weights(text_probabilities(model, texts), sif_coefficient)[:, None]
    if model.unk_token_id is not None:
        # model2vec leaves the unknown token out of a mean, sentence-transformers' StaticEmbedding
        # averages its vector in: a zero vector only shortens that mean, the same after normalising
        vectors[model.unk_token_id] = 0.0
    config = {**model.config, "sif_coefficient": sif_coefficient, "weighting": weighting}
    # no truncation: a static model has no positions, and model2vec cuts a long text's characters
    # before its tokens where sentence-transformers cuts tokens only; untruncated, both read the same
    student = StaticModel(vectors, model.tokenizer, config=config, normalize=True,
                          base_model_name=model.base_model_name, language=model.language, max_length=None)
    tuned = None
    if align is not None:
        from compress.embedding.model import embed

        targets = embed(teacher, tokenizer, [teacher.prompts.other + t for t in texts], batch_size)
        tuned = align_static(student, texts, targets, align)
    student.embedding = student.embedding.astype(dtype)
    report = {"recipe": "model2vec distill_from_model (token pass, PCA, SIF weights)",
              "model2vec": _version(), "dims": dims, "vocab": len(student.tokens),
              "teacher_vocab": int(teacher.config.vocab_size), "token_pooling": pooling,
              "weighting": weighting, "sif_coefficient": sif_coefficient, "dtype": dtype,
              **({"frequency_texts": len(texts)} if weighting == "text" else {}),
              **({"align": tuned} if tuned is not None else {})}
    return student, report


def _version() -> str:
    import model2vec

    return model2vec.__version__
