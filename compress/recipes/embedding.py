"""``compress eval --task embedding``: a sentence-embedding model (the packaged all-MiniLM-L6-v2, any
sentence-transformers folder or hub id, or a run folder of ``compress prune --task embedding``) scored
as is, without fine-tuning (``compress.embedding.scores``; its data and scorer:
``compress.embedding.evaluation``)."""

from __future__ import annotations

import torch

from compress.core.config import to_dict
from compress.core.runs import RunDir
from compress.embedding.evaluation import encoder_scorer, load_eval_data, refuse_non_embedding_model
from compress.embedding.model import load_sentence_encoder
from compress.embedding.scores import brief, embedding_scores
from compress.tasks.embedding import EMBEDDING_TASK


def eval_embedding(cfg) -> dict:
    """Score the model on ReQA (and MRPC pairs where present); writes an eval run folder."""
    data = load_eval_data(cfg)
    model, tokenizer, meta = load_sentence_encoder(cfg.model)
    refuse_non_embedding_model(meta, cfg.model)
    data = data.with_prompts(model.prompts)
    if torch.cuda.is_available():
        model.to("cuda")
    with RunDir("eval", name=EMBEDDING_TASK, out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        scores, _ = embedding_scores(encoder_scorer(model, tokenizer, cfg.batch_size, cfg.max_length), data)
        run.write_summary({"command": "eval", "task": EMBEDDING_TASK, "model": cfg.model, "metric": "p@1",
                           "pooling": vars(model.pooling), "eval": scores})
    print(f"embedding ({cfg.model}): {brief(scores)} on {scores['reqa']['n']} questions / "
          f"{scores['reqa']['candidates']} sentences -> {run.path}")
    return scores


