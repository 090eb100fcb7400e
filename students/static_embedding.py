"""Static-embedding student: one fixed vector per vocabulary token, a sentence is the mean of its
tokens' vectors, l2-normalised. No attention, no layers: the embedding counterpart of the
logistic-regression student. Its vectors come from a teacher (``compress.embedding.static``); the
model itself knows nothing about how.

The student is a ``model2vec.StaticModel`` and is saved by model2vec's own ``save_pretrained``: a
folder (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``modules.json``) that
``model2vec.StaticModel.from_pretrained`` and ``sentence_transformers.SentenceTransformer`` open with
no code of this project. ``StaticEncoder`` gives the embeddings model2vec's ``encode`` gives (same
tokens, same truncation, the unknown token left out, same mean and normalisation), with one sparse
product per batch instead of model2vec's per-length buckets.

Folders of the earlier format (``static.json`` + ``static.safetensors``) are refused with the fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.errors import ModelError

CONFIG_FILE = "config.json"  # model2vec's, with model_type "model2vec"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
MODEL_TYPE = "model2vec"
OLD_CONFIG_FILE = "static.json"  # the format before model2vec's; no longer read


def old_format_message(folder: Path) -> str:
    return (f"{folder} holds a static student in the old format ({OLD_CONFIG_FILE} + static.safetensors), "
            "which model2vec and sentence-transformers cannot open; distil it again with 'compress distill "
            "--task embedding --student static --teacher TEACHER'")


def is_static_folder(folder: Path) -> bool:
    """True where ``folder`` holds a model2vec static model (its ``config.json`` says so)."""
    try:
        config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def find_static_folder(path: Path) -> Path | None:
    """The static student of ``path`` (a run folder of ``compress distill --task embedding`` or the
    student folder itself), None where it holds none; ModelError for the old format."""
    for folder in (path / "student", path):
        if is_static_folder(folder):
            return folder
        if (folder / OLD_CONFIG_FILE).is_file():
            raise ModelError(old_format_message(folder))
    return None


def load_static(folder: Path) -> Any:
    """The ``model2vec.StaticModel`` saved in ``folder`` (or in ``folder/student``)."""
    from model2vec import StaticModel

    found = find_static_folder(Path(folder))
    if found is None:
        raise ModelError(f"{folder} holds no static-embedding student ({CONFIG_FILE} with model_type "
                         f"'{MODEL_TYPE}', {WEIGHTS_FILE} and {TOKENIZER_FILE}); build one with 'compress "
                         "distill --task embedding --student static'")
    for name in (WEIGHTS_FILE, TOKENIZER_FILE):
        if not (found / name).is_file():
            raise ModelError(f"{found} is a model2vec folder without {name}; save the student again")
    return StaticModel.from_pretrained(found)


def save_static(model, folder: Path) -> None:
    """``model`` (a ``model2vec.StaticModel``) written by model2vec's own ``save_pretrained``."""
    model.save_pretrained(Path(folder))


class StaticEncoder:
    """``encoder(texts) -> (N, dims)`` float32 embeddings: what ``model.encode(texts)`` gives for a
    ``model2vec.StaticModel`` (model2vec's own tokens and truncation, the unknown token left out, a
    text with no known token zeros). Each batch's means are one sparse (texts x vocabulary) product
    with the table, accumulated in float64 (model2vec's pairwise float32 sums and this agree to 1e-7
    on texts of thousands of tokens): no padding, no buckets."""

    def __init__(self, model, batch_size: int = 1024):
        self.model = model
        self.batch_size = batch_size
        self.table = np.asarray(model.embedding, dtype=np.float64)
        self.limit = None if model.max_length is None else model.max_length * model.median_token_length

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        from itertools import chain

        from scipy.sparse import csr_matrix

        m = self.model
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float64)
        for i in range(0, len(texts), self.batch_size):
            batch = list(texts[i:i + self.batch_size])
            ids = m.tokenize([t[:self.limit] for t in batch] if self.limit else batch)
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
            share = np.repeat(1.0 / np.maximum(lengths, 1), lengths)
            if m.weights is not None:
                share *= m.weights[flat]
            columns = flat if m.token_mapping is None else m.token_mapping[flat]
            indptr = np.concatenate(([0], np.cumsum(lengths)))
            out[i:i + len(batch)] = csr_matrix((share, columns, indptr), shape=(len(batch), len(self.table))
                                               ) @ self.table
        if m.normalize:
            out /= np.linalg.norm(out, axis=1, keepdims=True) + 1e-32
        return torch.from_numpy(out.astype(np.float32))


def encode_static(model, texts: Sequence[str], batch_size: int = 1024) -> torch.Tensor:
    """(N, dims) float32 embeddings of ``texts`` (``StaticEncoder``, built for one call)."""
    return StaticEncoder(model, batch_size)(texts)
