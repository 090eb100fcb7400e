"""Where each supported encoder keeps its matrices: one role table per architecture.

A *role* names what a matrix does in an encoder layer, whatever the architecture calls it:

==========  ==========================================================================
``query``   query projection, ``[heads * head_dim, hidden]`` (rows grouped by head)
``key``     key projection, same layout
``value``   value projection, same layout
``qkv``     fused query/key/value (ModernBERT's ``Wqkv``): ``[3 * heads * head_dim, hidden]``,
            rows in blocks q | k | v, each grouped by head
``pos_query``, ``pos_key``  DeBERTa's separate relative-position projections (only when
            ``share_att_key`` is off); rows grouped by head like ``query``/``key``
``attn_out`` attention output, ``[hidden, heads * head_dim]`` (columns grouped by head)
``ffn_in``  FFN input, ``[ffn, hidden]``; gated (GLU) FFNs stack input and gate rows:
            ``[2 * ffn, hidden]``, neuron j owning rows j and ffn + j
``ffn_gate`` a gated FFN's separate gate projection, ``[ffn, hidden]`` (found by discovery only)
``ffn_out`` FFN output, ``[hidden, ffn]`` (neuron j owns column j)
==========  ==========================================================================

plus ``word_embeddings`` outside the layers. Names are *canonical* (relative to the base model, see
``compress.pruning.targets.canonical_name``). Pruning targets, ``--include role:NAME``, the
sparsity report, structured pruning and FLOPs all read this table. An architecture outside it gets
a layout found from its structure and one hooked forward pass (``compress.models.discovery``); one
the discovery cannot read is refused, saying what was not found (``--include`` can still name
targets by hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from compress.core.errors import ModelError, UsageError
from compress.models.discovery import discover

ROLES = ("query", "key", "value", "qkv", "pos_query", "pos_key", "attn_out", "ffn_gate", "ffn_in",
         "ffn_out")
# roles whose rows are grouped by head, and the one whose columns are
HEAD_ROW_ROLES = ("query", "key", "value", "qkv", "pos_query", "pos_key")
QKV_PARTS = ("query", "key", "value")


@dataclass(frozen=True)
class EncoderLayout:
    """Where one architecture keeps its encoder matrices (module paths are canonical).

    ``layers``: regular expression of a layer module's path; its groups, read as integers, give
    the layer index (ALBERT's group and inner index). ``roles``: role -> module path inside a
    layer; ``optional`` roles may be absent (DeBERTa's position projections). ``attention``: the
    module inside a layer that holds the head-count attributes named in ``head_attrs``
    (attribute -> "heads" or "width", i.e. heads * head_dim).
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    roles: dict[str, str]
    attention: str
    head_attrs: dict[str, str]
    word_embeddings: str
    optional: tuple[str, ...] = ()
    glu: bool = False
    shared_layers: bool = False
    # the onnxruntime transformer optimizer's model type (its fusions), None if it has none
    ort_model_type: str | None = "bert"
    heads_config: str = "num_attention_heads"
    ffn_config: str = "intermediate_size"
    notes: str = ""
    extra: dict = field(default_factory=dict)
    # True when found by compress.models.discovery rather than written in LAYOUTS
    discovered: bool = False

    @property
    def fused_qkv(self) -> bool:
        return "qkv" in self.roles


_BERT_ROLES = {"query": "attention.self.query", "key": "attention.self.key",
               "value": "attention.self.value", "attn_out": "attention.output.dense",
               "ffn_in": "intermediate.dense", "ffn_out": "output.dense"}
_BERT_HEADS = {"num_attention_heads": "heads", "all_head_size": "width"}

LAYOUTS: dict[str, EncoderLayout] = {
    "bert": EncoderLayout(
        "bert", ("bert", "roberta", "xlm-roberta", "camembert", "electra"),
        r"encoder\.layer\.(\d+)", _BERT_ROLES, "attention.self", _BERT_HEADS,
        "embeddings.word_embeddings"),
    "distilbert": EncoderLayout(
        "distilbert", ("distilbert",), r"transformer\.layer\.(\d+)",
        {"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
         "attn_out": "attention.out_lin", "ffn_in": "ffn.lin1", "ffn_out": "ffn.lin2"},
        "attention", {"n_heads": "heads", "dim": "width"}, "embeddings.word_embeddings",
        heads_config="n_heads", ffn_config="hidden_dim"),
    "albert": EncoderLayout(
        "albert", ("albert",), r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)",
        {"query": "attention.query", "key": "attention.key", "value": "attention.value",
         "attn_out": "attention.dense", "ffn_in": "ffn", "ffn_out": "ffn_output"},
        "attention", _BERT_HEADS, "embeddings.word_embeddings", shared_layers=True,
        notes="ALBERT shares its layer weights across depth: each shared layer is pruned once"),
    "deberta-v2": EncoderLayout(
        "deberta-v2", ("deberta-v2",), r"encoder\.layer\.(\d+)",
        {"query": "attention.self.query_proj", "key": "attention.self.key_proj",
         "value": "attention.self.value_proj", "pos_query": "attention.self.pos_query_proj",
         "pos_key": "attention.self.pos_key_proj", "attn_out": "attention.output.dense",
         "ffn_in": "intermediate.dense", "ffn_out": "output.dense"},
        "attention.self", _BERT_HEADS, "embeddings.word_embeddings",
        optional=("pos_query", "pos_key"), ort_model_type=None,
        notes="disentangled attention: no onnxruntime fusion applies"),
    "modernbert": EncoderLayout(
        "modernbert", ("modernbert",), r"layers\.(\d+)",
        {"qkv": "attn.Wqkv", "attn_out": "attn.Wo", "ffn_in": "mlp.Wi", "ffn_out": "mlp.Wo"},
        "attn", {"num_heads": "heads", "all_head_size": "width"}, "embeddings.tok_embeddings",
        glu=True, ort_model_type=None,
        notes="fused QKV, rotary embeddings and a gated FFN: no onnxruntime fusion applies"),
}
_BY_MODEL_TYPE = {t: lay for lay in LAYOUTS.values() for t in lay.model_types}
SUPPORTED = tuple(t for t in _BY_MODEL_TYPE if not t.startswith("compress_"))


def base_model_type(model_type: str) -> str:
    """``compress_roberta`` (a structured-pruned RoBERTa) -> ``roberta``."""
    return model_type[len("compress_"):] if model_type.startswith("compress_") else model_type


def layout_for(model: torch.nn.Module) -> EncoderLayout:
    """The role table of ``model``'s architecture, or the layout discovery found; UsageError saying
    what was not found otherwise."""
    layout = find_layout(model)
    if layout is None:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        why = getattr(model, DISCOVERY_ATTR, (None, "it has no config; name the matrices to prune with "
                                                     "--include (glob or re:REGEX)"))[1]
        raise UsageError(f"architecture '{model_type}' has no role table and its roles were not found: "
                         f"{why}")
    return layout


DISCOVERY_ATTR = "_compress_discovered_layout"


def find_layout(model: torch.nn.Module) -> EncoderLayout | None:
    """The role table of ``model``'s architecture; else the layout found by discovery (cached on the
    model); None when discovery cannot read it (``layout_for`` says why)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        return None
    table = _BY_MODEL_TYPE.get(model_type) or _BY_MODEL_TYPE.get(base_model_type(model_type))
    if table is not None:
        return table
    cached = getattr(model, DISCOVERY_ATTR, None)
    stored = getattr(model.config, "pruned_layout", None)
    if cached is None and stored:  # a structured-pruned model of a discovered type, as saved
        cached = (layout_from_dict(base_model_type(model_type), stored), "")
        object.__setattr__(model, DISCOVERY_ATTR, cached)
    if cached is None:
        cached = _discovered_layout(model, model_type)
        object.__setattr__(model, DISCOVERY_ATTR, cached)
    return cached[0]


def _discovered_layout(model: torch.nn.Module, model_type: str) -> tuple[EncoderLayout | None, str]:
    try:
        found = discover(model)
    except ModelError as err:
        return None, str(err)
    return layout_from_dict(model_type, {
        "layers": found.layers, "roles": found.roles, "attention": found.attention,
        "head_attrs": found.head_attrs, "word_embeddings": found.word_embeddings, "glu": found.glu,
        "heads_config": found.heads_config, "ffn_config": found.ffn_config,
        "unassigned": list(found.unassigned), "head_dim": found.head_dim,
        "head_extras": dict(found.head_extras), "qkv_order": found.qkv_order}), ""


def layout_from_dict(model_type: str, found: dict) -> EncoderLayout:
    """The ``EncoderLayout`` of a discovered type from its plain-data form (``layout_to_dict``; how
    a structured-pruned model of that type keeps it in ``config.pruned_layout``)."""
    unassigned = tuple(found.get("unassigned", ()))
    return EncoderLayout(model_type, (model_type,), found["layers"], dict(found["roles"]), found["attention"],
                         dict(found["head_attrs"]), found["word_embeddings"], glu=bool(found["glu"]),
                         ort_model_type=None, heads_config=found["heads_config"],
                         ffn_config=found["ffn_config"],
                         notes="roles found from the model's structure and a forward pass"
                         + (f"; left dense: {', '.join(unassigned)}" if unassigned else ""),
                         extra={"unassigned": unassigned, "head_dim": found.get("head_dim") or None,
                                "head_extras": dict(found.get("head_extras") or {}),
                                "qkv_order": found.get("qkv_order") or "blocks"},
                         discovered=True)


def layout_to_dict(layout: EncoderLayout) -> dict:
    """A discovered layout as plain data (JSON), read back by ``layout_from_dict``."""
    return {"layers": layout.layers, "roles": dict(layout.roles), "attention": layout.attention,
            "head_attrs": dict(layout.head_attrs), "word_embeddings": layout.word_embeddings,
            "glu": layout.glu, "heads_config": layout.heads_config, "ffn_config": layout.ffn_config,
            "unassigned": list(layout.extra.get("unassigned", ())), "head_dim": layout.extra.get("head_dim"),
            "head_extras": dict(layout.extra.get("head_extras", {})),
            "qkv_order": layout.extra.get("qkv_order", "blocks")}


def canonical_name(model: torch.nn.Module, name: str) -> str:
    """Strip the base-model prefix (``bert.``) so names agree across heads."""
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and name.startswith(prefix + "."):
        return name[len(prefix) + 1:]
    return name


@dataclass(frozen=True)
class EncoderLayer:
    """One layer as the table sees it: index, canonical path, module, and role -> Linear."""

    index: int
    path: str
    module: torch.nn.Module
    linears: dict[str, torch.nn.Linear]


def encoder_layers(model: torch.nn.Module, layout: EncoderLayout | None = None) -> list[EncoderLayer]:
    """The encoder layers of ``model`` in order, each with its role -> Linear map.

    Raises ModelError when the table's layer pattern finds no layer, when a layer lacks a required
    role, or when a layer holds a Linear the table does not name (it would be left dense silently).
    ALBERT's shared layers appear once each (index = group * inner_group_num + inner index).
    """
    layout = layout or layout_for(model)
    pattern = re.compile(f"^{layout.layers}$")
    found: list[tuple[tuple[int, ...], str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        canon = canonical_name(model, name)
        m = pattern.match(canon)
        if m:
            found.append((tuple(int(g) for g in m.groups()), canon, module))
    if not found:
        raise ModelError(f"no encoder layer matches '{layout.layers}' in this {layout.name} model; "
                         "its module names differ from the role table's")
    found.sort(key=lambda t: t[0])
    layers = []
    for index, (_, path, module) in enumerate(found):
        modules = dict(module.named_modules())
        linears: dict[str, torch.nn.Linear] = {}
        for role, sub in layout.roles.items():
            lin = modules.get(sub)
            if lin is None:
                if role in layout.optional:
                    continue
                raise ModelError(f"layer {path} has no '{sub}' ({role}); the {layout.name} role table "
                                 "does not recognise this model's layers")
            if not isinstance(lin, torch.nn.Linear):
                raise ModelError(f"{path}.{sub} ({role}) is a {type(lin).__name__}, not a Linear")
            linears[role] = lin
        named = {id(v) for v in linears.values()}
        left_dense = set(layout.extra.get("unassigned", ()))
        stray = [f"{path}.{n}" for n, mod in modules.items()
                 if isinstance(mod, torch.nn.Linear) and id(mod) not in named and n not in left_dense]
        if stray:
            raise ModelError(f"layer {path} has Linear modules the {layout.name} role table does not "
                             f"name: {', '.join(stray[:3])}")
        layers.append(EncoderLayer(index, path, module, linears))
    return layers


def role_of_weights(model: torch.nn.Module, layout: EncoderLayout | None = None
                    ) -> dict[str, tuple[int, str]]:
    """Canonical weight name -> (layer index, role) for every role matrix of the encoder."""
    out = {}
    for layer in encoder_layers(model, layout):
        subs = (layout or layout_for(model)).roles
        for role in layer.linears:
            out[f"{layer.path}.{subs[role]}.weight"] = (layer.index, role)
    return out


def head_layout(model: torch.nn.Module) -> tuple[int, int]:
    """(heads, head_dim) of the unpruned architecture, from the config."""
    layout = layout_for(model)
    cfg = model.config
    heads = getattr(cfg, layout.heads_config)
    hidden = getattr(cfg, "hidden_size", None) or cfg.dim
    head_dim = layout.extra.get("head_dim") or getattr(cfg, "attention_head_size", None) or hidden // heads
    return heads, head_dim


def head_slices(role: str, weight_shape: tuple[int, ...], head_dim: int, qkv_order: str = "blocks"
                ) -> list[list[tuple[int, int, int]]]:
    """For each head, the (dim, start:stop) row/column ranges it owns in a ``role`` matrix.

    Returned as ``[[(dim, start, stop), ...] per head]`` packed in tuples (dim 0 = rows).
    ``qkv_order``: a fused QKV's rows in q | k | v blocks ("blocks") or per head ("heads").
    """
    if role == "qkv" and qkv_order == "heads":
        span = 3 * head_dim
        return [[(0, h * span, (h + 1) * span)] for h in range(weight_shape[0] // span)]
    if role == "qkv":
        width = weight_shape[0] // 3
        heads = width // head_dim
        return [[(0, part * width + h * head_dim, part * width + (h + 1) * head_dim) for part in range(3)]
                for h in range(heads)]
    if role in HEAD_ROW_ROLES:
        return [[(0, h * head_dim, (h + 1) * head_dim)] for h in range(weight_shape[0] // head_dim)]
    if role == "attn_out":
        return [[(1, h * head_dim, (h + 1) * head_dim)] for h in range(weight_shape[1] // head_dim)]
    raise ValueError(f"role '{role}' is not grouped by head")
