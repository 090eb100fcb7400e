"""Collect the runs of benchmarks/embedding_minilm.sh into one JSON file and print its tables.

    python benchmarks/embedding_table.py RUNS --out embedding_minilm.json

Rows: every pruned run (its dense, one-shot and final scores, cosine to the dense embeddings,
seconds, the sentence-transformers reload check), every export (the scores of the PyTorch model and
of each graph, the mean cosine of the written graph to PyTorch), the fixed-shape bench (sequences/s
of each graph at each batch size, and the ratio to the first) and the bench on real sentences.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _scores(s: dict | None) -> dict | None:
    if not s:
        return None
    out = {"p@1": s["reqa"]["p@1"], "mrr": s["reqa"]["mrr"]}
    if "pairs" in s:
        out["pair_auc"] = s["pairs"]["roc_auc"]
    if "cosine_to_reference" in s:
        out["cosine_to_dense"] = s["cosine_to_reference"]["mean"]
    return out


def _speed_scores(s: dict) -> dict:
    return {**_scores(s), "sentences_per_second": s["sentences_per_second"]}


def prune_row(name: str, s: dict) -> dict:
    structured = s.get("structured") or {}
    return {"run": name, "criterion": s["criterion"], "sparsity": s.get("sparsity_target"),
            "speedup_target": structured.get("speedup_requested"),
            "predicted_speedup": structured.get("predicted_speedup"),
            "seed": None, "calibration_texts": s.get("calibration_texts"),
            "recovery_steps": s["recovery_steps"], "prune_seconds": s["prune_seconds"],
            "train_seconds": s.get("train_seconds"), "dense": _scores(s["eval_dense"]),
            "one_shot": _scores(s["eval_pruned_before_recovery"]), "final": _scores(s["eval"]),
            "p@1_drop_points": 100 * (s["eval_dense"]["reqa"]["p@1"] - s["eval"]["reqa"]["p@1"]),
            "sentence_transformers": s.get("sentence_transformers")}


def collect(runs: Path) -> dict:
    out: dict = {"prune": [], "export": [], "static": None, "bench_grid": None, "bench_sentences": None}
    for folder in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file()):
        s = json.loads((folder / "summary.json").read_text())
        if s.get("command") == "prune":
            row = prune_row(folder.name, s)
            row["seed"] = json.loads((folder / "env.json").read_text()).get("seed")
            out["prune"].append(row)
        elif s.get("command") == "eval":
            out["dense"] = _scores(s["eval"])
        elif s.get("command") == "distill":
            out["static"] = {"student": _speed_scores(s["eval"]), "teacher": _speed_scores(s["teacher_eval"]),
                             "model2vec": s["model2vec"] if "skipped" in s["model2vec"] else
                             {**_speed_scores(s["model2vec"]), "version": s["model2vec"]["version"]},
                             "recipe": s["static"]}
    for report in sorted(runs.glob("*.json")):
        r = json.loads(report.read_text())
        if r.get("kind") == "embedding" and "accuracy" in r:
            a = r["accuracy"]
            out["export"].append({"file": report.with_suffix(".onnx").name, "model": r["config"]["model"],
                                  **{k: _scores(a[k]) for k in ("torch", "fp32", "int8") if k in a},
                                  "parity_ok": a.get("parity_ok")})
    grid = runs / "bench-grid" / "bench.json"
    if grid.is_file():
        b = json.loads(grid.read_text())
        keys = ("model", "runtime", "batch", "seq_len", "mean_ms", "throughput", "vs_baseline",
                "vs_baseline_by_round")
        out["bench_grid"] = {"threads": b.get("threads"), "load_average_1min": b.get("load_average_1min"),
                             "rows": [{k: row.get(k) for k in keys} for row in b["rows"]]}
    sentences = runs / "bench-sentences" / "bench.json"
    if sentences.is_file():
        b = json.loads(sentences.read_text())
        keys = ("timed_texts", "batch_size", "max_length", "threads", "rounds")
        out["bench_sentences"] = {k: b[k] for k in keys}
        out["bench_sentences"]["rows"] = [
            {"label": r["label"], "kind": r["kind"], "sentences_per_second": r["sentences_per_second"],
             "speedup": r["speedup"], **_scores(r["scores"])} for r in b["rows"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = collect(args.runs)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for row in result["prune"]:
        f = row["final"]
        print(f"{row['run']:<28} P@1 {100 * f['p@1']:.2f} (dense {100 * row['dense']['p@1']:.2f}, drop "
              f"{row['p@1_drop_points']:.2f}) MRR {f['mrr']:.4f} cos {f.get('cosine_to_dense', 1):.4f}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
