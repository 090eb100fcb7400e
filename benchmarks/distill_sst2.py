"""SST-2 distillation benchmark (issue 4): a MiniLM teacher fine-tuned on the first --train-limit
training sentences, then each student trained with KD on the same sentences plus --augment copies,
and again with --no-kd as the baseline. Writes one JSON to artifacts/benchmarks/.

The teacher's logits for the transfer set are computed once (first KD run) and reused by every
other run through --teacher-cache. Examples:

    python benchmarks/distill_sst2.py                                   # the full setting
    python benchmarks/distill_sst2.py --train-limit 2000 --augment 2 --epochs 2 --teacher-epochs 1
    python benchmarks/distill_sst2.py --teacher artifacts/finetune/<run> --students bilstm,logreg
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compress.core.runs import artifacts_root, environment, write_json  # noqa: E402
from compress.recipes.distill import DistillConfig, run_distill  # noqa: E402
from compress.recipes.finetune import FinetuneConfig, run_finetune  # noqa: E402
from students.registry import STUDENTS  # noqa: E402

# The students' own defaults, which differ between single- and multi-label tasks (logreg).
DEFAULT_LR = {name: {"single-label": e.default_lr, "multi-label": e.lr_for(True)}
              for name, e in STUDENTS.items()}


def suite_arguments(p: argparse.ArgumentParser, *, train_limit, augment, epochs, max_length,
                    students, teacher_epochs, teacher_lr=5e-5) -> None:
    p.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--teacher", default=None,
                   help="an existing fine-tuned run folder for the task (default: fine-tune MiniLM)")
    p.add_argument("--teacher-cache", default=None,
                   help="a distill run folder whose cached teacher logits to reuse (same transfer set)")
    p.add_argument("--teacher-epochs", type=float, default=teacher_epochs)
    p.add_argument("--teacher-lr", type=float, default=teacher_lr)
    p.add_argument("--train-limit", type=int, default=train_limit)
    p.add_argument("--eval-limit", type=int, default=None)
    p.add_argument("--max-length", type=int, default=max_length)
    p.add_argument("--augment", type=int, default=augment)
    p.add_argument("--epochs", type=int, default=epochs, help="student epochs")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="hold out this share of the training examples to pick each student's best epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--students", default=students, help="comma list of bilstm, kimcnn, logreg")
    p.add_argument("--lr", action="append", default=[], metavar="STUDENT=LR",
                   help=f"student learning rate (default {DEFAULT_LR})")
    p.add_argument("--student-options", action="append", default=[], metavar="STUDENT=K=V,K=V",
                   help="options for one student, e.g. bilstm=hidden_size=256")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-seed", type=int, default=None,
                   help="seed of the held-out split and augmented copies (default --seed); fix it "
                        "to vary --seed over one cached transfer set")
    p.add_argument("--out", default=None, help="JSON file to write")


def run_suite(task: str, args: argparse.Namespace) -> dict:
    """Teacher (fine-tuned or given), then KD and --no-kd runs of every student; returns the report."""
    os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")
    if (Path(args.data_dir) / "nltk_data").is_dir():  # the tagger data shipped with the data folder
        os.environ.setdefault("NLTK_DATA", str(Path(args.data_dir) / "nltk_data"))
    lrs = {}  # explicit --lr only; otherwise the workflow picks the student's default for the task
    for item in args.lr:
        name, _, value = item.partition("=")
        lrs[name] = float(value)
    options = {}
    for item in args.student_options:
        name, _, value = item.partition("=")
        options[name] = tuple(v for v in value.split(",") if v)
    students = [s for s in args.students.split(",") if s]
    t_start = time.time()

    teacher_seconds = 0.0
    teacher = args.teacher
    if teacher is None:
        t0 = time.time()
        teacher = str(run_finetune(FinetuneConfig(
            task=task, model="minilm", data_dir=args.data_dir, train_limit=args.train_limit,
            eval_limit=args.eval_limit, epochs=args.teacher_epochs, lr=args.teacher_lr,
            max_length=args.max_length, seed=args.seed, name=f"bench-distill-{task}-teacher")))
        teacher_seconds = time.time() - t0

    runs, cache = [], args.teacher_cache
    for student in students:
        for mode in ("kd", "no-kd"):
            cfg = DistillConfig(
                student=student, teacher=teacher, task=task, data_dir=args.data_dir,
                train_limit=args.train_limit, eval_limit=args.eval_limit, max_length=args.max_length,
                augment=args.augment if mode == "kd" else 0, no_kd=mode == "no-kd",
                epochs=args.epochs, batch_size=args.batch_size, lr=lrs.get(student), seed=args.seed,
                val_fraction=args.val_fraction, data_seed=args.data_seed,
                student_options=options.get(student, ()), teacher_cache=cache,
                name=f"bench-{task}-{student}-{mode}")
            t0 = time.time()
            run = run_distill(cfg)
            if mode == "kd" and cache is None:
                cache = str(run)  # every later run reuses these teacher logits
            s = json.loads((run / "summary.json").read_text())
            runs.append({"student": student, "mode": mode, "run": str(run),
                         "score": s["student_eval"]["score"], "eval": s["student_eval"],
                         "params": s["params"]["student"],
                         "flops_per_example": s["flops_per_example"]["student"],
                         "teacher_over_student_flops": s["flops_per_example"]["teacher_over_student"],
                         "augmented_examples": s["augmented_examples"], "lr": s["lr"],
                         "model_selection": s["model_selection"],
                         "seconds": round(time.time() - t0, 1), "seconds_detail": s["seconds"]})
            teacher_score = s["teacher_eval"]["score"]
            teacher_meta = {"params": s["params"]["teacher"],
                            "flops_per_example": s["flops_per_example"]["teacher"],
                            "flops_source": s["flops_per_example"]["teacher_source"],
                            "seq_len": s["flops_per_example"]["seq_len"]}
            metric = s["metric"]

    by = {(r["student"], r["mode"]): r["score"] for r in runs}
    checks = {f"kd_{st}_beats_no_kd": by[(st, "kd")] > by[(st, "no-kd")] for st in students}
    if "bilstm" in students:
        checks["kd_bilstm_within_3_points_of_teacher"] = by[("bilstm", "kd")] >= teacher_score - 0.03
    report = {
        "task": task, "metric": metric, "teacher": {"run": teacher, "score": teacher_score,
                                                    "finetune_seconds": round(teacher_seconds, 1),
                                                    **teacher_meta},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs, "checks": checks, "wall_seconds": round(time.time() - t_start, 1),
        "env": environment(args.seed),
    }
    out = Path(args.out) if args.out else artifacts_root() / "benchmarks" / f"distill_{task}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, report)
    print(f"\n{task}: teacher {metric} {teacher_score:.4f}")
    for r in runs:
        print(f"  {r['student']:<7} {r['mode']:<6} {metric} {r['score']:.4f}  params {r['params']:>11,}  "
              f"FLOPs {r['flops_per_example']:>13,} ({r['teacher_over_student_flops']}x fewer)  "
              f"{r['seconds']}s")
    for k, v in checks.items():
        print(f"  {k}: {'yes' if v else 'NO'}")
    print(f"-> {out}")
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    suite_arguments(p, train_limit=20000, augment=10, epochs=3, max_length=64,
                    students="bilstm,kimcnn,logreg", teacher_epochs=2.0)
    run_suite("sst2", p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
