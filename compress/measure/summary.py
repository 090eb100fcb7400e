"""What ``compress measure`` reports about one model: parameters, FLOPs per example (dense and
sparsity-aware), the sparsity table, the "will it be faster?" verdict and disk size; for a folder,
an .onnx file, or a module in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.core.errors import ModelError


def measure_spec(spec: str, seq_len: int, runtime: str = "onnxruntime CPU") -> dict[str, Any]:
    """Measure what ``compress measure`` takes: a model, run or student folder, 'minilm', or an
    .onnx file (parameters, sparsity and size only: FLOPs are counted on the PyTorch model)."""
    from compress.export.loading import is_onnx_file, load_torch_model
    from compress.measure.verdict import disk_sizes

    if is_onnx_file(spec):
        return measure_onnx(Path(spec), runtime)
    # transformers' default attention: SDPA where the architecture has it, eager where it does not
    # (DeBERTa); both count the same MACs (compress.measure.flops), the report names the one that ran
    loaded = load_torch_model(spec, attn_implementation=None)
    result: dict[str, Any] = {"model": spec, **measure_loaded(loaded, seq_len, runtime)}
    where = weights_location(loaded.path)
    result["disk"] = disk_sizes(where) if where is not None else None
    return result


def measure_module(model, seq_len: int) -> dict[str, Any]:
    """Measure a module in memory (a Hugging Face encoder or classifier, or any module with the
    ``forward(input_ids, attention_mask=None)`` contract)."""
    from compress.export.loading import as_loaded

    return {"model": type(model).__name__, **measure_loaded(as_loaded(model), seq_len)}


def weights_location(loaded_path: str | None) -> Path | None:
    """The folder whose files hold the weights (a student run's ``student/``), for disk sizes."""
    if loaded_path:
        p = Path(loaded_path)
        if (p / "student" / "model.safetensors").is_file():
            return p / "student"
        return p
    return None


def measure_onnx(path: Path, runtime: str = "onnxruntime CPU") -> dict[str, Any]:
    """Parameters and sparsity of an ONNX file's initializers, its int8-ness and size."""
    from compress.measure.params import onnx_initializer_stats
    from compress.measure.verdict import disk_sizes, is_structured_source, read_export_report, speed_verdict

    if not path.is_file():
        raise ModelError(f"ONNX file not found: {path}")
    try:
        stats = onnx_initializer_stats(path)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and friends
        raise ModelError(f"{path} is not a readable ONNX model ({type(exc).__name__}); "
                         "pass a file written by 'compress export'") from None
    ops = stats["op_counts"]
    int8 = any(op in ops for op in ("MatMulInteger", "QAttention", "DynamicQuantizeLinear", "QLinearMatMul"))
    export = read_export_report(path) or {}
    source = export.get("config", {}).get("model") if isinstance(export.get("config"), dict) else None
    fused = {op: ops[op] for op in ("Attention", "QAttention", "SkipLayerNormalization",
                                    "EmbedLayerNormalization", "BiasGelu", "FastGelu") if op in ops}
    return {
        "model": str(path), "kind": "onnx", "params": {k: v for k, v in stats.items() if k != "matrices"},
        "matrices": stats["matrices"], "fused_ops": fused,
        "flops": None, "flops_note": "FLOPs are counted on the PyTorch model; measure the model folder",
        "verdict": speed_verdict(unstructured_sparsity=stats["float_matrix_sparsity"], int8=int8,
                                 structured=is_structured_source(source),
                                 distilled=export.get("kind") == "student", runtime=runtime),
        "disk": disk_sizes(path),
    }


def measure_loaded(loaded, seq_len: int, runtime: str = "onnxruntime CPU") -> dict[str, Any]:
    """Parameters, FLOPs per example at ``seq_len``, sparsity and the speed verdict of a model in
    memory (a ``compress.export.loading.LoadedModel``): ``compress measure`` after loading, and
    ``compress.measure_model`` of a module. The example inputs go to the model's device, and the
    model's train/eval mode is left as it was."""
    import torch

    from compress.export.inputs import example_inputs
    from compress.measure.flops import count_flops
    from compress.measure.params import count_params
    from compress.measure.verdict import speed_verdict
    from compress.models.modeling_pruned import is_structured_config
    from compress.pruning.integrity import check_finite_parameters

    model = loaded.model
    # a NaN weight would be counted as a kept weight and its model judged by size and speed alone
    check_finite_parameters(model, loaded.path or None, "measure a model with finite weights")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    try:
        inputs = {k: v.to(device) for k, v in example_inputs(loaded, 1, seq_len).items()}
        params = count_params(model)
        flops = count_flops(model, inputs)
    finally:
        model.train(was_training)
    result: dict[str, Any] = {"kind": loaded.kind, "architecture": loaded.architecture,
                              "seq_len": seq_len, "params": params, "flops": flops}
    structured, pattern = False, None
    config = getattr(model, "config", None)
    if loaded.kind == "bert":
        from compress.measure.sparsity import format_sparsity_table, sparsity_report

        try:
            report = sparsity_report(model)
        except RuntimeError as exc:  # per-head slicing assumes the uniform head count
            result["sparsity_note"] = f"per-head sparsity table unavailable: {str(exc)[:120]}"
        else:
            result["sparsity"] = report
            result["sparsity_table"] = format_sparsity_table(report)
            pattern = report.get("pattern")
        if is_structured_config(config):
            structured = True
            result["structure"] = {"layer_heads": config.layer_heads,
                                   "layer_ffn": config.layer_intermediate}
    result["verdict"] = speed_verdict(unstructured_sparsity=params["encoder_matrix_sparsity"],
                                      structured=structured, distilled=loaded.kind == "student",
                                      runtime=runtime, pattern=pattern["pattern"] if pattern else None)
    if pattern:
        from compress.measure.verdict import local_cuda_capability, semi_structured_verdict

        capability, device = local_cuda_capability()
        result["verdict"]["semi_structured"] = semi_structured_verdict(
            pattern["pattern"], pattern["encoder"], capability, device)
    return result

