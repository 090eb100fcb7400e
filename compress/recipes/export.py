"""``compress export``: a model to ONNX with parity checks, optionally fused, in half precision or
int8, and scored on a task's dev set with onnxruntime (``compress.export.model_export``)."""

from __future__ import annotations

from typing import Any

from compress.export.model_export import ExportConfig, export_model


def run_export(cfg: ExportConfig) -> dict[str, Any]:
    """Export ``cfg.model`` to ``cfg.to`` with parity checks; returns (and writes) the report
    (``<to>.json``); a failed export leaves no file behind."""
    return export_model(cfg)
