"""``compress export``: a model to ONNX with parity checks, optionally fused, in half precision
or int8, and scored on a task's dev set with onnxruntime. The blocks are in ``compress.export``
(loading, inputs, onnx, optimize, precision, quantize); this recipe chains them and writes the
file and its report atomically."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress.config import check_choice, check_range, option, to_dict
from compress.errors import ModelError, UsageError
from compress.export.inputs import DEFAULT_SHAPES, parse_shapes
from compress.export.loading import LoadedModel, load_torch_model
from compress.export.onnx import FP32_ATOL, check_parity, export_onnx, onnx_checker
from compress.export.optimize import (
    attention_executions,
    attention_shape,
    fusion_summary,
    optimize_onnx,
    optimizer_model_type,
)
from compress.export.precision import PRECISION_CHOICES, convert_to_half, half_parity, half_session_error
from compress.export.quantize import INT8_ATOL, QUANTIZE_CHOICES, quantize_int8
from compress.tasks import task_choices


@dataclass(frozen=True)
class ExportConfig:
    model: str = option("minilm", help="model folder, run folder, student folder or 'minilm'")
    to: str | None = option(None, help="the .onnx file to write (a report goes beside it as .json)")
    optimize: bool = option(False, help="run onnxruntime's transformer optimizer (attention fusion; "
                                        "counts reported)")
    quantize: str | None = option(None, choices=QUANTIZE_CHOICES,
                                  help="int8: dynamic int8 quantization with its own looser parity "
                                       "check")
    per_channel: bool = option(False, help="int8 scale per output column of each weight matrix "
                                           "(default: one per matrix)")
    precision: str = option("fp32", choices=PRECISION_CHOICES,
                            help="fp32, or fp16/bf16: optimized (fused) first, then converted; "
                                 "float32 inputs and outputs, its own parity tolerance")
    atol: float = option(FP32_ATOL, help="fp32 parity tolerance (max absolute difference of logits)")
    int8_atol: float = option(INT8_ATOL, help="int8 parity tolerance (max absolute difference of "
                                              "logits)")
    half_atol: float | None = option(None, help="fp16/bf16 parity tolerance (max absolute difference "
                                                "of logits; unset: 0.05 for fp16, 0.4 for bf16)")
    shapes: str = option(",".join(f"{b}x{n}" for b, n in DEFAULT_SHAPES),
                         help="BATCHxLENGTH shapes the parity check runs on")
    opset: int = option(17, help="ONNX opset version of the export")
    provider: str = option("cpu", help="onnxruntime provider for the checks: cpu, cuda, auto or a "
                                       "full name")
    task: str | None = option(None, choices=task_choices,
                              help="also report this task's dev-set metric for fp32 and "
                                   "int8/fp16/bf16 (and, for fp16/bf16, the argmax agreement with "
                                   "fp32)")
    data_dir: str | None = option(None, help="folder holding the task's files")
    eval_limit: int | None = option(None, help="use only the first N dev examples")
    max_length: int | None = option(None, help="tokenizer max length for --task (unset: the "
                                               "model's)")

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


def warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    """Recorded warnings as ``Category: message`` strings, each once, in the order first raised."""
    seen: dict[str, None] = {}
    for w in caught:
        seen.setdefault(f"{w.category.__name__}: {w.message}".strip(), None)
    return list(seen)


def check_task_fits(spec: str, loaded, label_names: tuple[str, ...]) -> None:
    """``--task`` scores the model's outputs as the task's labels: a saved label set must be the
    task's (``compress eval``'s check); a model without one (an encoder with a fresh head) must at
    least have one output per label. Before anything is exported."""
    from compress.models import check_model_labels

    saved = (loaded.meta or {}).get("label_names")
    if saved is not None:
        check_model_labels(spec, saved, label_names)
        return
    outputs = getattr(getattr(loaded.model, "config", None), "num_labels", None)
    if outputs is not None and outputs != len(label_names):
        raise ModelError(f"model '{spec}' has {outputs} outputs and no saved label set, but the task has "
                         f"{len(label_names)} labels {list(label_names)}; export a model fine-tuned on "
                         "this task, or drop --task")


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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_torch_model(cfg.model)
        if task_data is not None:
            check_task_fits(cfg.model, loaded, task_data[1]["eval"].label_names)
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
                    fused = optimize_onnx(fp32, tmp / "optimized.onnx", heads, hidden,
                                          model_type=model_type)
                    report["parity_optimized"] = check_parity(loaded, tmp / "optimized.onnx", shapes,
                                                              cfg.atol, provider, "optimized fp32")
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
                report["int8_tolerance_note"] = (f"int8 parity uses an absolute tolerance of "
                                                 f"{cfg.int8_atol:g} on logits (dynamic quantization "
                                                 "rounds activations)")
                final = q
            if task_data is not None:
                spec, data = task_data
                tok = tokenizer_for(loaded)
                max_len = cfg.max_length or (loaded.meta or {}).get("max_length", 128)
                if cfg.precision != "fp32":
                    acc = half_accuracy(fp32_final, final, cfg.precision, tok, spec, data["eval"], max_len,
                                        provider)
                else:
                    acc = {"fp32": ort_accuracy(fp32_final, tok, spec, data["eval"], max_len,
                                                provider=provider)}
                if cfg.quantize == "int8":
                    acc["int8"] = ort_accuracy(final, tok, spec, data["eval"], max_len, provider=provider)
                report["accuracy"] = {"task": spec.name, "metric": spec.metric, **acc}
            shutil.move(str(final), dst)
            report["file"] = str(dst)
            report["bytes"] = dst.stat().st_size
            report["report"] = str(report_path)
            # torch's exporter warns on every export (TracerWarning on shape-dependent branches,
            # UserWarning on opsets): recorded in the report instead of printed; --verbose prints them
            report["exporter_warnings"] = warning_lines(caught)
            report_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return report


# Task accuracy of the exported graphs: the evaluation loop of ``compress eval`` on an onnxruntime
# session, so that the export blocks never import the evaluation loop.

def ort_accuracy(onnx_path: str | Path, tokenizer, spec, ds, max_length: int,
                 batch_size: int = 64, provider: str | None = None, with_logits: bool = False
                 ) -> dict[str, Any]:
    """The task metric of an ONNX model on ``ds`` (same tokenisation as ``compress eval``); with
    ``with_logits`` also the logits ([examples, labels] numpy) under ``"logits"``."""
    from compress.evaluation import evaluate
    from compress.export.ort import OrtModel

    model = OrtModel(onnx_path, provider=provider)
    return evaluate(lambda batch: model(**batch), tokenizer, spec, ds, max_length, batch_size, with_logits)


def half_accuracy(fp32_path: str | Path, half_path: str | Path, precision: str, tokenizer, spec, ds,
                  max_length: int, provider: str) -> dict[str, Any]:
    """Dev-set metric of the fp32 and the half-precision graph and how often their argmax agree;
    the half side is ``{"skipped": why}`` where ``provider`` cannot run it."""
    fp32 = ort_accuracy(fp32_path, tokenizer, spec, ds, max_length, provider=provider, with_logits=True)
    ref = fp32.pop("logits")
    why = half_session_error(half_path, provider)
    if why is not None:
        return {"fp32": fp32, precision: {"skipped": why, "n": len(ds)}}
    half = ort_accuracy(half_path, tokenizer, spec, ds, max_length, provider=provider, with_logits=True)
    logits = half.pop("logits")
    half["argmax_agreement"] = float(np.mean(logits.argmax(-1) == ref.argmax(-1)))
    half["max_abs_diff"] = float(np.max(np.abs(logits - ref)))
    return {"fp32": fp32, precision: half}


def tokenizer_for(loaded: LoadedModel):
    """The tokenizer saved beside the model (students keep the teacher's WordPiece one)."""
    from transformers import AutoTokenizer

    if not loaded.path:
        raise UsageError("--task accuracy needs a model folder that holds its tokenizer")
    try:
        return AutoTokenizer.from_pretrained(loaded.path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"no tokenizer in {loaded.path} for --task accuracy "
                         f"({type(exc).__name__})") from None
