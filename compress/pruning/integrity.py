"""Integrity of pruned models: masked weights must be exactly zero, after training, saving, loading."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from compress.core.errors import DataError, IntegrityError, ModelError
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


@torch.no_grad()
def check_finite_parameters(model: torch.nn.Module, source: str | None = None,
                            fix: str = "prune a model with finite weights") -> None:
    """Raise ModelError naming the first parameter or buffer of ``model`` (in memory) holding NaN
    or infinite entries, and how many tensors do: pruning such a model would spread them (SparseGPT's
    Gram matrix, Wanda's norms) or hide them behind zeros."""
    bad = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point():
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            if nan or inf:
                bad.append((name, nan, inf))
    if bad:
        name, nan, inf = bad[0]
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        where = f" of {source}" if source else ""
        raise ModelError(f"the model{where} is not finite: {name} holds {nan} NaN and {inf} infinite "
                         f"entries{more}; {fix} (its run diverged or its file is damaged)")


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
    from compress.models.loading import check_loaded_weights, check_safetensors_folder, register_model_types

    check_safetensors_folder(model_dir, REDO)
    register_model_types(model_dir)
    model, info = cls.from_pretrained(model_dir, use_safetensors=True, trust_remote_code=False,
                                      output_loading_info=True)
    check_loaded_weights(str(model_dir), model, info)
    return model


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
    """``compress verify`` of any folder compress writes: reload ``RUN/model`` (or the model folder
    itself) from disk and check that every saved weight is finite; a structured-pruned model's
    weight shapes against its config's ``layer_heads`` / ``layer_intermediate``; every mask, and
    the N:M pattern of every masked matrix when the run records one. A dense model (no masks, none
    recorded) passes on the first two; a distillation run's ``student/`` on its weights being
    finite. Returns counts for the report (``kind``: masked, dense or student)."""
    run = Path(run)
    if not (run / "model").is_dir() and (run / "student" / "student.json").is_file():
        return _verify_student(run / "student")
    model_dir = run / "model" if (run / "model").is_dir() else run
    if not (model_dir / "config.json").is_file():
        if (model_dir / "student.json").is_file():
            return _verify_student(model_dir)
        raise DataError(f"{run} is not a run folder with a saved model (no model/config.json); pass "
                        "a folder written by 'compress prune'")
    from compress.models.loading import check_safetensors_folder

    check_safetensors_folder(model_dir, REDO)
    check_finite_weights(model_dir)  # first: a dense folder (no masks) is checked too
    structure = check_structure(model_dir)
    meta = _read_meta(model_dir)
    masks_file = model_dir / MASKS_FILE
    if not masks_file.is_file() and (meta.get("pruning") or {}).get("masks_file"):
        raise IntegrityError(f"{model_dir} records masks (compress.json: pruning.masks_file) but has no "
                             f"{MASKS_FILE}: the pruned weights cannot be checked; {REDO}")
    masks = load_masks(masks_file) if masks_file.is_file() else {}
    model = load_saved_model(model_dir)
    pattern = recorded_pattern(model_dir) if masks else None
    if pattern:  # first: a weight regrown in a group names the group, not only the tensor
        check_pattern(model, list(masks), pattern)
    check_masks(model, masks)
    stock = check_stock_folder(model_dir, model)
    pruned = sum(m.numel() - int(torch.count_nonzero(m)) for m in masks.values())
    total = sum(m.numel() for m in masks.values())
    return {"kind": "masked" if masks else "dense", "tensors": len(masks), "pruned": pruned,
            "total": total, "sparsity": pruned / total if total else 0.0, "model_dir": str(model_dir),
            "pattern": pattern, "structure": structure, "stock_copy": stock}


def check_stock_folder(model_dir: Path, model) -> bool:
    """The stock copy a saved embedding folder keeps for sentence-transformers (``0_Transformer``,
    ``compress.pruning.stock_copy``) beside a structured-pruned ``model``: complete, finite, and
    computing what the pruned weights compute (IntegrityError naming the folder otherwise), since
    ``SentenceTransformer(folder)`` reads it and not them. False when there is none."""
    from transformers import AutoModel

    from compress.models.loading import check_loaded_weights, check_safetensors_folder
    from compress.pruning.stock_copy import STOCK_DIR, output_gap, same_outputs

    stock_dir = Path(model_dir) / STOCK_DIR
    if not (stock_dir / "config.json").is_file():
        return False
    check_safetensors_folder(stock_dir, REDO)
    check_finite_weights(stock_dir)
    stock, info = AutoModel.from_pretrained(stock_dir, use_safetensors=True, trust_remote_code=False,
                                            output_loading_info=True)
    check_loaded_weights(str(stock_dir), stock, info)
    encoder = getattr(model, model.base_model_prefix, model)
    gap = output_gap(encoder, stock)
    if not same_outputs(gap):
        raise IntegrityError(f"{stock_dir}, the copy sentence-transformers loads, computes other outputs "
                             f"than the pruned weights beside it (relative gap {gap:.1e}); {REDO}")
    return True


def _read_meta(model_dir: Path) -> dict:
    meta_file = Path(model_dir) / "compress.json"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _verify_student(folder: Path) -> dict:
    """A distilled student (``student/``): its weights readable and finite."""
    from compress.models.loading import check_safetensors_folder

    check_safetensors_folder(folder, REDO)
    check_finite_weights(folder)
    return {"kind": "student", "tensors": 0, "pruned": 0, "total": 0, "sparsity": 0.0,
            "model_dir": str(folder), "pattern": None, "structure": None}


@torch.no_grad()
def check_structure(model_dir: Path) -> dict | None:
    """For a structured-pruned model (``config.json`` with ``layer_heads`` / ``layer_intermediate``):
    raise IntegrityError naming the first saved tensor whose shape differs from the one its config
    gives (the model built from the config on the meta device, so nothing is allocated); returns
    the per-layer sizes, or None for a model of uniform layers."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    from compress.models.loading import register_model_types

    raw = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    if raw.get("layer_heads") is None and raw.get("layer_intermediate") is None:
        return None
    register_model_types(model_dir)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    cls = AutoModelForSequenceClassification if _read_meta(model_dir).get("label_names") else AutoModel
    try:
        with torch.device("meta"):
            expected_model = cls.from_config(config)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise IntegrityError(f"{model_dir}/config.json does not describe a model: "
                             f"{str(exc).splitlines()[0][:160]}; {REDO}") from None
    prefix = f"{expected_model.base_model_prefix}."
    expected = {n.removeprefix(prefix): tuple(t.shape) for n, t in expected_model.state_dict().items()}
    sizes = {"layer_heads": raw.get("layer_heads"), "layer_intermediate": raw.get("layer_intermediate")}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        if f.name == MASKS_FILE:
            continue
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                shape = tuple(fh.get_slice(name).get_shape())
                want = expected.get(name.removeprefix(prefix))
                if want is not None and shape != want:
                    raise IntegrityError(
                        f"{name} is {list(shape)} in the saved weights, but config.json's layer_heads "
                        f"{sizes['layer_heads']} / layer_intermediate {sizes['layer_intermediate']} "
                        f"make it {list(want)}; the config and the weights disagree: {REDO}")
    return sizes
