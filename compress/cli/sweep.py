from compress.cli.common import add_config_args, config_from_args
from compress.recipes.sweep import SweepConfig, run_sweep

HELP = "run a grid of prune/fine-tune cells (sparsities x variants x tasks x learning rates), resumably"
EXAMPLES = """examples:
  compress sweep --sparsities 0,0.2,0.4 --tasks sst2 --variants magnitude,random \\
      --data-dir ../shared/data --train-limit 2000 --max-steps 100 --out artifacts/sweep/sst2
  compress sweep --sparsities 0:0.9:0.1 --tasks sst2,rte --lrs 2e-5,5e-5 --jobs 2 \\
      --pretrain-corpus ../shared/data/wikitext2 --pretrain-steps 200 --out artifacts/sweep/gordon
  compress sweep --sparsities 0,0.5,0.7 --tasks sst2 --variants sparsegpt,wanda,oneshot-magnitude \\
      --calibration-samples 256 --data-dir ../shared/data --out artifacts/sweep/oneshot  # no training
  compress sweep --backend ray --address auto --gpus-per-cell 1 --sparsities 0:0.9:0.1 \\
      --tasks sst2,rte --out /shared/nfs/sweeps/gordon     # on a Ray cluster's head node
re-run the same command to resume: finished cells are kept, killed ones redone.
then: compress report SWEEP
"""


def add_arguments(parser):
    add_config_args(parser, SweepConfig)


def run(args):
    cfg = config_from_args(SweepConfig, args)
    try:
        path = run_sweep(cfg)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (compress.cli.main.Terminated)
        import sys

        from compress.cli.main import Terminated

        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"compress sweep: {what}; re-run the same command (same --out) to resume: "
              "finished cells are kept, the interrupted ones are redone", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    print(f"sweep folder: {path}\nthen: compress report {path}")
    return 0
