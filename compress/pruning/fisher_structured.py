"""Fisher-guided structured pruning after Kwon et al. 2022, "A Fast Post-Training Pruning Framework
for Transformers": no retraining, a few hundred examples, a FLOPs target.

    fisher_prune_structured(model, batches, flops_reduction, seq_len, targets=("heads", "ffn"),
                            rearrange=True, tune=True) -> dict

removes heads and FFN neurons of any encoder of the role table (``compress.models.architectures``) in
place so that the encoder's FLOPs at ``seq_len`` tokens drop by at least ``flops_reduction``, and
returns a report (FLOPs before/after, units kept per layer, mask values, seconds per phase).
``batches``: dicts of tensors the model takes, with ``labels`` (or ``start_positions`` /
``end_positions``) for the task loss, without them for self-labelled cross-entropy.

Phases, each usable alone:

1. ``fisher_importance`` (``fisher_masks``): a multiplicative mask, all ones, on each head's
   context columns (the ``attn_out`` input, head h = columns h*d:(h+1)*d) and each neuron's
   activation (the ``ffn_out`` input, neuron j = column j), set by pre-hooks, so every architecture
   of the table works. The masks carry a batch dimension, so one backward pass of the summed
   per-example losses gives every example's own gradient exactly (examples do not interact in an
   encoder run in eval mode); importance = sum over examples of the squared gradient (the
   empirical Fisher diagonal).
2. ``search_masks`` (``fisher_search``): the FLOPs-constrained search.
3. ``rearrange_masks`` (``fisher_search``): greedy swaps under each layer's block of the Fisher,
   until no swap lowers the cost (at most ``max_swaps`` per block).
4. ``tune_masks_least_squares`` (``fisher_tuning``): per layer in order, real-valued scales of
   the kept heads, then of the kept neurons, fitted by ridge-damped least squares so the pruned
   layer's attention / FFN output (before residual and LayerNorm) matches the dense model's; the
   later layers see the tuned earlier ones. The scales stay in ``[-scale_bound, scale_bound]``
   (box-constrained least squares; Kwon et al.'s code stops tuning once a scale leaves [-10,
   10]). Scales that would not lower the error fall back to 1.
5. the scales are folded into the ``attn_out`` / ``ffn_out`` columns and the units are removed by
   ``compress.pruning.structured.remove_structured`` (same saved format as ``prune_structured``).

FLOPs (1 MAC = 2 FLOPs, as ``compress.measure``): per sequence of L tokens, a head costs
L * 4 * hidden * d (its Q, K, V rows and output columns) + 2 * L^2 * d (scores and context) MACs
and a neuron L * 2 * hidden (its input row, gate row too in a gated FFN, and output column).
ALBERT's shared layer counts once per pass. DeBERTa's relative-position terms and all
element-wise ops (LayerNorm, softmax, activations) are not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from compress.core.errors import UsageError
from compress.pruning.fisher_masks import (
    FisherImportance,
    fisher_importance,
    per_example_loss,
    unit_flops,
    unit_masks,
)
from compress.pruning.fisher_search import MAX_SWAPS, TARGETS, rearrange_masks, removal_cost, search_masks
from compress.pruning.fisher_tuning import SCALE_BOUND, fold_scales, tune_masks_least_squares
from compress.pruning.structured import check_removable, remove_structured

IMPORTANCE = ("empirical Fisher diagonal of per-head / per-neuron multiplicative masks (Kwon et al. 2022): "
              "sum over examples of the squared per-example gradient")

__all__ = ["MAX_SWAPS", "SCALE_BOUND", "FisherImportance", "block_costs", "fisher_importance",
           "fisher_prune_structured", "fold_scales", "per_example_loss", "rearrange_masks", "search_masks",
           "tune_masks_least_squares", "unit_flops", "unit_masks"]


def block_costs(keep_heads: list[list[int]], keep_neurons: list[list[int]],
                fisher: FisherImportance) -> float:
    """Sum over layers and unit kinds of ``removal_cost`` of the units not in the keep lists: the
    block-Fisher estimate of the loss increase that the rearrangement lowers."""
    total = 0.0
    for grads, keeps in ((fisher.head_grads, keep_heads), (fisher.neuron_grads, keep_neurons)):
        for g, keep in zip(grads, keeps):
            removed = torch.ones(g.shape[1], dtype=torch.bool)
            removed[keep] = False
            total += removal_cost(g, removed)
    return total


class PhaseClock:
    """``lap(phase)`` records the seconds since the previous lap (or the clock's start) under
    ``seconds[phase]``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._last, 3)
        self._last = now


def check_targets(targets) -> tuple[str, ...]:
    """``targets`` as a tuple; UsageError naming the valid ones for an unknown unit kind."""
    targets = tuple(targets)
    for t in targets:
        if t not in TARGETS:
            raise UsageError(f"unknown structured target '{t}'; choose from: {', '.join(TARGETS)}")
    return targets


def apply_keep_lists(model: nn.Module, batches: list[dict[str, torch.Tensor]], fisher: FisherImportance,
                     keep_heads: list[list[int]], keep_neurons: list[list[int]],
                     lap: Callable[[str], None] = lambda phase: None, rearrange: bool = True,
                     tune: bool = True, max_swaps: int = MAX_SWAPS,
                     scale_bound: float | None = SCALE_BOUND) -> dict[str, Any]:
    """Phases 3-5 on the searched keep lists, whatever searched them (FLOPs here, latency in
    ``compress.pruning.latency_structured``): rearrange, tune, fold the scales, remove the rest.
    Returns the report fields, ``kept_heads`` / ``kept_neurons`` the final lists; ``lap(phase)``
    is called after each phase."""
    cost_before = block_costs(keep_heads, keep_neurons, fisher)
    if rearrange:
        keep_heads, keep_neurons = rearrange_masks(keep_heads, keep_neurons, fisher.head_grads,
                                                   fisher.neuron_grads, max_swaps)
    lap("rearrange")
    if tune:
        tuned = tune_masks_least_squares(model, batches, keep_heads, keep_neurons, bound=scale_bound)
    else:
        tuned = {"heads": [torch.zeros(len(h)).index_fill_(0, torch.tensor(k, dtype=torch.long), 1.0)
                           for h, k in zip(fisher.heads, keep_heads)],
                 "neurons": [torch.zeros(len(n)).index_fill_(0, torch.tensor(k, dtype=torch.long), 1.0)
                             for n, k in zip(fisher.neurons, keep_neurons)]}
    lap("tune")
    fold_scales(model, tuned["heads"], tuned["neurons"])
    removal = remove_structured(model, keep_heads, keep_neurons)
    lap("remove")
    fields = {"rearranged": rearrange, "max_swaps": max_swaps,
              "removal_cost": {"searched": cost_before,
                               "kept": block_costs(keep_heads, keep_neurons, fisher)},
              "tuned": tune and "skipped" not in tuned, "scale_bound": scale_bound,
              "head_masks": [v.tolist() for v in tuned["heads"]],
              "neuron_masks": [v.tolist() for v in tuned["neurons"]],
              **removal, "kept_neurons": keep_neurons}
    for key in ("attn_error", "ffn_error", "skipped"):
        if key in tuned:
            fields[f"tune_{key}"] = tuned[key]
    return fields


def fisher_prune_structured(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
                            flops_reduction: float, seq_len: int, targets: tuple[str, ...] = TARGETS,
                            rearrange: bool = True, tune: bool = True,
                            loss_fn: Callable[[Any, dict], torch.Tensor] | None = None,
                            max_swaps: int = MAX_SWAPS, scale_bound: float | None = SCALE_BOUND,
                            fisher: FisherImportance | None = None) -> dict[str, Any]:
    """Remove heads / FFN neurons of ``model`` in place so the encoder's FLOPs at ``seq_len``
    tokens fall by at least ``flops_reduction`` (in (0, 1)); see the module docstring.
    ``max_swaps``: the rearrangement's cap per block; ``scale_bound``: the tuned scales stay in
    ``[-scale_bound, scale_bound]`` (None: unbounded); ``fisher``: an importance already taken on
    the same model (``loss_fn`` is then not read)."""
    if not 0 < flops_reduction < 1:
        raise UsageError(f"flops_reduction must be in (0, 1), got {flops_reduction}")
    if scale_bound is not None and not scale_bound >= 1:
        raise UsageError(f"scale_bound must be >= 1 (a scale of 1 is the untuned mask), got {scale_bound}")
    if max_swaps < 0:
        raise UsageError(f"max_swaps must be >= 0, got {max_swaps}")
    if seq_len < 1:
        raise UsageError(f"seq_len must be a positive number of tokens, got {seq_len}")
    targets = check_targets(targets)
    layout = check_removable(model, targets)  # a type whose layers cannot shrink is refused before any work
    batches = list(batches)
    lap = PhaseClock()
    if fisher is None:
        fisher = fisher_importance(model, batches, loss_fn)
    lap("fisher")
    per_head, per_neuron = unit_flops(model, seq_len)

    def flops(n_heads, n_neurons):
        return sum(n_heads) * per_head + sum(n_neurons) * per_neuron

    before = flops([len(h) for h in fisher.heads], [len(n) for n in fisher.neurons])
    keep_heads, keep_neurons = search_masks(fisher.heads, fisher.neurons, per_head, per_neuron,
                                            (1 - flops_reduction) * before, targets)
    lap("search")
    applied = apply_keep_lists(model, batches, fisher, keep_heads, keep_neurons, lap, rearrange, tune,
                               max_swaps, scale_bound)
    keep_heads, keep_neurons = applied["kept_heads"], applied["kept_neurons"]
    after = flops([len(h) for h in keep_heads], [len(n) for n in keep_neurons])
    report = {"method": "fisher (Kwon et al. 2022)", "importance": IMPORTANCE, "loss": fisher.loss,
              "architecture": layout.name, "targets": list(targets), "seq_len": seq_len,
              "examples": int(fisher.head_grads[0].shape[0]),
              "flops_reduction_requested": flops_reduction,
              "encoder_flops_before": before, "encoder_flops_after": after,
              "flops_reduction": 1 - after / before,
              "flops_per_head": per_head, "flops_per_neuron": per_neuron,
              "flops_not_counted": "element-wise ops (LayerNorm, softmax, activations, biases); "
                                   "DeBERTa's relative-position terms; embeddings and task head",
              **applied, "seconds": lap.seconds}
    return report
