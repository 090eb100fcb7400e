"""Integrity of pruned models: masked weights must be exactly zero, after training, saving, loading."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from compress.core.errors import DataError, IntegrityError
from compress.pruning.targets import named_weights

MASKS_FILE = "masks.safetensors"
REDO = ("copy the run folder again, or re-run the command that wrote it ('compress prune', or "
        "'compress finetune' of a pruned model)")


@torch.no_grad()
def regrown_counts(model: torch.nn.Module, masks: dict[str, torch.Tensor]) -> dict[str, int]:
    """Per tensor, how many weights are non-zero where the mask says pruned (only non-zero counts)."""
    params = named_weights(model)
    out = {}
    for name in sorted(masks):
        if name not in params:
            raise IntegrityError(f"mask '{name}' names no parameter of the model (wrong model for "
                                 "these masks?)")
        p, m = params[name], masks[name]
        if tuple(p.shape) != tuple(m.shape):
            raise IntegrityError(f"mask '{name}' has shape {tuple(m.shape)} but the parameter has "
                                 f"{tuple(p.shape)}")
        n = int(torch.count_nonzero(p.detach().ne(0).logical_and_(m.to(p.device).logical_not())))
        if n:
            out[name] = n
    return out


def check_masks(model: torch.nn.Module, masks: dict[str, torch.Tensor]) -> None:
    """Raise IntegrityError naming each tensor with regrown weights and how many."""
    bad = regrown_counts(model, masks)
    if bad:
        first = ", ".join(f"{n}: {c} regrown" for n, c in list(bad.items())[:3])
        more = f" (and {len(bad) - 3} more tensors)" if len(bad) > 3 else ""
        raise IntegrityError(f"{sum(bad.values())} pruned weights are non-zero: {first}{more}")


@torch.no_grad()
def check_pattern(model: torch.nn.Module, names: list[str], pattern: str) -> None:
    """Raise IntegrityError when a matrix in ``names`` breaks the N:M ``pattern`` it was pruned
    with (a group of M along its input dimension holding fewer than N zeros in the stored weights),
    naming the first broken group (matrix, row, group, columns) and how many there are."""
    from compress.pruning.masks import NMPattern, broken_groups

    nm = NMPattern.parse(pattern)
    params = named_weights(model)
    total, first = 0, None
    for name in sorted(names):
        if name not in params:
            raise IntegrityError(f"the {pattern} pattern names '{name}', no parameter of the model "
                                 "(wrong model for these masks?)")
        w = params[name]
        if not nm.fits(tuple(w.shape)):
            raise IntegrityError(f"{name} is {list(w.shape)}: its input dimension is not a multiple of "
                                 f"{nm.m}, so it cannot hold the {pattern} pattern it was pruned with")
        n_bad, where = broken_groups(w, nm.n, nm.m)
        if n_bad and first is None:
            first = (name, *where)
        total += n_bad
    if first is not None:
        name, row, group, zeros = first
        raise IntegrityError(f"{total} groups break the {pattern} pattern: first {name} row {row} group "
                             f"{group} (columns {group * nm.m}-{group * nm.m + nm.m - 1}) has {zeros} "
                             f"zero(s), {nm.n} needed")


@torch.no_grad()
def non_finite_counts(model_dir: Path) -> dict[str, tuple[int, int]]:
    """Per tensor of the saved weights (every ``*.safetensors`` of ``model_dir`` but the masks), how
    many entries are NaN and how many infinite (only tensors with some). Read one tensor at a time
    from the files, so the check sees exactly what was saved."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        if f.name == MASKS_FILE:
            continue
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                t = fh.get_tensor(name)
                if not t.is_floating_point():
                    continue
                nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
                if nan or inf:
                    out[name] = (nan, inf)
    return out


def check_finite_weights(model_dir: Path) -> None:
    """Raise IntegrityError naming each saved tensor with NaN or infinite entries and how many: a
    model that holds them loads without complaint and predicts garbage."""
    bad = non_finite_counts(model_dir)
    if bad:
        first = ", ".join(f"{n}: {nan} NaN, {inf} inf" for n, (nan, inf) in list(bad.items())[:3])
        more = f" (and {len(bad) - 3} more tensors)" if len(bad) > 3 else ""
        total = sum(nan + inf for nan, inf in bad.values())
        raise IntegrityError(f"{total} saved weights are not finite: {first}{more}; the model is "
                             f"unusable: {REDO}")


def save_masks(masks: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({n: m.detach().to("cpu", torch.bool).contiguous() for n, m in masks.items()}, str(path))


def load_masks(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not Path(path).is_file():
        raise DataError(f"no masks at {path}; pass a run folder written by 'compress prune' (or "
                        "'compress finetune' of a pruned model)")
    from compress.models.loading import check_safetensors_file

    check_safetensors_file(path, REDO)
    return {n: t.bool() for n, t in load_file(str(path)).items()}


def load_saved_model(model_dir: Path):
    """Load a saved model with plain ``from_pretrained``: a classifier if it was fine-tuned on a task,
    else the bare encoder."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    meta_file = model_dir / "compress.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    cls = AutoModelForSequenceClassification if meta.get("label_names") else AutoModel
    from compress.models.loading import check_safetensors_folder, register_model_types

    check_safetensors_folder(model_dir, REDO)
    register_model_types()
    return cls.from_pretrained(model_dir, use_safetensors=True, trust_remote_code=False)


def recorded_pattern(model_dir: Path) -> str | None:
    """The N:M pattern the saved model was pruned with (``compress.json``'s ``pruning.pattern``)."""
    meta_file = Path(model_dir) / "compress.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    except ValueError:
        return None
    pruning = meta.get("pruning") if isinstance(meta, dict) else None
    return pruning.get("pattern") if isinstance(pruning, dict) else None


def verify_run(run: str | Path) -> dict:
    """Reload ``RUN/model`` from disk and check that every saved weight is finite (a dense model
    folder too), every mask, and the N:M pattern of every masked matrix when the run records one;
    returns counts for the report."""
    run = Path(run)
    model_dir = run / "model" if (run / "model").is_dir() else run
    if not (model_dir / "config.json").is_file():
        raise DataError(f"{run} is not a run folder with a saved model (no model/config.json); pass "
                        "a folder written by 'compress prune'")
    from compress.models.loading import check_safetensors_folder

    check_safetensors_folder(model_dir, REDO)
    check_finite_weights(model_dir)  # first: a dense folder (no masks) is checked too
    masks = load_masks(model_dir / MASKS_FILE)
    model = load_saved_model(model_dir)
    pattern = recorded_pattern(model_dir)
    if pattern:  # first: a weight regrown in a group names the group, not only the tensor
        check_pattern(model, list(masks), pattern)
    check_masks(model, masks)
    pruned = sum(m.numel() - int(torch.count_nonzero(m)) for m in masks.values())
    total = sum(m.numel() for m in masks.values())
    return {"tensors": len(masks), "pruned": pruned, "total": total,
            "sparsity": pruned / total if total else 0.0, "model_dir": str(model_dir),
            "pattern": pattern}
