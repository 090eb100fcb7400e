"""The reduced Gordon et al. sweep for a 2-core CPU: MiniLM; SST-2 (the first --train-limit training
sentences, the full 872-sentence dev set) and RTE (the full 277-pair dev set); sparsities 0, 0.2,
0.4, 0.6, 0.8; magnitude vs random pruning during --pretrain-steps steps of masked-LM pre-training
on WikiText-2, then --steps fine-tuning steps per task. 9 pre-training cells (dense + 4 sparsities
x 2 criteria) + 18 fine-tuning cells, then `compress report`.

Resumable: run the same command again (same --work); `compress sweep` keeps finished cells.

Time: measured 2026-11-23 with the defaults and one thread (OMP_NUM_THREADS=1) while two other jobs
shared the 2 cores: 9 pre-training cells of 71-82 s and 18 fine-tuning cells of 230-370 s (SST-2)
and 370-500 s (RTE), about 2 hours in all. --jobs 2 on an idle machine runs two cells at a time.
50 fine-tuning steps (the first setting) took 34 minutes but are too few for the pruned models to
recover: SST-2 then fell from 20% sparsity for both criteria.
"""

from __future__ import annotations

from benchmarks.suite import read_json

COMMON = ("data_dir", "work", "python")


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=300, help="fine-tuning steps per cell")
    p.add_argument("--pretrain-steps", type=int, default=30)
    p.add_argument("--train-limit", type=int, default=5000)
    p.add_argument("--lr", default="1e-4")
    p.add_argument("--jobs", type=int, default=1)


def budget(args) -> str:
    return (f"27 cells: {args.pretrain_steps} MLM steps per pre-training cell, {args.steps} fine-tuning "
            f"steps per task cell on {args.train_limit} SST-2 sentences and RTE, one seed")


def run(args, ctx) -> dict | None:
    data = args.data_dir
    ctx.compress("sweep", [
        "sweep", "--model", "minilm", "--data-dir", data,
        "--tasks", "sst2,rte", "--sparsities", "0,0.2,0.4,0.6,0.8", "--variants", "magnitude,random",
        "--lrs", args.lr, "--train-limit", args.train_limit, "--max-steps", args.steps, "--batch-size", 16,
        "--max-length", 64, "--pretrain-corpus", f"{data}/wikitext2", "--pretrain-steps", args.pretrain_steps,
        "--pretrain-lr", "1e-4", "--pretrain-batch-size", 16, "--pretrain-max-length", 64,
        "--pretrain-heldout-blocks", 64, "--jobs", args.jobs, "--out", args.work])
    ctx.compress("report", ["report", args.work])
    if ctx.dry_run:
        return None
    report = args.work / "report.md"
    summary = args.work / "sweep.json"
    return {"report": str(report), "report_md": report.read_text() if report.is_file() else None,
            "sweep": read_json(summary) if summary.is_file() else None, "timings": ctx.timings()}
