"""Data-aware one-shot pruning of a fine-tuned model against one-shot magnitude pruning, with and
without a short distillation recovery: the grid of ``compress prune --stage post-training`` runs,
one after the other, each row written to the JSON as soon as its run ends (a re-run skips the
finished rows).

    python benchmarks/oneshot_post_training.py --dense artifacts/dap/dense --task sst2 \\
        --data-dir ../shared/data --train-limit 20000 --runs-dir artifacts/dap/runs \\
        --out artifacts/benchmarks/oneshot_sst2.json
    python benchmarks/oneshot_post_training.py --dense SQUAD_RUN --task squad --data-dir ../shared/data \\
        --split-by-article 38/10 --max-length 256 --only sparsegpt-50,wanda-50,magnitude-50 \\
        --runs-dir RUNS --out artifacts/benchmarks/oneshot_squad.json

The encoder's matrices are pruned (``--exclude role:word_embeddings``, the post-training default
anyway; ``--with-embeddings`` adds the word embeddings with ``--include role:word_embeddings``,
pruned by magnitude whatever the criterion). Cells (``--cells``, comma-separated;
default all, in this order):
- ``oneshot``: sparsegpt, wanda and magnitude at 50%, 60%, 70% and 2:4, no training after pruning;
- ``recovery``: sparsegpt at 60%, 70%, 80% and 2:4, then ``--recovery-steps`` (250) steps
  distilling from the dense model (``--teacher self``);
- ``structured``: heads and FFN neurons by Fisher search at 40% fewer encoder FLOPs, one-shot and
  with the same recovery.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def grid(recovery_steps: int) -> dict[str, list[tuple[str, list[str]]]]:
    """Cell group -> [(run name, prune flags)]."""
    amounts = [("50", ["--sparsity", "0.5"]), ("60", ["--sparsity", "0.6"]), ("70", ["--sparsity", "0.7"]),
               ("2of4", ["--pattern", "2:4"])]
    recover = ["--recovery-steps", str(recovery_steps), "--teacher", "self"]
    fisher = ["--structured", "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.4"]
    return {
        "oneshot": [(f"{c}-{name}", ["--criterion", c, *flags]) for c in ("sparsegpt", "wanda", "magnitude")
                    for name, flags in amounts],
        "recovery": [(f"sparsegpt-{name}-kd{recovery_steps}", ["--criterion", "sparsegpt", *flags, *recover])
                     for name, flags in amounts[1:] + [("80", ["--sparsity", "0.8"])]],
        "structured": [("fisher-flops40", fisher),
                       (f"fisher-flops40-kd{recovery_steps}", [*fisher, *recover])],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--dense", required=True, help="the fine-tuned run folder to prune")
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--train-limit", type=int, default=20000)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--calibration-samples", type=int, default=512)
    p.add_argument("--recovery-steps", type=int, default=250)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--with-embeddings", action="store_true",
                   help="prune the word embeddings too (by magnitude); default: the encoder matrices only")
    p.add_argument("--split-by-article", default=None, help="passed on (squad: e.g. 38/10)")
    p.add_argument("--cells", default="oneshot,recovery,structured")
    p.add_argument("--only", default=None, help="comma-separated run names of those cells to run, in order")
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cells = grid(args.recovery_steps)
    out, runs = Path(args.out), Path(args.runs_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    record = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    record["config"] = vars(args)
    done = {r["name"] for r in record["rows"]}
    only = args.only.split(",") if args.only else None
    chosen = [(g, name, flags) for g in args.cells.split(",") for name, flags in cells[g]]
    if only is not None:
        unknown = sorted(set(only) - {name for _, name, _ in chosen})
        if unknown:
            p.error(f"--only names no run of --cells {args.cells}: {unknown}")
        chosen = sorted((c for c in chosen if c[1] in only), key=lambda c: only.index(c[1]))
    for group, name, flags in chosen:
        if name in done:
            continue
        run = runs / name
        cmd = [sys.executable, "-m", "compress", "prune", "--stage", "post-training", "--model",
               args.dense, "--task", args.task, "--data-dir", args.data_dir, "--train-limit",
               str(args.train_limit), "--max-length", str(args.max_length), "--calibration-samples",
               str(args.calibration_samples), "--seed", str(args.seed), *flags, "--out", str(run)]
        if args.split_by_article:
            cmd[-2:-2] = ["--split-by-article", args.split_by_article]
        if not args.with_embeddings and "--structured" not in flags:
            cmd[-2:-2] = ["--exclude", "role:word_embeddings"]
        elif "--structured" not in flags:
            cmd[-2:-2] = ["--include", "role:word_embeddings"]
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        row = {"name": name, "group": group, "cmd": " ".join(cmd[2:]), "rc": proc.returncode,
               "wall_s": round(time.time() - t0, 1)}
        if proc.returncode == 0:
            s = json.loads((run / "summary.json").read_text())
            row.update(dense=s["eval_dense"]["score"], oneshot=s["eval_pruned_before_recovery"]["score"],
                       final=s["eval"]["score"], recovery_steps=s["recovery_steps"],
                       prune_seconds=s["prune_seconds"], sparsity=s.get("sparsity"),
                       calibration=s.get("calibration"), structured=(s.get("structured") or {}).get(
                           "flops_reduction"))
            row["metrics"] = {k: s[k] for k in ("eval_dense", "eval_pruned_before_recovery", "eval")}
            row["drop_oneshot"] = round(100 * (row["oneshot"] - row["dense"]), 2)
            row["drop_final"] = round(100 * (row["final"] - row["dense"]), 2)
        else:
            row["stderr"] = proc.stderr[-2000:]
        record["rows"].append(row)
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"{name}: rc {row['rc']}, dense {row.get('dense')}, one-shot {row.get('oneshot')}, "
              f"final {row.get('final')} ({row['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
