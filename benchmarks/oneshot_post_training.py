"""Data-aware one-shot pruning of a fine-tuned model against one-shot magnitude pruning, with and
without a short distillation recovery: the grid of ``compress prune --stage post-training`` runs,
one after the other, each row written to the JSON as soon as its run ends.

    python -m benchmarks oneshot-post-training --dense artifacts/dap/dense --work artifacts/dap
    python -m benchmarks squad-oneshot --finetune-from MINILM     # SQuAD: fine-tune, then the grid

``squad-oneshot`` is this benchmark with SQuAD's defaults (``--task squad --split-by-article 38/10
--max-length 256 --cells oneshot,recovery --only sparsegpt-50,wanda-50,magnitude-50,sparsegpt-60,
sparsegpt-2of4,sparsegpt-70``): it fine-tunes ``--finetune-from`` on the training articles first
(two epochs, lr 1e-4, batch 16, seed 42; the settings of the QA section of docs/results.md; made
for a GPU, about two hours on a CPU) into WORK/dense, used again when it is there already (remove
it after changing the split, length or model). Each run goes to WORK/runs/NAME; a run whose
summary.json is there is read, not rerun.

The encoder's matrices are pruned (``--exclude role:word_embeddings``, the post-training default
anyway; ``--with-embeddings`` adds the word embeddings with ``--include role:word_embeddings``,
pruned by magnitude whatever the criterion). Cells (``--cells``, comma-separated;
default all, in this order):
- ``oneshot``: sparsegpt, wanda and magnitude at 50%, 60%, 70% and 2:4, no training after pruning;
- ``recovery``: sparsegpt at 60%, 70%, 80% and 2:4, then ``--recovery-steps`` (250) steps
  distilling from the dense model (``--teacher self``);
- ``structured``: heads and FFN neurons by Fisher search at 40% fewer encoder FLOPs, one-shot and
  with the same recovery.
"""

from __future__ import annotations

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("data_dir", "seeds", "work", "python")


def grid(recovery_steps: int) -> dict[str, list[tuple[str, list[str]]]]:
    """Cell group -> [(run name, prune flags)]."""
    amounts = [("50", ["--sparsity", "0.5"]), ("60", ["--sparsity", "0.6"]), ("70", ["--sparsity", "0.7"]),
               ("2of4", ["--pattern", "2:4"])]
    recover = ["--recovery-steps", str(recovery_steps), "--teacher", "self"]
    fisher = ["--structured", "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.4"]
    return {
        "oneshot": [(f"{c}-{name}", ["--criterion", c, *flags]) for c in ("sparsegpt", "wanda", "magnitude")
                    for name, flags in amounts],
        "recovery": [(f"sparsegpt-{name}-kd{recovery_steps}", ["--criterion", "sparsegpt", *flags, *recover])
                     for name, flags in amounts[1:] + [("80", ["--sparsity", "0.8"])]],
        "structured": [("fisher-flops40", fisher),
                       (f"fisher-flops40-kd{recovery_steps}", [*fisher, *recover])],
    }


def add_arguments(p) -> None:
    p.add_argument("--dense", help="the fine-tuned run folder to prune")
    p.add_argument("--finetune-from", metavar="MODEL",
                   help="fine-tune MODEL on --task first (into WORK/dense) and prune that")
    p.add_argument("--finetune-flags", default="", help="more flags for that fine-tune, e.g. '--max-steps 2'")
    p.add_argument("--task", default="sst2")
    p.add_argument("--train-limit", type=int, default=20000)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--calibration-samples", type=int, default=512)
    p.add_argument("--recovery-steps", type=int, default=250)
    p.add_argument("--with-embeddings", action="store_true",
                   help="prune the word embeddings too (by magnitude); default: the encoder matrices only")
    p.add_argument("--split-by-article", default=None, help="passed on (squad: e.g. 38/10)")
    p.add_argument("--cells", default="oneshot,recovery,structured")
    p.add_argument("--only", default=None, help="comma-separated run names of those cells to run, in order")


def budget(args) -> str:
    return (f"{len(chosen(args))} prunes from {args.calibration_samples} calibration samples, "
            f"{args.recovery_steps} KD steps in the recovery cells; seed {args.seeds[0]}"
            + ("; one fine-tune of two epochs first" if args.finetune_from else ""))


def chosen(args) -> list[tuple[str, str, list[str]]]:
    cells = grid(args.recovery_steps)
    groups = [g for g in args.cells.split(",") if g]
    if set(groups) - set(cells):
        raise BenchmarkError(f"--cells takes {', '.join(cells)}, got {args.cells}")
    picked = [(g, name, flags) for g in groups for name, flags in cells[g]]
    if args.only:
        only = args.only.split(",")
        unknown = sorted(set(only) - {name for _, name, _ in picked})
        if unknown:
            raise BenchmarkError(f"--only names no run of --cells {args.cells}: {unknown}")
        picked = sorted((c for c in picked if c[1] in only), key=lambda c: only.index(c[1]))
    return picked


def prune_argv(args, dense: str, flags: list[str], out) -> list:
    argv = ["prune", "--stage", "post-training", "--model", dense, "--task", args.task, "--data-dir",
            args.data_dir, "--train-limit", args.train_limit, "--max-length", args.max_length,
            "--calibration-samples", args.calibration_samples, "--seed", args.seeds[0], *flags]
    if args.split_by_article:
        argv += ["--split-by-article", args.split_by_article]
    if "--structured" not in flags:
        argv += ["--include" if args.with_embeddings else "--exclude", "role:word_embeddings"]
    return [*argv, "--out", out]


def row_of(summary: dict) -> dict:
    s = summary
    row = dict(dense=s["eval_dense"]["score"], oneshot=s["eval_pruned_before_recovery"]["score"],
               final=s["eval"]["score"], recovery_steps=s["recovery_steps"], prune_seconds=s["prune_seconds"],
               sparsity=s.get("sparsity"), calibration=s.get("calibration"),
               structured=(s.get("structured") or {}).get("flops_reduction"))
    row["metrics"] = {k: s[k] for k in ("eval_dense", "eval_pruned_before_recovery", "eval")}
    row["drop_oneshot"] = round(100 * (row["oneshot"] - row["dense"]), 2)
    row["drop_final"] = round(100 * (row["final"] - row["dense"]), 2)
    return row


def run(args, ctx) -> dict | None:
    if bool(args.dense) == bool(args.finetune_from):
        raise BenchmarkError("give one of --dense RUN (a fine-tuned model) and --finetune-from MODEL")
    picked = chosen(args)
    dense = args.dense
    result: dict = {"rows": []}
    if args.finetune_from:
        dense = str(args.work / "dense")
        data = ["--task", args.task, "--data-dir", args.data_dir]
        if args.split_by_article:
            data += ["--split-by-article", args.split_by_article]
        ctx.compress("finetune", ["finetune", "--model", args.finetune_from, *data, "--max-length",
                                  args.max_length, "--seed", 42, "--epochs", 2, "--lr", "1e-4",
                                  "--batch-size", 16, *args.finetune_flags.split(), "--out", dense],
                     done=(args.work / "dense" / "summary.json",))
        if not ctx.dry_run:
            result["dense_summary"] = read_json(args.work / "dense" / "summary.json")
    for group, name, flags in picked:
        run_dir = args.work / "runs" / name
        step = ctx.compress(name, prune_argv(args, dense, flags, run_dir), check=False,
                            done=(run_dir / "summary.json",))
        if ctx.dry_run:
            continue
        row = {"name": name, "group": group, "cmd": step["cmd"], "rc": step.get("rc", 0),
               "wall_s": step.get("seconds")}
        if row["rc"] == 0:
            row.update(row_of(read_json(run_dir / "summary.json")))
        else:
            row["stderr"] = step.get("tail", "")[-2000:]
        result["rows"].append(row)
        ctx.save(result)
        print(f"{name}: rc {row['rc']}, dense {row.get('dense')}, one-shot {row.get('oneshot')}, "
              f"final {row.get('final')} ({row['wall_s']} s)", flush=True)
    return None if ctx.dry_run else result
