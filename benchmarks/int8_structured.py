"""What dynamic int8 costs a Fisher-structured model, per pruning variant: each variant is one
``compress prune --stage post-training --structured heads,ffn --criterion fisher`` run, then two
``compress export --optimize --quantize int8 --task`` runs (one int8 scale per output column of each
weight matrix, the default, and ``--per-tensor``), each scoring the fp32 and the int8 graph on the
dev set. Rows go to the JSON as
soon as they end (a re-run skips the finished ones).

    python benchmarks/int8_structured.py --model /work/bench/teacher/RUN --data-dir ../shared/data \\
        --runs-dir artifacts/int8_structured --out artifacts/int8_structured.json

Variants (``--only``, comma-separated; default all, in this order):
- ``dense``: the fine-tuned model itself, exported only;
- ``no-tuning``: search and rearrangement, every kept unit at scale 1 (``--no-mask-tuning``);
- ``unbounded-20swaps``: least-squares scales without a bound, rearrangement stopped after 20
  swaps per block (the pipeline before the bound and the convergence);
- ``unbounded``: no bound, rearrangement to convergence;
- ``bound10-20swaps``, ``bound10``: scales within [-10, 10] (Kwon et al.'s limit), 20 swaps or
  convergence;
- ``bound2``: scales within [-2, 2].

``--by-role dense,unbounded-20swaps`` adds, for those variants, which matrices the int8 error comes
from: the optimized fp32 export (``compress export --optimize``), then int8 of one role's nodes
only (embeddings, fused QKV attention, attention output, FFN input, FFN output; the others left
in float32, ``quantize_int8(exclude=...)``), per tensor and per channel, each scored on the dev
set against the fp32 graph. Node roles are read from the exported BERT graph's node names.

Per row: the PyTorch dev score after pruning (the prune run's own evaluation), the range of the
tuned head and neuron scales, the block-Fisher removal cost before and after rearrangement, and
per export the onnxruntime fp32 and int8 dev scores, their argmax agreement on the dev set and on
the parity check's random inputs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, list[str] | None] = {
    "dense": None,
    "no-tuning": ["--no-mask-tuning"],
    "unbounded-20swaps": ["--scale-bound", "0", "--max-swaps", "20"],
    "unbounded": ["--scale-bound", "0"],
    "bound10-20swaps": ["--scale-bound", "10", "--max-swaps", "20"],
    "bound10": ["--scale-bound", "10"],
    "bound2": ["--scale-bound", "2"],
}
EXPORTS = {"per-channel": [], "per-tensor": ["--per-tensor"]}


def run(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "compress", *cmd], cwd=ROOT, capture_output=True, text=True)
    return proc, round(time.time() - t0, 1)


def scale_range(masks: list[list[float]]) -> list[float]:
    """[min, max] of the kept units' mask values (removed units are 0)."""
    kept = [v for layer in masks for v in layer if v != 0]
    return [min(kept), max(kept)] if kept else []


def prune_row(summary: dict) -> dict:
    s = summary["structured"]
    return {"dense_torch": summary["eval_dense"]["score"],
            "pruned_torch": summary["eval_pruned_before_recovery"]["score"],
            "flops_reduction": s["flops_reduction"], "layer_heads": s["layer_heads"],
            "layer_ffn": s["layer_ffn"], "head_scales": scale_range(s["head_masks"]),
            "neuron_scales": scale_range(s["neuron_masks"]), "removal_cost": s.get("removal_cost"),
            "scale_bound": s.get("scale_bound"), "max_swaps": s.get("max_swaps"),
            "prune_seconds": summary["prune_seconds"]}


def export_row(report: dict) -> dict:
    acc = report["accuracy"]
    parity = report["parity_int8"]
    return {"fp32": acc["fp32"]["score"], "int8": acc["int8"]["score"],
            "drop": round(100 * (acc["int8"]["score"] - acc["fp32"]["score"]), 2),
            "dev_agreement": acc["int8"].get("argmax_agreement"),
            "dev_max_abs_diff": acc["int8"].get("max_abs_diff"),
            "dev_mean_abs_diff": acc["int8"].get("mean_abs_diff"),
            "random_agreement": parity["argmax_agreement"],
            "random_max_abs_diff": max(parity["max_abs_diff"].values())}


ROLES = {"embeddings": "EmbedLayerNormalization", "qkv": "Attention_", "attn_out": "/attention/output/dense/",
         "ffn_in": "/intermediate/dense/", "ffn_out": "/output/dense/"}


def role_of(node_name: str) -> str | None:
    """The matrix role of a quantizable node of an optimized BERT export, by its name (the
    attention output's pattern is tried before the FFN output's, which it contains)."""
    return next((r for r, part in ROLES.items() if part in node_name), None)


def by_role(model: str, name: str, runs: Path, args) -> dict:
    """Dev score, argmax agreement and mean |logit diff| against fp32 when only one role is int8."""
    import numpy as np
    import onnx
    from transformers import AutoTokenizer

    from compress.export.quantize import quantize_int8
    from compress.recipes.export import agreement, ort_accuracy
    from compress.recipes.finetune import TaskDataConfig, load_task_data

    fp32 = runs / f"{name}-fp32.onnx"
    if not fp32.is_file():
        proc, _ = run(["export", model, "--to", str(fp32), "--optimize"])
        if proc.returncode != 0:
            return {"rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    spec, data = load_task_data(TaskDataConfig(task=args.task, data_dir=args.data_dir), ("eval",))
    tok = AutoTokenizer.from_pretrained(next(p for p in (Path(model) / "model", Path(model))
                                             if (p / "tokenizer.json").is_file()))
    ref = ort_accuracy(fp32, tok, spec, data["eval"], args.max_length, with_logits=True)
    ref_logits = ref.pop("logits")
    inits = {i.name for i in onnx.load(str(fp32)).graph.initializer}
    nodes = {n.name: role_of(n.name) for n in onnx.load(str(fp32)).graph.node
             if n.op_type in ("MatMul", "Attention", "EmbedLayerNormalization")
             and any(i in inits for i in n.input)}
    out: dict = {"fp32": ref["score"]}
    for scales in ("per-channel", "per-tensor"):
        for role in ("all", *ROLES):
            others = tuple(n for n, r in nodes.items() if role != "all" and r != role)
            q = quantize_int8(fp32, runs / f"{name}-only-{role}-{scales}.onnx",
                              per_channel=scales == "per-channel", exclude=others)
            acc = ort_accuracy(q, tok, spec, data["eval"], args.max_length, with_logits=True)
            out[f"{role} {scales}"] = {"int8": acc["score"], **agreement(acc.pop("logits"), ref_logits)}
            print(f"  {name}: only {role} {scales}: {out[f'{role} {scales}']}", flush=True)
            q.unlink()
    out["relative_mean_abs_diff_note"] = f"fp32 mean |logit| {float(np.abs(ref_logits).mean()):.3f}"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", required=True, help="the fine-tuned run folder to prune")
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--flops-reduction", type=float, default=0.6)
    p.add_argument("--calibration-samples", type=int, default=256)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--only", default=None, help="comma-separated variants, in this order")
    p.add_argument("--by-role", default="", help="comma-separated variants whose int8 error is split "
                                                  "by matrix role (after the grid)")
    p.add_argument("--runs-dir", default=str(ROOT / "artifacts" / "int8_structured"))
    p.add_argument("--out", default=str(ROOT / "artifacts" / "int8_structured.json"))
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else list(VARIANTS)
    unknown = sorted((set(names) | set(filter(None, args.by_role.split(",")))) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from: {', '.join(VARIANTS)}")
    out, runs = Path(args.out), Path(args.runs_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    record = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    record["config"] = vars(args)
    done = {r["name"] for r in record["rows"] if r.get("rc") == 0}
    record["rows"] = [r for r in record["rows"] if r["name"] in done]
    for name in names:
        if name in done:
            continue
        flags = VARIANTS[name]
        row: dict = {"name": name, "prune_flags": flags, "rc": 0}
        model = args.model
        if flags is not None and (runs / name / "summary.json").is_file():  # kept from an earlier run
            model = str(runs / name)
            row.update(prune_row(json.loads((Path(model) / "summary.json").read_text())))
        elif flags is not None:
            model = str(runs / name)
            proc, wall = run(["prune", "--stage", "post-training", "--model", args.model, "--task", args.task,
                              "--data-dir", args.data_dir, "--structured", "heads,ffn", "--criterion",
                              "fisher", "--flops-reduction", str(args.flops_reduction),
                              "--calibration-samples", str(args.calibration_samples), "--max-length",
                              str(args.max_length), "--seed", str(args.seed), *flags, "--out", model])
            row["prune_wall_s"] = wall
            if proc.returncode != 0:
                row.update(rc=proc.returncode, stderr=proc.stderr[-2000:])
            else:
                row.update(prune_row(json.loads((Path(model) / "summary.json").read_text())))
        for kind, extra in EXPORTS.items():
            if row["rc"] != 0:
                break
            onnx = runs / f"{name}-int8-{kind}.onnx"
            if onnx.with_suffix(".json").is_file():
                row[kind] = export_row(json.loads(onnx.with_suffix(".json").read_text()))
                continue
            proc, wall = run(["export", model, "--to", str(onnx), "--optimize", "--quantize", "int8", *extra,
                              "--task", args.task, "--data-dir", args.data_dir, "--max-length",
                              str(args.max_length)])
            if proc.returncode != 0:
                row.update(rc=proc.returncode, stderr=proc.stderr[-2000:])
                break
            row[kind] = {**export_row(json.loads(onnx.with_suffix(".json").read_text())), "wall_s": wall}
        record["rows"].append(row)
        out.write_text(json.dumps(record, indent=2) + "\n")
        summary = ", ".join(f"{k} fp32 {row[k]['fp32']:.4f} int8 {row[k]['int8']:.4f} "
                            f"(agree {row[k]['dev_agreement']})" for k in EXPORTS if k in row)
        print(f"{name}: rc {row['rc']}; {summary}", flush=True)
    for name in filter(None, args.by_role.split(",")):
        if name in record.get("by_role", {}):
            continue
        model = args.model if VARIANTS[name] is None else str(runs / name)
        record.setdefault("by_role", {})[name] = by_role(model, name, runs, args)
        out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
