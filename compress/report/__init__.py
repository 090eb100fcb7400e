"""``write_report(run_or_sweep_dir)``: report.md with PNG plots and CSV tables.

A sweep folder (``sweep.json``) gets the paper's views: dev metric against sparsity per variant
(best over the learning-rate grid), held-out pre-training loss against sparsity, the downstream
metric against pre-training loss with its linear fit (Gordon et al. Figure 2 left), layer-wise
feature similarity of pruned and dense pre-trained models (Figure 2 right), mask difference
between pre-training and downstream pruning (Figure 3), movement in the magnitude sort order
during fine-tuning (Table 2), per-head sparsity (Figure 4 left) and the Pareto front of metric
against non-zero weights and effective FLOPs. A pipeline folder (``pipeline.json``: docbert,
export-bench) gets the distillation table (params / FLOPs / latency / metric) and the BiLSTM
hidden-size curve. A single run folder gets its summary, sparsity tables, training-loss curve and
per-head sparsity.

Everything is read from run-folder files; the numbers come from ``compress.report.analysis``. Plots and
CSVs go to ``<dir>/report/``, report.md to ``<dir>/report.md`` (rewritten on every call).
"""


from __future__ import annotations

from pathlib import Path

from compress.core.errors import DataError
from compress.core.runs import write_text_atomic
from compress.report.pipeline import _pipeline_report
from compress.report.run import _run_report
from compress.report.sweep import _sweep_report


def write_report(path: str | Path) -> Path:
    """Write ``report.md`` (+ ``report/*.png``, ``report/*.csv``) for a sweep or run folder."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"{root} is not a folder; pass a sweep folder (with sweep.json) or a run "
                        "folder (with summary.json)")
    if (root / "sweep.json").is_file():
        text = _sweep_report(root)
    elif (root / "pipeline.json").is_file():
        text = _pipeline_report(root)
    elif (root / "summary.json").is_file():
        text = _run_report(root)
    else:
        raise DataError(f"{root} has no sweep.json, pipeline.json or summary.json; pass a finished "
                        "sweep, pipeline or run folder (an interrupted run is a .tmp-* folder with no "
                        "summary.json)")
    out = root / "report.md"
    write_text_atomic(out, text)
    return out
