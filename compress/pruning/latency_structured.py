"""Structured pruning aimed at a measured speedup: Kwon et al.'s Fisher pipeline (importance,
rearrangement, least-squares tuning, removal; ``compress.pruning.fisher_structured``) with the
FLOPs-constrained search replaced by the latency-constrained one of
``compress.pruning.latency_search`` over a measured ``LatencyTable``
(``compress.measure.latency_table``).

    fisher = fisher_importance(model, batches)            # once, on the dense model
    report = prune_to_speedup(model, batches, table, 3.0, fisher=fisher)

``prune_to_speedup`` removes heads, FFN neurons, whole attention / FFN blocks and whole layers (both
blocks; their two LayerNorms stay, which the table charges as the layer's fixed cost) in place,
so that the table predicts at least ``speedup`` times the dense model's speed in the table's
runtime and shape. One Fisher pass serves several targets (a family of models from one
calibration): pass the same ``fisher`` to each call on a fresh copy of the dense model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from compress.core.errors import UsageError
from compress.models.modeling_pruned import can_empty_blocks
from compress.pruning.fisher_masks import FisherImportance, fisher_importance, unit_flops
from compress.pruning.fisher_search import MAX_SWAPS, TARGETS
from compress.pruning.fisher_structured import PhaseClock, apply_keep_lists, check_targets
from compress.pruning.fisher_tuning import SCALE_BOUND
from compress.pruning.latency_search import (
    BlockOptions,
    block_budget_ms,
    block_options,
    default_ffn_step,
    search_latency,
    top_units,
    width_counts,
)
from compress.pruning.structured import check_removable


class LatencyModel(Protocol):
    """What the search reads of a ``compress.measure.latency_table.LatencyTable``."""

    base_ms: float
    layer_fixed_ms: float

    def attention_ms(self, heads: int) -> float: ...
    def ffn_ms(self, width: int) -> float: ...
    def predict_ms(self, layer_heads, layer_ffn) -> float: ...


def plan_for_speedup(fisher: FisherImportance, table: LatencyModel, speedup: float,
                     targets: tuple[str, ...] = TARGETS, allow_empty: bool = True,
                     ffn_step: int | None = None, dense_sizes: tuple[list[int], list[int]] | None = None
                     ) -> dict[str, Any]:
    """Per-layer keep lists meeting ``speedup`` by ``table``'s prediction, at the least estimated
    loss (``compress.pruning.latency_search``). A unit kind outside ``targets`` is kept whole.
    ``dense_sizes``: heads and neurons per layer of the model the target is relative to (default:
    the one ``fisher`` was taken on)."""
    if speedup <= 1:
        raise UsageError(f"--speedup must be above 1 (times the dense model's speed), got {speedup}")
    n_layers = len(fisher.heads)
    heads_full = [len(h) for h in fisher.heads]
    ffn_full = [len(n) for n in fisher.neurons]
    dense_ms = table.predict_ms(*(dense_sizes or (heads_full, ffn_full)))
    budget = block_budget_ms(table, dense_ms, speedup, n_layers)
    blocks: list[BlockOptions] = []
    for layer in range(n_layers):
        h_counts = (list(range(0 if allow_empty else 1, heads_full[layer] + 1)) if "heads" in targets
                    else [heads_full[layer]])
        step = ffn_step or default_ffn_step(ffn_full[layer])
        w_counts = width_counts(ffn_full[layer], step, allow_empty) if "ffn" in targets else [ffn_full[layer]]
        blocks.append(block_options("attention", layer, fisher.head_grads[layer], fisher.heads[layer],
                                    h_counts, table.attention_ms))
        blocks.append(block_options("ffn", layer, fisher.neuron_grads[layer], fisher.neurons[layer],
                                    w_counts, table.ffn_ms))
    choices, _, loss = search_latency(blocks, budget)
    counts = [b.counts[j] for b, j in zip(blocks, choices)]
    layer_heads, layer_ffn = counts[0::2], counts[1::2]
    predicted = table.predict_ms(layer_heads, layer_ffn)
    return {"keep_heads": [top_units(fisher.heads[i], k) for i, k in enumerate(layer_heads)],
            "keep_neurons": [top_units(fisher.neurons[i], k) for i, k in enumerate(layer_ffn)],
            "speedup_requested": speedup, "predicted_ms": predicted, "dense_predicted_ms": dense_ms,
            "predicted_speedup": dense_ms / predicted, "estimated_loss": loss}


def prune_to_speedup(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], table: LatencyModel,
                     speedup: float, targets: tuple[str, ...] = TARGETS, rearrange: bool = True,
                     tune: bool = True, fisher: FisherImportance | None = None, max_swaps: int = MAX_SWAPS,
                     scale_bound: float | None = SCALE_BOUND,
                     dense_sizes: tuple[list[int], list[int]] | None = None) -> dict[str, Any]:
    """Remove units, blocks and layers of ``model`` in place so ``table`` predicts ``speedup``;
    returns the report (the plan, what was removed, FLOPs before and after, seconds per phase).
    ``max_swaps``, ``scale_bound``: as in ``fisher_prune_structured``."""
    targets = check_targets(targets)
    layout = check_removable(model, targets)  # a type whose layers cannot shrink is refused before any work
    batches = list(batches)
    lap = PhaseClock()
    if fisher is None:
        fisher = fisher_importance(model, batches)
    lap("fisher")
    allow_empty = can_empty_blocks(model.config.model_type)
    plan = plan_for_speedup(fisher, table, speedup, tuple(targets), allow_empty, dense_sizes=dense_sizes)
    lap("search")
    per_head, per_neuron = unit_flops(model, getattr(table, "seq_len", 128))  # FLOPs at the table's length
    applied = apply_keep_lists(model, batches, fisher, plan["keep_heads"], plan["keep_neurons"], lap,
                               rearrange, tune, max_swaps, scale_bound)

    def flops(heads, neurons):
        return sum(len(h) for h in heads) * per_head + sum(len(n) for n in neurons) * per_neuron

    before = (flops([range(h) for h in dense_sizes[0]], [range(n) for n in dense_sizes[1]]) if dense_sizes
              else flops([range(len(h)) for h in fisher.heads], [range(len(n)) for n in fisher.neurons]))
    after = flops(applied["kept_heads"], applied["kept_neurons"])
    return {"method": "fisher importance, latency-constrained search (ZipLM-style dynamic programme "
                      "over a measured latency table)", "loss": fisher.loss, "architecture": layout.name,
            "targets": list(targets), "blocks_removable": allow_empty,
            **{k: v for k, v in plan.items() if not k.startswith("keep_")},
            "encoder_flops_before": before, "encoder_flops_after": after,
            "flops_reduction": 1 - after / before, **applied, "seconds": lap.seconds}


