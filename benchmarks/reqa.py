"""ReQA benchmark on held-out SQuAD articles: BM25, the dual encoder before training (zero-shot),
the dual encoder fine-tuned on gold pairs, and the dual encoder with cross-attention mined pairs.
P@1/5/10 and MRR; one JSON to artifacts/benchmarks/.

    python benchmarks/reqa.py --train-limit 500 --eval-limit 300 --epochs 1          # small run
    python benchmarks/reqa.py                                                          # 38/10, all
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compress.core.runs import artifacts_root, environment  # noqa: E402
from compress.recipes.finetune import FinetuneConfig, run_finetune  # noqa: E402
from compress.recipes.reqa_mining import ReQAMiningConfig, run_reqa_mining_distill  # noqa: E402
from compress.recipes.retrieval import bm25_metrics, dual_encoder_metrics, load_reqa_data  # noqa: E402
from compress.retrieval.dual_encoder import load_dual_encoder  # noqa: E402

SYSTEMS = ("bm25", "zero-shot", "dual-encoder", "mined")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--model", default="minilm")
    p.add_argument("--teacher", default="minilm", help="cross-encoder run folder, or an encoder to train")
    p.add_argument("--split-by-article", default="38/10")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--train-limit", type=int, default=None)
    p.add_argument("--eval-limit", type=int, default=None)
    p.add_argument("--teacher-train-limit", type=int, default=None)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--teacher-epochs", type=float, default=ReQAMiningConfig.teacher_epochs)
    p.add_argument("--teacher-lr", type=float, default=ReQAMiningConfig.teacher_lr,
                   help="the cross-encoder's learning rate")
    p.add_argument("--unlabeled-questions", type=int, default=0,
                   help="mined system: this many training questions after --train-limit, gold hidden")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")

    common = dict(task="reqa", model=args.model, data_dir=args.data_dir,
                  split_by_article=args.split_by_article, train_limit=args.train_limit,
                  eval_limit=args.eval_limit, epochs=args.epochs,
                  max_length=args.max_length, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
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
        mcfg = ReQAMiningConfig(**common, teacher=args.teacher, teacher_epochs=args.teacher_epochs,
                                teacher_lr=args.teacher_lr, unlabeled_questions=args.unlabeled_questions,
                                teacher_train_limit=args.teacher_train_limit, name="bench-reqa-mined")
        run = run_reqa_mining_distill(mcfg)
        s = json.loads((run / "summary.json").read_text())
        results["mined"] = {**s["eval"], "run": str(run), "train_pairs": s["train_pairs"],
                            "mining": s["mining"]}
    out_dir = artifacts_root() / "benchmarks"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"reqa-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"benchmark": "reqa", "args": vars(args), "eval_questions": len(ev),
                               "eval_candidates": len(ev.sentences), "results": results,
                               "seconds": round(time.time() - t0, 1), "env": environment(args.seed)},
                              indent=2) + "\n")
    print(f"{len(ev)} questions, {len(ev.sentences)} candidate sentences")
    for name, m in results.items():
        print(f"{name:>13}: P@1 {m['p@1']:.3f}  P@5 {m['p@5']:.3f}  P@10 {m['p@10']:.3f}  MRR {m['mrr']:.3f}")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
