"""Parameter counts: total, embeddings, encoder, head, non-zero; for PyTorch modules and ONNX files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

HEAD_PREFIXES = ("classifier", "pooler", "qa_outputs", "bert.pooler", "head", "fc_out", "out")


def _group(name: str, module_kinds: dict[str, type]) -> str:
    """'embeddings' for embedding tables (and the embedding LayerNorm), 'head' for the classifier
    and pooler, 'encoder' for the rest (transformer layers, or a student's LSTM/CNN body)."""
    owner = name.rsplit(".", 1)[0] if "." in name else ""
    if ".embeddings." in f".{name}" or issubclass(module_kinds.get(owner, object),
                                                  (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return "embeddings"
    parts = name.split(".")
    stripped = ".".join(parts[1:]) if parts[0] in ("bert", "model", "roberta") else name
    if stripped.startswith(HEAD_PREFIXES) or name.startswith(HEAD_PREFIXES):
        return "head"
    return "encoder"


def count_params(model: torch.nn.Module) -> dict[str, Any]:
    """Element counts of all parameters, split into embeddings / encoder / head, each with non-zeros.

    ``encoder_sparsity`` is the fraction of zeros among encoder parameters; ``encoder_matrix_sparsity``
    counts only the weight matrices (biases are often initialised to zero): what pruning zeroes.
    """
    kinds = {n: type(m) for n, m in model.named_modules()}
    out: dict[str, int] = {"total": 0, "nonzero": 0, "encoder_matrices": 0, "encoder_matrices_nonzero": 0}
    for g in ("embeddings", "encoder", "head"):
        out[g] = 0
        out[f"{g}_nonzero"] = 0
    for name, p in model.named_parameters():
        n = p.numel()
        nz = int(torch.count_nonzero(p.detach()))
        g = _group(name, kinds)
        out["total"] += n
        out["nonzero"] += nz
        out[g] += n
        out[f"{g}_nonzero"] += nz
        if g == "encoder" and p.dim() >= 2:
            out["encoder_matrices"] += n
            out["encoder_matrices_nonzero"] += nz
    res: dict[str, Any] = dict(out)
    res["sparsity"] = 1.0 - out["nonzero"] / out["total"] if out["total"] else 0.0
    res["encoder_sparsity"] = 1.0 - out["encoder_nonzero"] / out["encoder"] if out["encoder"] else 0.0
    em = out["encoder_matrices"]
    res["encoder_matrix_sparsity"] = 1.0 - out["encoder_matrices_nonzero"] / em if em else 0.0
    return res


def _onnx_paths(model) -> dict[str, str]:
    """Each initializer's module path (``bert.pooler.dense.weight``): its own name when the exporter
    kept it, else the name of the node that reads it (``/model/bert/encoder/layer.0/.../MatMul``:
    transposed Linear weights are stored as ``onnx::MatMul_N``). The export wrapper's ``model.``
    prefix is dropped."""
    readers: dict[str, str] = {}  # the first reader names a tensor several nodes read
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, node.name)
    paths = {}
    for init in model.graph.initializer:
        path = init.name
        if path.startswith("onnx::") or "/" in path or "." not in path:
            path = readers.get(init.name, init.name).strip("/").replace("/", ".")
        paths[init.name] = path[len("model."):] if path.startswith("model.") else path
    return paths


def onnx_initializer_stats(path: str | Path) -> dict[str, Any]:
    """Parameters of an ONNX file: its initializers (element counts, non-zeros, dtypes), grouped as
    ``count_params`` groups a PyTorch model (embeddings / encoder / head), each initializer by its
    module path (``_onnx_paths``); a tensor with no recognisable path counts as encoder.

    Quantized files hold int8 weights plus their scales and zero points; both are counted, and the
    int8 element count is given separately. ``float_matrix_sparsity`` is the zero fraction of the
    fp32 weight matrices (embeddings excluded): pruning zeros; in an int8 file it covers only the
    matrices left in fp32. In int8 weights a zero can also be a small weight rounded to zero, so
    ``int8_zero_fraction`` is reported apart.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    paths = _onnx_paths(model)
    out = dict.fromkeys(("total", "nonzero", "embeddings", "embeddings_nonzero", "encoder",
                         "encoder_nonzero", "head", "head_nonzero"), 0)
    int8 = int8_nz = fmat = fmat_nz = 0
    tensors = []
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        n = int(arr.size)
        nz = int(np.count_nonzero(arr))
        where = paths[init.name]
        group = "embeddings" if "embedding" in where.lower() else _group(where, {})
        out["total"] += n
        out["nonzero"] += nz
        out[group] += n
        out[f"{group}_nonzero"] += nz
        if arr.dtype in (np.int8, np.uint8):
            int8 += n
            int8_nz += nz
        elif ((arr.dtype.kind == "f" or arr.dtype.name == "bfloat16")  # ml_dtypes' bfloat16 is kind "V"
              and arr.ndim >= 2 and group != "embeddings"):
            fmat += n
            fmat_nz += nz
        if arr.ndim >= 2:
            tensors.append({"name": init.name, "module": where, "group": group, "shape": list(arr.shape),
                            "dtype": str(arr.dtype), "sparsity": 1.0 - nz / n if n else 0.0})
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    total, nonzero, enc = out["total"], out["nonzero"], out["encoder"]
    return {**out, "int8_elements": int8,
            "int8_zero_fraction": 1.0 - int8_nz / int8 if int8 else 0.0,
            "float_matrix_sparsity": 1.0 - fmat_nz / fmat if fmat else 0.0,
            "sparsity": 1.0 - nonzero / total if total else 0.0,
            "encoder_sparsity": 1.0 - out["encoder_nonzero"] / enc if enc else 0.0,
            "matrices": tensors, "op_counts": dict(sorted(ops.items()))}
