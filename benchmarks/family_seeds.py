"""Speedup families of several seeds as one table: per method and target, the mean and spread of
each score and measured speedup across the seeds' ``family.json`` (structured-reconstruction writes
one folder per method and seed, named METHOD-sSEED).

    python -m benchmarks family-seeds artifacts/structured-reconstruction

Spread = half the range (max - min) / 2 of the seeds' values: with two seeds, the distance of each
from their mean. The result holds the rows; the Markdown table is printed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.suite import BenchmarkError

FIELDS = {"one-shot": "score_before_recovery", "fp32": "score_fp32", "int8": "score_int8",
          "macro-F1 int8": "macro_f1_int8", "predicted": "predicted_speedup"}


def add_arguments(p) -> None:
    p.add_argument("folder", type=Path, help="a folder of METHOD-sSEED family folders")


def budget(args) -> str:
    return "none: reads finished family folders"


def _stats(values: list[float]) -> dict:
    return {"mean": sum(values) / len(values), "spread": (max(values) - min(values)) / 2, "values": values}


def collect(folder: Path) -> list[dict]:
    """One row per method (the folder name without its seed) and target label."""
    groups: dict[str, list[tuple[str, dict]]] = {}
    for family in sorted(Path(folder).glob("*/family.json")):
        m = re.fullmatch(r"(.+)-s(\d+)", family.parent.name)
        if m:
            groups.setdefault(m.group(1), []).append((m.group(2), json.loads(family.read_text())))
    rows = []
    for method, runs in groups.items():
        speed_keys = sorted({k for _, f in runs for r in f["rows"] for k in r if k.startswith("vs_")})
        labels = [r["label"] for r in runs[0][1]["rows"]]
        dense = _stats([f["dense_score"] for _, f in runs])
        for label in labels:
            cells = [next(r for r in f["rows"] if r["label"] == label) for _, f in runs]
            row = {"method": method, "target": label, "seeds": [s for s, _ in runs], "dense": dense,
                   "members_seconds": _stats([f.get("members_seconds", 0.0) for _, f in runs])}
            for name, key in FIELDS.items():
                values = [c[key] for c in cells if c.get(key) is not None]
                row[name] = _stats(values) if values else None
            for key in speed_keys:
                values = [c[key] for c in cells if c.get(key) is not None]
                row[key] = _stats(values) if values else None
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ["method", "target", "seeds", "dense", *FIELDS, "vs dense int8 32x128", "vs eager fp32 1x128"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(stat, scale=100.0, fmt=".2f"):
        if not stat:
            return ""
        return f"{scale * stat['mean']:{fmt}} ± {scale * stat['spread']:{fmt}}"

    for r in rows:
        lines.append("| " + " | ".join([
            r["method"], r["target"], ",".join(r["seeds"]), cell(r["dense"]),
            *(cell(r[name], 1.0 if name == "predicted" else 100.0) for name in FIELDS),
            cell(r.get("vs_dense_int8_32x128"), 1.0), cell(r.get("vs_eager_fp32_1x128"), 1.0)]) + " |")
    return "\n".join(lines)


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        print(f"# reads {args.folder}/*-sSEED/family.json")
        return None
    rows = collect(args.folder)
    if not rows:
        raise BenchmarkError(f"no METHOD-sSEED/family.json under {args.folder}")
    print(markdown(rows))
    return {"folder": str(args.folder), "rows": rows}
