"""Export models to ONNX (optionally optimised and int8-quantised) and benchmark them together.

Stages, top to bottom:
  1. measure   parameters and FLOPs of each model (``compress measure``);
  2. export    each model to ONNX, plus an optimised int8 copy when asked (``compress export``,
               which checks parity with PyTorch before writing);
  3. bench     PyTorch and onnxruntime latency of every model and file in one run;
  4. report    a table of params / FLOPs / latency per model via ``compress report``.
Run with ``compress run pipelines/configs/export-bench.yaml models=[minilm,artifacts/finetune/RUN]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.security import resolve_out, safe_run_name
from compress.report import write_report

try:  # loaded by path from ``compress run``: find stages.py beside this file
    from pipelines.stages import cli, json_stage, run_stage, top_level, write_manifest
except ImportError:  # pragma: no cover - pipelines/ not on sys.path
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipelines.stages import cli, json_stage, run_stage, top_level, write_manifest


@dataclass(frozen=True)
class ExportBenchOptions:
    out: str = "artifacts/export-bench"
    models: tuple[str, ...] = ("minilm",)
    optimize: bool = True
    int8: bool = True
    batch_sizes: tuple[int, ...] = (1, 32)
    seq_lens: tuple[int, ...] = (128,)
    iterations: int = 10


def _label(spec: str) -> str:
    return safe_run_name(Path(spec).name or spec)


def run(values: dict[str, Any], log=print) -> Path:
    o = top_level(values, ExportBenchOptions, ())
    if not o.models:
        raise UsageError("export-bench: 'models' is empty; list model or run folders (or minilm)")
    out = resolve_out(o.out)
    out.mkdir(parents=True, exist_ok=True)
    models: dict[str, dict[str, Any]] = {}
    bench_args: list[str] = []
    for spec in o.models:
        label = _label(spec)
        if label in models:
            raise UsageError(f"export-bench: two models share the name '{label}'; rename a folder")
        model = str(Path(spec).resolve()) if Path(spec).exists() else spec
        models[label] = {"run": model, "kind": "model"}

        # 1. measure
        json_stage(out / "measure" / f"{label}.json", ["measure", model, "--json", "--seq-len",
                                                       str(o.seq_lens[0])], log)
        models[label]["measure"] = str(out / "measure" / f"{label}.json")
        bench_args.append(f"{label}={model}")

        # 2. export (fp32, then optimised int8)
        onnx = out / "onnx" / f"{label}.onnx"
        if not onnx.is_file():
            onnx.parent.mkdir(exist_ok=True)
            cli(["export", model, "--to", str(onnx), *(["--optimize"] if o.optimize else [])],
                out / "logs" / f"export-{label}.log")
        bench_args.append(f"{label}-onnx={onnx}")
        if o.int8:
            q = out / "onnx" / f"{label}-int8.onnx"
            if not q.is_file():
                cli(["export", model, "--to", str(q), "--optimize", "--quantize", "int8"],
                    out / "logs" / f"export-{label}-int8.log")
            bench_args.append(f"{label}-int8={q}")

    # 3. bench everything in one run, the first model as the baseline
    run_stage(out, "bench", ["bench", *bench_args, "--batch-sizes", ",".join(map(str, o.batch_sizes)),
                             "--seq-lens", ",".join(map(str, o.seq_lens)),
                             "--iterations", str(o.iterations)], log)

    # 4. report
    write_manifest(out, "export-bench", to_dict(o), models)
    log(f"export-bench: report {write_report(out)}")
    return out
