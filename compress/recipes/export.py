"""``compress export``: a model to ONNX with parity checks, optionally fused, in half precision
or int8, and scored on a task's dev set with onnxruntime. The blocks are in
``compress.export.onnx``; this recipe chains them and writes the file and its report atomically."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compress.config import check_choice, check_range, to_dict
from compress.errors import UsageError
from compress.export.onnx import (
    DEFAULT_SHAPES,
    FP32_ATOL,
    INT8_ATOL,
    PRECISION_CHOICES,
    QUANTIZE_CHOICES,
    _tokenizer_for,
    attention_executions,
    attention_shape,
    check_parity,
    convert_to_half,
    export_onnx,
    fusion_summary,
    half_accuracy,
    half_parity,
    load_torch_model,
    onnx_checker,
    optimize_onnx,
    optimizer_model_type,
    ort_accuracy,
    parse_shapes,
    quantize_int8,
)


@dataclass(frozen=True)
class ExportConfig:
    model: str = "minilm"
    to: str | None = None
    optimize: bool = False
    quantize: str | None = None
    per_channel: bool = False
    precision: str = field(default="fp32", metadata={"choices": PRECISION_CHOICES})
    atol: float = FP32_ATOL
    int8_atol: float = INT8_ATOL
    half_atol: float | None = None
    shapes: str = ",".join(f"{b}x{n}" for b, n in DEFAULT_SHAPES)
    opset: int = 17
    provider: str = "cpu"
    task: str | None = None
    data_dir: str | None = None
    eval_limit: int | None = None
    max_length: int | None = None

    def __post_init__(self):
        if not self.to:
            raise UsageError("--to is required: the .onnx file to write (e.g. --to model.onnx)")
        if not str(self.to).endswith(".onnx"):
            raise UsageError(f"--to {self.to}: the output file name must end in .onnx")
        if self.quantize is not None:
            check_choice("quantize", self.quantize, QUANTIZE_CHOICES)
        elif self.per_channel:
            raise UsageError("--per-channel applies to int8 weights; add --quantize int8")
        check_choice("precision", self.precision, PRECISION_CHOICES)
        if self.precision != "fp32" and self.quantize is not None:
            raise UsageError(f"--precision {self.precision} and --quantize {self.quantize} exclude each "
                             "other: int8 is quantized from the fp32 graph; drop one of them")
        if self.half_atol is not None and self.precision == "fp32":
            raise UsageError("--half-atol is the fp16/bf16 parity tolerance; add --precision fp16 or bf16")
        check_range("atol", self.atol, 0, lo_open=True)
        check_range("int8_atol", self.int8_atol, 0, lo_open=True)
        if self.half_atol is not None:
            check_range("half_atol", self.half_atol, 0, lo_open=True)
        check_range("opset", self.opset, 14, 21)
        parse_shapes(self.shapes)
        if self.eval_limit is not None and self.eval_limit < 1:
            raise UsageError(f"--eval-limit must be >= 1, got {self.eval_limit}")


def run_export(cfg: ExportConfig) -> dict[str, Any]:
    """Export ``cfg.model`` to ``cfg.to`` with parity checks; returns (and writes) the report.

    Everything is built in a temporary folder beside ``cfg.to`` and moved into place only when
    every check passed, so a failed export leaves no file behind. The report goes to
    ``<to>.json``.
    """
    from compress.export.ort import resolve_provider

    dst = Path(cfg.to)
    report_path = dst.with_suffix(".json")
    if dst.exists():
        raise UsageError(f"{dst} already exists; exports are never overwritten (choose another --to)")
    if not dst.parent.is_dir():
        raise UsageError(f"folder {dst.parent} does not exist (create it or change --to)")
    provider = resolve_provider(cfg.provider)
    shapes = parse_shapes(cfg.shapes)
    task_data = None
    if cfg.task is not None:
        from compress.recipes.finetune import TaskDataConfig, load_task_data

        task_data = load_task_data(TaskDataConfig(task=cfg.task, data_dir=cfg.data_dir,
                                                  eval_limit=cfg.eval_limit), ("eval",))
    loaded = load_torch_model(cfg.model)
    tmp = dst.parent / f".tmp-{dst.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        report: dict[str, Any] = {"config": to_dict(cfg), "kind": loaded.kind,
                                  "inputs": list(loaded.input_names), "outputs": ["logits"],
                                  "dynamic_axes": {"batch": 0, "sequence": 1}, "provider": provider}
        fp32 = export_onnx(loaded, tmp / "fp32.onnx", cfg.opset)
        report["parity_fp32"] = check_parity(loaded, fp32, shapes, cfg.atol, provider, "fp32")
        final = fp32
        if cfg.optimize or cfg.precision != "fp32":  # half precision: fuse first, then convert
            model_type, why = optimizer_model_type(loaded)
            report["optimizer_model_type"] = model_type
            fused: dict[str, int] = {}
            if model_type is not None:
                heads, hidden = attention_shape(loaded)
                fused = optimize_onnx(fp32, tmp / "optimized.onnx", heads, hidden, model_type=model_type)
                report["parity_optimized"] = check_parity(loaded, tmp / "optimized.onnx", shapes, cfg.atol,
                                                          provider, "optimized fp32")
                final = tmp / "optimized.onnx"
            report["fused_ops"] = fused
            report["fusion"] = fusion_summary(model_type, why, fused, attention_executions(loaded))
        fp32_final = final
        if cfg.precision != "fp32":
            half = tmp / f"{cfg.precision}.onnx"
            report["half"] = convert_to_half(final, half, cfg.precision)
            onnx_checker(half)
            report[f"parity_{cfg.precision}"] = half_parity(loaded, half, cfg.precision, shapes,
                                                            cfg.half_atol, provider)
            final = half
        if cfg.quantize == "int8":
            q = quantize_int8(final, tmp / "int8.onnx", per_channel=cfg.per_channel)
            report["parity_int8"] = check_parity(loaded, q, shapes, cfg.int8_atol, provider, "int8")
            report["int8_tolerance_note"] = (f"int8 parity uses an absolute tolerance of {cfg.int8_atol:g} "
                                             "on logits (dynamic quantization rounds activations)")
            final = q
        if task_data is not None:
            spec, data = task_data
            tok = _tokenizer_for(loaded)
            max_len = cfg.max_length or (loaded.meta or {}).get("max_length", 128)
            if cfg.precision != "fp32":
                acc = half_accuracy(fp32_final, final, cfg.precision, tok, spec, data["eval"], max_len,
                                    provider)
            else:
                acc = {"fp32": ort_accuracy(fp32_final, tok, spec, data["eval"], max_len, provider=provider)}
            if cfg.quantize == "int8":
                acc["int8"] = ort_accuracy(final, tok, spec, data["eval"], max_len, provider=provider)
            report["accuracy"] = {"task": spec.name, "metric": spec.metric, **acc}
        shutil.move(str(final), dst)
        report["file"] = str(dst)
        report["bytes"] = dst.stat().st_size
        report["report"] = str(report_path)
        report_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report
