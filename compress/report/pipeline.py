"""The report of a pipeline folder (``pipeline.json``: docbert, export-bench): one row per model."""

from __future__ import annotations

from pathlib import Path

from compress.report import analysis as A
from compress.report.common import (
    _latency_ms,
    _md_table,
    _plt,
    _read_json,
    _save_fig,
    _write_csv,
)


def _score(summary: dict | None) -> float | None:
    for key in ("student_eval", "eval"):
        v = ((summary or {}).get(key) or {}).get("score")
        if isinstance(v, (int, float)):
            return float(v)
    return None


def _pipeline_report(root: Path) -> str:
    manifest = _read_json(root / "pipeline.json") or {}
    bench = _read_json(root / "bench" / "bench.json")
    out_dir = root / "report"
    rows = []
    for label, m in (manifest.get("models") or {}).items():
        measure = _read_json(Path(m["measure"])) if m.get("measure") else None
        params = ((measure or {}).get("params") or {}).get("total")
        flops = ((measure or {}).get("flops") or {}).get("dense_flops")
        rows.append({"model": label, "params": params, "flops": flops,
                     "latency_ms": _latency_ms(bench, label) if bench else None,
                     "score": _score(_read_json(Path(m["run"]) / "summary.json")),
                     "hidden": m.get("hidden"), "kd": m.get("kd")})
    ref = "teacher" if any(r["model"] == "teacher" for r in rows) else None
    table = A.distillation_table(rows, reference=ref)
    header = ["model", "params", "flops", "latency_ms", "score", "params_ratio", "speedup"]
    _write_csv(out_dir / "models.csv", header, [[r.get(k) for k in header] for r in table])
    md = [f"# {manifest.get('pipeline', 'pipeline')} report: {root.name}", "",
          "Parameters and dense FLOPs per example (FLOPs = 2 x multiply-adds) from `compress measure`; "
          "latency: median ms at the smallest benchmarked batch (`compress bench`, bench/bench.json); "
          "score: the task's dev metric. Ratios are against "
          f"{ref or 'the largest model'}. CSV: [report/models.csv](report/models.csv).", "",
          _md_table(["model", "params", "FLOPs", "latency ms", "dev score", "params ratio", "speedup"],
                    [[r.get(k) for k in header] for r in table]), ""]
    bench_rows = [[r.get(k) for k in ("model", "runtime", "batch", "seq_len", "median_ms", "p90_ms")]
                  for r in (bench or {}).get("rows", [])]
    if bench_rows:
        _write_csv(out_dir / "bench.csv", ["model", "runtime", "batch", "seq_len", "median_ms", "p90_ms"],
                   bench_rows)
        md += ["## Latency (compress bench)", "", "Every timed model and runtime; CSV: "
               "[report/bench.csv](report/bench.csv).", "",
               _md_table(["model", "runtime", "batch", "tokens", "median ms", "p90 ms"], bench_rows), ""]
    scored = [r for r in table if r["score"] is not None and r["params"]]
    if len(scored) >= 2:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([r["params"] / 1e6 for r in scored], [100 * r["score"] for r in scored])
        for r in scored:
            ax.annotate(r["model"], (r["params"] / 1e6, 100 * r["score"]), fontsize=7)
        front = A.pareto_front([(r["params"], r["score"]) for r in scored])
        ax.plot([scored[i]["params"] / 1e6 for i in front], [100 * scored[i]["score"] for i in front],
                color="red", label="Pareto front")
        ax.set_xscale("log")
        ax.set_xlabel("parameters (millions, log scale)")
        ax.set_ylabel("dev metric (%)")
        ax.set_title("metric vs model size")
        ax.grid(alpha=0.3)
        ax.legend()
        _save_fig(fig, out_dir / "metric_vs_params.png")
        md += ["![metric vs parameters](report/metric_vs_params.png)", ""]
    curve_rows = [r for r in rows if r.get("hidden") is not None and r["score"] is not None]
    if curve_rows:
        curve = A.hidden_size_curve(curve_rows)
        _write_csv(out_dir / "lstm_hidden_curve.csv", ["hidden_size", "score"], [list(c) for c in curve])
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([h for h, _ in curve], [100 * v for _, v in curve], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("BiLSTM hidden size (units per direction)")
        ax.set_ylabel("dev metric (%)")
        ax.set_title("distilled BiLSTM: metric vs hidden size")
        ax.grid(alpha=0.3)
        _save_fig(fig, out_dir / "lstm_hidden_curve.png")
        md += ["## BiLSTM hidden size (DocBERT Figure 1)", "",
               _md_table(["hidden size", "dev score"], [list(c) for c in curve]), "",
               "![hidden-size curve](report/lstm_hidden_curve.png)", ""]
    return "\n".join(md) + "\n"
