"""SQuAD benchmark: fine-tune on the first TRAIN articles of the SQuAD v1.1 dev file, evaluate on the
next EVAL articles (default 38/10), once per objective.

The full setting (all ~8,000 training questions at --max-length 384, 2 epochs) is hours of CPU;
the knobs make a small run possible:

    python -m benchmarks qa-squad --train-limit 300 --eval-limit 200 --max-length 256 --epochs 1
    python -m benchmarks qa-squad --objectives plain,pfa,hl-aacl            # the full comparison
    python -m benchmarks qa-squad --model artifacts/prune/<run>             # a pruned encoder
"""

from __future__ import annotations

import json
import os
import time

COMMON = ("data_dir", "seeds")


def add_arguments(p) -> None:
    p.add_argument("--model", default="minilm")
    p.add_argument("--split-by-article", default="38/10")
    p.add_argument("--objectives", default="plain", help="comma list of plain, pfa, hl-aacl")
    p.add_argument("--pfa-alignment", default="cosine")
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--doc-stride", type=int, default=None)
    p.add_argument("--train-limit", type=int, default=None, help="training questions (default: all)")
    p.add_argument("--eval-limit", type=int, default=None, help="eval questions (default: all)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=16)


def budget(args) -> str:
    steps = f"{args.max_steps} steps" if args.max_steps else f"{args.epochs:g} epochs"
    return (f"one fine-tune per objective ({args.objectives}) x seed: {steps} on {args.train_limit or 'all'} "
            f"training questions at length {args.max_length}; {args.eval_limit or 'all'} eval questions")


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        print(f"# fine-tune on SQuAD {args.split_by_article} once per objective {args.objectives}")
        return None
    from compress.api.finetuning import FinetuneConfig
    from compress.cli.finetune import finetune_task as run_finetune  # the recipe of the task's family

    os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")

    results = []
    for seed, objective in [(sd, o) for sd in args.seeds for o in args.objectives.split(",") if o]:
        cfg = FinetuneConfig(task="squad", model=args.model, data_dir=args.data_dir,
                             split_by_article=args.split_by_article, objective=objective,
                             pfa_alignment=args.pfa_alignment, max_length=args.max_length,
                             doc_stride=args.doc_stride, train_limit=args.train_limit,
                             eval_limit=args.eval_limit, epochs=args.epochs, max_steps=args.max_steps,
                             lr=args.lr, batch_size=args.batch_size, seed=seed, eval_batch_size=64,
                             name=f"bench-squad-{objective}")
        t0 = time.time()
        run = run_finetune(cfg)
        summary = json.loads((run / "summary.json").read_text())
        results.append({"objective": objective, "seed": seed, "run": str(run),
                        "seconds": round(time.time() - t0, 1),
                        "exact_match": summary["eval"]["exact_match"], "f1": summary["eval"]["f1"],
                        "train_questions": summary["train_questions"],
                        "train_windows": summary["train_windows"],
                        "eval_questions": summary["eval_questions"], "steps": summary["steps"]})
    for r in results:
        print(f"{r['objective']:>8}: EM {r['exact_match']:.2f}  F1 {r['f1']:.2f}  "
              f"({r['train_questions']} train questions, {r['steps']} steps, {r['seconds']:.0f}s)")
    return {"results": results}
