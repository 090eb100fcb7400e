"""The report of a single run folder (``summary.json``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from compress.report.common import (
    _md_table,
    _plt,
    _read_json,
    _save_fig,
    _write_csv,
)


def _scalars(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _scalars(v, key + ".")
        elif isinstance(v, (int, float, str, bool)) or v is None:
            if isinstance(v, float) and not math.isfinite(v):
                v = str(v)
            out.append((key, v))
    return out


def _run_report(root: Path) -> str:
    summary = _read_json(root / "summary.json") or {}
    out_dir = root / "report"
    md = [f"# Run report: {root.name}", ""]
    scalars = [(k, v) for k, v in _scalars(summary) if not k.startswith("prune_history")]
    _write_csv(out_dir / "summary.csv", ["key", "value"], [list(kv) for kv in scalars])
    md += ["## Summary", "", _md_table(["key", "value"], [list(kv) for kv in scalars]), "",
           "CSV: [report/summary.csv](report/summary.csv)", ""]
    plt = _plt()
    losses = []
    mpath = root / "metrics.jsonl"
    if mpath.is_file():
        for line in mpath.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("loss"), (int, float)) and "step" in rec:
                losses.append((rec.get("phase", "train"), rec["step"], rec["loss"]))
    if losses:
        _write_csv(out_dir / "training_loss.csv", ["phase", "step", "loss"], [list(x) for x in losses])
        fig, ax = plt.subplots(figsize=(6, 4))
        for phase in sorted({p for p, _, _ in losses}):
            pts = [(s, v) for p, s, v in losses if p == phase]
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=phase)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (nats per example/token)")
        ax.set_title("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
        _save_fig(fig, out_dir / "training_loss.png")
        md += ["## Training loss", "", "![training loss](report/training_loss.png)", ""]
    sp = _read_json(root / "sparsity.json")
    if sp and "layers" in sp:
        rows = [[g, sp[g]["numel"], sp[g]["zeros"], 100 * sp[g]["sparsity"]]
                for g in ("embeddings", "encoder", "other", "global") if g in sp]
        md += ["## Sparsity", "", _md_table(["group", "weights", "zeros", "sparsity %"], rows), ""]
        heads = sp.get("heads") or {}
        layer_rows = []
        for layer, v in sorted(sp["layers"].items(), key=lambda kv: int(kv[0])):
            h = heads.get(layer, {})
            layer_rows.append([int(layer), 100 * v["sparsity"], *(100 * h[k] if k in h else None
                                                                   for k in ("min", "mean", "max"))])
        _write_csv(out_dir / "layer_sparsity.csv",
                   ["layer", "sparsity_pct", "head_min_pct", "head_mean_pct", "head_max_pct"], layer_rows)
        md += [_md_table(["layer", "sparsity %", "head min %", "head mean %", "head max %"], layer_rows), ""]
        if heads:
            fig, ax = plt.subplots(figsize=(6, 4))
            xs = [r[0] for r in layer_rows if r[3] is not None]
            mean = [r[3] for r in layer_rows if r[3] is not None]
            lo = [r[3] - r[2] for r in layer_rows if r[3] is not None]
            hi = [r[4] - r[3] for r in layer_rows if r[3] is not None]
            ax.errorbar(xs, mean, yerr=[lo, hi], marker="o", capsize=3)
            ax.set_xlabel("encoder layer")
            ax.set_ylabel("attention-head sparsity (% zeros; bar = min-max)")
            ax.set_title("per-head sparsity")
            ax.grid(alpha=0.3)
            _save_fig(fig, out_dir / "head_sparsity.png")
            md += ["![per-head sparsity](report/head_sparsity.png)", ""]
    return "\n".join(md) + "\n"
