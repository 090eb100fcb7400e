"""ONNX export: declared inputs -> export -> mandatory parity check -> optional optimize / int8.

* Inputs are declared per model kind: BERT classifiers take ``input_ids, attention_mask,
  token_type_ids``; students and other modules with the ``forward(input_ids, attention_mask=None)``
  contract take the first two. Batch and sequence axes are dynamic.
* The export uses the TorchScript exporter (``dynamo=False``) on a model loaded with eager
  attention: that graph has the MatMul/Softmax/MatMul pattern onnxruntime's transformer optimizer
  fuses into ``Attention``. An sdpa export (and the dynamo exporter) does not fuse.
* Inputs of Hugging Face encoders are those ``forward`` accepts, with ``token_type_ids`` only where
  the model has a segment table of two or more rows (``declared_inputs``): RoBERTa, XLM-R,
  DistilBERT, DeBERTa-v3 and ModernBERT export ``input_ids, attention_mask``.
* ``--optimize`` picks onnxruntime's transformer-optimizer model type from the architecture's role
  table (``compress.architectures``, ``ort_model_type``): "bert" for the BERT family (RoBERTa,
  XLM-R, ELECTRA, DistilBERT, ALBERT; onnxruntime has no model type of their own), none for
  DeBERTa (disentangled attention) and ModernBERT (fused QKV, rotary, GLU), whose graph is kept as
  exported. The report's ``fusion`` line says what fused, or that nothing did and why.
* Parity: the ONNX model is run on several (batch, length) shapes with padding in the attention
  mask and compared with PyTorch; every mismatch is collected, then one ParityError names each
  output, its max difference and the shapes. fp32 tolerance 1e-4 (absolute, on logits); int8
  models get a looser stated tolerance (``INT8_ATOL``) plus the argmax agreement.
* ``--precision fp16|bf16`` writes a half-precision graph with float32 inputs and outputs (Cast
  nodes at the boundary): the exported graph is optimized first where a fusion applies (fused
  Attention is what the GPU's half-precision kernels run fastest), then converted
  (``convert_to_half``). Its parity check has its own tolerance (``FP16_ATOL``, ``BF16_ATOL``). A
  provider that cannot run the graph at all (onnxruntime's CPU provider has no bfloat16 kernels)
  is said in one line; the file is still written, checked by ``onnx.checker``.
"""

from __future__ import annotations

import inspect
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.config import check_choice
from compress.errors import ModelError, ParityError, UsageError

FP32_ATOL = 1e-4
# logits, absolute. Dynamic int8 rounds every activation tensor to 256 levels: the fine-tuned SST-2
# MiniLM differs by up to 0.42 on random-token inputs (dev accuracy 86.6% fp32 -> 85.8% int8), so the
# int8 check catches a broken graph, and the dev-set accuracy (--task) measures the quality cost.
INT8_ATOL = 1.0
# Lengths 1 and 3 reach what shorter inputs do differently (KimCNN's windows wider than the
# text, logreg's bigrams of one token), which a graph traced at length 16 must still compute.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((1, 8), (2, 16), (3, 37), (1, 1), (2, 3))
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
STUDENT_INPUTS = ("input_ids", "attention_mask")
QUANTIZE_CHOICES = ("int8",)
PRECISION_CHOICES = ("fp32", "fp16", "bf16")
# logits, absolute. Half precision rounds every activation: float16 keeps 11 significant bits,
# bfloat16 8, so bfloat16's tolerance is about 8x float16's. Both catch a broken graph (a wrong Cast,
# an overflow to inf, NaN); the dev-set argmax agreement (--task) measures the quality cost.
FP16_ATOL = 0.05
BF16_ATOL = 0.4
HALF_ATOL = {"fp16": FP16_ATOL, "bf16": BF16_ATOL}
# Kept in float32 (Cast nodes around them) in a bfloat16 graph, besides float16.py's default block
# list: onnxruntime's CUDA provider registers EmbedLayerNormalization for float and float16 only
# (contrib_ops/cuda/cuda_contrib_kernels.cc), while MatMul, Gemm, Attention, LayerNormalization,
# SkipLayerNormalization and the Gelu family have bfloat16 kernels there.
BF16_FLOAT32_OPS: tuple[str, ...] = ("EmbedLayerNormalization",)


# ----------------------------------------------------------------------------- loading


@dataclass
class LoadedModel:
    """A torch model with its declared input names and what is known about it."""

    model: torch.nn.Module
    input_names: tuple[str, ...]
    kind: str                      # "bert" | "student" | "module"
    path: str | None = None        # folder it came from
    meta: dict[str, Any] | None = None

    @property
    def vocab_size(self) -> int:
        if isinstance(getattr(self.model, "vocab_size", None), int):
            return int(self.model.vocab_size)
        cfg = getattr(self.model, "config", None)
        if cfg is not None and getattr(cfg, "vocab_size", None):
            return int(cfg.vocab_size)
        for m in self.model.modules():
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                return int(m.num_embeddings)
        return 1000


def is_onnx_file(spec: str) -> bool:
    return str(spec).lower().endswith(".onnx")


def _load_student_folder(folder: Path) -> LoadedModel | None:
    """A student saved by ``students.registry.save_student`` (``student.json``), else None."""
    from students.registry import STUDENT_FILE, load_student

    if not (folder / STUDENT_FILE).is_file() and not (folder / "student" / STUDENT_FILE).is_file():
        return None
    model, info = load_student(folder)
    where = folder / "student" if (folder / "student" / STUDENT_FILE).is_file() else folder
    return LoadedModel(model.eval(), STUDENT_INPUTS, "student", str(where), info)


def load_torch_model(spec: str, attn_implementation: str | None = "eager") -> LoadedModel:
    """A BERT-family classifier (model folder, run folder, 'minilm', structured-pruned) or a student.

    ``attn_implementation``: "eager" (the default: the graph the ONNX optimizer fuses), "sdpa", or
    None for transformers' own choice: SDPA where the architecture has it, eager otherwise
    (DeBERTa-v2/v3). The implementation that was loaded is ``model.config._attn_implementation``.

    Encoder-only folders (no classification head saved) get a randomly initialised 2-label head;
    the timing and FLOPs are those of a classifier, the outputs are not meaningful predictions.
    """
    if is_onnx_file(spec):
        raise UsageError(f"{spec} is an ONNX file; this step needs a PyTorch model folder")
    p = Path(spec).expanduser()
    if p.is_file():
        raise ModelError(f"{p} is a file, not a model; pass a model folder, a run folder, "
                         "'minilm' or an .onnx file")
    if p.is_dir():
        student = _load_student_folder(p)
        if student is not None:
            return student
    from transformers import AutoModelForSequenceClassification

    import compress.pruning.structured  # noqa: F401 - registers the structured-pruned BERT class
    from compress.models import load_pretrained, read_meta, resolve_model

    path = resolve_model(spec)
    meta = read_meta(path)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation}
    if "label_names" not in meta:
        kwargs["num_labels"] = 2
    model = load_pretrained(AutoModelForSequenceClassification, spec, path, "a sequence classifier", **kwargs)
    return LoadedModel(model.eval(), declared_inputs(model), "bert", path, meta)


def declared_inputs(model: torch.nn.Module) -> tuple[str, ...]:
    """The inputs a Hugging Face encoder is exported and measured with, in ``BERT_INPUTS`` order.

    ``forward`` must accept the name; ``token_type_ids`` also needs a segment table of at least two
    rows (``type_vocab_size``): RoBERTa and XLM-R (one row, every id 0) and DeBERTa-v3 (none) accept
    the argument but their tokenizers never produce it, and an id of 1 would index past the table.
    """
    params = inspect.signature(model.forward).parameters
    names = [n for n in BERT_INPUTS if n in params]
    types = getattr(getattr(model, "config", None), "type_vocab_size", None)
    if "token_type_ids" in names and types is not None and types < 2:
        names.remove("token_type_ids")
    return tuple(names)


def wrap_module(model: torch.nn.Module, input_names: tuple[str, ...] = STUDENT_INPUTS) -> LoadedModel:
    """Any module with the ``forward(input_ids, attention_mask=None) -> logits`` contract."""
    return LoadedModel(model.eval(), input_names, "module")


# ----------------------------------------------------------------------------- inputs


def as_loaded(model: torch.nn.Module) -> LoadedModel:
    """A ``LoadedModel`` of an in-memory module: a Hugging Face encoder with the inputs
    ``compress export`` declares for it, else the student contract (input_ids, attention_mask)."""
    if getattr(model, "config", None) is not None and hasattr(model, "base_model"):
        return LoadedModel(model, declared_inputs(model), "bert")
    return LoadedModel(model, STUDENT_INPUTS, "module")


def example_inputs(loaded: LoadedModel, batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids; rows after the first are right-padded so the mask matters."""
    g = torch.Generator().manual_seed(seed + 1000 * batch + length)
    low = min(100, loaded.vocab_size - 1)
    ids = torch.randint(low, loaded.vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        keep = max(1, length - (row * length) // (batch + 1))
        mask[row, keep:] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in loaded.input_names:
        tt = torch.zeros(batch, length, dtype=torch.long)
        tt[:, length // 2:] = 1
        out["token_type_ids"] = tt
    return {k: v for k, v in out.items() if k in loaded.input_names}


def torch_logits(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        out = loaded.model(**inputs)
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0]


class _Exportable(torch.nn.Module):
    """Positional inputs in the declared order -> one ``logits`` tensor."""

    def __init__(self, loaded: LoadedModel):
        super().__init__()
        self.model = loaded.model
        self._loaded = loaded

    def forward(self, *args):
        return torch_logits(self._loaded, dict(zip(self._loaded.input_names, args)))


# ----------------------------------------------------------------------------- export + parity


def export_onnx(loaded: LoadedModel, path: str | Path, opset: int = 17) -> Path:
    """Export with dynamic batch and sequence axes; output ``logits`` [batch, labels]."""
    path = Path(path)
    names = loaded.input_names
    sample = example_inputs(loaded, 2, 16)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic["logits"] = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(_Exportable(loaded).eval(), tuple(sample[n] for n in names), str(path),
                          input_names=list(names), output_names=["logits"], dynamic_axes=dynamic,
                          opset_version=opset, do_constant_folding=True, dynamo=False)
    return path


def check_parity(loaded: LoadedModel, onnx_path: str | Path, shapes=DEFAULT_SHAPES,
                 atol: float = FP32_ATOL, provider: str | None = "CPUExecutionProvider",
                 label: str = "fp32") -> dict[str, Any]:
    """Compare ONNX and PyTorch outputs on every (batch, length) shape; raise on any mismatch.

    Returns ``{"atol", "shapes", "max_abs_diff", "argmax_agreement"}``; raises ParityError naming
    each output, its max difference and the shapes where it exceeded ``atol``.
    """
    from compress.export.ort import OrtModel

    ort_model = OrtModel(onnx_path, provider=provider)
    worst: dict[str, float] = {}
    bad: dict[str, list[str]] = {}
    agree = total = 0
    for batch, length in shapes:
        inputs = example_inputs(loaded, batch, length)
        ref = {"logits": torch_logits(loaded, inputs).float().numpy()}
        got = ort_model.run(inputs)
        for name, want in ref.items():
            have = got.get(name)
            if have is None or have.shape != want.shape:
                shape = None if have is None else have.shape
                raise ParityError(f"ONNX output '{name}' has shape {shape}, PyTorch {want.shape} "
                                  f"at batch {batch} x length {length}")
            diff = float(np.max(np.abs(have.astype(np.float64) - want)))
            worst[name] = max(worst.get(name, 0.0), diff)
            if not diff <= atol:  # also catches NaN
                bad.setdefault(name, []).append(f"{batch}x{length}")
            agree += int(np.sum(have.argmax(-1) == want.argmax(-1)))
            total += want.shape[0]
    if bad:
        parts = [f"output '{n}' max |diff| {worst[n]:.3g} > {atol:g} at batch x length {', '.join(s)}"
                 for n, s in bad.items()]
        raise ParityError(f"{label} ONNX model {Path(onnx_path).name} does not match PyTorch: "
                          + "; ".join(parts))
    return {"label": label, "atol": atol, "shapes": [list(s) for s in shapes],
            "max_abs_diff": worst, "argmax_agreement": agree / total if total else 1.0}


def half_session_error(onnx_path: str | Path, provider: str) -> str | None:
    """None when ``provider`` can run the (half-precision) graph, else onnxruntime's reason in one line.

    onnxruntime refuses at session creation a node no kernel of the provider can run (its CPU
    provider has no bfloat16 MatMul; float16 nodes without a CPU kernel it runs in float32 through
    inserted Casts). Any other failure is raised as ModelError, as ``OrtModel`` does.
    """
    from compress.export.ort import OrtModel

    try:
        OrtModel(onnx_path, provider=provider)
    except ModelError as exc:
        text = str(exc)
        if "NOT_IMPLEMENTED" not in text and "Could not find an implementation" not in text:
            raise
        node = re.search(r"implementation for (\S+\(\d+\)) node", text)
        return (f"onnxruntime's {provider} has no kernel for {node.group(1) if node else 'a node'} "
                "in this precision")
    return None


def half_parity(loaded: LoadedModel, onnx_path: str | Path, precision: str, shapes=DEFAULT_SHAPES,
                atol: float | None = None, provider: str = "CPUExecutionProvider") -> dict[str, Any]:
    """``check_parity`` of a half-precision graph with its own tolerance, or, where ``provider``
    cannot run the graph, ``{"label", "skipped": why}`` (the file itself is valid ONNX)."""
    atol = HALF_ATOL[precision] if atol is None else atol
    why = half_session_error(onnx_path, provider)
    if why is not None:
        return {"label": precision, "atol": atol, "provider": provider,
                "skipped": f"{why}; the {precision} parity check needs a provider that runs {precision} "
                           "(--provider cuda on a GPU)"}
    out = check_parity(loaded, onnx_path, shapes, atol, provider, precision)
    if provider == "CPUExecutionProvider" and precision == "fp16":
        out["note"] = ("onnxruntime's CPU provider runs float16 nodes it has no float16 kernel for in "
                       "float32 (it inserts Casts), so this checks the graph and its rounded weights, "
                       "not GPU float16 arithmetic")
    out["provider"] = provider
    return out


# ----------------------------------------------------------------------------- optimize + quantize


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


def optimizer_model_type(loaded: LoadedModel) -> tuple[str | None, str]:
    """(onnxruntime optimizer model type or None, the reason) for ``loaded``, from its role table.

    None means no fusion applies: a student or module (no attention layers), an architecture without
    a role table, or one whose table says ``ort_model_type=None`` (DeBERTa, ModernBERT). A type the
    installed onnxruntime does not know is a ModelError naming the ones it does.
    """
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    from compress.architectures import find_layout

    if loaded.kind != "bert":
        return None, f"a {loaded.kind} has no transformer attention layers to fuse"
    layout = find_layout(loaded.model)
    model_type = getattr(getattr(loaded.model, "config", None), "model_type", type(loaded.model).__name__)
    if layout is None:
        return None, f"architecture '{model_type}' has no role table (compress.architectures)"
    if layout.ort_model_type is None:
        return None, f"{model_type}: {layout.notes or 'no onnxruntime fusion applies'}"
    if layout.ort_model_type not in MODEL_TYPES:
        raise ModelError(f"the {layout.name} role table names onnxruntime model type "
                         f"'{layout.ort_model_type}', which this onnxruntime lacks; it knows: "
                         f"{', '.join(sorted(MODEL_TYPES))}")
    return layout.ort_model_type, f"{model_type} uses onnxruntime's '{layout.ort_model_type}' fusions"


def attention_executions(loaded: LoadedModel) -> int | None:
    """How many attention blocks one forward pass runs (ALBERT runs its shared layer that often;
    a structured-pruned layer left with no head has none)."""
    from compress.architectures import find_layout

    cfg = getattr(loaded.model, "config", None)
    heads = getattr(cfg, "layer_heads", None)
    layout = find_layout(loaded.model)
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


def convert_to_half(src: str | Path, dst: str | Path, precision: str = "fp16") -> dict[str, Any]:
    """Write ``src`` (float32 ONNX) as a float16 or bfloat16 graph with float32 inputs and outputs.

    float16: onnxruntime's converter (``OnnxModel.convert_float_to_float16(keep_io_types=True)``):
    weights and activations in float16, Cast nodes after the graph's float inputs and before its
    float outputs (here the one ``logits`` output; token ids stay int64), ops of its default block
    list kept in float32. It knows the fused contrib ops (Attention, BiasGelu,
    SkipLayerNormalization) through symbolic shape inference, so it runs after the optimizer.
    bfloat16: neither onnx nor onnxruntime ship a converter; the float16 conversion is made with
    ``BF16_FLOAT32_OPS`` also blocked, then every float16 type (initializers, value infos, Cast
    targets, Constant values) is retyped to bfloat16, initializers and constants re-rounded from
    the float32 originals rather than from their float16 copies. Standard ops whose ONNX schema at
    the model's opset has no bfloat16 (Conv, LSTM, ConstantOfShape before opset 20: the students'
    graphs) are blocked too (``ops_without_bfloat16``). Returns ``{"precision",
    "float32_ops": [op types kept in float32], "half_initializers": n, "float32_initializers": n}``.
    """
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.onnx_model import OnnxModel

    check_choice("precision", precision, PRECISION_CHOICES[1:])
    model = onnx.load(str(src))
    originals = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
                 if i.data_type == TensorProto.FLOAT}
    constants = {n.name: numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value" and a.t.data_type == TensorProto.FLOAT}
    blocked = list(DEFAULT_OP_BLOCK_LIST)
    if precision == "bf16":
        blocked += [*BF16_FLOAT32_OPS, *sorted(ops_without_bfloat16(model))]
    opt = OnnxModel(model)
    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "initializer is used by both fp32 and fp16 nodes" per shared weight
    try:
        opt.convert_float_to_float16(keep_io_types=True, op_block_list=blocked)
    finally:
        quiet.setLevel(level)
    opt.topological_sort()  # the converter appends the Casts around blocked ops at the end
    model = opt.model
    if precision == "bf16":
        _retype_float16_as_bfloat16(model.graph, originals, constants)
    onnx.save(model, str(dst))
    half = TensorProto.BFLOAT16 if precision == "bf16" else TensorProto.FLOAT16
    present = {n.op_type for n in model.graph.node}
    return {"precision": precision, "float32_ops": sorted(present & set(blocked)),
            "half_initializers": sum(i.data_type == half for i in model.graph.initializer),
            "float32_initializers": sum(i.data_type == TensorProto.FLOAT for i in model.graph.initializer)}


def ops_without_bfloat16(model) -> set[str]:
    """Op types of ``model``'s default-domain nodes whose schema, at the model's opset, accepts
    float32 but not bfloat16 in some type constraint (a bfloat16 node of that type is invalid ONNX).
    Contrib ops (com.microsoft) are not in onnx's schemas and are left to ``BF16_FLOAT32_OPS``."""
    import onnx

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    out = set()
    for op in {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}:
        try:
            schema = onnx.defs.get_schema(op, opset, "")
        except onnx.defs.SchemaError:
            continue
        floats = [set(c.allowed_type_strs) for c in schema.type_constraints
                  if "tensor(float)" in c.allowed_type_strs]
        if any("tensor(bfloat16)" not in allowed for allowed in floats):
            out.add(op)
    return out


def _retype_float16_as_bfloat16(graph, originals: dict[str, np.ndarray], constants: dict[str, np.ndarray]
                                ) -> None:
    """Every float16 type in ``graph`` (and its subgraphs) becomes bfloat16, in place; tensors are
    rounded from their float32 originals (by initializer or Constant node name) where known."""
    import ml_dtypes
    from onnx import AttributeProto, TensorProto, numpy_helper

    f16, bf16 = TensorProto.FLOAT16, TensorProto.BFLOAT16

    def as_bf16(tensor, original: np.ndarray | None):
        values = numpy_helper.to_array(tensor) if original is None else original
        return numpy_helper.from_array(np.asarray(values, np.float32).astype(ml_dtypes.bfloat16), tensor.name)

    for init in graph.initializer:
        if init.data_type == f16:
            init.CopyFrom(as_bf16(init, originals.get(init.name)))
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.type.tensor_type.elem_type == f16:
            vi.type.tensor_type.elem_type = bf16
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == f16:
                attr.i = bf16
            elif attr.type == AttributeProto.TENSOR and attr.t.data_type == f16:
                original = constants.get(node.name) if node.op_type == "Constant" else None
                attr.t.CopyFrom(as_bf16(attr.t, original))
            elif attr.type == AttributeProto.GRAPH:
                _retype_float16_as_bfloat16(attr.g, originals, constants)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _retype_float16_as_bfloat16(sub, originals, constants)


def quantize_int8(src: str | Path, dst: str | Path, per_channel: bool = False) -> Path:
    """Dynamic int8: int8 weights, activations quantized per batch at run time (MatMulInteger).

    ``per_channel`` gives every output column of a weight matrix its own scale instead of one per
    matrix. It cost no time here (40%-structured MiniLM, batch 32 x 128: 277 ms either way) and
    moved SST-2 dev accuracy by -0.46 points (dense MiniLM) and +0.69 (40% structured), both within
    the noise of 872 sentences; per-tensor stays the default."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Fused contrib ops (Attention, SkipLayerNormalization) have no shape-inference types; their
    # outputs are float32, which is what DefaultTensorType says.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs a "consider pre-processing" hint on every call
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)
    return Path(dst)


# ----------------------------------------------------------------------------- workflow


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """'1x8,2x16' -> ((1, 8), (2, 16)); errors name the bad item."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        try:
            b, n = (int(x) for x in parts)
        except ValueError:
            raise UsageError(f"--shapes item '{item}' is not BATCHxLENGTH (e.g. 2x16)") from None
        if b < 1 or n < 1:
            raise UsageError(f"--shapes item '{item}' must have batch and length >= 1")
        out.append((b, n))
    return tuple(out)


def onnx_checker(path: str | Path) -> None:
    """``onnx.checker`` on the file (full check, with shape inference); ModelError on failure."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelError(f"{Path(path).name} is not valid ONNX: {(str(exc).splitlines() or [''])[0][:200]}"
                         ) from None
