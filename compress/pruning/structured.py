"""Structured pruning for speed: remove whole attention heads and FFN neurons of any encoder in the
role table (``compress.models.architectures``: the BERT family, DistilBERT, ALBERT, DeBERTa-v2/v3,
ModernBERT), and of an encoder whose roles were found by discovery when its own forward accepts
the smaller layers: ``check_removable`` removes a head and half the FFN of the first layer of a copy
and compares it, before and after a save and reload, with the model whose units are zeroed
(Nyströmformer, whose convolution has one group per head of the config, is refused so). Per-head
inputs a discovered type computes outside its layers (MPNet's relative-position bias) are cut to
each layer's kept heads (``modeling_pruned.keep_head_inputs``).

Groups. A head owns its rows of the query, key and value matrices (the q, k and v blocks of a
fused ``qkv``; DeBERTa's ``pos_query``/``pos_key`` when present) and its columns of ``attn_out``;
an FFN neuron owns its ``ffn_in`` row (a gated FFN: its input *and* gate rows) and its ``ffn_out``
column. Removing a group removes exactly its contribution to the layer output, so the pruned model
computes what the unpruned one computes with those heads/neurons zeroed.

Importance. The L2 norm of all weights of a group (biases not counted), divided by the mean over
its layer's groups of the same kind, so layers are compared on relative, not absolute,
magnitudes; heads are ranked against heads and neurons against neurons across all layers, and the
``round(sparsity * total)`` lowest go. Layers therefore keep different head counts and FFN widths.
The hidden size (the residual stream) is never pruned.

Why slices from the table and not torch-pruning's ``MetaPruner``: the MetaPruner finds groups by
tracing autograd, which cannot follow DeBERTa's disentangled attention (the relative-position
projections reuse the key/query matrices on another input) or ModernBERT's fused, rotary,
GLU layers; the role table already says which rows and columns belong to each head and neuron,
so the slicing is done from it, the same way for every architecture.

ALBERT shares its layer weights across depth: each shared layer is pruned once (its heads count
once in the ranking), and every pass through it runs the pruned layer.

Loading. A stock config holds one size for all layers; ``compress.models.modeling_pruned`` adds
``Compress<T>Config`` (model type ``compress_<t>``) with ``layer_heads`` / ``layer_intermediate``
(and, for a discovered type, ``pruned_layout``: where its matrices are) and model classes that
build each layer at its size. Importing this module registers them with
the transformers Auto classes; a saved pruned model also carries that file and an ``auto_map``,
so ``from_pretrained(folder, trust_remote_code=True)`` works without compress.

Planning and applying are separate: ``prune_structured`` plans by magnitude and then calls
``remove_structured(model, keep_heads, keep_neurons)``, which other importance criteria
(``compress.pruning.fisher_structured``) call with their own per-layer keep lists.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compress.core.config import check_sparsity
from compress.core.errors import ModelError, UsageError, first_line
from compress.models.architectures import (
    HEAD_ROW_ROLES,
    SUPPORTED,
    EncoderLayer,
    EncoderLayout,
    encoder_layers,
    find_layout,
    head_layout,
    head_slices,
    layout_to_dict,
)
from compress.models.modeling_pruned import (
    MODULE_PATHS,
    PRUNED_CLASSES,
    base_model_type,
    can_empty_blocks,
    empty_blocks,
    hold_heads,
    pruned_class_of,
    register_auto_classes,
    resize_head_extra,
    set_head_attrs,
)

STRUCTURED_TARGETS = ("heads", "ffn")
UNSTRUCTURED_WORKS = "unstructured pruning (sparsegpt, wanda, magnitude) works on it"
IMPORTANCE = ("L2 norm of each head's / FFN neuron's weights (rows of Q, K, V or of the fused qkv blocks, "
              "position projections if any, columns of the attention output; FFN input row(s), gate "
              "row included, and output column) divided by its layer's mean, ranked across layers")

register_auto_classes()

# the pruned BERT classes by their historical names (saved folders have model type compress_bert)
CompressBertConfig = PRUNED_CLASSES["bert"]["AutoConfig"]
CompressBertModel = PRUNED_CLASSES["bert"]["AutoModel"]
CompressBertForSequenceClassification = PRUNED_CLASSES["bert"]["AutoModelForSequenceClassification"]


def _head_index(layer: EncoderLayer, role: str, heads: list[int], head_dim: int, qkv_order: str = "blocks"
                ) -> dict[int, torch.Tensor]:
    """dim -> sorted row/column indices that ``heads`` own in ``role`` (sorted keeps q|k|v order)."""
    w = layer.linears[role].weight
    spans = head_slices(role, tuple(w.shape), head_dim, qkv_order)
    out: dict[int, list[int]] = {dim: [] for dim, _, _ in spans[0]}  # no head kept: empty indices
    for h in heads:
        for dim, start, stop in spans[h]:
            out.setdefault(dim, []).extend(range(start, stop))
    return {dim: torch.tensor(sorted(ix), dtype=torch.long, device=w.device) for dim, ix in out.items()}


def _neuron_index(layer: EncoderLayer, layout: EncoderLayout, neurons: list[int]) -> torch.Tensor:
    """ffn_in rows of ``neurons`` (a gated FFN: input rows, then gate rows at the same offsets)."""
    width = ffn_size(layer)
    rows = list(neurons) + ([width + j for j in neurons] if layout.glu else [])
    return torch.tensor(rows, dtype=torch.long, device=layer.linears["ffn_in"].weight.device)


def ffn_size(layer: EncoderLayer) -> int:
    return layer.linears["ffn_out"].in_features


def head_count(layer: EncoderLayer, head_dim: int) -> int:
    return layer.linears["attn_out"].in_features // head_dim


@torch.no_grad()
def head_scores(layer: EncoderLayer, head_dim: int, qkv_order: str = "blocks") -> torch.Tensor:
    """``[heads]``: L2 norm of each head's weights over every role matrix it owns a slice of."""
    squares = torch.zeros(head_count(layer, head_dim), dtype=torch.float64)
    for role, lin in layer.linears.items():
        if role not in HEAD_ROW_ROLES and role != "attn_out":
            continue
        w = lin.weight.detach().double().cpu()
        for h, spans in enumerate(head_slices(role, tuple(w.shape), head_dim, qkv_order)):
            for dim, start, stop in spans:
                squares[h] += w.narrow(dim, start, stop - start).pow(2).sum()
    return squares.sqrt()


@torch.no_grad()
def neuron_scores(layer: EncoderLayer, layout: EncoderLayout) -> torch.Tensor:
    """``[ffn]``: L2 norm of each FFN neuron's input row(s) and output column."""
    width = ffn_size(layer)
    w_in = layer.linears["ffn_in"].weight.detach().double().cpu()
    w_out = layer.linears["ffn_out"].weight.detach().double().cpu()
    squares = w_in[:width].pow(2).sum(1) + w_out.pow(2).sum(0)
    if layout.glu:
        squares += w_in[width:].pow(2).sum(1)
    if "ffn_gate" in layer.linears:
        squares += layer.linears["ffn_gate"].weight.detach().double().cpu().pow(2).sum(1)
    return squares.sqrt()


def plan_removal(scores: list[torch.Tensor], sparsity: float, unit: str) -> list[list[int]]:
    """Per layer, the indices to keep after removing ``round(sparsity * total)`` of the units with the
    lowest layer-normalised score, ranked across layers (ties: earlier layer, lower index first).

    UsageError, before anything changes, when that would empty a layer or when the sparsity is too
    small to remove a single unit.
    """
    total = sum(len(s) for s in scores)
    n_remove = round(sparsity * total)
    if sparsity > 0 and n_remove == 0:
        raise UsageError(f"sparsity {sparsity} of {total} {unit} removes none (one {unit[:-1]} is "
                         f"{1 / total:.1%}); use a --sparsity of at least {1 / (2 * total):.3f}")
    normalised = torch.cat([s / s.mean().clamp_min(1e-30) for s in scores])
    order = torch.argsort(normalised, stable=True)[:n_remove].tolist()
    removed: list[set[int]] = [set() for _ in scores]
    offsets = [0]
    for s in scores:
        offsets.append(offsets[-1] + len(s))
    for flat in order:
        layer = next(i for i in range(len(scores)) if flat < offsets[i + 1])
        removed[layer].add(flat - offsets[layer])
    keep = [[j for j in range(len(s)) if j not in gone] for s, gone in zip(scores, removed)]
    emptied = [i for i, k in enumerate(keep) if not k]
    if emptied:
        raise UsageError(f"removing {sparsity:.0%} of the {unit} ({n_remove} of {total}) ranked across "
                         f"layers would leave layer {emptied[0]} with none; use a lower --sparsity")
    return keep


def _keep(lin: nn.Linear, dim: int, index: torch.Tensor) -> None:
    """Keep only ``index`` along ``dim`` of ``lin`` (rows: outputs and bias; columns: inputs), in place."""
    grad = lin.weight.requires_grad
    lin.weight = nn.Parameter(lin.weight.detach().index_select(dim, index).clone(), requires_grad=grad)
    if dim == 0:
        if lin.bias is not None:
            lin.bias = nn.Parameter(lin.bias.detach().index_select(0, index).clone(),
                                    requires_grad=lin.bias.requires_grad)
        lin.out_features = len(index)
    else:
        lin.in_features = len(index)


def _keep_head_extra(layer: nn.Module, path: str, kind: str, heads: list[int], head_dim: int) -> None:
    """Keep the parts of heads ``heads`` in the head-sized part ``path`` of ``layer`` (a discovered
    layout's ``head_extras``): rebuilt at the new size as a reload rebuilds it
    (``resize_head_extra``), then given the kept entries along dim 0 of each of its tensors (a
    Linear's rows, a vector's entries: ``head_dim`` per head; a per-head convolution: one per head)."""
    parent_path, _, attr = path.rpartition(".")
    parent = layer.get_submodule(parent_path) if parent_path else layer
    old = getattr(parent, attr)
    old_tensors = dict(old.named_parameters()) if isinstance(old, nn.Module) else {"": old}
    resize_head_extra(layer, path, kind, len(heads), head_dim)
    new = getattr(parent, attr)
    new_tensors = dict(new.named_parameters()) if isinstance(new, nn.Module) else {"": new}
    units = heads if kind == "channels" else [r for h in heads
                                               for r in range(h * head_dim, (h + 1) * head_dim)]
    for name, tensor in old_tensors.items():
        index = torch.tensor(units, dtype=torch.long, device=tensor.device)
        with torch.no_grad():
            new_tensors[name].copy_(tensor.index_select(0, index))
        new_tensors[name].requires_grad_(tensor.requires_grad)


def layer_sizes(model: nn.Module) -> dict[str, list[int]]:
    """Per-layer head counts and FFN widths of a (possibly pruned) encoder, read from its weights."""
    layers = encoder_layers(model)
    _, head_dim = head_layout(model)
    return {"heads": [head_count(lay, head_dim) for lay in layers], "ffn": [ffn_size(lay) for lay in layers]}


def _pruned_class(model: nn.Module) -> type:
    cls = pruned_class_of(type(model))
    if cls is None:
        raise ModelError(f"structured pruning cannot save a {type(model).__name__} (no pruned class for it): "
                         "it saves transformers' base models and their SequenceClassification, "
                         "QuestionAnswering, MaskedLM and TokenClassification heads")
    return cls


def _check_args(sparsity: float, targets: tuple[str, ...]) -> None:
    check_sparsity(sparsity)
    if not targets:
        raise UsageError(f"--structured needs at least one of: {', '.join(STRUCTURED_TARGETS)}")
    for t in targets:
        if t not in STRUCTURED_TARGETS:
            raise UsageError(f"unknown structured target '{t}'; choose from: {', '.join(STRUCTURED_TARGETS)}")


def prune_structured(model: nn.Module, sparsity: float,
                     targets: tuple[str, ...] = STRUCTURED_TARGETS) -> dict[str, Any]:
    """Remove ``sparsity`` of the attention heads and/or FFN neurons of ``model`` in place.

    ``model`` is an encoder of the role table or one of its SequenceClassification,
    QuestionAnswering, MaskedLM or TokenClassification models; afterwards it is the matching
    ``Compress*`` class with a ``compress_<type>`` config recording the per-layer sizes, so
    ``save_pretrained`` / ``from_pretrained`` round-trip. A sparsity that would empty a layer or
    remove nothing is refused (UsageError) with the model unchanged.
    Returns the sizes before/after, the heads kept per layer and the parameter counts.
    """
    targets = tuple(targets)
    _check_args(sparsity, targets)
    layout = check_removable(model, targets)  # refuse an unsupported class or type before any planning
    layers = encoder_layers(model, layout)
    _, head_dim = head_layout(model)
    before = layer_sizes(model)

    # plan everything first: a refusal leaves the model as it was
    order = layout.extra.get("qkv_order", "blocks")
    keep_heads = (plan_removal([head_scores(lay, head_dim, order) for lay in layers], sparsity, "heads")
                  if "heads" in targets else [list(range(n)) for n in before["heads"]])
    keep_neurons = (plan_removal([neuron_scores(lay, layout) for lay in layers], sparsity, "FFN neurons")
                    if "ffn" in targets else [list(range(n)) for n in before["ffn"]])
    removal = remove_structured(model, keep_heads, keep_neurons)
    return {"targets": list(targets), "sparsity": sparsity, "architecture": layout.name,
            "importance": IMPORTANCE, **removal}


def check_removable(model: nn.Module, targets: tuple[str, ...] = STRUCTURED_TARGETS) -> EncoderLayout:
    """The layout of ``model`` when its ``targets`` (heads and/or FFN neurons) can be removed
    physically and saved; UsageError/ModelError naming what is missing otherwise (called before any
    data is read).

    A type without a module table (roles found by discovery) is tried on a copy first
    (``probe_removal``): the architecture's own forward decides whether its attention accepts
    fewer heads than its config says. Where its heads cannot go but its FFN neurons can, the
    refusal says so (``--structured ffn``)."""
    layout = _structured_layout(model)
    _pruned_class(model)
    targets = tuple(t for t in STRUCTURED_TARGETS if t in targets)
    if not layout.discovered or set(targets) <= getattr(model, PROBED_ATTR, frozenset()):
        return layout
    model_type = model.config.model_type
    ffn_only = ("only its FFN neurons can be removed (--structured ffn, or targets=('ffn',)); "
                + UNSTRUCTURED_WORKS)
    first = encoder_layers(model, layout)[0].linears
    if "heads" in targets and "key" in first and first["key"].out_features != first["query"].out_features:
        raise UsageError(f"structured pruning cannot remove heads of {model_type}: its "
                         f"{first['query'].out_features} query rows share {first['key'].out_features} "
                         f"key/value rows (grouped-query attention), and removing whole groups is not "
                         f"built; {ffn_only}")
    try:
        probe_removal(model, targets)
    except UsageError as err:
        if targets != STRUCTURED_TARGETS:
            raise
        try:
            probe_removal(model, ("ffn",))
        except UsageError:
            raise err from None
        object.__setattr__(model, PROBED_ATTR, getattr(model, PROBED_ATTR, frozenset()) | {"ffn"})
        probe_removal(model, ("heads",), fix=ffn_only)  # the heads' own refusal, with the FFN-only way
        raise err from None
    # once per model and unit kind: a pipeline calls this again
    object.__setattr__(model, PROBED_ATTR, getattr(model, PROBED_ATTR, frozenset()) | set(targets))
    return layout


PROBED_ATTR = "_compress_removal_probed"


PROBE_TOLERANCE = 1e-4  # of the output's largest magnitude, in float32
PROBE_TOLERANCE_HALF = 2e-2  # fp16 / bf16 weights: the removed and the zeroed sums round differently


def _first_output(model: nn.Module, inputs: dict) -> torch.Tensor:
    out = model(**inputs)
    if isinstance(out, torch.Tensor):
        return out
    return out["logits"] if "logits" in out else out[0]


def probe_removal(model: nn.Module, targets: tuple[str, ...] = STRUCTURED_TARGETS,
                  fix: str = UNSTRUCTURED_WORKS) -> float:
    """Remove head 0 (with "heads" in ``targets``) and every second FFN neuron (with "ffn") of the
    first layer of a copy of ``model``, then check that the copy computes what ``model`` computes
    with those units zeroed, before and after a save and reload. Returns the largest difference;
    UsageError naming the step that failed and ending in ``fix``."""
    import copy
    import tempfile

    from transformers.utils import logging as hf_logging

    from compress.models.discovery import dummy_inputs, left_as_is

    model_type = model.config.model_type
    layout = find_layout(model)
    first = encoder_layers(model, layout)[0]
    _, head_dim = head_layout(model)
    heads, width = head_count(first, head_dim), ffn_size(first)
    drop_heads = [0] if heads > 1 and "heads" in targets else []
    drop_neurons = list(range(0, width, 2)) if "ffn" in targets else []
    inputs = dummy_inputs(model)
    was_training = model.training
    model.eval()

    def zero_columns(columns):
        return lambda module, args: (args[0].index_fill(-1, columns, 0.0), *args[1:])

    head_cols = torch.tensor([c for h in drop_heads for c in range(h * head_dim, (h + 1) * head_dim)],
                             dtype=torch.long, device=first.linears["attn_out"].weight.device)
    hooks = [first.linears["attn_out"].register_forward_pre_hook(zero_columns(head_cols)),
             first.linears["ffn_out"].register_forward_pre_hook(
                 zero_columns(torch.tensor(drop_neurons, dtype=torch.long, device=head_cols.device)))]
    try:
        with torch.no_grad(), left_as_is(model):
            expected = _first_output(model, inputs)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    probe = copy.deepcopy(model).eval()
    keep_heads = [list(range(n)) for n in layer_sizes(probe)["heads"]]
    keep_neurons = [list(range(n)) for n in layer_sizes(probe)["ffn"]]
    keep_heads[0] = [h for h in range(heads) if h not in drop_heads]
    keep_neurons[0] = [j for j in range(width) if j not in drop_neurons]
    units = " or ".join(name for name, t in (("heads", "heads"), ("FFN neurons", "ffn")) if t in targets)
    scale = expected.abs().max().item() + 1e-12
    tolerance = PROBE_TOLERANCE if expected.dtype in (torch.float32, torch.float64) else PROBE_TOLERANCE_HALF
    step = "removing them"
    try:
        remove_structured(probe, keep_heads, keep_neurons)
        with torch.no_grad():
            diff = (_first_output(probe, inputs) - expected).abs().max().item() / scale
        if diff <= tolerance:
            step = "a save and reload"
            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            try:
                with tempfile.TemporaryDirectory() as folder:
                    probe.save_pretrained(folder)
                    reloaded = type(probe).from_pretrained(folder, use_safetensors=True).eval()
                weight = next(probe.parameters())
                reloaded.to(device=weight.device, dtype=weight.dtype)  # from_pretrained loads on the CPU
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
            with torch.no_grad():
                diff = max(diff, (_first_output(reloaded, inputs) - expected).abs().max().item() / scale)
    except Exception as err:  # noqa: BLE001 - any failure of the architecture's own code refuses it
        raise UsageError(f"structured pruning cannot remove {units} of {model_type}: "
                         f"{step} on a copy failed ({type(err).__name__}: {first_line(err)[:100]}); "
                         f"{fix}") from None
    if diff > tolerance:
        raise UsageError(f"structured pruning cannot remove {units} of {model_type}: after "
                         f"{step}, a copy differs from the model with those units zeroed by {diff:.1e} of "
                         f"its output (its attention keeps sizes the discovery did not find); {fix}")
    return diff


def _structured_layout(model: nn.Module) -> EncoderLayout:
    layout = find_layout(model)
    if layout is None:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise UsageError(f"structured pruning supports the BERT-family encoders of the role table "
                         f"({', '.join(SUPPORTED)}), got {model_type}")
    return layout


def _check_keep(keep: list[list[int]], sizes: list[int], unit: str, allow_empty: bool = False
                ) -> list[list[int]]:
    """Sorted, in-range keep lists, one per layer, non-empty unless ``allow_empty`` (the architecture
    can remove a whole block); UsageError naming the first bad one."""
    if len(keep) != len(sizes):
        raise UsageError(f"keep lists for {unit} name {len(keep)} layers; the model has {len(sizes)}")
    out = []
    for i, (k, n) in enumerate(zip(keep, sizes)):
        k = sorted({int(j) for j in k})
        if not k and allow_empty:
            out.append(k)
            continue
        if not k:
            raise UsageError(f"layer {i} would keep no {unit}; this architecture cannot remove a whole "
                             "block: keep at least one per layer")
        if k[0] < 0 or k[-1] >= n:
            raise UsageError(f"layer {i} keeps {unit} index {k[0] if k[0] < 0 else k[-1]}, "
                             f"outside 0..{n - 1}")
        out.append(k)
    return out


def _keep_head_inputs(model: nn.Module, layout: EncoderLayout, layers: list[EncoderLayer],
                      keep_heads: list[list[int]], head_dim: int) -> None:
    """Record in ``config.layer_kept_heads`` which of the unpruned heads each layer keeps (composed
    with an earlier removal); each layer of a discovered type holds its attention module at its
    head count and lets it slice the per-head inputs it is given, computed outside the layer
    (``modeling_pruned.hold_heads``)."""
    config = model.config
    total = getattr(config, layout.heads_config)
    before = getattr(config, "layer_kept_heads", None) or [list(range(total)) for _ in layers]
    kept = [[before[i][j] for j in keep] for i, keep in enumerate(keep_heads)]
    config.layer_kept_heads = kept
    for layer, heads in zip(layers, kept):
        if len(heads) < total:
            hold_heads(layer.module, layout, len(heads), head_dim, heads, total)


def remove_structured(model: nn.Module, keep_heads: list[list[int]],
                      keep_neurons: list[list[int]]) -> dict[str, Any]:
    """Keep exactly ``keep_heads[l]`` / ``keep_neurons[l]`` (indices into layer l's current heads /
    FFN neurons) of every encoder layer of ``model``, removing the rest in place.

    The model becomes the matching ``Compress*`` class (see ``prune_structured``). Lists are
    validated first (one per layer, in range, none empty: UsageError, model unchanged).
    Returns the sizes before/after, the heads kept per layer and the parameter counts.
    """
    layout = _structured_layout(model)
    pruned_class = _pruned_class(model)
    layers = encoder_layers(model, layout)
    _, head_dim = head_layout(model)
    before = layer_sizes(model)
    model_type = base_model_type(model.config.model_type)
    blocks = can_empty_blocks(model_type)
    keep_heads = _check_keep(keep_heads, before["heads"], "heads", blocks)
    keep_neurons = _check_keep(keep_neurons, before["ffn"], "FFN neurons", blocks)
    params_before = sum(p.numel() for p in model.parameters())

    for layer, heads, neurons in zip(layers, keep_heads, keep_neurons):
        if len(heads) < head_count(layer, head_dim):
            for role, lin in layer.linears.items():
                if role in HEAD_ROW_ROLES or role == "attn_out":
                    for dim, index in _head_index(layer, role, heads, head_dim,
                                                  layout.extra.get("qkv_order", "blocks")).items():
                        _keep(lin, dim, index)
            for path, kind in layout.extra.get("head_extras", {}).items():
                _keep_head_extra(layer.module, path, kind, heads, head_dim)
            attention = layer.module.get_submodule(layout.attention)
            set_head_attrs(attention, layout, len(heads), head_dim)
        if len(neurons) < ffn_size(layer):
            index = torch.tensor(neurons, dtype=torch.long, device=layer.linears["ffn_out"].weight.device)
            _keep(layer.linears["ffn_in"], 0, _neuron_index(layer, layout, neurons))
            _keep(layer.linears["ffn_out"], 1, index)
            if "ffn_gate" in layer.linears:
                _keep(layer.linears["ffn_gate"], 0, index)
        if not heads or not neurons:
            empty_blocks(layer.module, MODULE_PATHS[model_type], len(heads), len(neurons))

    after = layer_sizes(model)
    config = model.config
    config.__class__ = pruned_class.config_class
    # a config read from config.json keeps its "model_type" as an instance attribute, which would
    # hide the pruned class's (to_dict writes the class's, but code reading config.model_type would not)
    vars(config).pop("model_type", None)
    # a discovered type whose heads all stay keeps its config's head count (ConvBERT's output
    # projection reads more than its heads' context, so its weights would miscount them)
    untouched = (layout.discovered and after["heads"] == before["heads"]
                 and getattr(config, "layer_heads", None) is None)
    config.layer_heads = None if untouched else after["heads"]
    config.layer_intermediate = after["ffn"]
    if layout.discovered:  # no module table for this type: the saved config says where its matrices are
        config.pruned_layout = layout_to_dict(layout)
        _keep_head_inputs(model, layout, layers, keep_heads, head_dim)
        register_auto_classes([model_type])
    model.__class__ = pruned_class
    params_after = sum(p.numel() for p in model.parameters())
    heads_b, heads_a = sum(before["heads"]), sum(after["heads"])
    ffn_b, ffn_a = sum(before["ffn"]), sum(after["ffn"])
    report = {"layer_heads_before": before["heads"], "layer_heads": after["heads"],
              "attention_blocks_removed": sum(1 for n in after["heads"] if n == 0),
              "ffn_blocks_removed": sum(1 for n in after["ffn"] if n == 0),
              "layers_removed": sum(1 for h, f in zip(after["heads"], after["ffn"]) if h == 0 and f == 0),
              "kept_heads": keep_heads,
              "layer_ffn_before": before["ffn"], "layer_ffn": after["ffn"],
              "heads_removed": heads_b - heads_a, "heads_removed_fraction": (heads_b - heads_a) / heads_b,
              "ffn_removed": ffn_b - ffn_a, "ffn_removed_fraction": (ffn_b - ffn_a) / ffn_b,
              "params_before": params_before, "params_after": params_after}
    if layout.shared_layers:
        report["shared_layers"] = layout.notes
    return report
