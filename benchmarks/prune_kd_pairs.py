"""Distillation-aware pruning against plain pruning: the same pruning run with and without
``--teacher`` for each cell and seed, on the same budget, compared seed by seed. One JSON to
artifacts/benchmarks/, rewritten after every run so a stopped benchmark keeps what it measured.

Each run starts from the fine-tuned dense model (``--model TEACHER``) and prunes it while it keeps
training on the task (``--stage finetune``, gradual schedule over the first half); the KD side adds
``--teacher self``: the same dense model as teacher. The dense reference is that model's own dev
score.

    python benchmarks/prune_kd_pairs.py --teacher artifacts/kd-prune/teacher --task sst2 \
        --data-dir ../shared/data --train-limit 20000 --cells u60,u80,s40 --seeds 42 \
        --extra-seeds-cell u60 --extra-seeds 1,2 --runs-dir artifacts/kd-prune/runs-20k
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compress.core.runs import artifacts_root, environment, write_json  # noqa: E402
from compress.recipes.prune import PruneConfig  # noqa: E402
from compress.recipes.prune_run import run_prune  # noqa: E402
from compress.report.analysis import paired_comparison  # noqa: E402

CELLS = {  # name -> PruneConfig options
    "u60": {"sparsity": 0.6},
    "u80": {"sparsity": 0.8},
    "s40": {"sparsity": 0.4, "structured": ("heads", "ffn")},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", required=True, help="the fine-tuned dense run (start and teacher)")
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--train-limit", type=int, default=20000)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--cells", default="u60,u80,s40", help=f"comma-separated, of: {', '.join(CELLS)}")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--extra-seeds-cell", default="u60", help="the cell that gets --extra-seeds too")
    ap.add_argument("--extra-seeds", default="", help="seeds run after every cell's --seeds")
    ap.add_argument("--runs-dir", default=None,
                    help="where the pruned runs go (default artifacts/kd-prune/runs); a run whose "
                         "folder already has a summary.json is read, not rerun, so give each "
                         "budget its own folder")
    ap.add_argument("--out", default=None,
                    help="JSON path (default artifacts/benchmarks/prune_kd_pairs.json)")
    args = ap.parse_args()

    out = Path(args.out) if args.out else artifacts_root() / "benchmarks" / "prune_kd_pairs.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(args.runs_dir) if args.runs_dir else artifacts_root() / "kd-prune" / "runs"
    teacher_summary = json.loads((Path(args.teacher) / "summary.json").read_text())
    dense = teacher_summary["eval"]["score"]
    plan = [(c, int(s)) for s in args.seeds.split(",") for c in args.cells.split(",")]
    plan += [(args.extra_seeds_cell, int(s)) for s in args.extra_seeds.split(",") if s]
    result = {"task": args.task, "teacher": args.teacher, "dense_score": dense,
              "train_limit": args.train_limit, "epochs": args.epochs, "max_length": args.max_length,
              "runs": [], "env": environment()}
    for cell, seed in plan:
        for kd in (False, True):
            name = f"{cell}-{'kd' if kd else 'plain'}-s{seed}"
            folder = runs_dir / name
            if not (folder / "summary.json").is_file():
                cfg = PruneConfig(model=args.teacher, task=args.task, data_dir=args.data_dir,
                                  train_limit=args.train_limit, epochs=args.epochs,
                                  max_length=args.max_length,
                                  seed=seed, out=str(folder), teacher="self" if kd else None,
                                  **CELLS[cell])
                t0 = time.time()
                run_prune(cfg)
                wall = round(time.time() - t0, 1)
            else:
                wall = None  # finished by an earlier invocation
            s = json.loads((folder / "summary.json").read_text())
            result["runs"].append({"cell": cell, "kd": kd, "seed": seed, "score": s["eval"]["score"],
                                   "drop_vs_dense": dense - s["eval"]["score"], "wall_s": wall,
                                   "train_seconds": s.get("train_seconds"),
                                   "sparsity": s["sparsity"], "distillation": s.get("distillation"),
                                   "run": str(folder)})
            comparisons = {}
            for c in {r["cell"] for r in result["runs"]}:
                a = {r["seed"]: r["score"] for r in result["runs"] if r["cell"] == c and r["kd"]}
                b = {r["seed"]: r["score"] for r in result["runs"] if r["cell"] == c and not r["kd"]}
                if set(a) & set(b):
                    comparisons[c] = paired_comparison(a, b)
            result["kd_minus_plain"] = comparisons
            write_json(out, result)
            print(f"{name}: {s['eval']['score']:.4f} (dense {dense:.4f}) wall {wall}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
