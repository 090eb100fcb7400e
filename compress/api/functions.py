"""The Python API: prune, distil, measure and export inside your own training code.

Each function is a thin layer over the building blocks the ``compress`` commands use
(``compress.pruning``, ``compress.distill.losses``, ``compress.measure``, ``compress.export``);
``compress/__init__.py`` re-exports the public names lazily, so ``import compress`` stays cheap.

A pruning loop of your own, in four calls::

    pruner = compress.make_pruner(model, sparsity=0.6, total_steps=1000)
    pruner.initialize()
    for step, batch in enumerate(loader, 1):
        loss = model(**batch).loss
        loss.backward()
        pruner.mask_grads()            # pruned weights get no gradient (before clipping)
        optimizer.step(); optimizer.zero_grad()
        pruner.step(step)              # prune on the schedule, re-apply the masks
    masks = pruner.finalize()
    compress.save_model(model, tokenizer, "out/", masks)   # `compress verify out/` checks it

With ``transformers.Trainer`` use ``compress.PruningCallback`` and ``compress.DistillationTrainer``
(``compress.integrations.hf_trainer``) instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compress.api import checks as check
from compress.distill.losses import DEFAULT_TEMPERATURE
from compress.pruning.schedules import DEFAULT_POWER  # pure Python: no torch at import

if TYPE_CHECKING:
    import torch

    from compress.pruning.pruner import ScheduledPruner

# ----------------------------------------------------------------------------- pruning


def prunable_targets(model: torch.nn.Module, include: Sequence[str] = (),
                     exclude: Sequence[str] = (), *, word_embeddings: bool = True
                     ) -> dict[str, torch.nn.Parameter]:
    """The parameters ``make_pruner`` would prune, by canonical name (``encoder.layer.0...``).

    Default: every role matrix of the architecture's role table (Q, K, V or fused QKV, attention
    output, FFN in and out of every layer) and the word embeddings (``word_embeddings=False``: not
    them, unless ``include`` names them; what ``prune_model`` with a calibrated criterion prunes).
    ``include``/``exclude`` take the
    ``--include``/``--exclude`` patterns (glob, ``re:REGEX``, ``role:NAME``). A model outside the
    role table whose roles discovery cannot find, with no ``include``, raises UsageError saying what
    was not found and the fix (name its matrices with ``include``).
    """
    from compress.core.errors import UsageError
    from compress.models.architectures import layout_for
    from compress.pruning.targets import select_targets

    check.check_module("model", model)
    check.check_patterns("include", include)
    check.check_patterns("exclude", exclude)
    if not include:
        try:
            layout_for(model)
        except UsageError as err:  # the reason, in the API's words for the fix
            raise UsageError(f"{err}; pass include=('re:<regex>',) naming its weight matrices, e.g. "
                             "include=(r're:\\.weight$',)") from None
    return select_targets(model, tuple(include), tuple(exclude), word_embeddings)


def make_pruner(model: torch.nn.Module, sparsity: float, *, schedule: str = "gradual",
                total_steps: int | None = None, prune_steps: int | None = None,
                prune_every: int | None = None, start_step: int = 0, initial_sparsity: float = 0.0,
                power: float = DEFAULT_POWER, criterion: str = "magnitude", scope: str = "local",
                include: Sequence[str] = (), exclude: Sequence[str] = (), seed: int = 0,
                initial_masks: dict[str, torch.Tensor] | None = None,
                pattern: str | None = None) -> ScheduledPruner:
    """A ``ScheduledPruner`` for ``model`` (not yet initialized): the pruner ``compress prune`` uses.

    ``schedule``: "gradual" (Zhu & Gupta cubic ramp from ``initial_sparsity`` at ``start_step`` to
    ``sparsity`` over ``prune_steps``, masks recomputed every ``prune_every`` steps; defaults: the
    first half of ``total_steps``, ten increments) or "oneshot" (all at ``start_step``).
    ``criterion``: "magnitude" or "random"; ``scope``: "local" (one threshold per matrix) or
    "global". ``initial_masks`` (True = kept) stay pruned: re-pruning a pruned model.
    ``pattern`` "N:M" (e.g. "2:4"): N zeros in every group of M weights along each matrix's input
    dimension, by magnitude, local scope, ``sparsity`` = N/M; a gradual schedule prunes the pattern
    in a growing fraction of the groups.

    Lifecycle: ``initialize()`` before the first step, ``mask_grads()`` after each backward (or
    ``register_grad_masks()`` once), ``step(t)`` after optimizer step t (1-based), ``finalize()`` at
    the end -> masks. Out of order raises ``PrunerStateError`` naming the call to make.
    """
    from compress.core.errors import UsageError
    from compress.pruning.masks import NMPattern
    from compress.pruning.pruner import ScheduledPruner
    from compress.pruning.schedules import SCHEDULES, make_schedule

    check.check_module("model", model)
    check.check_real("sparsity", sparsity, 0, 1)
    check.check_int("total_steps", total_steps, 1, optional=True)
    check.check_int("prune_steps", prune_steps, 1, optional=True)
    check.check_int("prune_every", prune_every, 1, optional=True)
    check.check_int("start_step", start_step, 0)
    check.check_real("initial_sparsity", initial_sparsity, 0, 1)
    check.check_real("power", power)
    check.check_int("seed", seed, 0)
    check.check_initial_masks(initial_masks, model)
    if schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule '{schedule}'; choose one of: {', '.join(SCHEDULES)}")
    if schedule == "gradual" and total_steps is None and prune_steps is None:
        raise UsageError("a gradual schedule needs total_steps= (the optimizer steps of your loop) or "
                         "prune_steps= (the steps to ramp over); or pass schedule='oneshot'")
    targets = prunable_targets(model, include, exclude)
    sched = make_schedule(schedule, sparsity, total_steps or 0, prune_steps, prune_every, start_step,
                          initial_sparsity, power)
    return ScheduledPruner(targets, sched, criterion, scope, seed, initial_masks,
                           pattern=NMPattern.parse(pattern) if pattern else None)


def prune_model(model: torch.nn.Module, sparsity: float, *, criterion: str = "magnitude",
                scope: str = "local", include: Sequence[str] = (), exclude: Sequence[str] = (),
                seed: int = 0, pattern: str | None = None,
                calibration: Sequence[dict[str, torch.Tensor]] | None = None,
                initial_masks: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Prune ``model`` in place, one-shot, to ``sparsity``; returns the masks (canonical name ->
    bool tensor on the CPU, True = kept). Keep them enforced in later training with
    ``make_pruner(..., initial_masks=masks)`` or save them with ``save_model``. ``pattern`` "N:M"
    as in ``make_pruner`` (``sparsity`` N/M).

    ``criterion`` "wanda" or "sparsegpt" choose the masks from ``calibration``: batches of the
    model's inputs (dicts with ``input_ids``, ``attention_mask``, ...; e.g. a few hundred training
    sentences through your tokenizer), run through the model layer by layer
    (``compress.pruning.calibration``); "sparsegpt" also rewrites the kept weights. They leave the
    word embeddings dense unless ``include=("role:word_embeddings",)`` names them (then pruned by
    magnitude, as other matrices outside the encoder layers). ``initial_masks`` (True = kept) stay
    pruned, in every matrix: those of matrices not pruned now are applied and returned too.

    Everything is checked before the model changes (one UsageError line): a model with NaN or
    infinite weights (ModelError), calibration batches that are not integer ``input_ids`` of the
    model's vocabulary and length, an ``attention_mask`` of another shape or with an empty row, a
    ``pattern`` with another ``sparsity``, ``initial_masks`` naming an unknown matrix, of another
    shape or not bool."""
    from compress.core.errors import UsageError
    from compress.pruning.criteria import get_criterion
    from compress.pruning.integrity import check_finite_parameters
    from compress.pruning.masks import NMPattern
    from compress.pruning.pruner import check_pattern_fits

    check.check_module("model", model)
    check.check_real("sparsity", sparsity, 0, 1)
    check.check_int("seed", seed, 0)
    data_aware = isinstance(criterion, str) and get_criterion(criterion).data_aware
    if not data_aware and calibration is not None:
        raise UsageError(f"calibration= is read by the criteria that see data (wanda, sparsegpt), "
                         f"not by '{criterion}'; drop it or choose one of those")
    batches = check.check_calibration(calibration, model) if data_aware else None
    check.check_initial_masks(initial_masks, model)
    nm = NMPattern.parse(pattern) if pattern else None
    if nm is not None:
        check_pattern_fits(nm, {}, criterion if isinstance(criterion, str) else "magnitude", scope, sparsity)
    check_finite_parameters(model)
    if not data_aware:
        pruner = make_pruner(model, sparsity, schedule="oneshot", criterion=criterion, scope=scope,
                             include=include, exclude=exclude, seed=seed, pattern=pattern,
                             initial_masks=initial_masks)
        pruner.initialize()
        masks = pruner.finalize()
    else:
        from compress.pruning.calibration import prune_calibrated

        targets = prunable_targets(model, include, exclude, word_embeddings=False)
        masks, _ = prune_calibrated(model, targets, batches, criterion, sparsity, scope, nm, initial_masks,
                                    seed=seed)
    from compress.pruning.calibration import carry_masks

    return dict(sorted({**masks, **carry_masks(model, masks, initial_masks)}.items()))


def model_meta(model: torch.nn.Module, base_model: str | None = None, **extra: Any) -> dict[str, Any]:
    """The ``compress.json`` metadata of a Hugging Face model saved outside a ``compress`` command:
    a sequence classifier's label names (so ``compress verify``, ``measure`` and ``export`` load it
    with its head) and the base model it started from."""
    config = getattr(model, "config", None)
    meta: dict[str, Any] = {}
    if type(model).__name__.endswith("ForSequenceClassification") and config is not None:
        id2label = getattr(config, "id2label", None) or {}
        meta["label_names"] = [str(id2label.get(i, id2label.get(str(i), i)))
                               for i in range(config.num_labels)]
        meta["multilabel"] = getattr(config, "problem_type", None) == "multi_label_classification"
    base = base_model or getattr(config, "_name_or_path", None)
    if base:
        meta["base_model"] = str(base)
    return {**meta, **extra}


def save_model(model: torch.nn.Module, tokenizer: Any, folder: str | os.PathLike,
               masks: dict[str, torch.Tensor] | None = None, meta: dict[str, Any] | None = None,
               metrics: dict[str, float] | None = None) -> dict[str, Any]:
    """Save ``model`` (Hugging Face format; a pruned model's zeros stored), its tokenizer,
    ``compress.json``, ``sparsity.json``, a ``README.md`` model card and, given ``masks``,
    ``masks.safetensors`` into ``folder``; the model is reloaded with plain ``from_pretrained`` and
    every mask checked on it (IntegrityError if a pruned weight is non-zero). ``compress verify``,
    ``measure``, ``export`` and ``finetune --model`` read the folder. Returns the sparsity report.
    ``meta`` adds to ``compress.json`` (e.g. ``{"base_model": ..., "task": ...,
    "distillation": {...}}``); ``metrics`` (e.g. ``{"accuracy": 0.91}``) go into the card."""
    from compress.models.loading import save_model as save_folder
    from compress.report.modelcard import write_model_card

    check.check_module("model", model)
    check.check_path("folder", folder)
    check.check_tokenizer("tokenizer", tokenizer)
    if masks is not None and not isinstance(masks, dict):
        from compress.core.errors import UsageError

        raise UsageError(f"masks must be a dict of name -> bool tensor (what prune_model or "
                         f"pruner.finalize() return) or None, got {type(masks).__name__}")
    folder = Path(folder)
    meta = {**model_meta(model), **(meta or {})}
    if masks:
        meta.setdefault("pruning", {}).update({"masks_file": "masks.safetensors", "targets": sorted(masks)})
    save_folder(model, tokenizer, folder, meta)
    report = write_pruning_files(folder, model, masks, reload_check=True)
    write_model_card(folder, model, meta=meta, metrics=metrics)  # after sparsity.json, which it reads
    return report


def write_pruning_files(folder: str | os.PathLike, model: torch.nn.Module,
                        masks: dict[str, torch.Tensor] | None, reload_check: bool = True) -> dict[str, Any]:
    """``masks.safetensors`` and ``sparsity.json`` beside a saved model in ``folder``; the masks are
    checked on ``model`` and, with ``reload_check`` and a ``config.json`` in ``folder``, on the model
    reloaded from disk. Returns the sparsity report."""
    from compress.core.runs import write_json
    from compress.measure.sparsity import sparsity_report
    from compress.pruning.integrity import MASKS_FILE, check_masks, load_saved_model, save_masks

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if masks:
        check_masks(model, masks)
        save_masks(masks, folder / MASKS_FILE)
        if reload_check and (folder / "config.json").is_file():
            check_masks(load_saved_model(folder), masks)
    report = sparsity_report(model, masks or None)
    write_json(folder / "sparsity.json", report)
    return report


def verify_masks(folder: str | os.PathLike) -> dict[str, Any]:
    """``compress verify``: reload the model saved in ``folder`` (or ``folder/model``) from disk and
    check that every weight is finite, that a structured-pruned model's shapes are its config's, and
    that every weight its ``masks.safetensors`` prunes is exactly zero (a dense folder has none).
    Returns counts (kind, tensors, pruned, total, sparsity); raises IntegrityError naming the
    offending tensors."""
    from compress.pruning.integrity import verify_run

    check.check_path("folder", folder)
    return verify_run(folder)


# ----------------------------------------------------------------------------- distillation


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
            labels: torch.Tensor | None = None, *, temperature: float = DEFAULT_TEMPERATURE,
            kd_lambda: float | None = None, kind: str = "kl", multilabel: bool = False,
            label_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Knowledge-distillation loss of any student against any teacher's logits (both
    ``[batch, labels]``): ``{"loss", "task", "distill"}`` with loss = task + kd_lambda * distill.

    distill: T^2 * KL(softmax(t/T) || softmax(s/T)) (single-label), the per-label Bernoulli KL
    (``multilabel``), or the squared logit difference (``kind="mse"``). task: cross-entropy with
    ``labels`` (int ``[batch]``; multi-hot ``[batch, labels]`` for multi-label), over the rows whose
    ``label_mask`` is true; 0 without labels. ``kd_lambda`` defaults to 4 (single-label) and 1
    (multi-label) as ``compress distill``. The teacher's logits carry no gradient.
    """
    import torch

    from compress.core.errors import UsageError
    from compress.distill.losses import KD_LOSS_CHOICES, MAX_KD_LAMBDA, MAX_TEMPERATURE, distillation_loss

    for name, t in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(t, torch.Tensor):
            raise UsageError(f"{name} must be a torch.Tensor [batch, labels], got {type(t).__name__}; "
                             "pass outputs.logits")
    if kind not in KD_LOSS_CHOICES:
        raise UsageError(f"unknown KD loss kind '{kind}'; choose one of: {', '.join(KD_LOSS_CHOICES)}")
    check.check_real("temperature", temperature, 0, MAX_TEMPERATURE, lo_open=True)
    if kd_lambda is not None:
        check.check_real("kd_lambda", kd_lambda, 0, MAX_KD_LAMBDA)
    if student_logits.dim() != 2 or teacher_logits.dim() != 2:
        raise UsageError(f"kd_loss takes [batch, labels] logits; got student {tuple(student_logits.shape)}, "
                         f"teacher {tuple(teacher_logits.shape)} (pass outputs.logits)")
    (bs, ns), (bt, nt) = student_logits.shape, teacher_logits.shape
    if ns != nt:
        raise UsageError(f"the student predicts {ns} labels and the teacher {nt}; build the student with "
                         f"the teacher's label set (num_labels={nt}, the same id2label order)")
    if bs != bt:
        raise UsageError(f"the student's batch has {bs} rows and the teacher's {bt}; run both on the "
                         "same batch")
    if kd_lambda is None:
        from compress.distill.losses import default_kd_lambda

        kd_lambda = default_kd_lambda(multilabel)
    if labels is not None:
        check.check_labels("labels", labels, ns, bs)
    if labels is None:
        labels = torch.zeros(bs, dtype=torch.long, device=student_logits.device)
        label_mask = torch.zeros(bs, dtype=torch.bool, device=student_logits.device)
    elif label_mask is None:
        label_mask = torch.ones(bs, dtype=torch.bool, device=student_logits.device)
    teacher = teacher_logits.detach().to(student_logits.device, student_logits.dtype)
    return distillation_loss(student_logits, teacher, labels, label_mask, multilabel, temperature,
                             kd_lambda, kind)


# ----------------------------------------------------------------------------- measure and export


def measure_model(model: torch.nn.Module | str | os.PathLike, seq_len: int = 128) -> dict[str, Any]:
    """``compress measure`` of a model: parameters, FLOPs per example at ``seq_len`` (dense and
    sparsity-aware; 1 MAC = 2 FLOPs), the sparsity report and the "will it be faster?" verdict.

    ``model`` is a module in memory (a Hugging Face encoder or classifier, or any module with the
    ``forward(input_ids, attention_mask=None)`` contract) or what ``compress measure`` takes (a model
    or run folder, 'minilm', an .onnx file). The model's train/eval mode is left as it was.
    """
    from compress.core.config import check_range
    from compress.measure.summary import measure_module, measure_spec

    check.check_module("model", model, paths_too=True)
    check.check_int("seq_len", seq_len, 1)
    check_range("seq_len", seq_len, 1, 4096)
    if isinstance(model, (str, os.PathLike)):
        return measure_spec(str(model), seq_len)
    return measure_module(model, seq_len)


def export_onnx(model: torch.nn.Module, path: str | os.PathLike, *, atol: float = 1e-4,
                shapes: Sequence[tuple[int, int]] | None = None, opset: int = 17,
                provider: str = "cpu") -> dict[str, Any]:
    """Export ``model`` to ONNX at ``path`` (dynamic batch and sequence axes, output ``logits``) and
    check parity with PyTorch on every (batch, length) of ``shapes`` (default: the export's own
    ``DEFAULT_SHAPES``, lengths 1 and 3 included), with padding; ParityError
    names each output, its max difference and the shapes where it exceeded ``atol``. The file is
    written beside ``path`` under a temporary name and moved there only when parity holds, never
    over an existing file. Returns ``{"file", "inputs", "parity"}``, and ``"trace"`` where the
    graph was traced again on the model's longest input (see ``compress export``).

    Eager attention exports the graph onnxruntime fuses; a model loaded with SDPA exports too.
    For ``--optimize``/``--quantize int8`` export a saved folder with ``compress export``.
    """
    from compress.core.errors import UsageError
    from compress.export.inputs import DEFAULT_SHAPES
    from compress.export.loading import as_loaded
    from compress.export.onnx import export_checked
    from compress.export.ort import resolve_provider

    check.check_module("model", model)
    check.check_path("path", path)
    check.check_real("atol", atol, 0, lo_open=True)
    if shapes is not None:
        check.check_shapes(shapes)
    check.check_int("opset", opset, 1)
    dst = Path(path)
    if dst.suffix != ".onnx":
        raise UsageError(f"{dst}: the output file name must end in .onnx")
    if dst.exists():
        raise UsageError(f"{dst} already exists; exports are never overwritten (choose another path)")
    if not dst.parent.is_dir():
        raise UsageError(f"folder {dst.parent} does not exist (create it or change the path)")
    loaded = as_loaded(model)
    was_training = model.training
    model.eval()
    tmp = dst.parent / f".tmp-{dst.name}"
    try:
        shapes = DEFAULT_SHAPES if shapes is None else shapes
        _, parity, retraced = export_checked(loaded, tmp, tuple(tuple(s) for s in shapes), atol,
                                             resolve_provider(provider), opset)
        shutil.move(str(tmp), dst)
    finally:
        tmp.unlink(missing_ok=True)
        model.train(was_training)
    return {"file": str(dst), "inputs": list(loaded.input_names), "parity": parity,
            **({"trace": retraced} if retraced else {})}
