"""``compress prune --stage post-training --task embedding``: prune a sentence-embedding model once
against its own embeddings, on unlabelled text, and recover it by embedding distillation
(``compress.api.embedding_prune``).

Reads top to bottom: check the config -> read the scored sets and the unlabelled text
(``--calibration-data`` or WikiText-2) -> prune, score, recover and save (``prune_embedding_once``).
"""

from __future__ import annotations

from pathlib import Path

from compress.api.embedding_prune import check_embedding_config, load_unlabelled_text, prune_embedding_once
from compress.api.prune_stages import PruneConfig
from compress.embedding.evaluation import load_eval_data


def prune_post_training_embedding(cfg: PruneConfig, fisher=None) -> Path:
    """Prune, score, optionally distil and save a sentence-embedding model (``prune_embedding_once``).
    ``fisher``: the embedding Fisher of the same dense model and calibration set, computed once for
    a family of ``--speedup`` targets."""
    check_embedding_config(cfg)
    data = load_eval_data(cfg)
    return prune_embedding_once(cfg, data, load_unlabelled_text(cfg), fisher)
