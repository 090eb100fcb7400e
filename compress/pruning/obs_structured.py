"""Structured pruning with reconstruction (ZipLM, Kurtic, Frantar & Alistarh 2023): whole heads, FFN
neurons, blocks and layers removed with the optimal update of what each layer keeps.

    database = removal_database(model, batches)                 # once per starting model
    report = obs_prune_to_speedup(model, batches, table, 3.0, database=database)
    report = obs_prune_structured(model, batches, 0.5, seq_len=128)   # a FLOPs target instead

Two passes over the calibration ``batches``:

1. **The database** (``removal_database``): one pass of the model as it is; for every layer, the
   Gram matrix of the inputs of its attention output projection and of its FFN output projection
   (real tokens only), and the removal path of each (``compress.pruning.obs_groups``): heads (one
   head = its ``head_size`` input columns) then neurons (one input column each) removed one at a
   time, each the one whose removal raises the projection's output error least after the optimal
   update of the others, down to the whole block, with the error after every count. The error is
   the squared output error summed over the calibration tokens; the attention and FFN outputs of
   a layer both add to the same residual stream, so their errors are in one unit.
2. **The plan**: per block, the kept count of least summed error within the target, by the same
   dynamic programme as the Fisher search (``compress.pruning.latency_search``): against the
   latency table's milliseconds (``--speedup``) or the FLOPs of the kept units
   (``--flops-reduction``).
3. **The removal** (``apply_removal``), layer by layer in order as SparseGPT runs: the calibration
   inputs of layer l come from layers 0..l-1 already pruned and updated, the FFN's from the layer's
   own attention already pruned; each projection loses its planned number of groups by the same
   one-at-a-time OBS removal on those inputs, and its remaining columns keep their update. The
   heads' queries, keys and values and the neurons' input rows then go with them
   (``compress.pruning.structured.remove_structured``).

The database is taken on the starting model's own inputs: the plan needs every block's error
curve before any layer is cut. The removal of step 3 uses the pruned model's inputs, so its
recorded errors (``layer_error``) are those of the model that is saved.

The counterpart that only rescales what it keeps is Kwon et al.'s Fisher search with least-squares
mask tuning (``compress.pruning.fisher_structured``, ``--criterion fisher``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from compress.core.errors import UsageError
from compress.models.architectures import encoder_layers, head_layout
from compress.models.modeling_pruned import can_empty_blocks
from compress.pruning.fisher_masks import split_labels, to_device, unit_flops
from compress.pruning.fisher_search import TARGETS
from compress.pruning.fisher_structured import PhaseClock, check_targets
from compress.pruning.latency_search import BlockOptions, block_budget_ms, search_latency, width_counts
from compress.pruning.layer_replay import layer_calls, real_tokens, replay_layer
from compress.pruning.obs_groups import RemovalPath, remove_groups
from compress.pruning.structured import check_removable, remove_structured

PERCDAMP = 0.01
LOSS_UNIT = "squared output error summed over the calibration tokens"
METHOD = ("structured OBS: heads and FFN neurons removed one at a time with the optimal update of the "
          "kept weights of the layer (ZipLM, Kurtic, Frantar & Alistarh 2023)")


@dataclass(frozen=True)
class RemovalDatabase:
    """Per layer, the removal path of its heads and of its FFN neurons on the calibration inputs
    (``paths[l].errors[r]``: the output error with ``r`` units gone), and the tokens they summed."""

    heads: tuple[RemovalPath, ...]
    neurons: tuple[RemovalPath, ...]
    tokens: int

    def head_losses(self, layer: int) -> tuple[float, ...]:
        return self.heads[layer].errors

    def neuron_losses(self, layer: int) -> tuple[float, ...]:
        return self.neurons[layer].errors


def _check_model(model: nn.Module, targets: tuple[str, ...]):
    layout = check_removable(model, targets)
    if layout.shared_layers:
        raise UsageError(f"{layout.name} shares its layers between passes: one reconstructed weight would "
                         "serve every pass; use --criterion fisher (rescaling) for it")
    for p in model.parameters():
        if not torch.isfinite(p).all():
            raise UsageError("the model holds non-finite weights; the reconstruction would spread them: "
                             "load a finite model")
    return layout


def _grams(model: nn.Module, layers, batches: list[dict[str, torch.Tensor]]
           ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """X^T X (float64) of every layer's attention- and FFN-output-projection inputs on ``batches``
    (real tokens only), and the number of tokens."""
    attn = [torch.zeros(lay.linears["attn_out"].in_features, lay.linears["attn_out"].in_features,
                        dtype=torch.float64) for lay in layers]
    ffn = [torch.zeros(lay.linears["ffn_out"].in_features, lay.linears["ffn_out"].in_features,
                       dtype=torch.float64) for lay in layers]
    current: dict[str, Any] = {}

    def hook(store, i):
        def pre(module, args):
            x = real_tokens(args[0], current["batch"]).double().cpu()
            store[i] += x.T @ x
        return pre

    handles = [lay.linears[role].register_forward_pre_hook(hook(store, i))
               for role, store in (("attn_out", attn), ("ffn_out", ffn)) for i, lay in enumerate(layers)]
    tokens = 0
    try:
        for batch in batches:
            current["batch"] = batch
            inputs, _ = split_labels(batch)
            tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else \
                int(next(iter(inputs.values())).numel())
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
    return attn, ffn, tokens


@torch.no_grad()
def removal_database(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
                     targets: tuple[str, ...] = TARGETS, percdamp: float = PERCDAMP) -> RemovalDatabase:
    """Every layer's removal paths on ``model``'s own inputs (module docstring, pass 1); the model is
    not changed. A unit kind outside ``targets`` gets a path that removes nothing."""
    targets = check_targets(targets)
    _check_model(model, targets)
    batches = list(batches)
    if not batches:
        raise UsageError("the structured OBS removal needs at least one calibration batch")
    layers = encoder_layers(model)
    _, d = head_layout(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        attn, ffn, tokens = _grams(model, layers, [to_device(b, device) for b in batches])
    finally:
        model.train(was_training)
    heads, neurons = [], []
    for lay, ga, gf in zip(layers, attn, ffn):
        w_attn, w_ffn = lay.linears["attn_out"].weight, lay.linears["ffn_out"].weight
        heads.append(remove_groups(w_attn.detach().cpu(), ga, d, percdamp=percdamp)[1] if "heads" in targets
                     else RemovalPath((), (0.0,)))
        neurons.append(remove_groups(w_ffn.detach().cpu(), gf, 1, percdamp=percdamp)[1] if "ffn" in targets
                       else RemovalPath((), (0.0,)))
    return RemovalDatabase(tuple(heads), tuple(neurons), tokens)


@torch.no_grad()
def apply_removal(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], layer_heads: list[int],
                  layer_ffn: list[int], percdamp: float = PERCDAMP) -> dict[str, Any]:
    """Keep ``layer_heads[l]`` heads and ``layer_ffn[l]`` neurons in layer l (module docstring, pass 3),
    then remove the rest; returns ``remove_structured``'s report with ``kept_neurons`` and
    ``layer_error`` (per layer, the attention and FFN output errors of the removal on the pruned
    model's inputs)."""
    _check_model(model, TARGETS)
    batches = list(batches)
    layers = encoder_layers(model)
    _, d = head_layout(model)
    if len(layer_heads) != len(layers) or len(layer_ffn) != len(layers):
        raise UsageError(f"the plan names {len(layer_heads)} / {len(layer_ffn)} layers; the model has "
                         f"{len(layers)}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batches = [to_device(b, device) for b in batches]
    keep_heads, keep_neurons = [], []
    errors: dict[str, list[float]] = {"attention": [], "ffn": []}
    try:
        calls = layer_calls(model, layers, batches)
        stream = [c[0][0][0] for c in calls]
        for lay in layers:
            for role, size, count, keep, kind in (("attn_out", d, layer_heads, keep_heads, "attention"),
                                                  ("ffn_out", 1, layer_ffn, keep_neurons, "ffn")):
                lin = lay.linears[role]
                groups = lin.in_features // size
                if not 0 <= count[lay.index] <= groups:
                    raise UsageError(f"layer {lay.index} has {groups} {'heads' if size > 1 else 'neurons'}; "
                                     f"the plan keeps {count[lay.index]}")
                if count[lay.index] == groups:  # nothing to remove (an empty block included): no pass
                    keep.append(list(range(groups)))
                    errors[kind].append(0.0)
                    continue
                gram = torch.zeros(lin.in_features, lin.in_features, dtype=torch.float64)
                for b, batch in enumerate(batches):
                    x = replay_layer(lay, calls[b][lay.index], stream[b], role)
                    x = real_tokens(x, batch).double().cpu()
                    gram += x.T @ x
                new, path = remove_groups(lin.weight.detach().cpu(), gram, size, groups - count[lay.index],
                                          percdamp)
                lin.weight.copy_(new.to(lin.weight))
                keep.append(path.kept(groups))
                errors[kind].append(path.errors[-1])
            stream = [replay_layer(lay, calls[b][lay.index], stream[b]) for b in range(len(batches))]
    finally:
        model.train(was_training)
    report = remove_structured(model, keep_heads, keep_neurons)
    return {**report, "kept_neurons": keep_neurons, "layer_error": errors}


def _options(database: RemovalDatabase, sizes_h: list[int], sizes_f: list[int], targets: tuple[str, ...],
             allow_empty: bool, head_cost, ffn_cost, ffn_step: int | None) -> list[BlockOptions]:
    """Per block, its kept counts with their costs (``head_cost(k)``, ``ffn_cost(k)``) and errors."""
    from compress.pruning.latency_search import default_ffn_step

    blocks = []
    for layer, (nh, nf) in enumerate(zip(sizes_h, sizes_f)):
        h_counts = list(range(0 if allow_empty else min(1, nh), nh + 1)) if "heads" in targets else [nh]
        w_counts = (width_counts(nf, ffn_step or default_ffn_step(nf), allow_empty) if "ffn" in targets and nf
                    else [nf])
        for kind, counts, n, losses, cost in (
                ("attention", h_counts, nh, database.head_losses(layer), head_cost),
                ("ffn", w_counts, nf, database.neuron_losses(layer), ffn_cost)):
            blocks.append(BlockOptions(kind, layer, tuple(counts),
                                       tuple(0.0 if k == 0 else float(cost(k)) for k in counts),
                                       tuple(float(losses[n - k]) if n - k < len(losses) else float("inf")
                                             for k in counts)))
    return blocks


def _sizes(model: nn.Module) -> tuple[list[int], list[int]]:
    _, d = head_layout(model)
    layers = encoder_layers(model)
    return ([lay.linears["attn_out"].in_features // d for lay in layers],
            [lay.linears["ffn_out"].in_features for lay in layers])


def plan_for_speedup_obs(database: RemovalDatabase, sizes: tuple[list[int], list[int]], table, speedup: float,
                         targets: tuple[str, ...] = TARGETS, allow_empty: bool = True,
                         dense_sizes: tuple[list[int], list[int]] | None = None,
                         ffn_step: int | None = None) -> dict[str, Any]:
    """Per-layer kept counts whose predicted time in ``table`` is at most the dense model's over
    ``speedup``, at the least summed error of ``database``. ``sizes``: the current model's heads and
    neurons per layer; ``dense_sizes``: the unpruned model's, which the target is relative to (a
    gradual family's later members start from a pruned model; default ``sizes``)."""
    if speedup <= 1:
        raise UsageError(f"--speedup must be above 1 (times the dense model's speed), got {speedup}")
    heads, ffn = sizes
    dense_heads, dense_ffn = dense_sizes or sizes
    dense_ms = table.predict_ms(dense_heads, dense_ffn)
    budget = block_budget_ms(table, dense_ms, speedup, len(heads))
    blocks = _options(database, heads, ffn, targets, allow_empty, table.attention_ms, table.ffn_ms, ffn_step)
    choices, _, loss = search_latency(blocks, budget)
    counts = [b.counts[j] for b, j in zip(blocks, choices)]
    layer_heads, layer_ffn = counts[0::2], counts[1::2]
    predicted = table.predict_ms(layer_heads, layer_ffn)
    return {"layer_heads_planned": layer_heads, "layer_ffn_planned": layer_ffn, "speedup_requested": speedup,
            "predicted_ms": predicted, "dense_predicted_ms": dense_ms,
            "predicted_speedup": dense_ms / predicted, "estimated_loss": loss,
            "estimated_loss_unit": LOSS_UNIT}


def plan_for_flops_obs(database: RemovalDatabase, sizes: tuple[list[int], list[int]], per_head: float,
                       per_neuron: float, budget: float, targets: tuple[str, ...] = TARGETS,
                       allow_empty: bool = True) -> dict[str, Any]:
    """Per-layer kept counts whose encoder FLOPs stay within ``budget``, at the least summed error."""
    heads, ffn = sizes
    blocks = _options(database, heads, ffn, targets, allow_empty, lambda k: k * per_head,
                      lambda k: k * per_neuron, 1)
    choices, flops, loss = search_latency(blocks, budget, resolution=4000)
    counts = [b.counts[j] for b, j in zip(blocks, choices)]
    return {"layer_heads_planned": counts[0::2], "layer_ffn_planned": counts[1::2], "estimated_loss": loss,
            "estimated_loss_unit": LOSS_UNIT}


def _flops(model: nn.Module, seq_len: int, heads: list[int], ffn: list[int]) -> float:
    per_head, per_neuron = unit_flops(model, seq_len)
    return sum(heads) * per_head + sum(ffn) * per_neuron


def _start(model: nn.Module, batches, targets, database: RemovalDatabase | None, percdamp: float):
    """The checks and the database both targets start with: (targets, layout, batches as a list,
    the phase clock, the database, taken here unless given)."""
    targets = check_targets(targets)
    layout = _check_model(model, targets)
    batches = list(batches)
    lap = PhaseClock()
    database = database or removal_database(model, batches, targets, percdamp)
    lap("database")
    return targets, layout, batches, lap, database


def _remove_as_planned(model: nn.Module, batches: list[dict[str, torch.Tensor]], plan: dict[str, Any],
                       percdamp: float, lap: PhaseClock, flops_before: float, seq_len: int) -> dict[str, Any]:
    """``apply_removal`` of the plan's counts, with the encoder FLOPs at ``seq_len`` before and after."""
    applied = apply_removal(model, batches, plan["layer_heads_planned"], plan["layer_ffn_planned"], percdamp)
    lap("remove")
    after = _flops(model, seq_len, applied["layer_heads"], applied["layer_ffn"])
    return {"encoder_flops_before": flops_before, "encoder_flops_after": after,
            "flops_reduction": 1 - after / flops_before, **applied}


def obs_prune_to_speedup(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], table, speedup: float,
                         targets: tuple[str, ...] = TARGETS, database: RemovalDatabase | None = None,
                         dense_sizes: tuple[list[int], list[int]] | None = None,
                         percdamp: float = PERCDAMP) -> dict[str, Any]:
    """Remove units, blocks and layers of ``model`` in place, with reconstruction, so ``table``
    predicts ``speedup`` over the dense model (``dense_sizes``; default: ``model`` as it is);
    returns the report. ``database``: one already taken on the same model and batches."""
    targets, layout, batches, lap, database = _start(model, batches, targets, database, percdamp)
    allow_empty = can_empty_blocks(model.config.model_type)
    sizes = _sizes(model)
    plan = plan_for_speedup_obs(database, sizes, table, speedup, targets, allow_empty, dense_sizes)
    lap("search")
    seq_len = getattr(table, "seq_len", 128)
    before = _flops(model, seq_len, *(dense_sizes or sizes))
    removed = _remove_as_planned(model, batches, plan, percdamp, lap, before, seq_len)
    return {"method": METHOD, "architecture": layout.name, "targets": list(targets),
            "blocks_removable": allow_empty, "calibration_tokens": database.tokens, "percdamp": percdamp,
            **plan, **removed, "seconds": lap.seconds}


def obs_prune_structured(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], flops_reduction: float,
                         seq_len: int, targets: tuple[str, ...] = TARGETS,
                         database: RemovalDatabase | None = None,
                         percdamp: float = PERCDAMP) -> dict[str, Any]:
    """Remove heads and FFN neurons of ``model`` in place, with reconstruction, so the encoder's FLOPs
    at ``seq_len`` tokens fall by at least ``flops_reduction`` (in (0, 1)); returns the report."""
    if not 0 < flops_reduction < 1:
        raise UsageError(f"flops_reduction must be in (0, 1), got {flops_reduction}")
    if seq_len < 1:
        raise UsageError(f"seq_len must be a positive number of tokens, got {seq_len}")
    targets, layout, batches, lap, database = _start(model, batches, targets, database, percdamp)
    per_head, per_neuron = unit_flops(model, seq_len)
    sizes = _sizes(model)
    before = _flops(model, seq_len, *sizes)
    allow_empty = can_empty_blocks(model.config.model_type)
    plan = plan_for_flops_obs(database, sizes, per_head, per_neuron, (1 - flops_reduction) * before, targets,
                              allow_empty)
    lap("search")
    removed = _remove_as_planned(model, batches, plan, percdamp, lap, before, seq_len)
    return {"method": METHOD, "architecture": layout.name, "targets": list(targets), "seq_len": seq_len,
            "calibration_tokens": database.tokens, "percdamp": percdamp,
            "flops_reduction_requested": flops_reduction, **plan, "flops_per_head": per_head,
            "flops_per_neuron": per_neuron, **removed, "seconds": lap.seconds}
