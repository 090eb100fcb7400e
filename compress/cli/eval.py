from compress.cli.common import add_config_args, config_from_args
from compress.cli.option_groups import QA_TRAINING_ONLY
from compress.recipes.finetune import EvalConfig, run_eval

HELP = "evaluate a fine-tuned model (run folder or model folder) on a task's eval split"
EXAMPLES = """examples:
  compress eval --model artifacts/finetune/20261122-101500-sst2 --task sst2 --data-dir ../shared/data
"""


def add_arguments(parser):
    # evaluation reads the eval split only and trains nothing: no training options
    add_config_args(parser, EvalConfig, {"model": "run folder or fine-tuned model folder"},
                    skip=("train_limit", *QA_TRAINING_ONLY))


def run(args):
    run_eval(config_from_args(EvalConfig, args))
    return 0
