"""Distillation-aware pruning against plain pruning: the same pruning run with and without
``--teacher`` for each cell and seed, on the same budget, compared seed by seed. The JSON is
rewritten after every run so a stopped benchmark keeps what it measured; a run whose folder
(WORK/CELL-kd|plain-sSEED) already has a summary.json is read, not rerun, so give each training
budget its own --work.

Each run starts from the fine-tuned dense model (``--model TEACHER``) and prunes it while it keeps
training on the task (``--stage finetune``, gradual schedule over the first half); the KD side adds
``--teacher self``: the same dense model as teacher. The dense reference is that model's own dev
score.

    python -m benchmarks prune-kd-pairs --teacher artifacts/kd-prune/teacher --task sst2 \
        --train-limit 20000 --cells u60,u80,s40 --seeds 42 --extra-seeds-cell u60 --extra-seeds 1,2 \
        --work artifacts/kd-prune/runs-20k
"""

from __future__ import annotations

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("data_dir", "seeds", "work")

CELLS = {  # name -> PruneConfig options
    "u60": {"sparsity": 0.6},
    "u80": {"sparsity": 0.8},
    "s40": {"sparsity": 0.4, "structured": ("heads", "ffn")},
}


def add_arguments(p) -> None:
    p.add_argument("--teacher", required=True, help="the fine-tuned dense run (start and teacher)")
    p.add_argument("--task", default="sst2")
    p.add_argument("--train-limit", type=int, default=20000)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--cells", default="u60,u80,s40", help=f"comma-separated, of: {', '.join(CELLS)}")
    p.add_argument("--extra-seeds-cell", default="u60", help="the cell that gets --extra-seeds too")
    p.add_argument("--extra-seeds", default="", help="seeds run after every cell's --seeds")


def plan(args) -> list[tuple[str, int]]:
    cells = [c for c in args.cells.split(",") if c]
    if set(cells) - set(CELLS):
        raise BenchmarkError(f"--cells takes {', '.join(CELLS)}, got {args.cells}")
    return ([(c, s) for s in args.seeds for c in cells]
            + [(args.extra_seeds_cell, int(s)) for s in args.extra_seeds.split(",") if s])


def budget(args) -> str:
    return (f"{2 * len(plan(args))} prune runs ({len(plan(args))} pairs: cell x seed, plain and KD), each "
            f"{args.epochs:g} epoch(s) over {args.train_limit} {args.task} examples at length "
            f"{args.max_length}")


def run(args, ctx) -> dict | None:
    from compress.api.prune_stages import PruneConfig
    from compress.cli.prune import run_prune
    from compress.report.analysis import paired_comparison

    pairs = plan(args)
    dense = None if ctx.dry_run else read_json(args.teacher + "/summary.json")["eval"]["score"]
    result = {"task": args.task, "teacher": args.teacher, "dense_score": dense,
              "train_limit": args.train_limit, "epochs": args.epochs, "max_length": args.max_length,
              "runs": []}
    for cell, seed in pairs:
        for kd in (False, True):
            name = f"{cell}-{'kd' if kd else 'plain'}-s{seed}"
            folder = args.work / name
            if (folder / "summary.json").is_file():
                print(f"{name}: finished earlier, read")
            else:
                cfg = PruneConfig(model=args.teacher, task=args.task, data_dir=args.data_dir,
                                  train_limit=args.train_limit, epochs=args.epochs,
                                  max_length=args.max_length, seed=seed, out=str(folder),
                                  teacher="self" if kd else None, **CELLS[cell])
                ctx.call(name, run_prune, cfg)
            if ctx.dry_run:
                continue
            s = read_json(folder / "summary.json")
            result["runs"].append({"cell": cell, "kd": kd, "seed": seed, "score": s["eval"]["score"],
                                   "drop_vs_dense": dense - s["eval"]["score"],
                                   "wall_s": ctx.timings().get(name), "train_seconds": s.get("train_seconds"),
                                   "sparsity": s["sparsity"], "distillation": s.get("distillation"),
                                   "run": str(folder)})
            comparisons = {}
            for c in {r["cell"] for r in result["runs"]}:
                a = {r["seed"]: r["score"] for r in result["runs"] if r["cell"] == c and r["kd"]}
                b = {r["seed"]: r["score"] for r in result["runs"] if r["cell"] == c and not r["kd"]}
                if set(a) & set(b):
                    comparisons[c] = paired_comparison(a, b)
            result["kd_minus_plain"] = comparisons
            ctx.save(result)
            print(f"{name}: {s['eval']['score']:.4f} (dense {dense:.4f})", flush=True)
    return None if ctx.dry_run else result
