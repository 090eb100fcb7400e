"""The packaged all-MiniLM-L6-v2 compressed as an embedding model, end to end, with no fine-tuning:
scored as is on ReQA (SQuAD dev, the last 10 of 48 articles) and MRPC dev pairs; pruned one-shot
(SparseGPT over --seeds calibration draws, SparseGPT with 2048 sentences, Wanda, magnitude at 50%),
calibrated on WikiText-2 sentences; a structured model aimed at --speedup times the dense int8
speed (latency table of this machine) and recovered by --recovery-steps of embedding distillation
three ways (embeddings alone, plus the layer-wise MSE, embeddings alone at lr 2e-4); the dense and
structured models exported to int8 ONNX with their embedding parity; the static student beside
Model2Vec; one fixed-shape bench (batch 1 and 32 x 128 tokens, int8 graphs in onnxruntime) and one
bench on real sentences (sentences/s with scores).

Each step is skipped when its run folder (under WORK/runs) or file is there already, so the
benchmark can be stopped and run again. Results: every run's scores, the exports' parity, both
benches: rows of every pruned run (its dense, one-shot and final scores, cosine to the dense
embeddings, seconds, the sentence-transformers reload check), every export (the scores of the
PyTorch model and of each graph, the mean cosine of the written graph to PyTorch), the fixed-shape
bench (sequences/s of each graph at each batch size, and the ratio to the first) and the bench on
real sentences.
"""

from __future__ import annotations

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


COMMON = ("data_dir", "seeds", "work", "python")
SEEDS = "42,1,2"


def add_arguments(p) -> None:
    p.add_argument("--speedup", default="2", help="the structured target (x dense int8)")
    p.add_argument("--recovery-steps", type=int, default=500)


def budget(args) -> str:
    return (f"one-shot prunes at 512 calibration sentences (SparseGPT over seeds "
            f"{','.join(map(str, args.seeds))}) and 2048; one structured prune at {args.speedup}x with "
            f"three recoveries of {args.recovery_steps} steps; three int8 exports; two bench runs (5 rounds; "
            f"3 rounds on real sentences)")


def run(args, ctx) -> dict | None:
    runs = args.work / "runs"
    data = ["--task", "embedding", "--data-dir", args.data_dir, "--split-by-article", "38/10"]

    def step(name: str, argv: list) -> None:
        ctx.compress(name, [*argv, "--out", runs / name], log=runs / f"{name}.log",
                     done=(runs / name / "summary.json", runs / name / "bench.json"))

    def export(name: str, model) -> None:
        onnx = runs / f"{name}.onnx"
        ctx.compress(name, ["export", model, "--to", onnx, "--optimize", "--quantize", "int8", *data],
                     log=runs / f"{name}.log", done=(onnx,))

    step("dense-eval", ["eval", "--model", "minilm", *data])
    post = ["prune", "--stage", "post-training", "--model", "minilm", *data]
    # the same structured prune (same seed, same Fisher), three recoveries: embeddings alone at the
    # default rate, plus the layer-wise MSE of the kept layers, and embeddings alone at 4x the rate
    s = f"structured-{args.speedup}x"
    structured = ["--structured", "heads,ffn", "--criterion", "fisher", "--speedup", args.speedup,
                  "--recovery-steps", args.recovery_steps]
    step(s, [*post, *structured])
    step(f"{s}-layers", [*post, *structured, "--teacher", "self", "--kd-layers", 1])
    step(f"{s}-lr2e-4", [*post, *structured, "--lr", "2e-4"])
    export("dense-int8", "minilm")
    for m in (s, f"{s}-lr2e-4"):
        export(f"{m}-int8", runs / m)
    for seed in args.seeds:
        step(f"sparsegpt-50-seed{seed}", [*post, "--criterion", "sparsegpt", "--sparsity", 0.5,
                                          "--seed", seed])
    step("sparsegpt-50-2048", [*post, "--criterion", "sparsegpt", "--sparsity", 0.5,
                               "--calibration-samples", 2048])
    step("wanda-50", [*post, "--criterion", "wanda", "--sparsity", 0.5])
    step("magnitude-50", [*post, "--criterion", "magnitude", "--sparsity", 0.5])
    step("static-256", ["distill", "--student", "static", "--teacher", "minilm", *data])
    graphs = [f"dense-int8={runs / 'dense-int8.onnx'}", f"structured-int8={runs / f'{s}-int8.onnx'}",
              f"structured-lr2e-4-int8={runs / f'{s}-lr2e-4-int8.onnx'}"]
    step("bench-grid", ["bench", *graphs, "--batch-sizes", "1,32", "--seq-lens", "128", "--runtimes", "ort",
                        "--provider", "cpu", "--rounds", 5])
    step("bench-sentences", ["bench", "--task", "embedding", "dense-torch=minilm", *graphs,
                             f"static={runs / 'static-256'}", *data[2:]])
    if ctx.dry_run:
        return None
    return {**collect(runs), "timings": ctx.timings()}
