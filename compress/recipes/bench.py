"""``compress bench``: PyTorch eager vs onnxruntime latency/throughput, same process, same inputs
(``compress.measure.bench``)."""

from __future__ import annotations

from typing import Any

from compress.measure.bench import BenchConfig, bench_models


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Time every model/runtime on the grid; write ``bench.json`` in a run folder; return the results."""
    return bench_models(cfg)
