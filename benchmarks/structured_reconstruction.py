"""Structured removal with reconstruction (--criterion obs) against Fisher + rescaling (--criterion
fisher), paired: the same fine-tuned model, calibration draw (--seed), targets and latency table.

TEACHER: MiniLM fine-tuned on SST-2 (`compress finetune --task sst2 --data-dir ../shared/data
--train-limit 20000 --epochs 1 --max-length 64`). STEP names one run (default: the list below, in
order):

  obs-oneshot-sSEED / fisher-oneshot-sSEED     --speedup 2,3,4, no recovery, each from dense
  obs-gradual-sSEED / fisher-gradual-sSEED     --speedup 2,3,4, --recovery-steps KD steps each, gradual
  obs-transfer-sSEED / fisher-transfer-sSEED   the gradual family with --transfer-steps KD steps each over
                                               the labelled split plus --transfer-unlabeled texts the
                                               teacher labels (--recovery-unlabeled)
  agnews-teacher                               MiniLM on the AG News 10,000-sentence subset
  agnews-obs-gradual-sSEED / agnews-fisher-oneshot-sSEED (and the other two)  --speedup 2,3 on AG News

Each step writes WORK/STEP (family.json / family.md) and is skipped when that folder exists. The
result holds every step's wall time and the families' mean ± spread over seeds (family-seeds).
"""

from __future__ import annotations

import os
import re

from benchmarks import family_seeds
from benchmarks.suite import BenchmarkError

COMMON = ("data_dir", "work", "python")
DEFAULT_STEPS = ("obs-oneshot-s42", "fisher-oneshot-s42", "obs-gradual-s42", "obs-oneshot-s1",
                 "obs-gradual-s1", "agnews-teacher", "agnews-obs-gradual-s42", "fisher-gradual-s42")
STEP = re.compile(r"(agnews-)?(obs|fisher)-(oneshot|gradual|transfer)-s(\d+)")


def add_arguments(p) -> None:
    p.add_argument("teacher", help="MiniLM fine-tuned on SST-2 (run folder)")
    p.add_argument("steps", nargs="*", metavar="STEP", help=f"default: {' '.join(DEFAULT_STEPS)}")
    p.add_argument("--recovery-steps", type=int, default=500, help="KD steps per gradual member")
    p.add_argument("--transfer-steps", type=int, default=1000, help="KD steps per member of a transfer step")
    p.add_argument("--transfer-unlabeled", type=int, default=20000,
                   help="training texts beyond --train-limit the teacher labels in a transfer step")


def budget(args) -> str:
    steps = args.steps or DEFAULT_STEPS
    return (f"{len(steps)} runs ({', '.join(steps)}): 512 calibration samples each, "
            f"{args.recovery_steps} KD steps per gradual member; transfer steps: {args.transfer_steps} KD "
            f"steps per member over the labelled split + {args.transfer_unlabeled} teacher-labelled texts")


def family_argv(args, step: str, model: str, task: str, limit: int, targets: str, criterion: str, seed: str,
                mode: str, extra: list) -> list:
    return ["prune", "--stage", "post-training", "--model", model, "--task", task,
            "--data-dir", args.data_dir, "--train-limit", limit, "--max-length", 64,
            "--structured", "heads,ffn", "--criterion", criterion,
            "--calibration-samples", 512, "--latency-shape", "32x128", "--seed", seed, "--speedup", targets,
            "--family-mode", mode, *extra, "--out", args.work / step]


def run(args, ctx) -> dict | None:
    env = {"COMPRESS_CACHE_DIR": os.environ.get("COMPRESS_CACHE_DIR", str(args.work / "cache"))}
    recover = ["--recovery-steps", args.recovery_steps, "--teacher", "self"]
    transfer = ["--recovery-steps", args.transfer_steps, "--teacher", "self",
                "--recovery-unlabeled", args.transfer_unlabeled]
    for step in args.steps or DEFAULT_STEPS:
        done = (args.work / step,)
        if step == "agnews-teacher":
            ctx.compress(step, ["finetune", "--task", "ag_news", "--data-dir", args.data_dir, "--train-limit",
                                10000, "--epochs", 1, "--max-length", 64, "--out", args.work / step],
                         done=done, env=env)
            continue
        m = STEP.fullmatch(step)
        if m is None:
            raise BenchmarkError(f"unknown step {step!r}; steps are agnews-teacher and "
                                 "[agnews-](obs|fisher)-(oneshot|gradual|transfer)-sSEED")
        agnews, criterion, kind, seed = m.groups()
        mode, extra = {"oneshot": ("independent", []), "gradual": ("gradual", recover),
                       "transfer": ("gradual", transfer)}[kind]
        if agnews:
            argv = family_argv(args, step, str(args.work / "agnews-teacher"), "ag_news", 10000, "2,3",
                               criterion, seed, mode, extra)
        else:
            argv = family_argv(args, step, args.teacher, "sst2", 20000, "2,3,4", criterion, seed, mode, extra)
        ctx.compress(step, argv, done=done, env=env)
    if ctx.dry_run:
        return None
    return {"timings": ctx.timings(), "seeds": family_seeds.collect(args.work)}
