"""ReQA benchmark on held-out SQuAD articles: BM25, the dual encoder before training (zero-shot),
the dual encoder fine-tuned on gold pairs, and the dual encoder with cross-attention mined pairs.
P@1/5/10 and MRR.

    python -m benchmarks reqa --train-limit 500 --eval-limit 300 --epochs 1     # small run
    python -m benchmarks reqa                                                     # 38/10, all
"""

from __future__ import annotations

import json
import os
import time

from benchmarks.suite import BenchmarkError

COMMON = ("data_dir", "seeds")
SYSTEMS = ("bm25", "zero-shot", "dual-encoder", "mined")


def add_arguments(p) -> None:
    p.add_argument("--model", default="minilm")
    p.add_argument("--teacher", default="minilm", help="cross-encoder run folder, or an encoder to train")
    p.add_argument("--split-by-article", default="38/10")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--train-limit", type=int, default=None)
    p.add_argument("--eval-limit", type=int, default=None)
    p.add_argument("--teacher-train-limit", type=int, default=None)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--teacher-epochs", type=float, default=None,
                   help="the cross-encoder's epochs (default: compress's ReQA mining default)")
    p.add_argument("--teacher-lr", type=float, default=None,
                   help="the cross-encoder's learning rate (default: compress's ReQA mining default)")
    p.add_argument("--unlabeled-questions", type=int, default=0,
                   help="mined system: this many training questions after --train-limit, gold hidden")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)


def budget(args) -> str:
    return (f"systems {args.systems}: dual encoders {args.epochs:g} epochs on {args.train_limit or 'all'} "
            f"training questions (+{args.unlabeled_questions} unlabelled), seed {args.seeds[0]}; "
            f"{args.eval_limit or 'all'} eval questions")


def run(args, ctx) -> dict | None:
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise BenchmarkError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    if ctx.dry_run:
        print(f"# ReQA {args.split_by_article}: {', '.join(systems)}")
        return None
    from compress.api.finetuning import FinetuneConfig
    from compress.cli.finetune import finetune_task as run_finetune  # the recipe of the task's family
    from compress.recipes.reqa_mining import ReQAMiningConfig, run_reqa_mining_distill
    from compress.retrieval.dual_encoder import load_dual_encoder
    from compress.retrieval.finetuning import bm25_metrics, dual_encoder_metrics, load_reqa_data

    os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")
    teacher_epochs = ReQAMiningConfig.teacher_epochs if args.teacher_epochs is None else args.teacher_epochs
    teacher_lr = ReQAMiningConfig.teacher_lr if args.teacher_lr is None else args.teacher_lr

    common = dict(task="reqa", model=args.model, data_dir=args.data_dir,
                  split_by_article=args.split_by_article, train_limit=args.train_limit,
                  eval_limit=args.eval_limit, epochs=args.epochs,
                  max_length=args.max_length, batch_size=args.batch_size, lr=args.lr, seed=args.seeds[0])
    cfg = FinetuneConfig(**common, name="bench-reqa")
    results = {}
    t0 = time.time()
    ev = load_reqa_data(cfg, ("dev",))["dev"]
    if "bm25" in systems:
        results["bm25"] = bm25_metrics(ev)
    if "zero-shot" in systems:
        model, tok, _ = load_dual_encoder(args.model)
        results["zero-shot"] = dual_encoder_metrics(model, tok, ev, args.max_length, 128)
    if "dual-encoder" in systems:
        run = run_finetune(cfg)
        s = json.loads((run / "summary.json").read_text())
        results["dual-encoder"] = {**s["eval"], "run": str(run), "train_pairs": s["train_pairs"]}
    if "mined" in systems:
        mcfg = ReQAMiningConfig(**common, teacher=args.teacher, teacher_epochs=teacher_epochs,
                                teacher_lr=teacher_lr, unlabeled_questions=args.unlabeled_questions,
                                teacher_train_limit=args.teacher_train_limit, name="bench-reqa-mined")
        run = run_reqa_mining_distill(mcfg)
        s = json.loads((run / "summary.json").read_text())
        results["mined"] = {**s["eval"], "run": str(run), "train_pairs": s["train_pairs"],
                            "mining": s["mining"]}
    print(f"{len(ev)} questions, {len(ev.sentences)} candidate sentences")
    for name, m in results.items():
        print(f"{name:>13}: P@1 {m['p@1']:.3f}  P@5 {m['p@5']:.3f}  P@10 {m['p@10']:.3f}  MRR {m['mrr']:.3f}")
    return {"eval_questions": len(ev), "eval_candidates": len(ev.sentences), "results": results,
            "seconds": round(time.time() - t0, 1)}
