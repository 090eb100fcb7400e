"""The Python API of the embedding task: load a sentence-embedding model with its pooling, embed
texts, prune it against its own embeddings on unlabelled text, distil it back towards the dense
model, save it as a folder ``sentence_transformers.SentenceTransformer`` opens, and build the
static-embedding student. The same blocks as ``compress prune / distill --task embedding``.

    model, tok = compress.load_embedding_model("minilm")
    dense = copy.deepcopy(model)
    masks = compress.prune_embedding_model(model, tok, texts, criterion="sparsegpt", sparsity=0.5)
    compress.distil_embedding_model(model, dense, tok, texts, steps=200, masks=masks)
    compress.save_embedding_model(model, tok, "pruned-minilm", masks=masks)
    SentenceTransformer("pruned-minilm")   # the same embeddings
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from compress.api import checks as check
from compress.core.errors import ModelError, UsageError
from compress.embedding.model import SentenceEncoder


def load_embedding_model(spec: str) -> tuple[SentenceEncoder, Any]:
    """(model, tokenizer) of ``spec`` (``minilm``, a sentence-transformers folder or hub id, a run
    folder): the encoder with the pooling and normalisation its sentence-transformers config says
    (mean pooling and normalisation where it has none)."""
    from compress.embedding.model import load_sentence_encoder

    model, tokenizer, _ = load_sentence_encoder(spec)
    return model, tokenizer


def embed_texts(model: SentenceEncoder, tokenizer, texts: Sequence[str], batch_size: int = 128,
                prompt: str | None = None) -> torch.Tensor:
    """(len(texts), hidden) float32 embeddings on the CPU, as sentence-transformers' ``encode`` gives
    them: ``prompt`` before each text, the model's default prompt when None (``model.prompts.query``
    and ``model.prompts.document`` are those of ``encode_query`` and ``encode_document``)."""
    from compress.embedding.model import embed

    _encoder("model", model)
    check.check_tokenizer("tokenizer", tokenizer)
    check.check_int("batch_size", batch_size, 1)
    if prompt is not None and not isinstance(prompt, str):
        raise UsageError(f"prompt must be a string or None, not {type(prompt).__name__}")
    prefix = model.prompts.other if prompt is None else prompt
    out = embed(model, tokenizer, [prefix + t for t in _texts(texts)], batch_size)
    if not torch.isfinite(out).all():
        raise ModelError(f"{int((~torch.isfinite(out)).any(1).sum())} of {len(out)} embeddings hold NaN or "
                         "infinite values: the model's weights are not finite; load a finite model")
    return out


def _encoder(name: str, value: Any) -> None:
    """A ``SentenceEncoder`` (what ``load_embedding_model`` returns: the encoder with its pooling)."""
    check.check_module(name, value)
    if not isinstance(value, SentenceEncoder):
        raise UsageError(f"{name} is a {type(value).__name__}; pass a sentence encoder from "
                         "compress.load_embedding_model(spec) (it carries the pooling the embeddings use)")


def _texts(texts: Iterable[str]) -> list[str]:
    """``texts`` as a list (any iterable: a generator is read once); UsageError unless it holds
    non-blank strings only, at least one."""
    message = "texts must be a non-empty list of non-blank strings (unlabelled sentences)"
    if isinstance(texts, (str, bytes)):
        raise UsageError(message)
    try:
        texts = list(texts)
    except TypeError:
        raise UsageError(f"{message}, not a {type(texts).__name__}") from None
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise UsageError(message)
    return texts


def prune_embedding_model(model: SentenceEncoder, tokenizer, texts: Sequence[str], *,
                          criterion: str = "sparsegpt", sparsity: float = 0.5, batch_size: int = 32,
                          max_length: int = 128, structured: bool = False,
                          flops_reduction: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Prune ``model`` in place, once, calibrated on ``texts``; no labels.

    Unstructured (``structured=False``): ``criterion`` sparsegpt, wanda or magnitude to ``sparsity``
    in every encoder matrix; returns the masks (``compress.prune_model``'s). Structured: whole heads
    and FFN neurons removed to ``flops_reduction`` by Kwon et al.'s search, its Fisher taken on the
    embeddings (``compress.embedding.losses.embedding_fisher``; the default, measured better on
    all-MiniLM-L6-v2), or with ``criterion="obs"`` with the optimal update of what each layer keeps
    (structured OBS on the encoder's own outputs); returns the search's report."""
    from compress.api.functions import prune_model
    from compress.embedding.losses import embedding_fisher, text_collate

    _encoder("model", model)
    check.check_tokenizer("tokenizer", tokenizer)
    if structured and criterion not in ("sparsegpt", "fisher", "obs"):
        raise UsageError(f"structured=True removes heads and FFN neurons with criterion 'fisher' (the "
                         f"default for it) or 'obs' (reconstruction); got '{criterion}'")
    if not structured and criterion in ("fisher", "obs"):
        raise UsageError(f"criterion '{criterion}' removes whole heads and FFN neurons: add structured=True "
                         "and flops_reduction=F")
    texts = _texts(texts)
    check.check_int("batch_size", batch_size, 1)
    check.check_int("max_length", max_length, 2)
    collate = text_collate(tokenizer, max_length, model.pooling.lower_case)
    batches = [collate(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]
    if not structured:
        if flops_reduction is not None:
            raise UsageError("flops_reduction sets the target of structured=True; drop it or add "
                             "structured=True")
        return prune_model(model.encoder, sparsity, criterion=criterion, seed=seed,
                           calibration=batches if criterion in ("sparsegpt", "wanda") else None)
    from compress.pruning.fisher_structured import fisher_prune_structured

    if flops_reduction is None:
        raise UsageError("structured=True removes heads and FFN neurons to a FLOPs target: pass "
                         "flops_reduction=F in (0, 1)")
    if criterion == "obs":  # the default (sparsegpt, the unstructured one) means fisher here, as measured
        from compress.pruning.obs_structured import obs_prune_structured

        return obs_prune_structured(model.encoder, batches, flops_reduction, max_length)
    fisher = embedding_fisher(model, batches, seed=seed)
    return fisher_prune_structured(model.encoder, batches, flops_reduction, max_length, fisher=fisher)


def distil_embedding_model(student: SentenceEncoder, teacher: SentenceEncoder, tokenizer,
                           texts: Sequence[str], *, steps: int,
                           masks: dict[str, torch.Tensor] | None = None, lr: float = 5e-5,
                           batch_size: int = 32, max_length: int = 128, seed: int = 0) -> dict[str, Any]:
    """Train ``student`` ``steps`` steps on ``texts`` towards ``teacher``'s embeddings (mean cosine
    distance), keeping ``masks`` (True = kept) pruned; returns the loop's result (steps, final loss).
    ``teacher`` is frozen by this call."""
    from compress.embedding.losses import cosine_distillation_loss, text_collate
    from compress.pruning.pruner import KeepMasksHook
    from compress.training.loop import TrainConfig, train

    _encoder("student", student)
    _encoder("teacher", teacher)
    check.check_tokenizer("tokenizer", tokenizer)
    if student is teacher:
        raise UsageError("student and teacher are the same object, so freezing the teacher would freeze "
                         "the student; pass a copy as teacher (copy.deepcopy(model) before pruning)")
    if student.dim != teacher.dim:
        raise UsageError(f"the student embeds in {student.dim} dimensions and the teacher in {teacher.dim}; "
                         "the cosine loss compares them one to one: distil from a teacher of the same width")
    texts = _texts(texts)
    check.check_int("steps", steps, 1)
    cfg = replace(TrainConfig(), max_steps=steps, lr=lr, batch_size=batch_size, max_length=max_length,
                  seed=seed)
    hooks = [KeepMasksHook(student.encoder, masks, {})] if masks else []
    collate = text_collate(tokenizer, max_length, student.pooling.lower_case)
    return train(student, tokenizer, texts, cfg, hooks, collate=collate,
                 loss_fn=cosine_distillation_loss(teacher), hook_module=lambda m: m.encoder)


def save_embedding_model(model: SentenceEncoder, tokenizer, folder: str | os.PathLike,
                         masks: dict[str, torch.Tensor] | None = None, base_model: str | None = None
                         ) -> Path:
    """A sentence-transformers folder (weights, tokenizer, modules and pooling config, card) with the
    masks beside the weights when given; ``SentenceTransformer(folder)`` opens it (a structured-pruned
    model through its stock copy in ``0_Transformer``, the same embeddings)."""
    from compress.embedding.model import save_sentence_transformer
    from compress.pruning.integrity import MASKS_FILE, check_masks, save_masks
    from compress.report.modelcard import write_model_card

    _encoder("model", model)
    check.check_tokenizer("tokenizer", tokenizer)
    check.check_path("folder", folder)
    check.check_initial_masks(masks, model.encoder, "masks")  # before anything is written
    if masks:
        check_masks(model.encoder, masks)
    folder = Path(folder)
    meta = {"task": "embedding", "head": "sentence-embedding", "max_length": model.pooling.max_length,
            **({"base_model": base_model} if base_model else {})}
    save_sentence_transformer(model, tokenizer, folder, meta)
    if masks:
        save_masks(masks, folder / MASKS_FILE)
    write_model_card(folder, model.encoder, meta=meta)
    return folder
