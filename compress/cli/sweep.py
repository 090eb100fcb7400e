from compress.cli.common import add_config_args, config_from_args
from compress.recipes.sweep import VARIANTS, SweepConfig, run_sweep

HELP = "run a grid of prune/fine-tune cells (sparsities x variants x tasks x learning rates), resumably"
EXAMPLES = """examples:
  compress sweep --sparsities 0,0.2,0.4 --tasks sst2 --variants magnitude,random \\
      --data-dir ../shared/data --train-limit 2000 --max-steps 100 --out artifacts/sweep/sst2
  compress sweep --sparsities 0:0.9:0.1 --tasks sst2,rte --lrs 2e-5,5e-5 --jobs 2 \\
      --pretrain-corpus ../shared/data/wikitext2 --pretrain-steps 200 --out artifacts/sweep/gordon
  compress sweep --backend ray --address auto --gpus-per-cell 1 --sparsities 0:0.9:0.1 \\
      --tasks sst2,rte --out /shared/nfs/sweeps/gordon     # on a Ray cluster's head node
re-run the same command to resume: finished cells are kept, killed ones redone.
then: compress report SWEEP
"""
HELPS = {
    "sparsities": "numbers and START:STOP:STEP ranges (STOP included), e.g. 0,0.2 or 0:0.9:0.1",
    "tasks": "comma-separated task names", "lrs": "fine-tuning learning rates (best one is reported)",
    "variants": "comma-separated, from: " + ", ".join(VARIANTS),
    "teacher": "add a distillation-aware twin (<variant>+kd, prune --teacher) of every cell pruned "
               "on the task: 'self' (after-finetune cells distil from their dense phase) or a run "
               "fine-tuned on the task",
    "pretrain_corpus": "prune during masked-LM pre-training on this text first (file(s) or folder)",
    "pretrain_steps": "optimizer steps of each pre-training cell",
    "jobs": "--backend local: cells run at once (each gets cores/jobs threads)",
    "out": "sweep folder; re-run with the same --out to resume",
    "runner": "command prefix that runs one cell (default: this Python's 'python -m compress')",
    "max_steps": "fine-tuning steps per cell (unset: --epochs over the data)",
    "model": "start model: minilm, a model folder, a run folder or a hub name",
    "data_dir": "folder holding the task files (e.g. ../shared/data)",
    "train_limit": "use only the first N training examples of each task",
    "eval_limit": "score only the first N dev examples", "epochs": "fine-tuning epochs per cell",
    "batch_size": "fine-tuning batch size", "max_length": "fine-tuning sequence length (tokens)",
    "seed": "seed of every cell", "schedule": "pruning schedule of every cell: gradual or oneshot",
    "pretrain_lr": "learning rate of the pre-training cells",
    "pretrain_batch_size": "batch size of the pre-training cells",
    "pretrain_max_length": "block length (tokens) of the pre-training cells",
    "pretrain_heldout_blocks": "held-out corpus blocks scored for the MLM loss",
}


def add_arguments(parser):
    add_config_args(parser, SweepConfig, HELPS)


def run(args):
    cfg = config_from_args(SweepConfig, args)
    try:
        path = run_sweep(cfg)
    except KeyboardInterrupt:
        import sys

        print("compress sweep: interrupted; re-run the same command (same --out) to resume: "
              "finished cells are kept, the interrupted ones are redone", file=sys.stderr)
        return 130
    print(f"sweep folder: {path}\nthen: compress report {path}")
    return 0
