"""Initial embedding matrices for students on the teacher's vocabulary (WordPiece, BPE, SentencePiece).

``teacher``: the teacher's input word embeddings (vocab x hidden, 384-d for MiniLM).
``random``: None (the student's own initialisation).
PATH: a word2vec/GloVe text file (``word v1 ... vd`` per line, an optional ``count dim`` header)
mapped onto the vocabulary: a token takes the vector of the same word, else of its lower-cased
form, else of the piece without its marker (WordPiece's ``##piece``, byte-level BPE's ``Ġword``,
SentencePiece's ``▁word``), as is or lower-cased; tokens with no vector get N(0, s^2) with s the
standard deviation of the found vectors; the padding token is zero.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from compress.core.errors import DataError, UsageError

EMBEDDING_SOURCES = ("teacher", "random")


def check_embedding_spec(spec: str) -> None:
    if spec in EMBEDDING_SOURCES:
        return
    if not Path(spec).is_file():
        raise UsageError(f"--student-embeddings '{spec}' is neither {' nor '.join(EMBEDDING_SOURCES)} "
                         "nor an existing word2vec/GloVe text file")


def embedding_width(spec: str, teacher: str) -> int | None:
    """The width the ``--student-embeddings`` matrix will have, known before any training: the
    teacher's input-embedding width, the first vector's length in a vectors file, None for random."""
    if spec == "random":
        return None
    if spec == "teacher":
        from transformers import AutoConfig

        from compress.models.loading import resolve_model

        config = AutoConfig.from_pretrained(resolve_model(teacher))
        return int(getattr(config, "embedding_size", None) or config.hidden_size)
    for _, parts in _vector_lines(Path(spec)):
        return len(parts) - 1
    raise DataError(f"{spec} holds no vectors (expected 'word v1 v2 ...' lines)")


def check_embed_dim(options: dict, width: int | None) -> None:
    """``embed_dim`` in --student-options must agree with the initial embeddings' width."""
    if width is not None and "embed_dim" in options and int(options["embed_dim"]) != width:
        raise UsageError(f"embed_dim={options['embed_dim']} differs from the {width}-d initial "
                         "embeddings; drop embed_dim or use --student-embeddings random")


def _vector_lines(path: Path):
    """(line number, ``[word, v1, v2, ...]``) of a word2vec/GloVe text file: the optional
    ``count dim`` header and lines without a vector are skipped."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, start=1):
            parts = line.rstrip().split(" ")
            if n == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # word2vec header: count dim
            if len(parts) >= 2:
                yield n, parts


def read_vectors(path: Path) -> dict[str, np.ndarray]:
    vectors: dict[str, np.ndarray] = {}
    dim = None
    for n, parts in _vector_lines(path):
        try:
            vec = np.asarray(parts[1:], dtype=np.float32)
        except ValueError:
            raise DataError(f"{path}:{n}: not a 'word v1 v2 ...' vector line") from None
        if dim is None:
            dim = vec.shape[0]
        elif vec.shape[0] != dim:
            raise DataError(f"{path}:{n}: vector has {vec.shape[0]} values, earlier lines {dim}")
        vectors.setdefault(parts[0], vec)
    if not vectors:
        raise DataError(f"{path} holds no vectors (expected 'word v1 v2 ...' lines)")
    return vectors


# Marks of a piece that continues a word (WordPiece) or starts one (byte-level BPE, SentencePiece).
PIECE_MARKS = ("##", "\u0120", "\u2581")  # "##", "Ġ", "▁"


def bare_piece(token: str) -> str | None:
    """``##ing`` -> ``ing``, ``Ġmovie`` -> ``movie``, ``▁film`` -> ``film``; None without a mark."""
    for mark in PIECE_MARKS:
        if token.startswith(mark) and len(token) > len(mark):
            return token[len(mark):]
    return None


def vectors_for_vocab(vectors: dict[str, np.ndarray], vocab: dict[str, int], pad_id: int,
                      seed: int = 0) -> tuple[torch.Tensor, float]:
    """(matrix (len(vocab), dim), coverage = fraction of tokens that found a vector)."""
    dim = len(next(iter(vectors.values())))
    size = max(vocab.values()) + 1
    mat = np.zeros((size, dim), dtype=np.float32)
    found = np.zeros(size, dtype=bool)
    for tok, i in vocab.items():
        bare = bare_piece(tok)
        for cand in (tok, tok.lower(), bare, bare and bare.lower()):
            if cand and cand in vectors:
                mat[i] = vectors[cand]
                found[i] = True
                break
    std = float(mat[found].std()) if found.any() else 0.1
    rng = np.random.default_rng(seed)
    mat[~found] = rng.normal(0.0, std, size=(int((~found).sum()), dim))
    if 0 <= pad_id < size:
        mat[pad_id] = 0.0
    return torch.from_numpy(mat), float(found.mean())


def initial_embeddings(spec: str, teacher_model, tokenizer, seed: int = 0
                       ) -> tuple[torch.Tensor | None, dict]:
    """The matrix to copy into the student (None for ``random``) and a description for the report."""
    if spec == "random":
        return None, {"source": "random"}
    if spec == "teacher":
        w = teacher_model.get_input_embeddings().weight.detach().float().cpu().clone()
        return w, {"source": "teacher", "dim": int(w.shape[1])}
    vocab = tokenizer.get_vocab()
    mat, coverage = vectors_for_vocab(read_vectors(Path(spec)), vocab, tokenizer.pad_token_id or 0, seed)
    return mat, {"source": str(spec), "dim": int(mat.shape[1]), "vocab_coverage": round(coverage, 4)}
