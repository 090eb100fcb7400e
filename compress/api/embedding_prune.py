"""The post-training prune of a sentence-embedding model, as library functions the recipes call
(``compress.recipes.embedding_prune`` once, ``compress.recipes.speed_family`` once per ``--speedup``
target): prune it once against its own embeddings, on unlabelled text, and recover it by embedding
distillation. Not re-exported by ``import compress``.

Reads top to bottom: read the unlabelled text (``--calibration-data`` or WikiText-2) and the scored
sets -> load the model with its pooling and refuse non-finite weights -> choose the matrices ->
open the run folder -> score the dense model (its embeddings of the held-out texts are the
reference) -> prune once from ``--calibration-samples`` sentences: SparseGPT, Wanda or magnitude per
matrix, or with ``--structured heads,ffn --criterion fisher`` Kwon et al.'s search against a FLOPs
target or a measured ``--speedup``, its Fisher taken on the embeddings (``embedding_fisher``) ->
score again -> ``--recovery-steps`` of embedding distillation from the dense model (cosine distance
between the two embeddings of each sentence; masks kept) -> save a sentence-transformers folder
and check that ``SentenceTransformer`` gives the same embeddings.

No label is read anywhere: the loss of the Fisher and of the recovery is the distance to the dense
model's embeddings.
"""

from __future__ import annotations

import copy
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from compress.api.post_training import (
    OneShot,
    post_training_meta,
    post_training_summary,
    post_training_targets,
    prune_once,
)
from compress.api.prune_stages import PruneConfig, prune_run_name, write_masks_and_sparsity
from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir, write_json
from compress.distill.teacher_kd import TEACHER_SELF
from compress.embedding.evaluation import encoder_scorer, refuse_non_embedding_model
from compress.embedding.losses import cosine_distillation_loss, embedding_fisher, text_collate
from compress.embedding.model import SentenceEncoder, embed, load_sentence_encoder, save_sentence_transformer
from compress.embedding.scores import brief, embedding_scores
from compress.pruning.calibration import calibration_sample
from compress.pruning.integrity import check_finite_parameters
from compress.report.modelcard import write_model_card
from compress.tasks.embedding import EMBEDDING_TASK, EmbeddingEval, unlabelled_text
from compress.training.loop import set_seed, train

ST_CHECK_TEXTS = 64


def check_embedding_config(cfg: PruneConfig) -> None:
    """What the embedding stage does not do, refused before any data or model is read."""
    if cfg.stage != "post-training":
        raise UsageError(f"--task embedding prunes a sentence-embedding model once, from unlabelled text: "
                         f"use --stage post-training (not {cfg.stage}); add --recovery-steps N to distil "
                         "it from its dense original after")
    if cfg.teacher not in (None, TEACHER_SELF):
        raise UsageError(f"--task embedding recovers by distillation from the dense model itself: use "
                         f"--teacher self (needed for --kd-layers) or no --teacher, not {cfg.teacher}")
    # --kd-lambda, --kd-hidden and --temperature are refused by PruneConfig itself for this task


def calibration_texts(cfg: PruneConfig, texts: list[str]) -> list[str]:
    return [texts[i] for i in calibration_sample(len(texts), cfg.calibration_samples, cfg.seed)]


def text_batches(tokenizer, texts: list[str], batch_size: int, max_length: int, lower_case: bool
                 ) -> list[dict]:
    collate = text_collate(tokenizer, max_length, lower_case)
    return [collate(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)]


def check_sentence_transformers(folder: Path, texts: list[str], expected: torch.Tensor) -> dict:
    """Open ``folder`` with ``sentence_transformers.SentenceTransformer`` and compare its embeddings
    of ``texts`` with ``expected`` (this project's); the largest absolute difference."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return {"checked": False, "reason": "sentence-transformers is not installed"}
    st = SentenceTransformer(str(folder), device="cpu")  # texts carry their prompts: none added
    got = torch.as_tensor(st.encode(texts, batch_size=32, convert_to_numpy=True, prompt=""))
    diff = float((got - expected).abs().max())
    return {"checked": True, "texts": len(texts), "max_abs_diff": diff, "equal_to_1e-5": diff <= 1e-5}


def load_unlabelled_text(cfg: PruneConfig) -> list[str]:
    """The unlabelled text of the calibration and the recovery (``--calibration-data`` or WikiText-2),
    read once for one embedding prune or for every member of a ``--speedup`` family."""
    return unlabelled_text(cfg.data_options(), cfg.calibration_data)


def load_dense_embedding(cfg: PruneConfig, texts: list[str] | None = None
                         ) -> tuple[SentenceEncoder, Any, list[str], list[dict], int]:
    """(the dense sentence encoder of ``cfg.model``, checked to be an embedding model with finite
    weights; its tokenizer; the unlabelled text (``texts``, else read); the calibration batches drawn
    from it; the token limit), what one embedding prune and a ``--speedup`` family start from."""
    texts = load_unlabelled_text(cfg) if texts is None else texts
    set_seed(cfg.seed)
    model, tokenizer, meta = load_sentence_encoder(cfg.model)
    refuse_non_embedding_model(meta, cfg.model)
    check_finite_parameters(model, cfg.model)
    max_length = min(cfg.max_length, model.pooling.max_length)
    batches = text_batches(tokenizer, calibration_texts(cfg, texts), cfg.batch_size, max_length,
                           model.pooling.lower_case)
    return model, tokenizer, texts, batches, max_length


def prune_embedding_once(cfg: PruneConfig, data: EmbeddingEval, texts: list[str], fisher=None) -> Path:
    """Prune, score, optionally distil and save a sentence-embedding model (module docstring), scored
    on ``data`` (``compress.embedding.evaluation.load_eval_data``) and calibrated and recovered on
    ``texts`` (``load_unlabelled_text``), both loaded by the caller. ``fisher``: the embedding Fisher
    of the same dense model and calibration set, computed once for a family of ``--speedup``
    targets."""
    from compress.pruning.pruner import KeepMasksHook

    model, tokenizer, texts, batches, max_length = load_dense_embedding(cfg, texts)
    data = data.with_prompts(model.prompts)
    targets, initial = post_training_targets(cfg, model.encoder)
    dense_model = copy.deepcopy(model).eval() if cfg.recovery_steps else None
    with RunDir("prune", name=prune_run_name(cfg, EMBEDDING_TASK), out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        t0 = time.time()
        score = encoder_scorer(model, tokenizer, cfg.eval_batch_size, max_length)
        dense, reference = embedding_scores(score, data)
        run.log_metrics({"phase": "dense", "eval": dense})
        t_prune = time.time()
        if fisher is None and cfg.structured and cfg.criterion == "fisher":
            fisher = embedding_fisher(model, batches, seed=cfg.seed)
        masks, calibration, structured = prune_once(cfg, model.encoder, targets, batches, initial, run,
                                                    fisher)
        seconds = round(time.time() - t_prune, 1)
        pruned, _ = embedding_scores(score, data, reference)
        run.log_metrics({"phase": "pruned", "step": 0, "eval": pruned})
        once = OneShot(dense, pruned, [], masks, calibration, structured, seconds)
        metrics, steps = pruned, 0
        if cfg.recovery_steps:
            hooks = [KeepMasksHook(model.encoder, masks, {})] if masks else []
            steps = train(model, tokenizer, texts, replace(cfg, max_steps=cfg.recovery_steps), hooks,
                          log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                          checkpoint_dir=run.checkpoint_dir,
                          collate=text_collate(tokenizer, max_length, model.pooling.lower_case),
                          loss_fn=cosine_distillation_loss(dense_model, cfg.kd_layers),
                          hook_module=lambda m: m.encoder)["steps"]
            metrics, _ = embedding_scores(score, data, reference)
            run.log_metrics({"phase": "recovery", "step": steps, "eval": metrics})
        meta = {"task": EMBEDDING_TASK, "head": "sentence-embedding", "max_length": max_length,
                "base_model": cfg.model, "pruning": post_training_meta(cfg, masks, structured),
                **({"distillation": {"loss": "cosine distance to the dense model's embeddings",
                                     "layers_weight": cfg.kd_layers, "steps": steps}} if steps else {})}
        if run.rank == 0:
            folder = run.path / "model"
            no_stock_copy = save_sentence_transformer(model, tokenizer, folder, meta)
            write_model_card(folder, model.encoder, meta=meta)
            sparsity = write_masks_and_sparsity(run.path, masks)
            probe = data.heldout_texts()[:ST_CHECK_TEXTS]
            ours = embed(model, tokenizer, probe, 32, max_length)
            st_check = check_sentence_transformers(folder, probe, ours)
            if no_stock_copy:
                st_check["no_stock_copy"] = no_stock_copy
            summary = {"run": run.final.name,
                       **post_training_summary(cfg, EMBEDDING_TASK, "p@1", once, metrics, steps, t0),
                       "calibration_texts": sum(len(b["input_ids"]) for b in batches),
                       "unlabelled_texts": len(texts), "sentence_transformers": st_check,
                       "sparsity": {g: sparsity[g]["sparsity"] for g in ("global", "embeddings", "encoder")}}
            write_json(run.path / "scores.json", {"dense": dense, "pruned": pruned, "final": metrics})
            run.write_summary(summary)
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    if run.rank == 0:
        print(f"embedding dense: {brief(dense)}\nembedding pruned: {brief(pruned)}"
              + (f"\nafter {steps} distillation steps: {brief(metrics)}" if steps else "")
              + f"\n-> {run.path}")
    return run.path
