"""KD vs --no-kd for the logistic-regression student over several seeds, beside scikit-learn's
LogisticRegression on the same tf-idf features (an independent optimum to check the student's
training against).

The linear student's KD gain is small next to seed-to-seed variation, so one run per side cannot
tell them apart; this runs both sides for each seed on the same transfer set (no augmentation:
the originals with teacher logits, computed once and reused) and reports mean and spread,
and the KD-minus-no-KD difference seed by seed with a paired t-test.
``--augment N`` gives the KD runs N augmented copies per sentence (Tang et al. 2019; teacher labels
only, so the --no-kd runs cannot use them). The copies come from ``--data-seed`` (default: the first seed) in
every run, so the teacher labels them once; the seeds vary the students' training. ``--val-fraction``
keeps each student's best epoch on held-out training sentences (the same ones in every run).

    python -m benchmarks distill-logreg-seeds --teacher artifacts/finetune/<sst2 run> --seeds 42,1,2
    python -m benchmarks distill-logreg-seeds --teacher artifacts/finetune/<sst2 run> --augment 10
    python -m benchmarks distill-logreg-seeds --teacher ... --augment 10 --kd-loss mse \
        --teacher-cache artifacts/distill/<a KD run of the first seed with the same --augment>
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from benchmarks.suite import read_json
from compress.distill.augment import OPERATORS, AugmentConfig  # no torch: --help stays fast

COMMON = ("data_dir", "seeds")
SEEDS = "42,1,2"


def sklearn_reference(cfg, cs: list[float]) -> tuple[str, dict[str, float]]:
    """The task's dev score (accuracy; micro-F1 for multi-label tasks, one-vs-rest) of sklearn's
    LogisticRegression(C) on the student's own tf-idf features: (metric name, {C: score})."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import MultiLabelBinarizer

    from compress.models.loading import load_tokenizer
    from compress.tasks.task_data import load_task_data
    from students.logreg import LogRegConfig, LogRegStudent

    _, data = load_task_data(cfg)
    tok = load_tokenizer(cfg.teacher)
    train, dev = data["train"], data["eval"]
    student = LogRegStudent(LogRegConfig(num_labels=len(train.label_names),
                                         special_ids=tuple(tok.all_special_ids)), len(tok))

    def enc(texts):
        return tok(texts, truncation=True, max_length=cfg.max_length)["input_ids"]

    vec = TfidfVectorizer(analyzer=student.analyze, lowercase=False)
    x_train = vec.fit_transform(enc(train.texts))
    x_dev = vec.transform(enc(dev.texts))
    if not train.multilabel:
        return "accuracy", {str(c): float(LogisticRegression(C=c, max_iter=3000)
                                          .fit(x_train, train.labels).score(x_dev, dev.labels))
                            for c in cs}
    # Every label index is a column, so the training and dev matrices line up.
    mlb = MultiLabelBinarizer(classes=list(range(len(train.label_names))))
    y_train, y_dev = mlb.fit_transform(train.labels), mlb.transform(dev.labels)
    scores = {}
    for c in cs:
        clf = OneVsRestClassifier(LogisticRegression(C=c, max_iter=3000)).fit(x_train, y_train)
        scores[str(c)] = float(f1_score(y_dev, clf.predict(x_dev), average="micro"))
    return "micro_f1", scores


def add_arguments(p) -> None:
    p.add_argument("--teacher", required=True, help="a fine-tuned run folder of --task")
    p.add_argument("--task", default="sst2")
    p.add_argument("--train-limit", type=int, default=20000)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--data-seed", type=int, default=None,
                   help="seed of the held-out split and augmented copies (default: the first seed); "
                        "fix it to run seeds in separate calls over one --teacher-cache")
    p.add_argument("--augment", type=int, default=0, help="augmented copies per example (KD runs)")
    for flag in OPERATORS:
        default = getattr(AugmentConfig, flag)
        p.add_argument("--" + flag.replace("_", "-"), type=type(default), default=default,
                       help=f"with --augment: as compress distill (default {default})")
    p.add_argument("--unlabeled-examples", type=int, default=0,
                   help="training examples after --train-limit that the KD runs see with teacher labels only")
    p.add_argument("--val-fraction", type=float, default=0.0, help="held-out share for epoch selection")
    p.add_argument("--kd-loss", default="kl", help="kl or mse (the KD runs)")
    p.add_argument("--teacher-cache", default=None,
                   help="an earlier KD run of this benchmark whose cached teacher logits to reuse")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="the students' L2 penalty (default: the logreg student's own default)")
    p.add_argument("--lr", type=float, default=None, help="the students' learning rate (default: its own)")
    p.add_argument("--sklearn-c", default="0.5,1,2,4",
                   help="inverse L2 strengths of the scikit-learn reference (comma list)")
    p.add_argument("--kd-lambda", type=float, default=None,
                   help="weight of the KD term (default: the task family's, 4 single-label, 1 multi-label)")
    p.add_argument("--temperature", type=float, default=None, help="KD temperature (default: distill's)")


def budget(args) -> str:
    return (f"2 x {len(args.seeds)} logreg runs (KD and --no-kd per seed), {args.epochs} epochs on "
            f"{args.train_limit} {args.task} examples + {args.augment} augmented copies and "
            f"{args.unlabeled_examples} unlabelled examples (KD); sklearn at C = {args.sklearn_c}")


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        print(f"# logreg KD and --no-kd for seeds {args.seeds}, then scikit-learn's reference")
        return None
    from compress.recipes.distill import DistillConfig, run_distill
    from compress.report.analysis import paired_comparison

    if args.temperature is None:
        args.temperature = DistillConfig.temperature
    os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")
    if (Path(args.data_dir) / "nltk_data").is_dir():  # the tagger data shipped with the data folder
        os.environ.setdefault("NLTK_DATA", str(Path(args.data_dir) / "nltk_data"))
    seeds = args.seeds
    data_seed = args.data_seed if args.data_seed is not None else seeds[0]
    t_start = time.time()
    runs, cache = [], args.teacher_cache
    for seed in seeds:
        for mode in ("kd", "no-kd"):
            cfg = DistillConfig(student="logreg", teacher=args.teacher, task=args.task,
                                data_dir=args.data_dir, train_limit=args.train_limit,
                                max_length=args.max_length, epochs=args.epochs, seed=seed,
                                no_kd=mode == "no-kd", augment=0 if mode == "no-kd" else args.augment,
                                **({} if mode == "no-kd" or not args.augment else
                                   {f: getattr(args, f) for f in OPERATORS}),
                                unlabeled_examples=0 if mode == "no-kd" else args.unlabeled_examples,
                                data_seed=data_seed, val_fraction=args.val_fraction,
                                **({} if mode == "no-kd" else  # the KD settings: refused with no_kd
                                   {"kd_loss": args.kd_loss, "kd_lambda": args.kd_lambda,
                                    "temperature": args.temperature}),
                                weight_decay=args.weight_decay, lr=args.lr,
                                teacher_cache=cache, name=f"bench-logreg-{mode}-s{seed}")
            t0 = time.time()
            run = run_distill(cfg)
            if mode == "kd" and cache is None:
                cache = str(run)  # the same transfer set for every seed: labelled once
            s = read_json(run / "summary.json")
            runs.append({"seed": seed, "mode": mode, "run": str(run), "score": s["student_eval"]["score"],
                         "model_selection": s["model_selection"],
                         "augmented_examples": s["augmented_examples"],
                         "unlabeled_examples": s["unlabeled_examples"], "seconds": round(time.time() - t0, 1),
                         "seconds_detail": s["seconds"],
                         "weight_decay": s["weight_decay"], "lr_schedule": s["lr_schedule"]})
            teacher_score = s["teacher_eval"]["score"]
    by_mode = {m: [r["score"] for r in runs if r["mode"] == m] for m in ("kd", "no-kd")}
    stats = {m: {"mean": statistics.mean(v), "stdev": statistics.stdev(v) if len(v) > 1 else 0.0,
                 "min": min(v), "max": max(v)} for m, v in by_mode.items()}
    # The two sides of a seed share its held-out split and the dev set: compare them in pairs.
    paired = paired_comparison({r["seed"]: r["score"] for r in runs if r["mode"] == "kd"},
                               {r["seed"]: r["score"] for r in runs if r["mode"] == "no-kd"})
    metric, ref = sklearn_reference(DistillConfig(student="logreg", teacher=args.teacher, task=args.task,
                                          data_dir=args.data_dir, train_limit=args.train_limit,
                                          max_length=args.max_length),
                            [float(c) for c in args.sklearn_c.split(",") if c])
    report = {"task": args.task, "teacher": {"run": args.teacher, "score": teacher_score},
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs,
              "stats": stats, "kd_mean_minus_no_kd_mean": stats["kd"]["mean"] - stats["no-kd"]["mean"],
              "kd_minus_no_kd_by_seed": paired,
              "sklearn_metric": metric, "sklearn_logistic_regression_dev_score_by_C": ref,
              "wall_seconds": round(time.time() - t_start, 1)}
    for m, st in stats.items():
        print(f"logreg {m:<6} mean {st['mean']:.4f}  sd {st['stdev']:.4f}  "
              f"[{st['min']:.4f}, {st['max']:.4f}]")
    p_text = "n/a (one seed)" if paired["p"] is None else f"{paired['p']:.3f}"
    print(f"KD minus no-KD by seed: mean {paired['mean_difference']:+.4f}, KD ahead on {paired['wins']} "
          f"of {len(paired['seeds'])} seeds, paired t-test p = {p_text}")
    print(f"sklearn LogisticRegression on the same features ({metric}):",
          {c: round(v, 4) for c, v in ref.items()})
    return report
