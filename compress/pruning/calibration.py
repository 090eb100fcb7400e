"""Calibration: run sample data through a model and prune it with a criterion that sees the data.

``prune_calibrated`` is the one-shot, data-aware prune (SparseGPT, Wanda, or a weight-only
criterion for comparison). It processes the encoder layers in order, as SparseGPT does: for layer
``i`` the calibration batches run through the model, whose layers ``0 .. i-1`` are already pruned
(and reconstructed), while forward pre-hooks on layer ``i``'s target matrices gather the statistics
the criterion asks for (``compress.pruning.criteria``); the forward stops at the end of layer ``i``
(the rest would be wasted), the layer's matrices are pruned, and the next layer sees them pruned.
Only one layer's statistics exist at a time (for a hidden-768 model the largest is the 3072 x 3072
input Gram matrix of the FFN output, 75 MB in float64). Running the whole model up to the layer,
instead of replaying captured layer inputs, costs ``L (L + 1) / 2`` layer passes per batch instead
of ``L`` but works for every architecture of the role table unchanged (their layers take different
masks, position embeddings and relative-position inputs). ALBERT's shared layer runs at every
depth: its statistics sum over all of them and it is pruned once, after one full pass.

Statistics cover the non-padding tokens only. Matrices outside the encoder layers (the word
embeddings, and what ``--include`` adds) are pruned by magnitude: an embedding's input is a one-hot
token, so no input statistic says more about it than its weights do.

Scopes. ``local``: every matrix loses ``round(sparsity * numel)`` weights (a criterion that compares
within rows, Wanda, loses ``round(sparsity * in)`` per row). ``global``: a first pass over the dense
model scores every encoder matrix with the criterion's own score (SparseGPT: the OBS saliency
``w^2 / [H^-1]_jj^2``), one threshold over all of them gives each matrix its count, and the
layer-wise pass prunes each matrix to that count; the embeddings stay at ``sparsity``.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterable, Sequence

import torch

from compress.core.config import check_sparsity
from compress.core.errors import ModelError, UsageError
from compress.models.architectures import encoder_layers, find_layout
from compress.pruning.criteria import Criterion, LayerStats, unstructured
from compress.pruning.masks import NMPattern, get_scope, keep_mask_flat, n_pruned, nm_mask
from compress.pruning.pruner import check_pattern_fits
from compress.pruning.sparsegpt import sparsegpt_prune
from compress.pruning.targets import named_weights

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


class _StopForward(Exception):
    """Raised by a forward hook at the end of the layer being calibrated: the rest is not needed."""


def calibration_sample(n_examples: int, n: int, seed: int, labels: Sequence | None = None) -> list[int]:
    """``n`` distinct example indices out of ``n_examples`` (all of them when ``n`` is larger), drawn
    by a seeded permutation and returned sorted: the same calibration set for the same seed.

    With ``labels`` (one hashable label per example, e.g. a class id or a tuple of them) the draw
    is stratified: each label gets its share of ``n`` in proportion to its count (largest
    remainders; at least one example per label while ``n`` allows), so a small class is neither
    left out nor over-drawn by chance; within a label the examples are the first of the same
    seeded permutation."""
    if n < 1:
        raise UsageError(f"--calibration-samples must be >= 1, got {n}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_examples, generator=g).tolist()
    if labels is None or n >= n_examples:
        return sorted(order[:n])
    if len(labels) != n_examples:
        raise UsageError(f"calibration_sample got {len(labels)} labels for {n_examples} examples")
    groups: dict = {}
    for i in order:  # each label's examples in the permutation's order
        groups.setdefault(labels[i], []).append(i)
    return sorted(i for key, k in _stratum_sizes({k: len(v) for k, v in groups.items()}, n).items()
                  for i in groups[key][:k])


def _stratum_sizes(counts: dict, n: int) -> dict:
    """How many of ``n`` draws (fewer than the examples) each stratum of ``counts`` (key -> size,
    in first-seen order) gets: shares in proportion to the sizes by largest remainders (ties: the
    first seen), then a stratum left at 0 takes one from the largest while that has more than one
    (the larger strata first), so every label is seen when ``n`` allows."""
    keys = list(counts)
    total = sum(counts.values())
    exact = {k: n * counts[k] / total for k in keys}
    sizes = {k: int(exact[k]) for k in keys}
    for k in sorted(keys, key=lambda k: -(exact[k] - sizes[k]))[:n - sum(sizes.values())]:
        sizes[k] += 1
    for k in sorted((k for k in keys if sizes[k] == 0), key=lambda k: -counts[k]):
        donor = max(keys, key=lambda d: sizes[d])
        if sizes[donor] <= 1:
            break
        sizes[donor] -= 1
        sizes[k] += 1
    return sizes


def _model_inputs(batch: dict, device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items() if k in MODEL_INPUTS}


def pads_inside(model: torch.nn.Module) -> bool:
    """Whether ``model`` pads its batch inside, at the end, to a multiple of an attention window
    (Longformer) or block (BigBird's block-sparse attention): its Linears then see more positions
    than the batch has."""
    config = getattr(model, "config", None)
    return getattr(config, "attention_window", None) is not None or \
        getattr(config, "attention_type", None) == "block_sparse"


def _token_rows(x: torch.Tensor, mask: torch.Tensor | None, name: str, padded_inside: bool = False
                ) -> tuple[torch.Tensor, int]:
    """(rows ``[n, in]`` of a Linear's input, the weight of each row). The batch's tokens: padding
    dropped, weight 1. An input that is not per token (DeBERTa's relative-position embeddings, run
    through the shared query/key projections once per batch): every row weighs the batch size, as
    every example sees them, so the statistics do not depend on how the examples are batched."""
    if mask is None:
        return x.reshape(-1, x.shape[-1]).float(), 1
    if x.ndim == 3 and tuple(x.shape[:2]) == tuple(mask.shape):
        return x[mask].float(), 1  # [tokens, in]: padding positions dropped
    batch, length = mask.shape
    if padded_inside and x.ndim == 3 and x.shape[0] != batch and x.shape[1] == batch and x.shape[0] >= length:
        x = x.transpose(0, 1)  # [positions, batch, in] (Longformer's attention projections)
    if padded_inside and x.ndim == 3 and x.shape[0] == batch and x.shape[1] > length:
        # the model padded the batch inside, at the end (``pads_inside``): the positions past the
        # batch's are padding
        return x[:, :length][mask].float(), 1
    if x.ndim == 3 and x.shape[0] == mask.shape[0]:
        raise ModelError(f"{name} sees {x.shape[1]} of the batch's {mask.shape[1]} positions at a time "
                         "(chunk_size_feed_forward?): its padding cannot be told apart; load the model with "
                         "chunk_size_feed_forward=0")
    return x.reshape(-1, x.shape[-1]).float(), int(mask.shape[0])


def gather_stats(model: torch.nn.Module, batches: Sequence[dict], linears: dict[str, torch.nn.Linear],
                 needs: Iterable[str], stop_after: torch.nn.Module | None = None) -> dict[str, LayerStats]:
    """Run ``batches`` through ``model`` and gather, for each of ``linears`` (name -> Linear), the
    input statistics in ``needs`` (``input_gram`` in float64, ``input_sq``) over the non-padding
    tokens. ``stop_after``: a module whose forward ends the pass (the layer being calibrated)."""
    needs = set(needs)
    stats = {n: LayerStats() for n in linears}
    token_mask: dict[str, torch.Tensor | None] = {"mask": None}
    padded_inside = pads_inside(model)

    def hook_for(name: str):
        def hook(module, args):
            x, weight = _token_rows(args[0].detach(), token_mask["mask"], name, padded_inside)
            st = stats[name]
            if "input_gram" in needs:
                g = weight * (x.T @ x).double()
                st.input_gram = g if st.input_gram is None else st.input_gram + g
            if "input_sq" in needs:
                s = weight * (x * x).sum(dim=0).double()
                st.input_sq = s if st.input_sq is None else st.input_sq + s
            st.tokens += weight * x.shape[0]
        return hook

    def stop(module, args, output):
        raise _StopForward

    handles = [lin.register_forward_pre_hook(hook_for(n)) for n, lin in linears.items()]
    if stop_after is not None:
        handles.append(stop_after.register_forward_hook(stop))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = _model_inputs(batch, device)
                am = inputs.get("attention_mask")
                token_mask["mask"] = am.bool() if am is not None else None
                try:
                    model(**inputs)
                except _StopForward:
                    pass
    finally:
        for h in handles:
            h.remove()
    return stats


def _keep_from_scores(scores: torch.Tensor, count: int, pattern: NMPattern | None, by_row: bool,
                      sparsity: float) -> torch.Tensor:
    if pattern is not None:
        return nm_mask(scores, pattern.n, pattern.m)
    if by_row:
        k = n_pruned(scores.shape[-1], sparsity)
        return torch.stack([keep_mask_flat(row, k) for row in scores.reshape(-1, scores.shape[-1])]
                           ).reshape(scores.shape)
    return keep_mask_flat(scores, count).reshape(scores.shape)


def _layer_groups(model: torch.nn.Module, targets: dict[str, torch.nn.Parameter]):
    """[(layer module, {name: Linear})] in depth order for the targets inside encoder layers, and
    the names of the other targets. A model whose roles are unknown (its targets named by
    ``--include``) is one group: every targeted Linear sees the dense model's inputs."""
    layout = find_layout(model)
    name_of = {id(p): n for n, p in targets.items()}
    groups, inside = [], set()
    if layout is None:
        lins = {name_of[id(m.weight)]: m for m in model.modules()
                if isinstance(m, torch.nn.Linear) and id(m.weight) in name_of}
        groups = [(model, dict(sorted(lins.items())))] if lins else []
        return None, groups, [n for n in targets if n not in lins]
    for layer in encoder_layers(model, layout):
        lins = {name_of[id(lin.weight)]: lin for lin in layer.linears.values() if id(lin.weight) in name_of}
        if lins:
            groups.append((layer.module, dict(sorted(lins.items()))))
            inside.update(lins)
    return layout, groups, [n for n in targets if n not in inside]


def _global_counts(model, groups, batches, crit: Criterion, sparsity: float, forced: dict,
                   stop: bool, generator: torch.Generator) -> dict[str, int]:
    """Per-matrix prune counts from one threshold over the dense model's criterion scores."""
    scores = {}
    for module, lins in groups:
        stats = (gather_stats(model, batches, lins, crit.needs, module if stop else None)
                 if crit.needs else {})
        for name, lin in lins.items():
            s = crit.score(lin.weight, stats.get(name), generator).float().cpu()
            if name in forced:
                s.masked_fill_(forced[name], float("-inf"))
            scores[name] = s
    names = sorted(scores)
    flat = torch.cat([scores[n].reshape(-1) for n in names])
    keep = keep_mask_flat(flat, n_pruned(flat.numel(), sparsity))
    counts, start = {}, 0
    for n in names:
        size = scores[n].numel()
        counts[n] = size - int(keep[start:start + size].sum())
        start += size
    return counts


@torch.no_grad()
def carry_masks(model: torch.nn.Module, targets: dict | Iterable[str],
                initial_masks: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The ``initial_masks`` (True = kept) of matrices outside ``targets``, applied to ``model``'s
    weights and returned (CPU bool): a prune of some matrices keeps every other matrix's old
    zeros, in the weights and in the masks it saves."""
    params = named_weights(model)
    out = {}
    for name, m in (initial_masks or {}).items():
        if name in targets or name not in params:
            continue
        keep = m.detach().to("cpu", torch.bool)
        params[name].masked_fill_(~keep.to(params[name].device), 0.0)
        out[name] = keep
    return out


@torch.no_grad()
def prune_calibrated(model: torch.nn.Module, targets: dict[str, torch.nn.Parameter],
                     batches: Sequence[dict], criterion: str, sparsity: float, scope: str = "local",
                     pattern: NMPattern | None = None, initial_masks: dict[str, torch.Tensor] | None = None,
                     seed: int = 0, blocksize: int = 128, percdamp: float = 0.01
                     ) -> tuple[dict[str, torch.Tensor], dict]:
    """Prune ``targets`` (canonical name -> parameter of ``model``) in place, one-shot, with
    ``criterion`` and the calibration ``batches`` (dicts of the model's input tensors; labels and
    other keys are ignored). Returns the masks (CPU bool, True = kept) and a report: per-matrix
    sparsity (and SparseGPT's estimated error), the calibration tokens, seconds and peak memory.
    ``initial_masks`` (True = kept) stay pruned, those of matrices outside ``targets`` too (they are
    returned among the masks). The model is left in the train/eval mode it had."""
    crit = unstructured(criterion)
    get_scope(scope)
    if pattern is not None:  # the pattern checks of the training-time pruner: scope, shapes
        check_pattern_fits(pattern, targets, criterion, scope)
        sparsity = pattern.sparsity
    check_sparsity(sparsity)
    if crit.data_aware and not batches:
        raise UsageError(f"criterion '{criterion}' needs calibration batches; got none")
    t0 = time.time()
    was_training = model.training
    model.eval()
    layout, groups, others = _layer_groups(model, targets)
    stop = layout is not None and not layout.shared_layers
    forced = {n: ~m.bool().cpu() for n, m in (initial_masks or {}).items() if n in targets}
    g = torch.Generator().manual_seed(seed)
    counts = {n: n_pruned(p.numel(), sparsity) for n, p in targets.items()}
    if scope == "global" and groups:
        counts.update(_global_counts(model, groups, batches, crit, sparsity, forced, stop, g))
    masks, per_matrix, tokens = {}, {}, 0
    for module, lins in groups:
        stats = (gather_stats(model, batches, lins, crit.needs, module if stop else None)
                 if crit.needs else {})
        for name, lin in lins.items():
            w, st = lin.weight, stats.get(name)
            tokens = max(tokens, st.tokens if st else 0)
            info: dict = {}
            if crit.reconstructs:
                new, keep, err = sparsegpt_prune(
                    w, st.input_gram, counts[name], (pattern.n, pattern.m) if pattern else None,
                    forced.get(name), blocksize, percdamp)
                w.copy_(new.to(w.device))
                info["estimated_error"] = round(err, 6)
            else:
                scores = crit.score(w, st, g).float()
                if name in forced:
                    scores.masked_fill_(forced[name].to(scores.device), float("-inf"))
                keep = _keep_from_scores(scores, counts[name], pattern,
                                         crit.compare == "row" and scope == "local", sparsity)
                if name in forced:
                    keep &= ~forced[name].to(keep.device)
            w.masked_fill_(~keep.to(w.device), 0.0)
            masks[name] = keep.cpu()
            per_matrix[name] = {"sparsity": round(1 - float(keep.float().mean()), 6), **info}
    for name in others:  # word embeddings and matrices outside the layers: by magnitude
        w = targets[name]
        scores = w.detach().abs().float()
        if name in forced:
            scores.masked_fill_(forced[name].to(scores.device), float("-inf"))
        keep = _keep_from_scores(scores, n_pruned(w.numel(), sparsity), pattern, False, sparsity)
        if name in forced:
            keep &= ~forced[name].to(keep.device)
        w.masked_fill_(~keep.to(w.device), 0.0)
        masks[name] = keep.cpu()
        per_matrix[name] = {"sparsity": round(1 - float(keep.float().mean()), 6), "criterion": "magnitude"}
    model.train(was_training)
    total = sum(m.numel() for m in masks.values())
    sparsity_reached = round(sum(int((~m).sum()) for m in masks.values()) / max(1, total), 6)
    carried = carry_masks(model, targets, initial_masks)
    masks.update(carried)
    report = {"criterion": criterion, "scope": scope, "pattern": str(pattern) if pattern else None,
              "sparsity_target": sparsity,
              "sparsity": sparsity_reached,
              "masks_kept_outside_targets": sorted(carried),
              "calibration_batches": len(batches), "calibration_tokens": tokens,
              "layer_passes": ("sequential, each layer sees the pruned layers before it" if layout is not None
                               else "one pass: every matrix sees the dense model's inputs (no role table)"),
              "outside_layers": {"criterion": "magnitude", "matrices": others},
              "seconds": round(time.time() - t0, 2),
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "matrices": per_matrix}
    return dict(sorted(masks.items())), report
