"""Distillation of a MiniLM teacher into the students, per task (distill-sst2, distill-reuters): the
teacher fine-tuned on the first --train-limit training examples (or --teacher, an existing run),
then each student trained with KD on the same examples plus --augment copies, and again with
--no-kd as the baseline, once per seed of --seeds. Reuters-21578 is ModApte, 90 topics,
multi-label micro-F1, Bernoulli KD with lambda 1.

The teacher's logits for the transfer set are computed once (first KD run) and reused by every
other run of the seed through --teacher-cache (with --data-seed, by every seed). Examples:

    python -m benchmarks distill-sst2                                   # the full setting
    python -m benchmarks distill-sst2 --train-limit 2000 --augment 2 --epochs 2 --teacher-epochs 1
    python -m benchmarks distill-sst2 --teacher artifacts/finetune/<run> --students bilstm,logreg
    python -m benchmarks distill-reuters --teacher artifacts/finetune/<reuters run>
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.suite import read_json

COMMON = ("data_dir", "seeds")


def add_arguments(p) -> None:
    """The task's defaults (train limit, augmentation, epochs, length, students, teacher epochs and
    lr) come from its registry entry."""
    p.add_argument("--task", help="the task (set by the benchmark's name)")
    p.add_argument("--teacher", default=None,
                   help="an existing fine-tuned run folder for the task (default: fine-tune MiniLM)")
    p.add_argument("--teacher-cache", default=None,
                   help="a distill run folder whose cached teacher logits to reuse (same transfer set)")
    p.add_argument("--teacher-epochs", type=float)
    p.add_argument("--teacher-lr", type=float)
    p.add_argument("--train-limit", type=int)
    p.add_argument("--eval-limit", type=int, default=None)
    p.add_argument("--max-length", type=int)
    p.add_argument("--augment", type=int)
    p.add_argument("--epochs", type=int, help="student epochs")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="hold out this share of the training examples to pick each student's best epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--students", help="comma list of bilstm, kimcnn, logreg")
    p.add_argument("--lr", action="append", default=[], metavar="STUDENT=LR",
                   help="student learning rate (default: the student's own for the task)")
    p.add_argument("--student-options", action="append", default=[], metavar="STUDENT=K=V,K=V",
                   help="options for one student, e.g. bilstm=hidden_size=256")
    p.add_argument("--data-seed", type=int, default=None,
                   help="seed of the held-out split and augmented copies (default: each seed); fix it "
                        "to vary --seeds over one cached transfer set")


def budget(args) -> str:
    students = [s for s in args.students.split(",") if s]
    teacher = "given teacher" if args.teacher else f"teacher fine-tuned {args.teacher_epochs:g} epochs"
    return (f"{teacher}; {len(students)} students x KD/--no-kd x {len(args.seeds)} seeds, "
            f"{args.epochs} epochs each on {args.train_limit or 'all'} {args.task} examples "
            f"+ {args.augment} augmented copies (KD)")


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        print(f"# {'fine-tune the teacher, then ' if args.teacher is None else ''}distill {args.students} "
              f"with KD and --no-kd for seeds {args.seeds}")
        return None
    reports = []
    for seed in args.seeds:
        reports.append(run_suite(args.task, args, seed))
        args.teacher = reports[0]["teacher"]["run"]  # a teacher fine-tuned here serves every seed
    return reports[0] if len(reports) == 1 else {"seeds": reports}


def run_suite(task: str, args, seed: int) -> dict:
    """Teacher (fine-tuned or given), then KD and --no-kd runs of every student; returns the report."""
    from compress.api.finetuning import FinetuneConfig
    from compress.recipes.distill import DistillConfig, run_distill
    from compress.recipes.finetune import run_finetune

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
            max_length=args.max_length, seed=seed, name=f"bench-distill-{task}-teacher")))
        teacher_seconds = time.time() - t0

    runs, cache = [], args.teacher_cache
    for student in students:
        for mode in ("kd", "no-kd"):
            cfg = DistillConfig(
                student=student, teacher=teacher, task=task, data_dir=args.data_dir,
                train_limit=args.train_limit, eval_limit=args.eval_limit, max_length=args.max_length,
                augment=args.augment if mode == "kd" else 0, no_kd=mode == "no-kd",
                epochs=args.epochs, batch_size=args.batch_size, lr=lrs.get(student), seed=seed,
                val_fraction=args.val_fraction, data_seed=args.data_seed,
                student_options=options.get(student, ()), teacher_cache=cache,
                name=f"bench-{task}-{student}-{mode}")
            t0 = time.time()
            run = run_distill(cfg)
            if mode == "kd" and cache is None:
                cache = str(run)  # every later run reuses these teacher logits
            s = read_json(run / "summary.json")
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
        "seed": seed,
    }
    print(f"\n{task}: teacher {metric} {teacher_score:.4f}")
    for r in runs:
        print(f"  {r['student']:<7} {r['mode']:<6} {metric} {r['score']:.4f}  params {r['params']:>11,}  "
              f"FLOPs {r['flops_per_example']:>13,} ({r['teacher_over_student_flops']}x fewer)  "
              f"{r['seconds']}s")
    for k, v in checks.items():
        print(f"  {k}: {'yes' if v else 'NO'}")
    return report
