"""Structured-pruned encoders that load with stock transformers: per-layer head counts and FFN widths.

A stock config has one head count and one FFN width for every layer, so it cannot describe an
encoder whose layers lost different numbers of heads and FFN neurons. For a base type ``T`` this
module defines ``Compress<T>Config`` (model type ``compress_<t>``, e.g. ``compress_bert``,
``compress_roberta``, ``compress_ernie``) with two extra fields, ``layer_heads`` and
``layer_intermediate`` (one entry per encoder layer; ALBERT: per shared layer; None = the layer
keeps the uniform size), and ``Compress`` + the stock class name for the base model and its
SequenceClassification, QuestionAnswering, MaskedLM and TokenClassification heads where
transformers has them. Their ``__init__`` builds the stock model, then rebuilds each layer's Linear
modules at the saved size (the weights load afterwards) and sets the attention module's head-count
attributes. The nine types of ``MODULE_PATHS`` are built at import; any other type is built when
first asked for (``pruned_classes_for``, or a module attribute ``Compress<StockClass>``), and its
config carries ``pruned_layout``: the module paths that role discovery found.

This file is self-contained on purpose (it imports only the standard library, torch and
transformers, with no relative imports): ``save_pretrained`` of a pruned model copies it beside the
weights and writes ``auto_map`` into ``config.json``, the Hugging Face custom-code convention, so
``AutoModelFor...from_pretrained(folder, trust_remote_code=True)`` works where this project is not
installed. Importing it registers nothing; ``register_auto_classes()`` does (the project calls it
through ``compress.models.loading.register_model_types``).

``MODULE_PATHS`` repeats, for the module paths only, the role table of ``compress.models.architectures`` (a
test keeps the two equal).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn

PREFIX = "compress_"
HEAD_ROW_ROLES = ("query", "key", "value", "qkv", "pos_query", "pos_key")


@dataclass(frozen=True)
class PrunedLayout:
    """Where one architecture keeps the matrices that structured pruning resizes.

    ``layers``: regular expression of a layer's path inside the base model (its integer groups
    order the layers); ``roles``: role -> Linear path inside a layer; ``attention``: the module
    holding ``head_attrs`` (attribute -> "heads" or "width" = heads * head_dim).
    """

    layers: str
    roles: dict
    attention: str
    head_attrs: dict
    heads_config: str = "num_attention_heads"
    glu: bool = False
    # module paths inside a layer whose forward is replaced when its block keeps no unit (an empty
    # attention block / FFN block); None = this architecture cannot remove a whole block
    empty_attention: str | None = None
    empty_ffn: tuple[str, str] | None = None
    head_dim: int | None = None  # None: attention_head_size, else hidden size / head count
    # parts of the attention module sized by its heads besides the role Linears (found by discovery):
    # path inside the layer -> "rows" (a Linear whose output rows are grouped by head), "vector" (a
    # parameter of heads * head_dim entries) or "channels" (a convolution with one group per head)
    head_extras: dict | None = None


_BERT = PrunedLayout(
    r"encoder\.layer\.(\d+)",
    {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
     "attn_out": "attention.output.dense", "ffn_in": "intermediate.dense", "ffn_out": "output.dense"},
    "attention.self", {"num_attention_heads": "heads", "all_head_size": "width"},
    empty_attention="attention", empty_ffn=("intermediate", "output"))
MODULE_PATHS = {
    "bert": _BERT, "roberta": _BERT, "xlm-roberta": _BERT, "camembert": _BERT, "electra": _BERT,
    "distilbert": PrunedLayout(
        r"transformer\.layer\.(\d+)",
        {"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
         "attn_out": "attention.out_lin", "ffn_in": "ffn.lin1", "ffn_out": "ffn.lin2"},
        "attention", {"n_heads": "heads", "dim": "width"}, heads_config="n_heads"),
    "albert": PrunedLayout(
        r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)",
        {"query": "attention.query", "key": "attention.key", "value": "attention.value",
         "attn_out": "attention.dense", "ffn_in": "ffn", "ffn_out": "ffn_output"},
        "attention", {"num_attention_heads": "heads", "all_head_size": "width"}),
    "deberta-v2": PrunedLayout(
        r"encoder\.layer\.(\d+)",
        {"query": "attention.self.query_proj", "key": "attention.self.key_proj",
         "value": "attention.self.value_proj", "pos_query": "attention.self.pos_query_proj",
         "pos_key": "attention.self.pos_key_proj", "attn_out": "attention.output.dense",
         "ffn_in": "intermediate.dense", "ffn_out": "output.dense"},
        "attention.self", {"num_attention_heads": "heads", "all_head_size": "width"}),
    "modernbert": PrunedLayout(
        r"layers\.(\d+)",
        {"qkv": "attn.Wqkv", "attn_out": "attn.Wo", "ffn_in": "mlp.Wi", "ffn_out": "mlp.Wo"},
        "attn", {"num_heads": "heads", "all_head_size": "width"}, glu=True),
}


def base_model_type(model_type: str) -> str:
    """``compress_roberta`` -> ``roberta`` (any other type unchanged)."""
    return model_type[len(PREFIX):] if model_type.startswith(PREFIX) else model_type


def layout_of(config) -> PrunedLayout:
    """The module paths of ``config``'s architecture: the table above, else the layout that role
    discovery found and ``remove_structured`` saved in ``config.pruned_layout``."""
    base = base_model_type(config.model_type)
    if base in MODULE_PATHS:
        return MODULE_PATHS[base]
    stored = getattr(config, "pruned_layout", None)
    if not stored:
        raise ValueError(f"model type '{config.model_type}' has no module table and its config has no "
                         "pruned_layout")
    return PrunedLayout(stored["layers"], dict(stored["roles"]), stored["attention"],
                        dict(stored["head_attrs"]), stored["heads_config"], bool(stored.get("glu")),
                        head_dim=stored.get("head_dim"), head_extras=dict(stored.get("head_extras") or {}))


def head_dim_of(config) -> int:
    """Head size of the unpruned architecture (pruning removes whole heads, never head dims)."""
    layout = layout_of(config)
    if layout.head_dim:
        return layout.head_dim
    heads = getattr(config, layout.heads_config)
    hidden = getattr(config, "hidden_size", None) or config.dim
    return getattr(config, "attention_head_size", None) or hidden // heads


def find_layers(base_model: nn.Module, layout: PrunedLayout) -> list[nn.Module]:
    """The encoder layers of ``base_model`` in order (ALBERT's shared layers once each)."""
    pattern = re.compile(f"^{layout.layers}$")
    found = []
    for name, module in base_model.named_modules():
        m = pattern.match(name)
        if m:
            found.append((tuple(int(g) for g in m.groups()), module))
    return [module for _, module in sorted(found, key=lambda t: t[0])]


def _rebuild_linear(layer: nn.Module, path: str, in_features: int, out_features: int) -> None:
    parent_path, _, attr = path.rpartition(".")
    parent = layer.get_submodule(parent_path) if parent_path else layer
    old = getattr(parent, attr)
    with warnings.catch_warnings():  # an empty block's projections have no element to initialise
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        setattr(parent, attr, nn.Linear(in_features, out_features, bias=old.bias is not None,
                                        device=old.weight.device, dtype=old.weight.dtype))


def set_head_attrs(attention: nn.Module, layout: PrunedLayout, heads: int, head_dim: int) -> None:
    """Tell the attention module its head count / width (``layout.head_attrs``)."""
    for attr, kind in layout.head_attrs.items():
        setattr(attention, attr, heads if kind == "heads" else heads * head_dim)


def resize_head_extra(layer: nn.Module, path: str, kind: str, heads: int, head_dim: int) -> None:
    """Rebuild the head-sized part ``path`` of ``layer`` (see ``PrunedLayout.head_extras``) for
    ``heads`` heads (new, uninitialised values: ``from_pretrained`` loads them)."""
    parent_path, _, attr = path.rpartition(".")
    parent = layer.get_submodule(parent_path) if parent_path else layer
    old = getattr(parent, attr)
    if kind == "rows":
        _rebuild_linear(layer, path, old.in_features, heads * head_dim)
    elif kind == "vector":
        setattr(parent, attr, nn.Parameter(old.new_empty(heads * head_dim), requires_grad=old.requires_grad))
    elif kind == "channels":
        conv = type(old)(heads, heads, old.kernel_size, stride=old.stride, padding=old.padding,
                         dilation=old.dilation, groups=heads, bias=old.bias is not None,
                         padding_mode=old.padding_mode, device=old.weight.device, dtype=old.weight.dtype)
        setattr(parent, attr, conv)
    else:
        raise ValueError(f"unknown head-sized part kind '{kind}' of {path}")


def _hold_heads(layer, args, kwargs):
    """Forward pre-hook of a layer: its attention module keeps the pruned head count even where the
    model replaces that module at run time (BigBird builds a new one from the config whenever it
    switches between full and block-sparse attention, moving only the projections across)."""
    path, heads, head_dim, attrs, kept, total = layer.compress_heads
    attention = layer.get_submodule(path)
    if getattr(attention, "compress_held", None) is not layer.compress_heads:
        for attr, kind in attrs:
            setattr(attention, attr, heads if kind == "heads" else heads * head_dim)
        if kept is not None:
            keep_head_inputs(attention, kept, total)
        attention.compress_held = layer.compress_heads


def hold_heads(layer: nn.Module, layout: PrunedLayout, heads: int, head_dim: int, kept=None,
               total: int = 0) -> None:
    """Set the head attributes of ``layer``'s attention module now and before every forward of the
    layer (``_hold_heads``); ``kept``/``total``: as in ``keep_head_inputs``; idempotent."""
    attrs = tuple(sorted(layout.head_attrs.items()))
    kept = None if kept is None or len(kept) >= total else tuple(int(h) for h in kept)
    layer.compress_heads = (layout.attention, int(heads), int(head_dim), attrs, kept, int(total))
    if _hold_heads not in layer._forward_pre_hooks.values():
        layer.register_forward_pre_hook(_hold_heads, with_kwargs=True)
    _hold_heads(layer, (), {})


def _slice_head_inputs(module, args, kwargs):
    """Forward pre-hook: a 4-D input with one entry per head of the unpruned layer along dim 1 (MPNet's
    relative-position bias, computed once for all layers) keeps the rows of this layer's heads."""
    kept, total = module.compress_kept_heads, module.compress_total_heads

    def cut(t):
        if isinstance(t, torch.Tensor) and t.ndim == 4 and t.shape[1] == total:
            return t.index_select(1, torch.tensor(kept, dtype=torch.long, device=t.device))
        return t
    return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}


def keep_head_inputs(attention: nn.Module, kept: list[int], total: int) -> None:
    """Make ``attention`` (which keeps heads ``kept`` of ``total``) take per-head inputs computed for
    ``total`` heads outside it (``_slice_head_inputs``); idempotent."""
    attention.compress_kept_heads = tuple(int(h) for h in kept)  # no tensor: models are built on "meta"
    attention.compress_total_heads = int(total)
    if _slice_head_inputs not in attention._forward_pre_hooks.values():
        attention.register_forward_pre_hook(_slice_head_inputs, with_kwargs=True)


# An empty block computes what its layer computed with every head / neuron of the block removed:
# the output projection of nothing is its bias, so the block's output is LayerNorm(residual + bias)
# (BERT's post-LN layout). The modules stay in place (their zero-size projections too, so the
# saved weights keep their names); only their forward changes.
def _empty_attention_forward(self, hidden_states, *args, **kwargs):
    out = self.output
    bias = out.dense.bias if out.dense.bias is not None else hidden_states.new_zeros(hidden_states.shape[-1])
    return out.LayerNorm(out.dropout(bias.expand_as(hidden_states)) + hidden_states), None


def _empty_intermediate_forward(self, hidden_states):
    return hidden_states  # read by nothing: the empty output block ignores it


def _empty_output_forward(self, hidden_states, input_tensor):
    bias = self.dense.bias if self.dense.bias is not None else input_tensor.new_zeros(input_tensor.shape[-1])
    return self.LayerNorm(self.dropout(bias.expand_as(input_tensor)) + input_tensor)


_EMPTY_VARIANTS: dict[tuple[type, str], type] = {}


def _make_empty(module: nn.Module, forward) -> None:
    """Give ``module`` a subclass of its class whose ``forward`` is ``forward`` (once per class)."""
    cls = type(module)
    if getattr(cls, "empty_block", False):
        return
    key = (cls, forward.__name__)
    if key not in _EMPTY_VARIANTS:
        name = f"Empty{cls.__name__}"
        _EMPTY_VARIANTS[key] = type(name, (cls,), {"forward": forward, "empty_block": True,
                                                   "__module__": __name__, "__qualname__": name})
    module.__class__ = _EMPTY_VARIANTS[key]


def is_structured_config(config) -> bool:
    """Whether a model config (an object or ``config.json``'s dict) records resized layers: per-layer
    head counts, FFN widths or both (a discovered type pruned FFN-only keeps ``layer_heads`` None)."""
    fields = ("layer_heads", "layer_intermediate")
    if isinstance(config, dict):
        return any(config.get(f) is not None for f in fields)
    return any(getattr(config, f, None) is not None for f in fields)


def can_empty_blocks(model_type: str) -> bool:
    """Whether this architecture can remove a whole attention or FFN block (every unit of it)."""
    layout = MODULE_PATHS.get(base_model_type(model_type))
    return layout is not None and layout.empty_attention is not None


def empty_blocks(layer: nn.Module, layout: PrunedLayout, heads: int, neurons: int) -> None:
    """Make the attention block of ``layer`` empty when it keeps no head, its FFN block when it keeps
    no neuron (ValueError where the architecture cannot)."""
    if (heads == 0 or neurons == 0) and layout.empty_attention is None:
        raise ValueError("this architecture cannot remove a whole attention or FFN block; keep at least "
                         "one head and one FFN neuron per layer")
    if heads == 0:
        _make_empty(layer.get_submodule(layout.empty_attention), _empty_attention_forward)
    if neurons == 0:
        inter, output = layout.empty_ffn
        _make_empty(layer.get_submodule(inter), _empty_intermediate_forward)
        _make_empty(layer.get_submodule(output), _empty_output_forward)


def resize_pruned_layers(base_model: nn.Module, config) -> None:
    """Rebuild each layer's role Linears at the sizes in ``config.layer_heads`` /
    ``config.layer_intermediate`` (new, uninitialised weights: ``from_pretrained`` loads them)."""
    layout = layout_of(config)
    layers = find_layers(base_model, layout)
    head_dim = head_dim_of(config)
    for field in ("layer_heads", "layer_intermediate"):
        sizes = getattr(config, field, None)
        if sizes is not None and len(sizes) != len(layers):
            raise ValueError(f"config.{field} has {len(sizes)} entries but the model has {len(layers)} "
                             "encoder layers")
    for i, layer in enumerate(layers):
        modules = dict(layer.named_modules())
        roles = {role: path for role, path in layout.roles.items() if path in modules}
        if config.layer_heads is not None:
            heads = config.layer_heads[i]
            width = heads * head_dim
            for role in HEAD_ROW_ROLES:
                if role in roles:
                    rows = 3 * width if role == "qkv" else width
                    _rebuild_linear(layer, roles[role], modules[roles[role]].in_features, rows)
            _rebuild_linear(layer, roles["attn_out"], width, modules[roles["attn_out"]].out_features)
            for path, kind in (layout.head_extras or {}).items():
                resize_head_extra(layer, path, kind, heads, head_dim)
            set_head_attrs(modules[layout.attention], layout, heads, head_dim)
            if base_model_type(config.model_type) not in MODULE_PATHS:  # a discovered type
                kept = getattr(config, "layer_kept_heads", None)
                hold_heads(layer, layout, heads, head_dim, None if kept is None else kept[i],
                           getattr(config, layout.heads_config))
        if config.layer_intermediate is not None:
            neurons = config.layer_intermediate[i]
            ffn_in = modules[roles["ffn_in"]]
            _rebuild_linear(layer, roles["ffn_in"], ffn_in.in_features, neurons * (2 if layout.glu else 1))
            if "ffn_gate" in roles:
                _rebuild_linear(layer, roles["ffn_gate"], modules[roles["ffn_gate"]].in_features, neurons)
            _rebuild_linear(layer, roles["ffn_out"], neurons, modules[roles["ffn_out"]].out_features)
        empty_blocks(layer, layout, *_sizes_of(config, i))


def _sizes_of(config, index: int) -> tuple[int, int]:
    """(heads, FFN width) of layer ``index`` by ``config``; -1 = the layer keeps the uniform size."""
    heads = -1 if config.layer_heads is None else config.layer_heads[index]
    neurons = -1 if config.layer_intermediate is None else config.layer_intermediate[index]
    return heads, neurons


def write_remote_code(folder: str | Path, config) -> None:
    """Copy this file beside a saved pruned model and point ``config.json``'s ``auto_map`` at its
    classes, so ``from_pretrained(folder, trust_remote_code=True)`` needs no install of compress."""
    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():  # save_pretrained(is_main_process=False) writes no config
        return
    module = Path(__file__).stem
    shutil.copyfile(__file__, folder / Path(__file__).name)
    classes = pruned_classes_for(base_model_type(config.model_type))
    auto_map = {auto: f"{module}.{cls.__name__}" for auto, cls in classes.items()}
    saved = json.loads(config_file.read_text(encoding="utf-8"))
    saved["auto_map"] = auto_map
    config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _config_class(base: type) -> type:
    def __init__(self, layer_heads=None, layer_intermediate=None, pruned_layout=None, layer_kept_heads=None,
                 **kwargs):
        base.__init__(self, **kwargs)
        self.layer_heads = None if layer_heads is None else [int(n) for n in layer_heads]
        self.layer_intermediate = None if layer_intermediate is None else [int(n) for n in layer_intermediate]
        if pruned_layout is not None:  # a type outside MODULE_PATHS: where its matrices are
            self.pruned_layout = dict(pruned_layout)
        if layer_kept_heads is not None:  # and which of its heads each layer kept
            self.layer_kept_heads = [[int(h) for h in kept] for kept in layer_kept_heads]

    name = f"Compress{base.__name__}"
    doc = f"{base.__name__} plus per-layer head counts and FFN widths (None = the uniform size)."
    return type(name, (base,), {"model_type": PREFIX + base.model_type, "__init__": __init__,
                                "__doc__": doc, "__module__": __name__, "__qualname__": name})


def _model_class(base: type, config_class: type) -> type:
    def __init__(self, config, *args, **kwargs):
        base.__init__(self, config, *args, **kwargs)
        resize_pruned_layers(self.base_model, config)
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs):
        base.save_pretrained(self, save_directory, *args, **kwargs)
        write_remote_code(save_directory, self.config)

    name = f"Compress{base.__name__}"
    doc = f"{base.__name__} whose layers have the sizes in ``config.layer_heads`` / ``layer_intermediate``."
    return type(name, (base,), {"config_class": config_class, "__init__": __init__,
                                "save_pretrained": save_pretrained, "__doc__": doc,
                                "__module__": __name__, "__qualname__": name})


def _class_names(base_type: str) -> dict[str, str]:
    """"AutoConfig" | Auto model class name -> the stock class name transformers maps
    ``base_type`` to (only the Auto classes it has a class for)."""
    from transformers.models.auto import configuration_auto, modeling_auto

    config_name = configuration_auto.CONFIG_MAPPING_NAMES.get(base_type)
    if config_name is None:
        return {}
    out = {"AutoConfig": config_name}
    for auto, mapping in AUTO_MAPPINGS.items():
        name = getattr(modeling_auto, mapping).get(base_type)
        name = name[0] if isinstance(name, (tuple, list)) else name
        if name:
            out[auto] = name
    return out


AUTO_MAPPINGS = {"AutoModel": "MODEL_MAPPING_NAMES",
                 "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                 "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
                 "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
                 "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"}
# base model type -> {"AutoConfig" | Auto model class name -> pruned class}, filled on demand
PRUNED_CLASSES: dict[str, dict[str, type]] = {}
# the stock class a pruned class extends -> that pruned class
PRUNED_CLASS_OF: dict[type, type] = {}


def pruned_classes_for(base_type: str) -> dict[str, type]:
    """The pruned config and model classes of ``base_type`` (``Compress`` + the stock class name),
    built once; {} when this transformers release has no such type."""
    if base_type in PRUNED_CLASSES:
        return PRUNED_CLASSES[base_type]
    names = _class_names(base_type)
    if not names:
        return {}
    try:
        classes = {"AutoConfig": _config_class(getattr(transformers, names.pop("AutoConfig")))}
    except (AttributeError, ImportError):
        return {}
    for auto, name in names.items():
        try:
            classes[auto] = _model_class(getattr(transformers, name), classes["AutoConfig"])
        except (AttributeError, ImportError):
            continue
    PRUNED_CLASSES[base_type] = classes
    for cls in classes.values():
        globals()[cls.__name__] = cls
        PRUNED_CLASS_OF[cls.__mro__[1]] = cls
    return classes


def pruned_class_of(cls: type) -> type | None:
    """The pruned class that extends the stock model class ``cls`` (itself when it is one); None
    when there is none."""
    if getattr(cls, "config_class", None) is not None and cls in PRUNED_CLASS_OF.values():
        return cls
    model_type = getattr(getattr(cls, "config_class", None), "model_type", None)
    if model_type:
        pruned_classes_for(model_type)
    return PRUNED_CLASS_OF.get(cls)


for _base_type in MODULE_PATHS:
    pruned_classes_for(_base_type)


def __getattr__(name: str) -> type:
    """``Compress<StockClass>`` of any model type, built when first asked for (how ``auto_map`` of a
    saved folder finds the classes of a type outside ``MODULE_PATHS``)."""
    if name.startswith("Compress"):
        from transformers.models.auto import configuration_auto

        for base_type in configuration_auto.CONFIG_MAPPING_NAMES:
            if name[len("Compress"):] in _class_names(base_type).values():
                pruned_classes_for(base_type)
                if name in globals():
                    return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_auto_classes(model_types=()) -> None:
    """Register the ``compress_<type>`` config and model classes with transformers' Auto classes:
    the table's types, those built so far, and ``model_types`` (base or ``compress_`` types)."""
    for model_type in model_types:
        pruned_classes_for(base_model_type(model_type))
    for classes in list(PRUNED_CLASSES.values()):
        config_class = classes["AutoConfig"]
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        for auto, cls in classes.items():
            if auto != "AutoConfig":
                getattr(transformers, auto).register(config_class, cls, exist_ok=True)


__all__ = ["MODULE_PATHS", "PRUNED_CLASSES", "PRUNED_CLASS_OF", "can_empty_blocks", "empty_blocks",
           "is_structured_config",
           "hold_heads", "layout_of", "resize_head_extra", "pruned_class_of", "pruned_classes_for",
           "register_auto_classes", "resize_pruned_layers", "write_remote_code"]
