"""Layer-wise distillation in the recovery after a post-training prune, against the same recovery
with the logit KD term only: ``compress prune --stage post-training --recovery-steps N --teacher T``
with and without ``--kd-layers W``, for each seed on the same data, compared seed by seed (layers
minus logits). The JSON is rewritten after every run; a run whose folder (WORK/SIDE-sSEED) already
holds a summary.json is read, not rerun.

Everything after ``--`` goes unchanged to every run: the task and its data, and the prune itself.
``--model`` is what gets pruned: a fine-tuned dense run (the teacher is then ``self``), or a run
pruned earlier, with its dense original as ``--teacher`` (``self`` would be the pruned model).

    python -m benchmarks layerwise-recovery --model artifacts/dap/dense --recovery-steps 250 \\
        --kd-layers 1 --seeds 1,2 --work artifacts/layerwise/runs -- --task sst2 \\
        --data-dir ../shared/data --train-limit 20000 --max-length 64 \\
        --structured heads,ffn --criterion fisher --flops-reduction 0.4
"""

from __future__ import annotations

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("seeds", "work", "python")
SEEDS = "1,2"
PASSTHROUGH = True
# set by this benchmark for every run; refused after "--"
OWN_FLAGS = ("--stage", "--model", "--recovery-steps", "--teacher", "--kd-layers", "--seed", "--out")


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="the run to prune (fine-tuned dense, or pruned earlier)")
    p.add_argument("--teacher", default="self", help="self (the --model), or the dense run folder")
    p.add_argument("--recovery-steps", type=int, required=True)
    p.add_argument("--kd-layers", type=float, default=1.0, help="W of the layer-wise side")


def budget(args) -> str:
    return (f"2 x {len(args.seeds)} post-training prunes (logits only, + layer-wise W {args.kd_layers:g}), "
            f"{args.recovery_steps} recovery steps each; prune flags: {' '.join(args.extra) or 'none'}")


def prune_argv(args, seed: int, kd_layers: float | None, out) -> list:
    argv = ["prune", "--stage", "post-training", "--model", args.model,
            "--recovery-steps", args.recovery_steps, "--teacher", args.teacher, "--seed", seed,
            "--out", out, *args.extra]
    return argv + (["--kd-layers", f"{kd_layers:g}"] if kd_layers else [])


def read_run(folder) -> dict:
    """The scores of a finished run: dev score and metric after recovery, before it, and dense."""
    s = read_json(folder / "summary.json")
    return {"metric": s["metric"], "dev": s["eval"][s["metric"]], "score": s["eval"]["score"],
            "before_recovery": s["eval_pruned_before_recovery"]["score"], "dense": s["eval_dense"]["score"],
            "recovery_steps": s["recovery_steps"], "train_seconds": s.get("train_seconds"),
            "distillation": {k: v for k, v in (s.get("distillation") or {}).items() if k != "teacher_eval"},
            "structured": (s.get("structured") or {}).get("flops_reduction"), "run": str(folder)}


def run(args, ctx) -> dict | None:
    from compress.report.analysis import paired_comparison

    clash = [f for f in args.extra if f.split("=")[0] in OWN_FLAGS]
    if clash:
        raise BenchmarkError(f"{', '.join(clash)} after -- is set by this benchmark; use its own options")
    if args.kd_layers <= 0:
        raise BenchmarkError(f"--kd-layers must be > 0, got {args.kd_layers:g}")
    result = {"model": args.model, "teacher": args.teacher, "recovery_steps": args.recovery_steps,
              "kd_layers": args.kd_layers, "seeds": args.seeds, "extra_args": args.extra, "runs": []}
    for seed in args.seeds:
        for kd_layers in (None, args.kd_layers):
            side = "layers" if kd_layers else "logits"
            folder = args.work / f"{side}-s{seed}"
            step = ctx.compress(f"{side}-s{seed}", prune_argv(args, seed, kd_layers, folder), check=False,
                                done=(folder / "summary.json",))
            if ctx.dry_run:
                continue
            row = {"side": side, "seed": seed, "kd_layers": kd_layers or 0.0, "cmd": step["cmd"],
                   "wall_s": step.get("seconds")}
            if step.get("rc", 0) != 0:
                row.update(rc=step["rc"], stderr=step.get("tail", ""))
            else:
                row.update(read_run(folder))
            result["runs"].append(row)
            done = {(r["side"], r["seed"]): r["score"] for r in result["runs"] if "score" in r}
            layers = {s: v for (side_, s), v in done.items() if side_ == "layers"}
            logits = {s: v for (side_, s), v in done.items() if side_ == "logits"}
            if set(layers) & set(logits):
                result["layers_minus_logits"] = paired_comparison(layers, logits)
            ctx.save(result)
            print(f"{side} seed {seed}: " + (f"{row['metric']} {row['dev']:.4f} (before recovery "
                  f"{row['before_recovery']:.4f}, dense {row['dense']:.4f})" if "score" in row
                  else f"failed (rc {row['rc']}): {(row['stderr'].strip().splitlines() or [''])[-1]}"),
                  flush=True)
    if ctx.dry_run:
        return None
    if "layers_minus_logits" in result:
        c = result["layers_minus_logits"]
        print(f"layers - logits per seed {dict(zip(c['seeds'], c['differences']))}, mean "
              f"{c['mean_difference']:+.4f}")
    return result
