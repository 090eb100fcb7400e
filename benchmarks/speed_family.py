"""A family of structured MiniLM models aimed at measured int8 speedups on SST-2, and what each costs:

  table      the latency table of the shipping runtime (onnxruntime int8, this machine, 32 x 128),
             timed, with the latency-table benchmark's check of real layouts;
  oneshot    the one-shot family (no recovery) at --targets, timed;
  recovered  the family with --recovery-steps of distillation from the dense model each, timed; its
             report (family.md / family.json / family.png) names the fastest model within 1 point
             of dense.

TEACHER: a run folder of MiniLM fine-tuned on SST-2, e.g. `compress finetune --task sst2 --data-dir
../shared/data --train-limit 20000 --epochs 1 --max-length 64`. The latency table is built where the
prune reads it ($COMPRESS_CACHE_DIR/latency, default WORK/latency-cache/latency).
"""

from __future__ import annotations

import os

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("data_dir", "seeds", "work", "python")
STEPS = ("table", "oneshot", "recovered")


def add_arguments(p) -> None:
    p.add_argument("teacher", help="MiniLM fine-tuned on SST-2 (run folder)")
    p.add_argument("--targets", default="2,3,4", help="--speedup targets")
    p.add_argument("--recovery-steps", type=int, default=500)
    p.add_argument("--kd-layers", type=float, default=0, help="layer-wise KD weight (0: logits only)")
    p.add_argument("--only", default=",".join(STEPS), help=f"the steps to run, of {', '.join(STEPS)}")


def budget(args) -> str:
    return (f"targets {args.targets}; 512 calibration samples; {args.recovery_steps} KD steps per recovered "
            f"member; seed {args.seeds[0]}")


def run(args, ctx) -> dict | None:
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(STEPS) or len(args.seeds) != 1:
        raise BenchmarkError(f"--only takes {', '.join(STEPS)} (got {args.only}); --seeds one seed")
    cache = os.environ.get("COMPRESS_CACHE_DIR", str(args.work / "latency-cache"))
    env = {"COMPRESS_CACHE_DIR": cache}
    common = ["--stage", "post-training", "--model", args.teacher, "--task", "sst2",
              "--data-dir", args.data_dir, "--train-limit", 20000, "--max-length", 64,
              "--structured", "heads,ffn", "--criterion", "fisher", "--calibration-samples", 512,
              "--latency-shape", "32x128", "--seed", args.seeds[0]]
    table = args.work / "latency_table.json"
    if "table" in only:
        ctx.benchmark("latency_table", "latency-table", [
            "--model", args.teacher, "--runtime", "ort-int8", "--batch", 32, "--seq-len", 128, "--rebuild",
            "--cache-dir", f"{cache}/latency", "--out", table], env=env)
    if "oneshot" in only:
        ctx.compress("oneshot_family", ["prune", *common, "--speedup", args.targets,
                                        "--out", args.work / "oneshot"],
                     done=(args.work / "oneshot",), env=env)
    if "recovered" in only:
        kd = ["--teacher", "self", *(["--kd-layers", f"{args.kd_layers:g}"] if args.kd_layers else [])]
        ctx.compress("recovered_family", ["prune", *common, "--speedup", args.targets, "--recovery-steps",
                                          args.recovery_steps, *kd, "--out", args.work / "recovered"],
                     done=(args.work / "recovered",), env=env)
    if ctx.dry_run:
        return None
    families = {name: read_json(args.work / name / "family.json") for name in ("oneshot", "recovered")
                if (args.work / name / "family.json").is_file()}
    return {"timings": ctx.timings(), "families": families,
            "latency_table": read_json(table)["results"] if table.is_file() else None}
