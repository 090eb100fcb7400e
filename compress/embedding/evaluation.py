"""The embedding task's scored sets for a run (``load_eval_data``), the scorer of a ``SentenceEncoder``
(``encoder_scorer``) and the check that a model is a sentence-embedding one."""

from __future__ import annotations

from collections.abc import Callable

import torch

from compress.core.errors import UsageError
from compress.embedding.model import SentenceEncoder, embed
from compress.tasks.embedding import EMBEDDING_TASK, EmbeddingEval, load_embedding_eval


def load_eval_data(cfg) -> EmbeddingEval:
    return load_embedding_eval(cfg.data_options(), cfg.split_by_article, cfg.eval_limit)


def encoder_scorer(model: SentenceEncoder, tokenizer, batch_size: int, max_length: int | None
                   ) -> Callable[[list[str]], torch.Tensor]:
    """``encode(texts)`` of the model as it is when called (after pruning, the pruned one)."""
    return lambda texts: embed(model, tokenizer, texts, batch_size, max_length)


def refuse_non_embedding_model(meta: dict, spec: str) -> None:
    """A run folder of another task (a classifier, a span model) is not scored as an embedding model."""
    task = meta.get("task")
    if task not in (None, EMBEDDING_TASK):
        raise UsageError(f"model '{spec}' was trained for task '{task}'; --task embedding scores "
                         "sentence-embedding models (minilm, a sentence-transformers folder, or a run "
                         "of 'compress prune --task embedding')")
