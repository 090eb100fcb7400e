"""Layer-wise distillation in the recovery after a post-training prune, against the same recovery
with the logit KD term only: ``compress prune --stage post-training --recovery-steps N --teacher T``
with and without ``--kd-layers W``, for each seed on the same data, compared seed by seed (layers
minus logits). One JSON (default artifacts/benchmarks/layerwise_recovery.json), rewritten after
every run; a run whose folder already holds a summary.json is read, not rerun.

Everything after ``--`` goes unchanged to every run: the task and its data, and the prune itself.
``--model`` is what gets pruned: a fine-tuned dense run (the teacher is then ``self``), or a run
pruned earlier, with its dense original as ``--teacher`` (``self`` would be the pruned model).

    python benchmarks/layerwise_recovery.py --model artifacts/dap/dense --recovery-steps 250 \\
        --kd-layers 1 --seeds 1,2 --runs-dir artifacts/layerwise/runs -- --task sst2 \\
        --data-dir ../shared/data --train-limit 20000 --max-length 64 \\
        --structured heads,ffn --criterion fisher --flops-reduction 0.4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compress.core.runs import artifacts_root, environment, write_json  # noqa: E402
from compress.report.analysis import paired_comparison  # noqa: E402

# set by this script for every run; refused after "--"
OWN_FLAGS = ("--stage", "--model", "--recovery-steps", "--teacher", "--kd-layers", "--seed", "--out")


def prune_command(args, seed: int, kd_layers: float | None, out: Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "compress", "prune", "--stage", "post-training", "--model", args.model,
           "--recovery-steps", str(args.recovery_steps), "--teacher", args.teacher, "--seed", str(seed),
           "--out", str(out), *extra]
    return cmd + (["--kd-layers", f"{kd_layers:g}"] if kd_layers else [])


def read_run(folder: Path) -> dict:
    """The scores of a finished run: dev score and metric after recovery, before it, and dense."""
    s = json.loads((folder / "summary.json").read_text())
    return {"metric": s["metric"], "dev": s["eval"][s["metric"]], "score": s["eval"]["score"],
            "before_recovery": s["eval_pruned_before_recovery"]["score"], "dense": s["eval_dense"]["score"],
            "recovery_steps": s["recovery_steps"], "train_seconds": s.get("train_seconds"),
            "distillation": {k: v for k, v in (s.get("distillation") or {}).items() if k != "teacher_eval"},
            "structured": (s.get("structured") or {}).get("flops_reduction"), "run": str(folder)}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", required=True, help="the run to prune (fine-tuned dense, or pruned earlier)")
    p.add_argument("--teacher", default="self", help="self (the --model), or the dense run folder")
    p.add_argument("--recovery-steps", type=int, required=True)
    p.add_argument("--kd-layers", type=float, default=1.0, help="W of the layer-wise side")
    p.add_argument("--seeds", default="1,2", help="comma-separated; each runs both sides")
    p.add_argument("--runs-dir", default=None, help="default artifacts/layerwise-recovery/runs")
    p.add_argument("--out", default=None, help="default artifacts/benchmarks/layerwise_recovery.json")
    args = p.parse_args(own)
    clash = [f for f in extra if f.split("=")[0] in OWN_FLAGS]
    if clash:
        p.error(f"{', '.join(clash)} after -- is set by this script; use its own options")
    if args.kd_layers <= 0:
        p.error(f"--kd-layers must be > 0, got {args.kd_layers:g}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    out = Path(args.out) if args.out else artifacts_root() / "benchmarks" / "layerwise_recovery.json"
    runs_dir = Path(args.runs_dir) if args.runs_dir else artifacts_root() / "layerwise-recovery" / "runs"
    out.parent.mkdir(parents=True, exist_ok=True)
    # the worktree's compress, whatever the caller's folder (relative paths stay the caller's)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
        "PYTHONPATH")])])}
    result = {"model": args.model, "teacher": args.teacher, "recovery_steps": args.recovery_steps,
              "kd_layers": args.kd_layers, "seeds": seeds, "extra_args": extra, "runs": [],
              "env": environment()}
    failed = 0
    for seed in seeds:
        for kd_layers in (None, args.kd_layers):
            side = "layers" if kd_layers else "logits"
            folder = runs_dir / f"{side}-s{seed}"
            cmd = prune_command(args, seed, kd_layers, folder, extra)
            row = {"side": side, "seed": seed, "kd_layers": kd_layers or 0.0, "cmd": " ".join(cmd[2:])}
            if not (folder / "summary.json").is_file():
                t0 = time.time()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                row["wall_s"] = round(time.time() - t0, 1)
                if proc.returncode != 0:
                    failed += 1
                    row.update(rc=proc.returncode, stderr=proc.stderr[-2000:])
            if "rc" not in row:
                row.update(read_run(folder))
            result["runs"].append(row)
            done = {(r["side"], r["seed"]): r["score"] for r in result["runs"] if "score" in r}
            layers = {s: v for (side_, s), v in done.items() if side_ == "layers"}
            logits = {s: v for (side_, s), v in done.items() if side_ == "logits"}
            if set(layers) & set(logits):
                result["layers_minus_logits"] = paired_comparison(layers, logits)
            write_json(out, result)
            print(f"{side} seed {seed}: " + (f"{row['metric']} {row['dev']:.4f} (before recovery "
                  f"{row['before_recovery']:.4f}, dense {row['dense']:.4f})" if "score" in row
                  else f"failed (rc {row['rc']}): {(row['stderr'].strip().splitlines() or [''])[-1]}"),
                  flush=True)
    if "layers_minus_logits" in result:
        c = result["layers_minus_logits"]
        print(f"layers - logits per seed {dict(zip(c['seeds'], c['differences']))}, mean "
              f"{c['mean_difference']:+.4f} -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
