"""A structured-pruned model as its stock transformers class, for loaders that run no project code.

A structured-pruned model keeps different head counts and FFN widths per layer, which its own
``Compress<T>`` classes build (``compress.models.modeling_pruned``); stock transformers builds one
size for all layers. ``stock_copy`` writes the pruned weights back into the stock class: each layer
keeps the config's head count, the FFN is as wide as the widest kept layer, and every head or neuron
the pruned model lacks is zero in all its rows and columns. A removed unit's output columns are zero,
so it adds nothing whatever its attention or activation computes, and an emptied block leaves only
its output bias before the LayerNorm, as the pruned model's empty block does: the copy computes the
pruned model's outputs, checked on a probe batch. It runs at (almost) the unpruned cost; the speed
is in the pruned model and its ONNX export.

Where each kept weight goes is found, not restated: a stock model whose every tensor holds its own
element indices goes through ``remove_structured`` with the pruned model's keep lists, and the indices
that come out say where each of the pruned model's elements sits in the stock tensor. The heads keep
their places where the config records them (``layer_kept_heads``, a discovered type whose per-head
inputs, such as MPNet's position bias, are computed outside the layers); else layer l's heads fill its
first slots, which every type of the role table computes alike.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from compress.core.errors import ModelError
from compress.models.architectures import (
    DISCOVERY_ATTR,
    encoder_layers,
    find_layout,
    head_layout,
    layout_from_dict,
)
from compress.models.modeling_pruned import PRUNED_CLASS_OF, base_model_type, is_structured_config
from compress.pruning.structured import (
    PROBE_TOLERANCE,
    _first_output,
    ffn_size,
    head_count,
    remove_structured,
)

# keys of a pruned config that the stock config does not take
_PRUNED_KEYS = ("model_type", "auto_map", "architectures", "layer_heads", "layer_intermediate",
                "layer_kept_heads", "pruned_layout", "transformers_version", "_name_or_path")

STOCK_DIR = "0_Transformer"  # where a saved embedding folder keeps the stock copy sentence-transformers loads
STOCK_TOLERANCE = PROBE_TOLERANCE * 10  # relative output gap a stock copy may have


def _stock_class(model: nn.Module) -> type:
    stock = {pruned: base for base, pruned in PRUNED_CLASS_OF.items()}.get(type(model))
    if stock is None or not is_structured_config(getattr(model, "config", None)):
        raise ModelError(f"{type(model).__name__} is not a structured-pruned model of this project; only "
                         "those need a stock copy")
    return stock


def _stock_config(model: nn.Module, stock_class: type):
    config = model.config
    values = {k: v for k, v in config.to_dict().items() if k not in _PRUNED_KEYS}
    widths = getattr(config, "layer_intermediate", None)
    if widths is not None:
        values[find_layout(model).ffn_config] = max(1, *widths)
    out = stock_class.config_class(**values)
    out.architectures = [stock_class.__name__]
    return out


def _element_sources(model: nn.Module, stock_class: type, stock_config) -> dict[str, torch.Tensor]:
    """name -> for each element of the pruned model's tensor, its flat index in the stock tensor."""
    # a copy of the config: remove_structured makes the traced model's config a pruned one
    traced = stock_class(copy.deepcopy(stock_config)).to(torch.float64)  # exact integers up to 2**53
    stored = getattr(model.config, "pruned_layout", None)
    if stored:  # a discovered type: its layout as saved, not probed again on index-valued weights
        object.__setattr__(traced, DISCOVERY_ATTR,
                           (layout_from_dict(base_model_type(model.config.model_type), stored), ""))
    with torch.no_grad():
        for p in traced.parameters():
            p.copy_(torch.arange(p.numel(), dtype=torch.float64).view_as(p))
    layers = encoder_layers(traced)
    _, head_dim = head_layout(traced)
    config = model.config
    heads = config.layer_heads or [head_count(lay, head_dim) for lay in layers]
    widths = config.layer_intermediate or [ffn_size(lay) for lay in layers]
    kept = getattr(config, "layer_kept_heads", None) or [list(range(n)) for n in heads]
    remove_structured(traced, kept, [list(range(n)) for n in widths])
    return {name: p.detach().long() for name, p in traced.named_parameters()}


@torch.no_grad()
def stock_copy(model: nn.Module) -> nn.Module:
    """The structured-pruned ``model`` as its stock transformers class at the unpruned head count
    (the FFN as wide as its widest kept layer), removed units zero: the same outputs, loadable by
    ``from_pretrained`` without this project (ModelError when ``model`` is not structured-pruned or
    the copy's outputs differ)."""
    stock_class = _stock_class(model)
    stock_config = _stock_config(model, stock_class)
    sources = _element_sources(model, stock_class, stock_config)
    ref = next(model.parameters())
    stock = stock_class(stock_config).to(device=ref.device, dtype=ref.dtype)
    pruned = dict(model.named_parameters())
    for name, p in stock.named_parameters():
        if name not in pruned or pruned[name].shape != sources[name].shape:
            raise ModelError(f"the stock copy of {type(model).__name__} has no place for its tensor {name}")
        p.zero_()
        p.view(-1)[sources[name].reshape(-1).to(p.device)] = pruned[name].reshape(-1)
    buffers = dict(model.named_buffers())
    for name, b in stock.named_buffers():
        if name in buffers and buffers[name].shape == b.shape:
            b.copy_(buffers[name])
    _check_same_outputs(model, stock)
    return stock


def output_gap(model: nn.Module, stock: nn.Module) -> float:
    """The largest difference of ``stock``'s first output from ``model``'s on a probe batch (with
    padding), relative to the largest output; NaN when either holds NaN."""
    from compress.models.discovery import dummy_inputs, left_as_is

    stock.eval()
    inputs = dummy_inputs(model)
    inputs["attention_mask"][1, 6:] = 0  # padding too
    with left_as_is(model):
        model.eval()
        want = _first_output(model, inputs).float()
    with left_as_is(stock):  # BigBird's copy keeps its sparse attention after this short probe
        got = _first_output(stock, inputs).float()
    return float((want - got).abs().max()) / max(float(want.abs().max()), 1e-12)


def same_outputs(diff: float) -> bool:
    return diff <= STOCK_TOLERANCE  # False for NaN


def _check_same_outputs(model: nn.Module, stock: nn.Module) -> None:
    diff = output_gap(model, stock)
    if not same_outputs(diff):
        raise ModelError(f"the stock copy of {type(model).__name__} differs from it by {diff:.1e} of its "
                         "output; save the structured model alone (it loads with trust_remote_code=True)")
