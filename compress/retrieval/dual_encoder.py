"""Dual encoder for ReQA: one shared BERT for questions and sentences, mean pooling over tokens,
l2-normalised embeddings; trained with an in-batch sampled softmax over scaled dot products
(Henderson et al. 2017; scale 100 as in Yang et al. 2019), optionally weighted per pair."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from compress.core.errors import ModelError
from compress.embedding.model import pool, tokens
from compress.models.loading import (
    load_pretrained,
    load_tokenizer,
    match_tokenizer_inputs,
    read_meta,
    resolve_model,
)
from compress.training.loop import train

REQA_TASK = "reqa"


class DualEncoder(nn.Module):
    """texts -> (B, H) unit vectors; ``encoder`` is a Hugging Face ``AutoModel`` (saved as is)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        kw = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state
        return F.normalize(mean_pool(h, attention_mask), dim=-1)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of hidden (B, T, H) over tokens where mask (B, T) is 1 -> (B, H)."""
    return pool(hidden, mask, "mean")


def load_dual_encoder(spec: str, require_finetuned: bool = False):
    from transformers import AutoModel

    path = resolve_model(spec)
    meta = read_meta(path)
    if require_finetuned and meta.get("task") != REQA_TASK:
        raise ModelError(f"model '{spec}' is not a ReQA dual encoder (its task is {meta.get('task')!r}); "
                         "pass a run folder of 'compress finetune --task reqa'")
    enc = load_pretrained(AutoModel, spec, path, "an encoder")
    return DualEncoder(enc), match_tokenizer_inputs(load_tokenizer(spec), enc), meta


def in_batch_softmax_loss(q: torch.Tensor, s: torch.Tensor, scale: float,
                          weights: torch.Tensor | None = None,
                          not_negative: torch.Tensor | None = None) -> torch.Tensor:
    """Sampled softmax: pair i's sentence is the target among all sentences of the batch.

    q, s: (B, H) unit vectors; logits = scale * q @ s.T. ``weights`` (B,) weight each pair's
    cross-entropy (weighted mean). ``not_negative`` (B, B) bool marks off-diagonal entries that must
    not count as negatives (the same sentence or the same question twice in a batch).
    """
    logits = scale * q @ s.T
    if not_negative is not None:
        eye = torch.eye(len(q), dtype=torch.bool, device=q.device)
        logits = logits.masked_fill(not_negative & ~eye, float("-inf"))
    target = torch.arange(len(q), device=q.device)
    ce = F.cross_entropy(logits, target, reduction="none")
    if weights is None:
        return ce.mean()
    return (weights * ce).sum() / weights.sum()


@torch.no_grad()
def embed_texts(model: DualEncoder, tokenizer, texts: Sequence[str], max_length: int,
                batch_size: int = 128) -> torch.Tensor:
    """(N, H) unit vectors on the CPU."""
    model.eval()
    device = next(model.parameters()).device
    out = [model(**tokens(tokenizer, texts[i:i + batch_size], max_length, device)).float().cpu()
           for i in range(0, len(texts), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, 1)


def dual_encoder_order(model: DualEncoder, tokenizer, questions: Sequence[str], sentences: Sequence[str],
                       max_length: int, batch_size: int = 128) -> np.ndarray:
    """Candidates ranked by cosine similarity for each question: (n_questions, n_sentences)."""
    from compress.tasks.ranking import order_from_scores

    q = embed_texts(model, tokenizer, questions, max_length, batch_size)
    s = embed_texts(model, tokenizer, sentences, max_length, batch_size)
    return order_from_scores((q @ s.T).numpy())


def pair_collate(tokenizer, questions: Sequence[str], sentences: Sequence[str],
                 max_length: int) -> Callable[[list[tuple[int, int, float]]], dict]:
    """(question index, sentence index, weight) rows -> a batch: the questions' inputs as ``q_*``,
    the sentences' as ``s_*`` (each padded to its own longest), and ``question``, ``sentence``
    (indices, (B,)) and ``weight`` ((B,) float)."""
    def collate(rows: list[tuple[int, int, float]]) -> dict:
        q = tokens(tokenizer, [questions[r[0]] for r in rows], max_length, "cpu")
        s = tokens(tokenizer, [sentences[r[1]] for r in rows], max_length, "cpu")
        return {**{f"q_{k}": v for k, v in q.items()}, **{f"s_{k}": v for k, v in s.items()},
                "question": torch.tensor([r[0] for r in rows]),
                "sentence": torch.tensor([r[1] for r in rows]),
                "weight": torch.tensor([r[2] for r in rows], dtype=torch.float32)}
    return collate


def pair_loss(scale: float) -> Callable[[DualEncoder, dict], tuple[torch.Tensor, dict]]:
    """The in-batch softmax loss of a ``pair_collate`` batch; a question or sentence that occurs twice
    in the batch is not a negative of its other pairs."""
    def loss(model: DualEncoder, batch: dict) -> tuple[torch.Tensor, dict]:
        q = model(**{k[2:]: v for k, v in batch.items() if k.startswith("q_")})
        s = model(**{k[2:]: v for k, v in batch.items() if k.startswith("s_")})
        qi, si = batch["question"], batch["sentence"]
        same = (qi[:, None] == qi[None, :]) | (si[:, None] == si[None, :])
        return in_batch_softmax_loss(q, s, scale, batch["weight"], same), {}
    return loss


def train_dual_encoder(model: DualEncoder, tokenizer, pairs: Sequence[tuple[int, int, float]],
                       questions: Sequence[str], sentences: Sequence[str], cfg, scale: float,
                       hooks: Sequence = (), log: Callable[[dict], None] | None = None) -> dict:
    """Train on (question index, sentence index, weight) pairs with ``compress.training.loop.train``;
    returns its result. Hooks get the Hugging Face encoder (what pruning masks apply to)."""
    return train(model, tokenizer, list(pairs), cfg, list(hooks), log=log,
                 collate=pair_collate(tokenizer, questions, sentences, cfg.max_length),
                 loss_fn=pair_loss(scale), hook_module=lambda m: m.encoder)
