"""``compress measure``: parameters, FLOPs, sparsity, "will it be faster?" and disk size of one model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.config import check_range
from compress.errors import ModelError


@dataclass(frozen=True)
class MeasureConfig:
    model: str = "minilm"
    seq_len: int = 128
    json: bool = False
    runtime: str = "onnxruntime CPU"

    def __post_init__(self):
        check_range("seq_len", self.seq_len, 1, 4096)


def _weights_location(spec: str, loaded_path: str | None) -> Path | None:
    if loaded_path:
        p = Path(loaded_path)
        if (p / "student" / "model.safetensors").is_file():
            return p / "student"
        return p
    return None


def measure_onnx(path: Path, cfg: MeasureConfig) -> dict[str, Any]:
    """Parameters and sparsity of an ONNX file's initializers, its int8-ness and size."""
    from compress.measure.params import onnx_initializer_stats
    from compress.measure.report import disk_sizes, is_structured_source, read_export_report, speed_verdict

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
                                 distilled=export.get("kind") == "student", runtime=cfg.runtime),
        "disk": disk_sizes(path),
    }


def run_measure(cfg: MeasureConfig) -> dict[str, Any]:
    """Measure ``cfg.model`` (model folder, run folder, student folder, 'minilm' or .onnx file)."""
    from compress.export.onnx import is_onnx_file, load_torch_model
    from compress.measure.report import disk_sizes

    if is_onnx_file(cfg.model):
        return measure_onnx(Path(cfg.model), cfg)
    # transformers' default attention: SDPA where the architecture has it, eager where it does not
    # (DeBERTa); both count the same MACs (compress.measure.flops), the report names the one that ran
    loaded = load_torch_model(cfg.model, attn_implementation=None)
    result: dict[str, Any] = {"model": cfg.model, **measure_loaded(loaded, cfg.seq_len, cfg.runtime)}
    where = _weights_location(cfg.model, loaded.path)
    result["disk"] = disk_sizes(where) if where is not None else None
    return result


def measure_loaded(loaded, seq_len: int, runtime: str = "onnxruntime CPU") -> dict[str, Any]:
    """Parameters, FLOPs per example at ``seq_len``, sparsity and the speed verdict of a model in
    memory (a ``compress.export.onnx.LoadedModel``): ``compress measure`` after loading, and
    ``compress.measure_model`` of a module. The example inputs go to the model's device, and the
    model's train/eval mode is left as it was."""
    import torch

    from compress.export.onnx import example_inputs
    from compress.measure.flops import count_flops
    from compress.measure.params import count_params
    from compress.measure.report import speed_verdict

    model = loaded.model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    try:
        inputs = {k: v.to(device) for k, v in example_inputs(loaded, 1, seq_len).items()}
        params = count_params(model)
        flops = count_flops(model, inputs)
    finally:
        model.train(was_training)
    result: dict[str, Any] = {"kind": loaded.kind, "seq_len": seq_len, "params": params, "flops": flops}
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
        if getattr(config, "layer_heads", None) is not None:
            structured = True
            result["structure"] = {"layer_heads": config.layer_heads,
                                   "layer_ffn": config.layer_intermediate}
    result["verdict"] = speed_verdict(unstructured_sparsity=params["encoder_matrix_sparsity"],
                                      structured=structured, distilled=loaded.kind == "student",
                                      runtime=runtime, pattern=pattern["pattern"] if pattern else None)
    if pattern:
        from compress.measure.report import local_cuda_capability, semi_structured_verdict

        capability, device = local_cuda_capability()
        result["verdict"]["semi_structured"] = semi_structured_verdict(
            pattern["pattern"], pattern["encoder"], capability, device)
    return result


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def format_measure(r: dict[str, Any]) -> str:
    """The human-readable report printed by ``compress measure``."""
    from compress.measure.report import format_flops

    p = r["params"]
    if r["kind"] == "onnx":
        zeros = (f"fp32 weight-matrix sparsity {p['float_matrix_sparsity']:.1%}; int8 weights "
                 f"{_fmt_int(p['int8_elements'])}, {p['int8_zero_fraction']:.1%} zero (rounding included)")
    else:
        zeros = f"encoder weight-matrix sparsity {p['encoder_matrix_sparsity']:.1%}"
    lines = [f"model: {r['model']} ({r['kind']})",
             f"parameters: total {_fmt_int(p['total'])}, embeddings {_fmt_int(p.get('embeddings'))}, "
             f"encoder {_fmt_int(p.get('encoder'))}, head {_fmt_int(p.get('head'))}, "
             f"non-zero {_fmt_int(p['nonzero'])} ({zeros})"]
    f = r.get("flops")
    if f:
        lines += [
            f"FLOPs per example at length {r['seq_len']} ({f['unit']})"
            + (f", {f['attention_implementation']} attention:" if f.get("attention_implementation") else ":"),
            f"  dense      {format_flops(f['dense_flops']):>14} ({_fmt_int(f['dense_macs'])} MACs)",
            f"  effective  {format_flops(f['effective_flops']):>14} (MACs with a zero weight not counted)",
            "  by operator (dense MACs): " + ", ".join(f"{k} {v:,}" for k, v in
                                                      f["dense_macs_by_operator"].items() if v),
        ]
        zero = "; ".join(f"{k}: {v}" for k, v in f["zero_by_definition"].items())
        if zero:
            lines.append(f"  counted as zero: {zero}")
        skipped = ", ".join(f"{k} x{v}" for k, v in f["not_counted"].items())
        lines.append(f"  not counted (element-wise): {skipped or 'none'}")
    elif r.get("flops_note"):
        lines.append(r["flops_note"])
    if r.get("structure"):
        lines.append(f"structure: heads per layer {r['structure']['layer_heads']}, "
                     f"FFN widths {r['structure']['layer_ffn']}")
    if r.get("fused_ops"):
        lines.append("fused ops: " + ", ".join(f"{k} {v}" for k, v in r["fused_ops"].items()))
    v = r["verdict"]
    lines.append(f"will it be faster on {v['runtime']}? {v['faster']}: " + "; ".join(v["reasons"]))
    ss = v.get("semi_structured")
    if ss:
        devices = "; ".join(f"{k}: {a}" for k, a in ss["per_device"].items())
        lines.append(f"will the {ss['pattern']} pattern be faster? here ({ss['here']['device']}): "
                     f"{ss['here']['faster']}; {devices} ({ss['reason']})")
    d = r.get("disk")
    if d:
        lines.append(f"on disk: {d['bytes'] / 1e6:.2f} MB raw, {d['gzip_bytes'] / 1e6:.2f} MB gzip "
                     f"({d['gzip_ratio']:.0%}) [{', '.join(d['files'])}]")
    if r.get("matrices"):
        lines += ["", f"{'initializer':<60} {'shape':>16} {'dtype':>8} {'zeros':>7}"]
        for m in r["matrices"]:
            shape = "x".join(str(d) for d in m["shape"])
            lines.append(f"{m['name'][-60:]:<60} {shape:>16} {m['dtype']:>8} {m['sparsity']:7.1%}")
    if r.get("sparsity_note"):
        lines.append(r["sparsity_note"])
    if r.get("sparsity_table"):
        lines += ["", r["sparsity_table"]]
    return "\n".join(lines)
