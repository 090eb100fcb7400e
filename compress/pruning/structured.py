"""Structured pruning for speed: remove whole attention heads and FFN neurons of a BERT encoder.

Importance is the L2 magnitude of each group's weights (torch-pruning's ``MagnitudeImportance``
on the dependency groups its ``MetaPruner`` builds: a head = its Q, K, V rows and the matching
columns of the attention output projection; an FFN neuron = its intermediate row and output
column), divided by the mean over its layer's groups (torch-pruning's default normalizer), so
layers are compared on relative, not absolute, magnitudes. Ranking is across layers, so layers
keep different head counts and FFN widths. The hidden size
(the residual stream) is never pruned.

Stock BERT cannot load such a model: ``BertConfig`` has one ``intermediate_size`` and one head
count for all layers. ``CompressBertConfig`` (model type ``compress_bert``) adds ``layer_heads``
and ``layer_intermediate``, and the ``CompressBert*`` classes build each layer at its own size
before the weights are loaded. Importing this module registers them with the ``Auto*`` classes,
so ``AutoModelForSequenceClassification.from_pretrained(folder)`` works in a fresh process after
``import compress.pruning.structured`` (no remote code).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
)

from compress.config import check_range
from compress.errors import ModelError, UsageError

STRUCTURED_TARGETS = ("heads", "ffn")


class CompressBertConfig(BertConfig):
    """BertConfig plus per-layer attention head counts and FFN widths (None = the uniform size)."""

    model_type = "compress_bert"

    def __init__(self, layer_heads: list[int] | None = None, layer_intermediate: list[int] | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.layer_heads = list(layer_heads) if layer_heads is not None else None
        self.layer_intermediate = list(layer_intermediate) if layer_intermediate is not None else None


def _resize_layers(bert: BertModel, config: CompressBertConfig) -> None:
    """Rebuild each layer's Q/K/V/O and FFN linears at that layer's size (weights load afterwards)."""
    hidden = config.hidden_size
    head_size = hidden // config.num_attention_heads
    for i, layer in enumerate(bert.encoder.layer):
        if config.layer_heads is not None:
            width = config.layer_heads[i] * head_size
            att = layer.attention.self
            att.query = nn.Linear(hidden, width)
            att.key = nn.Linear(hidden, width)
            att.value = nn.Linear(hidden, width)
            att.num_attention_heads = config.layer_heads[i]
            att.all_head_size = width
            layer.attention.output.dense = nn.Linear(width, hidden)
        if config.layer_intermediate is not None:
            width = config.layer_intermediate[i]
            layer.intermediate.dense = nn.Linear(hidden, width)
            layer.output.dense = nn.Linear(width, hidden)


class CompressBertModel(BertModel):
    config_class = CompressBertConfig

    def __init__(self, config: CompressBertConfig, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        _resize_layers(self, config)
        self.post_init()


class CompressBertForSequenceClassification(BertForSequenceClassification):
    config_class = CompressBertConfig

    def __init__(self, config: CompressBertConfig):
        super().__init__(config)
        _resize_layers(self.bert, config)
        self.post_init()


AutoConfig.register("compress_bert", CompressBertConfig, exist_ok=True)
AutoModel.register(CompressBertConfig, CompressBertModel, exist_ok=True)
AutoModelForSequenceClassification.register(CompressBertConfig, CompressBertForSequenceClassification,
                                            exist_ok=True)


def layer_sizes(model: nn.Module) -> dict[str, list[int]]:
    """Per-layer head counts and FFN widths of a (possibly pruned) BERT, read from the weights."""
    bert = getattr(model, "bert", model)
    head_size = bert.config.hidden_size // bert.config.num_attention_heads
    return {"heads": [lay.attention.self.query.out_features // head_size for lay in bert.encoder.layer],
            "ffn": [lay.intermediate.dense.out_features for lay in bert.encoder.layer]}


def _example_inputs(model: nn.Module, length: int = 16) -> dict[str, torch.Tensor]:
    device = next(model.parameters()).device
    ids = torch.randint(100, min(2000, model.config.vocab_size), (1, length), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0]


def prune_structured(model: nn.Module, sparsity: float,
                     targets: tuple[str, ...] = STRUCTURED_TARGETS) -> dict[str, Any]:
    """Remove ``sparsity`` of the attention heads and/or FFN neurons of ``model`` in place.

    ``model`` is a ``BertForSequenceClassification`` or ``BertModel``; afterwards it is the matching
    ``CompressBert*`` class with a ``CompressBertConfig`` recording the per-layer sizes, so
    ``save_pretrained`` / ``from_pretrained`` round-trip. A sparsity whose global cut-off would
    empty a layer is refused (ModelError) rather than left less pruned than asked.
    Returns the sizes before/after and the parameter counts.
    """
    import torch_pruning as tp

    check_range("sparsity", sparsity, 0.0, 1.0, hi_open=True)
    targets = tuple(targets)
    if not targets:
        raise UsageError(f"--structured needs at least one of: {', '.join(STRUCTURED_TARGETS)}")
    for t in targets:
        if t not in STRUCTURED_TARGETS:
            raise UsageError(f"unknown structured target '{t}'; choose from: {', '.join(STRUCTURED_TARGETS)}")
    bert = getattr(model, "bert", model)
    if not isinstance(bert, BertModel) or not hasattr(bert, "encoder"):
        raise ModelError(f"structured pruning supports BERT encoders, got {type(model).__name__}")
    config = model.config
    head_size = config.hidden_size // config.num_attention_heads
    before = layer_sizes(model)
    params_before = sum(p.numel() for p in model.parameters())

    # Nothing on the residual stream is a pruning root: heads and FFN neurons only.
    ignored: list[nn.Module] = [m for m in (getattr(model, "classifier", None),
                                            getattr(bert.pooler, "dense", None) if bert.pooler else None)
                                if m is not None]
    num_heads: dict[nn.Module, int] = {}
    for i, layer in enumerate(bert.encoder.layer):
        att = layer.attention.self
        ignored += [layer.attention.output.dense, layer.output.dense]
        if "heads" in targets:
            for lin in (att.query, att.key, att.value):
                num_heads[lin] = before["heads"][i]
        else:
            ignored += [att.query, att.key, att.value]
        if "ffn" not in targets:
            ignored.append(layer.intermediate.dense)

    was_training = model.training
    model.eval()
    previous_attn = config._attn_implementation
    # The dependency graph is traced through autograd; eager attention exposes the Q K^T and P V
    # matmuls that couple each head's Q, K and V rows.
    model.set_attn_implementation("eager")
    pruner = tp.pruner.MetaPruner(
        model, _example_inputs(model), importance=tp.importance.MagnitudeImportance(p=2),
        global_pruning=True, pruning_ratio=sparsity,
        ignored_layers=ignored, num_heads=num_heads, prune_num_heads="heads" in targets,
        prune_head_dims=False, head_pruning_ratio=sparsity if "heads" in targets else 0.0,
        max_pruning_ratio=0.95, output_transform=_first_tensor,
    )
    for group in pruner.step(interactive=True):
        group.prune()
    model.set_attn_implementation(previous_attn)
    model.train(was_training)

    after = layer_sizes(model)
    # torch-pruning drops a whole group when the global cut-off would empty a layer, which leaves
    # that layer intact: the model would then be less pruned than asked, silently.
    for kind, unit in (("heads", "heads"), ("ffn", "FFN neurons")):
        if kind not in targets:
            continue
        total, removed = sum(before[kind]), sum(before[kind]) - sum(after[kind])
        # a layer kept whole costs at least its share of the cut; the pooled ranking of heads and
        # FFN neurons moves the FFN count by a few percent, which is allowed
        slack = max(len(before[kind]), total // len(before[kind]) // 2)
        if abs(removed - round(sparsity * total)) > slack:
            raise ModelError(f"structured pruning removed {removed} of {total} {unit}, not the "
                             f"{sparsity:.0%} asked (the global ranking would have emptied a layer, "
                             "so torch-pruning kept it whole); use a lower --sparsity")
    for i, lay in enumerate(bert.encoder.layer):
        rows = lay.attention.self.query.out_features
        if rows % head_size:
            raise ModelError(f"layer {i}: pruning left a partial head ({rows} query rows, "
                             f"head size {head_size})")
        if after["heads"][i] < 1 or after["ffn"][i] < 1:
            raise ModelError(f"layer {i} lost all its heads or FFN neurons at sparsity {sparsity}; "
                             "use a lower --sparsity")
        lay.attention.self.num_attention_heads = after["heads"][i]
        lay.attention.self.all_head_size = after["heads"][i] * head_size

    config.__class__ = CompressBertConfig
    config.layer_heads = after["heads"]
    config.layer_intermediate = after["ffn"]
    model.__class__ = (CompressBertForSequenceClassification
                       if isinstance(model, BertForSequenceClassification) else CompressBertModel)
    params_after = sum(p.numel() for p in model.parameters())
    heads_b, heads_a = sum(before["heads"]), sum(after["heads"])
    ffn_b, ffn_a = sum(before["ffn"]), sum(after["ffn"])
    return {"targets": list(targets), "sparsity": sparsity,
            "importance": "L2 magnitude of each head/neuron divided by its layer's mean (torch-pruning's "
                          "default normalizer), ranked across layers",
            "layer_heads_before": before["heads"], "layer_heads": after["heads"],
            "layer_ffn_before": before["ffn"], "layer_ffn": after["ffn"],
            "heads_removed": heads_b - heads_a, "heads_removed_fraction": (heads_b - heads_a) / heads_b,
            "ffn_removed": ffn_b - ffn_a, "ffn_removed_fraction": (ffn_b - ffn_a) / ffn_b,
            "params_before": params_before, "params_after": params_after}
