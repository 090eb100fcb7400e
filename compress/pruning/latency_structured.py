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

import time
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import nn

from compress.core.errors import UsageError
from compress.models.architectures import layout_for
from compress.models.modeling_pruned import can_empty_blocks
from compress.pruning.fisher_masks import FisherImportance, fisher_importance, unit_flops
from compress.pruning.fisher_search import TARGETS, rearrange_masks
from compress.pruning.fisher_tuning import fold_scales, tune_masks_least_squares
from compress.pruning.latency_search import (
    BlockOptions,
    block_options,
    default_ffn_step,
    search_latency,
    top_units,
    width_counts,
)
from compress.pruning.structured import remove_structured


class LatencyModel(Protocol):
    """What the search reads of a ``compress.measure.latency_table.LatencyTable``."""

    base_ms: float
    layer_fixed_ms: float

    def attention_ms(self, heads: int) -> float: ...
    def ffn_ms(self, width: int) -> float: ...
    def predict_ms(self, layer_heads, layer_ffn) -> float: ...


def plan_for_speedup(fisher: FisherImportance, table: LatencyModel, speedup: float,
                     targets: tuple[str, ...] = TARGETS, allow_empty: bool = True,
                     ffn_step: int | None = None) -> dict[str, Any]:
    """Per-layer keep lists meeting ``speedup`` by ``table``'s prediction, at the least estimated
    loss (``compress.pruning.latency_search``). A unit kind outside ``targets`` is kept whole."""
    if speedup <= 1:
        raise UsageError(f"--speedup must be above 1 (times the dense model's speed), got {speedup}")
    n_layers = len(fisher.heads)
    heads_full = [len(h) for h in fisher.heads]
    ffn_full = [len(n) for n in fisher.neurons]
    dense_ms = table.predict_ms(heads_full, ffn_full)
    fixed_ms = table.base_ms + n_layers * table.layer_fixed_ms
    budget = dense_ms / speedup - fixed_ms
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
                     tune: bool = True, fisher: FisherImportance | None = None) -> dict[str, Any]:
    """Remove units, blocks and layers of ``model`` in place so ``table`` predicts ``speedup``;
    returns the report (the plan, what was removed, FLOPs before and after, seconds per phase)."""
    for t in targets:
        if t not in TARGETS:
            raise UsageError(f"unknown structured target '{t}'; choose from: {', '.join(TARGETS)}")
    layout = layout_for(model)
    batches = list(batches)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    if fisher is None:
        fisher = fisher_importance(model, batches)
    seconds["fisher"] = round(time.perf_counter() - clock, 3)
    allow_empty = can_empty_blocks(model.config.model_type)
    plan = plan_for_speedup(fisher, table, speedup, tuple(targets), allow_empty)
    seconds["search"] = round(time.perf_counter() - clock - sum(seconds.values()), 3)
    keep_heads, keep_neurons = plan["keep_heads"], plan["keep_neurons"]
    if rearrange:
        keep_heads, keep_neurons = rearrange_masks(keep_heads, keep_neurons, fisher.head_grads,
                                                   fisher.neuron_grads)
    seconds["rearrange"] = round(time.perf_counter() - clock - sum(seconds.values()), 3)
    tuned = _tuned_masks(model, batches, fisher, keep_heads, keep_neurons, tune)
    seconds["tune"] = round(time.perf_counter() - clock - sum(seconds.values()), 3)
    per_head, per_neuron = unit_flops(model, getattr(table, "seq_len", 128))  # FLOPs at the table's length
    fold_scales(model, tuned["heads"], tuned["neurons"])
    removal = remove_structured(model, keep_heads, keep_neurons)
    seconds["remove"] = round(time.perf_counter() - clock - sum(seconds.values()), 3)

    def flops(heads, neurons):
        return sum(len(h) for h in heads) * per_head + sum(len(n) for n in neurons) * per_neuron

    before = flops([range(len(h)) for h in fisher.heads], [range(len(n)) for n in fisher.neurons])
    after = flops(keep_heads, keep_neurons)
    report = {"method": "fisher importance, latency-constrained search (ZipLM-style dynamic programme "
                        "over a measured latency table)", "loss": fisher.loss, "architecture": layout.name,
              "targets": list(targets), "blocks_removable": allow_empty,
              **{k: v for k, v in plan.items() if not k.startswith("keep_")},
              "encoder_flops_before": before, "encoder_flops_after": after,
              "flops_reduction": 1 - after / before, "rearranged": rearrange,
              "tuned": tune and "skipped" not in tuned,
              "head_masks": [v.tolist() for v in tuned["heads"]],
              "neuron_masks": [v.tolist() for v in tuned["neurons"]],
              "kept_neurons": keep_neurons, **removal, "seconds": seconds}
    for key in ("attn_error", "ffn_error", "skipped"):
        if key in tuned:
            report[f"tune_{key}"] = tuned[key]
    return report


def _tuned_masks(model, batches, fisher, keep_heads, keep_neurons, tune: bool) -> dict[str, Any]:
    if tune:
        return tune_masks_least_squares(model, batches, keep_heads, keep_neurons)
    return {"heads": [torch.zeros(len(h)).index_fill_(0, torch.tensor(k, dtype=torch.long), 1.0)
                      for h, k in zip(fisher.heads, keep_heads)],
            "neurons": [torch.zeros(len(n)).index_fill_(0, torch.tensor(k, dtype=torch.long), 1.0)
                        for n, k in zip(fisher.neurons, keep_neurons)]}
