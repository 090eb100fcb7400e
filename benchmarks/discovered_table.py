"""Compare the table path (``bert-*`` runs) with the discovered path (``ernie-*`` runs: the same
weights as ERNIE) of benchmarks/discovered_minilm.sh; write the comparison as JSON and print it.

    python benchmarks/discovered_table.py RUNS --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import date
from pathlib import Path

from safetensors.torch import load_file


def _summary(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "summary.json").read_text())


def _scores(block: dict) -> dict:
    return {"p@1": block["reqa"]["p@1"], "mrr": block["reqa"]["mrr"],
            "mrpc_roc_auc": (block.get("pairs") or {}).get("roc_auc")}


def _masks(runs: Path, name: str) -> dict:
    return {k.removeprefix("bert.").removeprefix("ernie."): v
            for k, v in load_file(str(runs / name / "model" / "masks.safetensors")).items()}


def compare(runs: Path) -> dict:
    out: dict = {"date": date.today().isoformat(),
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip()}
    for tag in ("bert", "ernie"):
        row: dict = {"dense": _scores(_summary(runs, f"{tag}-eval")["eval"])}
        sgpt = _summary(runs, f"{tag}-sparsegpt-50")
        row["sparsegpt_50"] = {**_scores(sgpt["eval"]), "prune_seconds": sgpt.get("prune_seconds")}
        fisher = _summary(runs, f"{tag}-fisher-50")
        st = fisher["structured"]
        row["fisher_50"] = {**_scores(fisher["eval"]), "prune_seconds": fisher.get("prune_seconds"),
                            "flops_reduction": st["flops_reduction"], "layer_heads": st["layer_heads"],
                            "layer_ffn": st["layer_ffn"], "kept_heads": st["kept_heads"]}
        export = json.loads((runs / f"{tag}-fisher-50-int8.json").read_text())
        acc = export["accuracy"]
        row["fisher_50_int8"] = {**_scores(acc["int8"]), "fused_ops": export["fused_ops"],
                                 "fusion": export["fusion"],
                                 "cosine_to_fp32_mean": acc["int8"]["cosine_to_reference"]["mean"]}
        out[tag] = row
    b, e = out["bert"], out["ernie"]
    mb, me = _masks(runs, "bert-sparsegpt-50"), _masks(runs, "ernie-sparsegpt-50")
    out["same"] = {
        "dense_scores": b["dense"] == e["dense"],
        "sparsegpt_masks": sorted(mb) == sorted(me) and all(bool((mb[k] == me[k]).all()) for k in mb),
        "sparsegpt_matrices": len(mb),
        "fisher_kept_heads": b["fisher_50"]["kept_heads"] == e["fisher_50"]["kept_heads"],
        "fisher_layer_ffn": b["fisher_50"]["layer_ffn"] == e["fisher_50"]["layer_ffn"],
        "fisher_p@1_difference": e["fisher_50"]["p@1"] - b["fisher_50"]["p@1"],
        "int8_fused_ops": b["fisher_50_int8"]["fused_ops"] == e["fisher_50_int8"]["fused_ops"],
    }
    bench = json.loads((runs / "bench" / "bench.json").read_text())
    out["bench"] = {"load_average_1min": bench.get("load_average_1min"), "threads": bench.get("threads"),
                    "rows": [{k: r[k] for k in ("model", "batch", "seq_len", "median_ms", "vs_baseline")}
                             for r in bench["rows"]], "baseline": bench["baseline"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = compare(args.runs)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| path | dense P@1 | SparseGPT 50% P@1 | Fisher -50% FLOPs P@1 | int8 P@1 | int8 cosine | fused |")
    print("|---|---|---|---|---|---|---|")
    for tag in ("bert", "ernie"):
        r = result[tag]
        print(f"| {tag} | {100 * r['dense']['p@1']:.2f} | {100 * r['sparsegpt_50']['p@1']:.2f} | "
              f"{100 * r['fisher_50']['p@1']:.2f} | {100 * r['fisher_50_int8']['p@1']:.2f} | "
              f"{r['fisher_50_int8']['cosine_to_fp32_mean']:.4f} | {r['fisher_50_int8']['fused_ops']} |")
    print(json.dumps(result["same"], indent=2))
    for r in result["bench"]["rows"]:
        print(f"{r['model']:10s} {r['batch']}x{r['seq_len']}: {r['median_ms']:.2f} ms, "
              f"{r['vs_baseline']:.2f}x {result['bench']['baseline']}")


if __name__ == "__main__":
    main()
