"""A model to ONNX with parity checks, optionally fused, in half precision or int8, and scored on a
task's dev set with onnxruntime (``export_model``, what ``compress export`` and a ``--speedup`` family
run). It chains the blocks of ``compress.export`` (loading, inputs, onnx, optimize, precision,
quantize) and writes the file and its report atomically."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress.core.config import check_choice, check_range, option, to_dict
from compress.core.errors import ModelError, UsageError, first_line
from compress.export.inputs import DEFAULT_SHAPES, parse_shapes
from compress.export.loading import LoadedModel, load_torch_model
from compress.export.onnx import check_parity, export_checked
from compress.export.optimize import (
    attention_executions,
    attention_shape,
    fusion_on_trial,
    fusion_summary,
    optimize_onnx,
    optimizer_model_type,
)
from compress.export.precision import PRECISION_CHOICES, PRECISIONS, QUANTIZE_CHOICES, half_session_error
from compress.tasks import task_choices
from compress.tasks.embedding import EMBEDDING_TASK


@dataclass(frozen=True)
class ExportConfig:
    model: str = option("minilm", help="model folder, run folder, student folder or 'minilm'")
    to: str | None = option(None, help="the .onnx file to write (a report goes beside it as .json)")
    optimize: bool = option(False, help="run onnxruntime's transformer optimizer (attention fusion; "
                                        "counts reported)")
    quantize: str | None = option(None, choices=QUANTIZE_CHOICES,
                                  help="int8: dynamic int8 quantization with its own looser parity "
                                       "check")
    per_tensor: bool = option(False, help="int8: one scale per weight matrix (default: one per output "
                                          "column, which keeps BERT's outlier output dimensions "
                                          "from costing the other rows their precision)")
    precision: str = option("fp32", choices=PRECISION_CHOICES,
                            help="fp32, or fp16/bf16: optimized (fused) first, then converted; "
                                 "float32 inputs and outputs, its own parity tolerance")
    atol: float = option(PRECISIONS["fp32"].atol,
                         help="fp32 parity tolerance (max absolute difference of logits)")
    int8_atol: float = option(PRECISIONS["int8"].atol,
                              help="int8 parity tolerance (max absolute difference of logits)")
    half_atol: float | None = option(None, help="fp16/bf16 parity tolerance (max absolute difference "
                                                "of logits; unset: "
                                                + ", ".join(f"{PRECISIONS[n].atol:g} for {n}"
                                                            for n in PRECISION_CHOICES if n != "fp32")
                                                + ")")
    shapes: str = option(",".join(f"{b}x{n}" for b, n in DEFAULT_SHAPES),
                         help="BATCHxLENGTH shapes the parity check runs on")
    opset: int = option(17, help="ONNX opset version of the export")
    provider: str = option("cpu", help="onnxruntime provider for the checks: cpu, cuda, auto or a "
                                       "full name")
    task: str | None = option(None, choices=task_choices,
                              help="also report this task's dev-set metric for fp32 and "
                                   "int8/fp16/bf16, and their argmax agreement with fp32")
    data_dir: str | None = option(None, help="folder holding the task's files")
    eval_limit: int | None = option(None, help="use only the first N dev examples")
    max_length: int | None = option(None, help="tokenizer max length for --task (unset: the "
                                               "model's)")
    split_by_article: str | None = option(None, help="--task embedding: TRAIN/EVAL article counts of "
                                                     "the SQuAD file; ReQA is scored on the EVAL "
                                                     "articles (e.g. 38/10)")

    def __post_init__(self):
        if not self.to:
            raise UsageError("--to is required: the .onnx file to write (e.g. --to model.onnx)")
        if not str(self.to).endswith(".onnx"):
            raise UsageError(f"--to {self.to}: the output file name must end in .onnx")
        if self.quantize is not None:
            check_choice("quantize", self.quantize, QUANTIZE_CHOICES)
        elif self.per_tensor:
            raise UsageError("--per-tensor applies to int8 weights; add --quantize int8")
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
        if self.split_by_article is not None:
            if self.task != EMBEDDING_TASK:
                raise UsageError("--split-by-article chooses the ReQA articles of --task embedding; add "
                                 "--task embedding or drop it")
            from compress.tasks.qa import parse_split_by_article

            parse_split_by_article(self.split_by_article)

    @property
    def target(self) -> str:
        """The precision written (a ``PRECISIONS`` name): --quantize's, else --precision's."""
        return self.quantize or self.precision

    @property
    def target_atol(self) -> float:
        """The parity tolerance of the written precision: --atol, --int8-atol or --half-atol (unset:
        the precision's own)."""
        if self.quantize is not None:
            return self.int8_atol
        if self.precision == "fp32":
            return self.atol
        return self.half_atol if self.half_atol is not None else PRECISIONS[self.precision].atol


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
    from compress.models.loading import check_model_labels

    saved = (loaded.meta or {}).get("label_names")
    if saved is not None:
        check_model_labels(spec, saved, label_names)
        return
    outputs = getattr(getattr(loaded.model, "config", None), "num_labels", None)
    if outputs is not None and outputs != len(label_names):
        raise ModelError(f"model '{spec}' has {outputs} outputs and no saved label set, but the task has "
                         f"{len(label_names)} labels {list(label_names)}; export a model fine-tuned on "
                         "this task, or drop --task")


def export_model(cfg: ExportConfig) -> dict[str, Any]:
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
    embedding = cfg.task == EMBEDDING_TASK
    if embedding:
        from compress.tasks.base import DataOptions, data_dir_from_env
        from compress.tasks.embedding import load_embedding_eval

        task_data = load_embedding_eval(DataOptions(data_dir_from_env(cfg.data_dir)), cfg.split_by_article,
                                        cfg.eval_limit)
    elif cfg.task is not None:
        from compress.tasks.task_data import TaskDataConfig, load_task_data

        task_data = load_task_data(TaskDataConfig(task=cfg.task, data_dir=cfg.data_dir,
                                                  eval_limit=cfg.eval_limit), ("eval",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_torch_model(cfg.model, embedding=embedding)
        if loaded.kind == "embedding" and cfg.task not in (None, EMBEDDING_TASK):
            raise UsageError(f"{cfg.model} is a sentence-embedding model; its export is scored with "
                             f"--task embedding, not --task {cfg.task}")
        if task_data is not None and not embedding:
            check_task_fits(cfg.model, loaded, task_data[1]["eval"].label_names)
        tmp = dst.parent / f".tmp-{dst.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            report: dict[str, Any] = {"config": to_dict(cfg), "kind": loaded.kind,
                                      "architecture": loaded.architecture,
                                      "inputs": list(loaded.input_names),
                                      "outputs": [loaded.output_name],
                                      "dynamic_axes": {"batch": 0, "sequence": 1}, "provider": provider}
            fp32, report["parity_fp32"], retraced = export_checked(
                loaded, tmp / "fp32.onnx", shapes, cfg.atol, provider, cfg.opset)
            if retraced:
                report["trace"] = retraced
            fp32_final = _optimized(cfg, loaded, fp32, shapes, provider, report)
            final = _converted(cfg, loaded, fp32_final, shapes, provider, report)
            if embedding:
                from compress.export.embedding import onnx_embedding_report

                report["accuracy"] = onnx_embedding_report(loaded, fp32_final, final, cfg.target, task_data,
                                                           cfg.max_length, provider)
            elif task_data is not None:
                report["accuracy"] = _task_accuracy(cfg, loaded, fp32_final, final, task_data, provider)
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


def _optimized(cfg: ExportConfig, loaded: LoadedModel, fp32: Path, shapes, provider: str,
               report: dict[str, Any]) -> Path:
    """The fp32 graph the conversion starts from: fused by onnxruntime's optimizer (with its own
    parity check) under --optimize or for a precision that fuses first, where a fusion applies."""
    if not (cfg.optimize or PRECISIONS[cfg.target].fuse_first):
        return fp32
    model_type, why = optimizer_model_type(loaded)
    report["optimizer_model_type"] = model_type
    fused: dict[str, int] = {}
    final = fp32
    if model_type is not None:
        trial = fusion_on_trial(loaded)
        # a discovered type: the optimizer reads each layer's head count from the graph
        heads, hidden = (0, 0) if trial else attention_shape(loaded)
        final = fp32.parent / "optimized.onnx"
        try:
            fused = optimize_onnx(fp32, final, heads, hidden, model_type=model_type)
            report["parity_optimized"] = check_parity(loaded, final, shapes, cfg.atol, provider,
                                                      "optimized fp32")
        except Exception as err:  # noqa: BLE001 - a trial fusion that fails in any way is dropped
            if not trial:
                raise
            # a discovered type's trial fusion that failed or changed its outputs: the graph as exported
            why = f"onnxruntime's 'bert' fusions were tried and dropped: {first_line(err)[:200]}"
            final, fused, model_type = fp32, {}, None
            report["optimizer_model_type"] = None
            report.pop("parity_optimized", None)
    report["fused_ops"] = fused
    report["fusion"] = fusion_summary(model_type, why, fused, attention_executions(loaded))
    return final


def _converted(cfg: ExportConfig, loaded: LoadedModel, fp32: Path, shapes, provider: str,
               report: dict[str, Any]) -> Path:
    """``fp32`` converted to the target precision (``PRECISIONS``) and parity-checked; fp32 as is."""
    target = PRECISIONS[cfg.target]
    if target.name == "fp32":
        return fp32
    out = fp32.parent / f"{target.name}.onnx"
    summary = target.convert(fp32, out, per_channel=not cfg.per_tensor)
    if target.summary_key is not None:
        report[target.summary_key] = summary
    atol = cfg.target_atol
    report[f"parity_{target.name}"] = target.check(loaded, out, shapes, atol, provider)
    if target.tolerance_note is not None:
        report[f"{target.name}_tolerance_note"] = target.tolerance_note.format(atol=atol)
    return out


def _task_accuracy(cfg: ExportConfig, loaded: LoadedModel, fp32: Path, final: Path, task_data,
                   provider: str) -> dict[str, Any]:
    """The dev-set metric of the fp32 graph and of the converted one (half precision: with the
    argmax agreement, or why the provider cannot run it)."""
    spec, data = task_data
    tok = tokenizer_for(loaded)
    max_len = cfg.max_length or (loaded.meta or {}).get("max_length", 128)
    if cfg.precision != "fp32":
        acc = half_accuracy(fp32, final, cfg.precision, tok, spec, data["eval"], max_len, provider)
    elif cfg.quantize is None:
        acc = {"fp32": ort_accuracy(fp32, tok, spec, data["eval"], max_len, provider=provider)}
    else:
        ref = ort_accuracy(fp32, tok, spec, data["eval"], max_len, provider=provider, with_logits=True)
        quant = ort_accuracy(final, tok, spec, data["eval"], max_len, provider=provider, with_logits=True)
        acc = {"fp32": ref, cfg.quantize: {**quant, **agreement(quant.pop("logits"), ref.pop("logits"))}}
    return {"task": spec.name, "metric": spec.metric, **acc}


def agreement(logits: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """How often the argmax of ``logits`` ([examples, labels]) is the reference's, and their
    largest and mean absolute difference."""
    return {"argmax_agreement": float(np.mean(logits.argmax(-1) == ref.argmax(-1))),
            "max_abs_diff": float(np.max(np.abs(logits - ref))),
            "mean_abs_diff": float(np.mean(np.abs(logits - ref)))}


# Task accuracy of the exported graphs: the evaluation loop of ``compress eval`` on an onnxruntime
# session, so that the export blocks never import the evaluation loop.

def ort_accuracy(onnx_path: str | Path, tokenizer, spec, ds, max_length: int,
                 batch_size: int = 64, provider: str | None = None, with_logits: bool = False
                 ) -> dict[str, Any]:
    """The task metric of an ONNX model on ``ds`` (same tokenisation as ``compress eval``); with
    ``with_logits`` also the logits ([examples, labels] numpy) under ``"logits"``."""
    from compress.export.ort import OrtModel
    from compress.training.evaluation import evaluate

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
    half.update(agreement(half.pop("logits"), ref))
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
