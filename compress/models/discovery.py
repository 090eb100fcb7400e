"""Find the role matrices of an encoder that has no role table, from its structure and forward pass.

For a model outside ``compress.models.architectures.LAYOUTS`` this reads, without relying on
module names:

1. the encoder's repeated layers: the ModuleList of identical modules holding the most parameters;
2. in its first layer, every Linear's shape, against the config's hidden size, head count, head
   size and FFN width;
3. one forward pass on a short dummy batch with hooks on that layer's Linears: the call order and
   which Linears read the same tensor (query, key and value do; so do an FFN's input and gate);
4. one forward pass per query/key/value candidate with its output zeroed: the value projection is
   the one whose zeroing zeroes the attention output projection's input (zeroing a query or key
   only makes the attention uniform). Query and key play the same part for every method here
   (scores = q k^T); they are told apart by name where the names say, by call order otherwise.

Linears of a layer outside these roles (adapters, global-attention or entity projections) are
left dense and listed (``Discovered.unassigned``). Names break ties only (query before key, gate
before up). A model the discovery cannot read fully raises ModelError naming what was not found;
it runs on the loaded model, before any data is read.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from compress.core.errors import ModelError, first_line

HEADS_CONFIG = ("num_attention_heads", "n_heads", "num_heads", "encoder_attention_heads")
FFN_CONFIG = ("intermediate_size", "hidden_dim", "ffn_dim", "encoder_ffn_dim", "d_ff")
HINT = "name the matrices to prune with --include (glob or re:REGEX)"


@dataclass(frozen=True)
class Discovered:
    """What the discovery found, in the terms of ``EncoderLayout`` (paths relative to the base model)."""

    layers: str
    roles: dict
    attention: str
    head_attrs: dict
    word_embeddings: str
    heads_config: str
    ffn_config: str
    glu: bool
    unassigned: tuple[str, ...] = ()
    head_dim: int = 0
    # parts of the attention sized by its heads besides the roles: layer path -> "rows" | "vector" |
    # "channels" (see compress.models.modeling_pruned.PrunedLayout.head_extras)
    head_extras: dict = field(default_factory=dict)
    # a fused QKV's row order: "blocks" (q | k | v, each grouped by head) or "heads" (per head q k v)
    qkv_order: str = "blocks"


def _config_value(config, names: tuple[str, ...], what: str) -> tuple[str, int]:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return name, value
    raise ModelError(f"its config names no {what} (looked for {', '.join(names)}); {HINT}")


def _layer_stack(base: nn.Module) -> tuple[str, nn.ModuleList]:
    best = None
    for path, module in base.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        kinds = {type(child) for child in module}
        if len(kinds) != 1 or not any(isinstance(m, nn.Linear) for m in module[0].modules()):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, path, module)
    if best is None:
        raise ModelError(f"no stack of repeated encoder layers (a ModuleList of identical modules with "
                         f"Linear layers) was found; {HINT}")
    return best[1], best[2]


def dummy_inputs(model: nn.Module) -> dict[str, torch.Tensor]:
    vocab = getattr(model.config, "vocab_size", None) or 100
    device = next(model.parameters()).device
    ids = torch.arange(8, device=device).repeat(2, 1) % max(vocab - 4, 1) + min(3, vocab - 1)
    ids[1, 5:] = ids[1, :3]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@contextmanager
def left_as_is(model: nn.Module):
    """Give every module of ``model`` its children and plain (str, int, float, bool) attributes
    back on exit: a model that switches its own mode on a short input (BigBird falls back to full
    attention for good) is left as it was by the probing forward passes run inside."""
    plain = (str, int, float, bool)
    state = [(m, dict(m._modules), {k: v for k, v in vars(m).items() if isinstance(v, plain)})
             for m in model.modules()]
    try:
        yield model
    finally:
        for module, children, attrs in state:
            module._modules.update(children)
            for key, value in attrs.items():
                setattr(module, key, value)


def _run(model: nn.Module, linears: dict[str, nn.Linear], zero: str | None = None) -> dict:
    """One forward pass; per Linear of the layer its first call: order, input tensor, output (the
    model left as it was, ``left_as_is``)."""
    seen: dict[str, dict] = {}
    hooks = []
    for sub, lin in linears.items():
        def hook(module, args, output, sub=sub):
            if sub not in seen:
                seen[sub] = {"order": len(seen), "input": args[0] if args else None}
            return torch.zeros_like(output) if sub == zero else None
        hooks.append(lin.register_forward_hook(hook))
    try:
        with torch.no_grad(), left_as_is(model):
            model(**dummy_inputs(model))
    except Exception as err:  # noqa: BLE001 - any failure means the model cannot be read this way
        raise ModelError(f"a forward pass on a dummy batch failed ({type(err).__name__}: "
                         f"{first_line(err)[:120]}); {HINT}") from err
    finally:
        for h in hooks:
            h.remove()
    return seen


def _same_input(calls: dict, subs: list[str]) -> list[list[str]]:
    """``subs`` grouped by the tensor they read (the same tensor, or equal values: a copy or a
    transposed view made per call), in call order."""
    groups: list[list[str]] = []
    for sub in sorted(subs, key=lambda s: calls[s]["order"]):
        x = calls[sub]["input"]
        for group in groups:
            y = calls[group[0]]["input"]
            if x is y or (x.shape == y.shape and (x.data_ptr() == y.data_ptr() or torch.equal(x, y))):
                group.append(sub)
                break
        else:
            groups.append([sub])
    return groups


def _by_hint(subs: list[str], hints: tuple[str, ...]) -> list[str]:
    """``subs`` ordered with the first whose last name part matches a hint first (stable)."""
    def rank(sub: str) -> int:
        last = sub.rsplit(".", 1)[-1].lower()
        return next((i for i, h in enumerate(hints) if re.search(h, last)), len(hints))
    return sorted(subs, key=rank)


def _common_parent(paths: list[str]) -> str:
    parts = [p.split(".")[:-1] for p in paths]
    common = []
    for items in zip(*parts):
        if len(set(items)) != 1:
            break
        common.append(items[0])
    return ".".join(common)


def discover(model: nn.Module) -> Discovered:
    """The roles of ``model``'s encoder (see the module docstring); ModelError when not found."""
    config = model.config
    hidden = getattr(config, "hidden_size", None) or getattr(config, "dim", None)
    if not isinstance(hidden, int):
        raise ModelError(f"its config names no hidden size; {HINT}")
    heads_config, heads = _config_value(config, HEADS_CONFIG, "attention head count")
    ffn_config, ffn = _config_value(config, FFN_CONFIG, "FFN width")
    head_dim = getattr(config, "head_dim", None) or getattr(config, "attention_head_size", None) \
        or hidden // heads
    width = heads * head_dim
    base = model.base_model
    stack_path, stack = _layer_stack(base)
    linears = {sub: m for sub, m in stack[0].named_modules() if isinstance(m, nn.Linear)}
    was_training = model.training
    model.eval()
    try:
        calls = _run(model, linears)
        roles = _attention_roles(model, linears, calls, hidden, width, head_dim)
        qkv_order = _qkv_order(model, linears, roles, head_dim, calls) if "qkv" in roles else "blocks"
    finally:
        model.train(was_training)
    ffn_roles, glu = _ffn_roles(linears, calls, hidden, ffn, set(roles.values()))
    roles.update(ffn_roles)
    # Linears outside the roles (adapters, global-attention or entity projections, convolution
    # kernels) are left dense: the layout lists them so that nothing else treats them as forgotten
    unassigned = tuple(sorted(set(linears) - set(roles.values())))
    attention = _common_parent([p for r, p in roles.items() if r in ("query", "key", "value", "qkv")])
    attn_module = stack[0].get_submodule(attention) if attention else stack[0]
    head_attrs = _head_attrs(attn_module, heads, width)
    qkv = roles.get("query") or roles["qkv"]
    qkv_width = linears[qkv].out_features // (1 if "query" in roles else 3)
    extras = _head_extras(attn_module, attention, [u for u in unassigned], linears, hidden, qkv_width,
                          qkv_width // head_dim)
    embeddings = base.get_input_embeddings()
    emb_path = next((p for p, m in base.named_modules() if m is embeddings), None)
    if emb_path is None:
        raise ModelError(f"the word embeddings were not found in the base model; {HINT}")
    return Discovered(rf"{re.escape(stack_path)}\.(\d+)", roles, attention, head_attrs, emb_path,
                      heads_config, ffn_config, glu, unassigned, head_dim, extras, qkv_order)


def _shifted(model: nn.Module, lin: nn.Linear, rows: slice, reader: tuple[str, nn.Linear]) -> torch.Tensor:
    """The input of ``reader`` (path, Linear) in a forward pass where ``lin``'s output rows ``rows``
    are raised by one."""
    def shift(module, args, output):
        output = output.clone()
        output[..., rows] += 1.0
        return output
    hook = lin.register_forward_hook(shift)
    try:
        return _run(model, {reader[0]: reader[1]})[reader[0]]["input"]
    finally:
        hook.remove()


def _qkv_order(model: nn.Module, linears: dict, roles: dict, head_dim: int, calls: dict) -> str:
    """How a fused QKV projection orders its rows, read from forward passes: raising the first
    head's value rows changes that head's columns of the attention output's input and no other.
    Rows ``2 * width ...`` are its value in q | k | v blocks (ModernBERT), rows ``2 * head_dim ...``
    where each head's q, k and v follow each other (DeBERTa v1's ``in_proj``). "blocks" when
    neither shows."""
    qkv, out = linears[roles["qkv"]], (roles["attn_out"], linears[roles["attn_out"]])
    width = qkv.out_features // 3
    base = calls[roles["attn_out"]]["input"]
    for order, start in (("blocks", 2 * width), ("heads", 2 * head_dim)):
        changed = (_shifted(model, qkv, slice(start, start + head_dim), out) - base).abs() > 1e-6
        columns = changed.reshape(-1, changed.shape[-1]).any(0)
        if columns[:head_dim].all() and not columns[head_dim:width].any():
            return order
    return "blocks"


def _head_extras(attention: nn.Module, attention_path: str, unassigned: list[str], linears: dict,
                 hidden: int, width: int, heads: int) -> dict[str, str]:
    """Parts of the attention module, besides the roles, whose size follows its heads: Linears
    ``hidden -> width`` left out of the roles (Longformer's global-attention projections, DeBERTa's
    position projections) as "rows", its own 1-D parameters of ``width`` entries (DeBERTa's query
    and value biases) as "vector", and convolutions with one group per head (Nystromformer's) as
    "channels". Paths are relative to the layer; removal keeps each head's part of them."""
    prefix = f"{attention_path}." if attention_path else ""
    out = {}
    for sub in unassigned:
        lin = linears[sub]
        if sub.startswith(prefix) and lin.in_features == hidden and lin.out_features == width:
            out[sub] = "rows"
    for name, param in attention.named_parameters(recurse=False):
        if param.ndim == 1 and param.numel() == width:
            out[prefix + name] = "vector"
    for name, module in attention.named_modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d)) and \
                module.groups == module.in_channels == module.out_channels == heads:
            out[prefix + name] = "channels"
    return out


def _head_attrs(attention: nn.Module, heads: int, width: int) -> dict[str, str]:
    """The attention module's integer attributes that hold its head count (named ``*head*``) or its
    width, heads x head size (named ``*head*``, ``all*``, ``inner*`` or ``embed_dim``): what removing
    heads must update. Whether that is all is checked by removing a head (``check_removable``)."""
    out = {}
    for name, value in vars(attention).items():
        if not isinstance(value, int) or isinstance(value, bool) or "hidden" in name:
            continue
        if value == heads and "head" in name:
            out[name] = "heads"
        elif value == width and re.search(r"head|^all|inner|^embed_dim$", name):
            out[name] = "width"
    return out


def _qkv_group(linears: dict, calls: dict, called: list[str], hidden: int, width: int) -> list[str] | None:
    """Three Linears ``hidden -> width`` that read one input: exactly three, else the first three
    called of a larger group (Longformer's global-attention projections read the same hidden
    states after them); None when there are none."""
    cands = [s for s in called if linears[s].in_features == hidden and linears[s].out_features == width]
    groups = _same_input(calls, cands)
    return next((g for g in groups if len(g) == 3), None) or next((g[:3] for g in groups if len(g) > 3), None)


def _gqa_group(linears: dict, calls: dict, called: list[str], hidden: int, width: int, kv_width: int
               ) -> list[str] | None:
    """Grouped-query attention: one Linear ``hidden -> width`` (the query) and two ``hidden ->
    kv_width`` (key and value) reading one input, in call order; None when there are none."""
    cands = [s for s in called
             if linears[s].in_features == hidden and linears[s].out_features in (width, kv_width)]
    for group in _same_input(calls, cands):
        wide = [s for s in group if linears[s].out_features == width]
        narrow = [s for s in group if linears[s].out_features == kv_width]
        if len(wide) == 1 and len(narrow) == 2:
            return sorted(wide + narrow, key=lambda s: calls[s]["order"])
    return None


def _attention_roles(model: nn.Module, linears: dict, calls: dict, hidden: int, width: int,
                     head_dim: int) -> dict:
    called = [s for s in linears if s in calls]
    fused = [s for s in called if linears[s].in_features == hidden and linears[s].out_features == 3 * width]
    if len(fused) == 1:
        qkv_order = calls[fused[0]]["order"]
        out = [s for s in called if linears[s].in_features == width and linears[s].out_features == hidden
               and calls[s]["order"] > qkv_order]
        if not out:
            raise ModelError(f"a fused QKV projection ({fused[0]}) but no attention output projection "
                             f"was found; {HINT}")
        # the output projection reads the heads' context, which follows the QKV output (DeBERTa's
        # position projection, as wide and called in between, reads the position embeddings)
        rows = slice(0, linears[fused[0]].out_features)
        fused_qkv = linears[fused[0]]
        context = [s for s in out
                   if not torch.equal(_shifted(model, fused_qkv, rows, (s, linears[s])), calls[s]["input"])]
        return {"qkv": fused[0], "attn_out": min(context or out, key=lambda s: calls[s]["order"])}
    group = _qkv_group(linears, calls, called, hidden, width)
    kv_heads = getattr(model.config, "num_key_value_heads", None)
    if group is None and isinstance(kv_heads, int) and 0 < kv_heads < width // head_dim:
        group = _gqa_group(linears, calls, called, hidden, width, kv_heads * head_dim)
    if group is None:  # an attention narrower than the config's heads (ConvBERT's head_ratio)
        narrower = sorted({linears[s].out_features for s in called if linears[s].in_features == hidden
                           and linears[s].out_features < width and linears[s].out_features % head_dim == 0},
                          reverse=True)
        group = next((g for w in narrower if (g := _qkv_group(linears, calls, called, hidden, w))), None)
    if group is None:
        raise ModelError(f"no query, key and value projections ({hidden} -> {width}, reading the same "
                         f"input) were found in the first layer; {HINT}")
    last = max(calls[s]["order"] for s in group)
    qkv_width = max(linears[s].out_features for s in group)
    # the output projection reads the heads' context (ConvBERT: followed by its convolution's output)
    outs = sorted((s for s in called if s not in group and linears[s].in_features >= qkv_width
                   and linears[s].in_features % head_dim == 0
                   and linears[s].out_features == hidden and calls[s]["order"] > last),
                  key=lambda s: calls[s]["order"])
    if not outs:
        raise ModelError(f"no attention output projection ({width} -> {hidden}) was found after the "
                         f"query/key/value projections; {HINT}")
    # the output projection reads the heads' context, which follows the query, key and value (a
    # projection as wide called in between, such as Longformer's global query, reads the layer input)
    attn_out = next((o for o in outs if any(
        not torch.equal(_shifted(model, linears[g], slice(None), (o, linears[o])), calls[o]["input"])
        for g in group)), outs[0])
    value = []
    for sub in group:
        zeroed = _run(model, linears, zero=sub)
        if bool((zeroed[attn_out]["input"] == 0).all()):
            value.append(sub)
    if len(value) != 1:  # a kernel that hides the zeros (e.g. an approximate attention): names decide
        value = [s for s in group if re.search(r"^v|value", s.rsplit(".", 1)[-1].lower())]
    if len(value) != 1:
        raise ModelError(f"the value projection among {', '.join(group)} could not be told apart "
                         f"(zeroing {len(value)} of them zeroed the attention output's input); {HINT}")
    rest = [s for s in group if s != value[0]]
    if linears[rest[0]].out_features != linears[rest[1]].out_features:  # grouped-query attention
        query, key = sorted(rest, key=lambda s: -linears[s].out_features)
    else:
        query, key = _by_hint(rest, (r"^q|query", r"^k|key"))
    return {"query": query, "key": key, "value": value[0], "attn_out": attn_out}


def _ffn_roles(linears: dict, calls: dict, hidden: int, ffn: int, taken: set) -> tuple[dict, bool]:
    free = [s for s in linears if s in calls and s not in taken]
    outs = [s for s in free if linears[s].out_features == hidden and linears[s].in_features in (ffn, 2 * ffn)]
    ins = [s for s in free if linears[s].in_features == hidden and linears[s].out_features in (ffn, 2 * ffn)]
    if len(outs) != 1 or not ins:
        raise ModelError(f"no FFN input and output projections ({hidden} -> {ffn} -> {hidden}) were "
                         f"found in the first layer; {HINT}")
    ffn_out = outs[0]
    if len(ins) == 1:
        glu = linears[ins[0]].out_features == 2 * linears[ffn_out].in_features
        return {"ffn_in": ins[0], "ffn_out": ffn_out}, glu
    pair = next((g for g in _same_input(calls, ins) if len(g) == 2), None)
    if pair is None:
        raise ModelError(f"FFN input projections {', '.join(ins)} do not read one input; {HINT}")
    gate, up = _by_hint(pair, (r"gate|^w1$", r"up|^w3$"))
    return {"ffn_gate": gate, "ffn_in": up, "ffn_out": ffn_out}, False
