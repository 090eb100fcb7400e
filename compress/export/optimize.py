"""onnxruntime's transformer optimizer on an exported graph: which fusions apply, the graph surgery
that lets them match, and the report's one ``fusion`` line.

``--optimize`` picks onnxruntime's transformer-optimizer model type from the architecture's role
table (``compress.models.architectures``, ``ort_model_type``): "bert" for the BERT family (RoBERTa, XLM-R,
ELECTRA, DistilBERT, ALBERT; onnxruntime has no model type of their own), none for DeBERTa
(disentangled attention) and ModernBERT (fused QKV, rotary, GLU), whose graph is kept as exported.
An encoder whose roles were found by discovery gets the "bert" fusions on trial
(``fusion_on_trial``): its fused graph is kept only where its parity check passes, else the graph
as exported. The report's ``fusion`` line says what fused, or that nothing did and why.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np

from compress.core.errors import ModelError
from compress.export.loading import LoadedModel


def attention_shape(loaded: LoadedModel) -> tuple[int, int]:
    """(num_heads, hidden_size) to give the optimizer; (0, 0) lets it read them from the graph."""
    cfg = getattr(loaded.model, "config", None)
    if cfg is None:
        return 0, 0
    heads = getattr(cfg, "layer_heads", None)
    if heads and len(set(heads)) > 1:
        return 0, 0  # per-layer head counts differ: the fusion reads each layer's from its Reshape
    if heads:
        head_size = cfg.hidden_size // cfg.num_attention_heads
        return int(heads[0]), int(heads[0]) * head_size
    return int(cfg.num_attention_heads), int(cfg.hidden_size)


def pin_attention_heads(path: str | Path) -> int:
    """Write each layer's head count into its Q/K/V Reshape, in place; returns how many were pinned.

    BERT reshapes projections to ``[batch, length, -1, head_size]``. With uniform heads the optimizer
    is told the count, but a structured-pruned model has a different count per layer and the
    fusion gives up on ``-1``. The count is the projection's width (its MatMul weight's columns)
    divided by the head size, so it is written as a constant in that Reshape's shape.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    inits = {i.name: i for i in graph.initializer}

    def const(name: str):
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = producer.get(name)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def weight_columns(name: str) -> int | None:
        node = producer.get(name)
        if node is not None and node.op_type == "Add":
            for inp in node.input:
                mm = producer.get(inp)
                if mm is not None and mm.op_type == "MatMul" and mm.input[1] in inits:
                    return int(inits[mm.input[1]].dims[-1])
        return None

    pinned = 0
    for node in graph.node:
        if node.op_type != "Reshape":
            continue
        concat = producer.get(node.input[1])
        if concat is None or concat.op_type != "Concat" or len(concat.input) != 4:
            continue
        heads_c, size_c = const(concat.input[2]), const(concat.input[3])
        if heads_c is None or size_c is None or heads_c.size != 1 or int(heads_c.ravel()[0]) != -1:
            continue
        width = weight_columns(node.input[0])
        head_size = int(size_c.ravel()[0])
        if width is None or head_size <= 0 or width % head_size:
            continue
        name = f"{node.name or node.output[0]}_num_heads"
        graph.initializer.append(numpy_helper.from_array(
            np.array([width // head_size], dtype=heads_c.dtype), name))
        concat.input[2] = name
        pinned += 1
    if pinned:
        onnx.save(model, str(path))
    return pinned


def order_residual_adds(path: str | Path) -> int:
    """Put the attention output first in each residual ``Add`` before a LayerNormalization, in place;
    returns how many were swapped (the sum is the same either way).

    onnxruntime's attention fusion walks up from that Add to the first parent that is an Add and
    expects the attention output projection (Add <- MatMul <- Reshape <- Transpose <- MatMul). ALBERT
    adds ``residual + attention`` in that order, and in its first layer the residual is itself an
    Add (the embedding projection's bias), so the walk takes the wrong branch and that layer stays
    unfused. BERT-style layers add ``attention + residual`` and are left as they are.
    """
    import onnx

    model = onnx.load(str(path))
    producer = {out: node for node in model.graph.node for out in node.output}

    def chain(name: str, ops: tuple[str, ...]) -> bool:
        """``name`` comes from ops[0], whose first input (any input for Add) comes from ops[1]..."""
        node = producer.get(name)
        if node is None or node.op_type != ops[0]:
            return False
        if len(ops) == 1:
            return True
        inputs = node.input if node.op_type == "Add" else node.input[:1]
        return any(chain(i, ops[1:]) for i in inputs)

    attention_out = ("Add", "MatMul", "Reshape", "Transpose", "MatMul")
    swapped = 0
    for node in model.graph.node:
        if node.op_type != "LayerNormalization":
            continue
        add = producer.get(node.input[0])
        if add is None or add.op_type != "Add" or len(add.input) != 2:
            continue
        first, second = add.input
        if chain(second, attention_out) and not chain(first, attention_out):
            add.input[0], add.input[1] = second, first
            swapped += 1
    if swapped:
        onnx.save(model, str(path))
    return swapped


def optimize_onnx(src: str | Path, dst: str | Path, num_heads: int = 0, hidden_size: int = 0,
                  model_type: str = "bert", skip_layer_norm: bool = False) -> dict[str, int]:
    """onnxruntime's transformer optimizer; returns its fused-operator counts (Attention, ...).

    The graph is prepared on a copy first: per-layer head counts pinned when ``num_heads`` is 0
    (``pin_attention_heads``), residual Adds ordered for the matcher (``order_residual_adds``).
    The residual Add + LayerNormalization pairs stay unfused unless ``skip_layer_norm``: the CPU
    provider's SkipLayerNormalization kernel is about 3x slower than the pair (measured, see
    ``compress.export.ort.CPU_DISABLED_OPTIMIZERS``). The CUDA provider fuses them itself when the
    session starts.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    # Per-layer fusion warnings ("Input hidden size (288) is not same as ...") describe pruned
    # layers that are handled from the pinned Reshape shapes; only errors are let through.
    quiet = [logging.getLogger(n) for n in ("fusion_attention", "onnxruntime.transformers")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    work = Path(dst).with_suffix(".prepared.onnx")
    shutil.copyfile(src, work)
    if num_heads == 0:
        pin_attention_heads(work)
    order_residual_adds(work)
    try:
        options = FusionOptions(model_type)
        options.enable_skip_layer_norm = skip_layer_norm
        opt = optimize_model(str(work), model_type=model_type, num_heads=num_heads,
                             hidden_size=hidden_size, opt_level=0, use_gpu=False,
                             optimization_options=options)
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
        work.unlink()
    opt.save_model_to_file(str(dst))
    stats = opt.get_fused_operator_statistics()
    return {k: int(v) for k, v in stats.items() if v}


def hf_encoder(loaded: LoadedModel):
    """The Hugging Face model whose role table applies: a sentence-embedding model's encoder (its
    pooling adds no attention), else the model itself."""
    return loaded.model.encoder if loaded.kind == "embedding" else loaded.model


def optimizer_model_type(loaded: LoadedModel) -> tuple[str | None, str]:
    """(onnxruntime optimizer model type or None, the reason) for ``loaded``, from its role table.

    None means no fusion applies: a student or module (no attention layers), an architecture without
    a role table, or one whose table says ``ort_model_type=None`` (DeBERTa, ModernBERT). A type the
    installed onnxruntime does not know is a ModelError naming the ones it does.
    """
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    from compress.models.architectures import find_layout

    if loaded.kind not in ("bert", "embedding"):
        return None, f"a {loaded.kind} has no transformer attention layers to fuse"
    encoder = hf_encoder(loaded)
    layout = find_layout(encoder)
    model_type = getattr(getattr(encoder, "config", None), "model_type", type(encoder).__name__)
    if layout is None:
        return None, f"architecture '{model_type}' has no role table (compress.models.architectures)"
    if layout.discovered:
        return "bert", (f"{model_type}: roles found by discovery; onnxruntime's 'bert' fusions are tried "
                        "and kept where the fused graph's parity holds")
    if layout.ort_model_type is None:
        return None, f"{model_type}: {layout.notes or 'no onnxruntime fusion applies'}"
    if layout.ort_model_type not in MODEL_TYPES:
        raise ModelError(f"the {layout.name} role table names onnxruntime model type "
                         f"'{layout.ort_model_type}', which this onnxruntime lacks; it knows: "
                         f"{', '.join(sorted(MODEL_TYPES))}")
    return layout.ort_model_type, f"{model_type} uses onnxruntime's '{layout.ort_model_type}' fusions"


def fusion_on_trial(loaded: LoadedModel) -> bool:
    """Whether ``optimizer_model_type``'s fusions are a trial for ``loaded`` (roles found by
    discovery, not a role table): the caller keeps the fused graph only where its parity holds."""
    from compress.models.architectures import find_layout

    if loaded.kind not in ("bert", "embedding"):
        return False
    layout = find_layout(hf_encoder(loaded))
    return bool(layout is not None and layout.discovered)


def attention_executions(loaded: LoadedModel) -> int | None:
    """How many attention blocks one forward pass runs (ALBERT runs its shared layer that often;
    a structured-pruned layer left with no head has none)."""
    from compress.models.architectures import find_layout

    cfg = getattr(loaded.model, "config", None)
    heads = getattr(cfg, "layer_heads", None)
    layout = find_layout(hf_encoder(loaded))
    if heads and not (layout and layout.shared_layers):  # ALBERT's list is per shared layer
        return sum(1 for h in heads if h > 0)
    layers = getattr(cfg, "num_hidden_layers", None)
    return int(layers) if layers else None


def fusion_summary(model_type: str | None, why: str, fused: dict[str, int] | None,
                   expected_attention: int | None = None) -> str:
    """The report's one ``fusion`` line: what the optimizer fused, or that no fusion applies and why."""
    if model_type is None:
        return (f"none applies ({why}); the exported graph is kept unoptimized "
                "(onnxruntime still applies its own session-level graph optimizations)")
    attention = (fused or {}).get("Attention", 0)
    if attention == 0:
        return (f"the optimizer (model type '{model_type}') fused no Attention node"
                + (f"; it fused only {', '.join(f'{k} {v}' for k, v in fused.items())}" if fused else "")
                + "; the optimized graph computes attention unfused")
    of = f" of {expected_attention}" if expected_attention else ""
    rest = ", ".join(f"{k} {v}" for k, v in fused.items() if k != "Attention")
    return (f"model type '{model_type}': Attention fused in {attention}{of} attention blocks"
            + (f"; also {rest}" if rest else ""))

