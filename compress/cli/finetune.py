from compress.cli.common import add_config_args, config_from_args
from compress.recipes.finetune import FinetuneConfig, run_finetune

HELP = "fine-tune a model's task head end to end and evaluate it on the task's dev split"
EXAMPLES = """examples:
  compress finetune                                   # packaged MiniLM on the bundled sample
  compress finetune --task sst2 --data-dir ../shared/data --train-limit 20000 --epochs 1
  compress finetune --task reuters --data-dir ../shared/data --max-length 256 --lr 1e-4
  compress finetune --task csv --data-dir mydata --text-column review --label-column stars
  compress finetune --model artifacts/prune/RUN --teacher artifacts/finetune/DENSE --task sst2 ...
                                          # a pruned model recovers by distilling from the dense one
"""


def add_arguments(parser):
    add_config_args(parser, FinetuneConfig)


def run(args):
    run_finetune(config_from_args(FinetuneConfig, args))
    return 0
