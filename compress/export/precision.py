"""The precisions an export is written in (``PRECISIONS``: fp32, fp16, bf16, int8) and the
half-precision conversion with its parity check.

``--precision fp16|bf16`` writes a half-precision graph with float32 inputs and outputs (Cast nodes
at the boundary): the exported graph is optimized first where a fusion applies (fused Attention is
what the GPU's half-precision kernels run fastest), then converted (``convert_to_half``). Its parity
check has its own tolerance (``FP16_ATOL``, ``BF16_ATOL``). A provider that cannot run the graph at
all (onnxruntime's CPU provider has no bfloat16 kernels) is said in one line; the file is still
written, checked by ``onnx.checker``. ``--quantize int8`` is in ``compress.export.quantize``.

Adding a precision is one ``PRECISIONS`` entry (its conversion, tolerance, parity check, bench row
name) plus its test; the export options' choices, the export recipe and ``compress bench`` read
the table.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from compress.core.config import check_choice
from compress.core.errors import ModelError
from compress.export.inputs import DEFAULT_SHAPES
from compress.export.loading import LoadedModel
from compress.export.onnx import FP32_ATOL, check_parity, onnx_checker
from compress.export.quantize import INT8_ATOL, quantize_int8

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

    check_choice("precision", precision, tuple(HALF_ATOL))
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


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Precision:
    """One number format an ONNX export is written in, and what export, bench and measure need to
    know about it.

    ``convert(src, dst, per_channel=True) -> summary`` writes ``dst`` from the float32 graph
    ``src`` (``per_channel`` is int8's option, ignored by the others); fp32's is a
    copy, since the export itself is float32. ``check(loaded, path, shapes, atol, provider)`` is
    its parity check against PyTorch fp32, ``atol`` its default tolerance (logits, absolute).
    """

    name: str
    option: str                       # the export option that selects it: "precision" or "quantize"
    convert: Callable[..., dict[str, Any]]
    atol: float
    check: Callable[..., dict[str, Any]]
    runtime: str                      # compress bench's row name for an ONNX file in this precision
    cpu_runs: bool                    # onnxruntime's CPU provider can run the graph
    fuse_first: bool = False          # optimized before the conversion, even without --optimize
    summary_key: str | None = None    # the export report's key for the conversion's summary
    weight_type: str | None = None    # onnx TensorProto type of the weight matrices that mark a file
    tolerance_note: str | None = None  # the export report's ``<name>_tolerance_note``, "{atol:g}" filled


def _copy_fp32(src: str | Path, dst: str | Path, per_channel: bool = True) -> dict[str, Any]:
    shutil.copyfile(src, dst)
    return {}


def _convert_half(src: str | Path, dst: str | Path, per_channel: bool = True, *, precision: str
                  ) -> dict[str, Any]:
    return convert_to_half(src, dst, precision)


def _quantize_int8(src: str | Path, dst: str | Path, per_channel: bool = True) -> dict[str, Any]:
    quantize_int8(src, dst, per_channel=per_channel)
    return {}


def _check_half(loaded: LoadedModel, path: str | Path, shapes, atol: float, provider: str, *,
                precision: str) -> dict[str, Any]:
    onnx_checker(path)
    return half_parity(loaded, path, precision, shapes, atol, provider)


def _half(name: str, weight_type: str, cpu_runs: bool) -> Precision:
    return Precision(name, "precision", partial(_convert_half, precision=name), HALF_ATOL[name],
                     partial(_check_half, precision=name), f"ort-{name}", cpu_runs, fuse_first=True,
                     summary_key="half", weight_type=weight_type)


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", "precision", _copy_fp32, FP32_ATOL, partial(check_parity, label="fp32"),
                      "ort", cpu_runs=True),
    "fp16": _half("fp16", "FLOAT16", cpu_runs=True),
    "bf16": _half("bf16", "BFLOAT16", cpu_runs=False),  # onnxruntime's CPU provider: no bfloat16 MatMul
    "int8": Precision("int8", "quantize", _quantize_int8, INT8_ATOL, partial(check_parity, label="int8"),
                      "ort", cpu_runs=True,  # int8 files' bench rows stay "ort"
                      tolerance_note="int8 parity uses an absolute tolerance of {atol:g} on logits "
                                     "(dynamic quantization rounds activations)"),
}
PRECISION_CHOICES = tuple(n for n, p in PRECISIONS.items() if p.option == "precision")
QUANTIZE_CHOICES = tuple(n for n, p in PRECISIONS.items() if p.option == "quantize")
