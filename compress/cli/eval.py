from collections.abc import Callable

from compress.cli.common import add_config_args, config_from_args
from compress.cli.option_groups import QA_TRAINING_ONLY
from compress.recipes.embedding import eval_embedding
from compress.recipes.finetune import EvalConfig, run_eval
from compress.recipes.qa import eval_qa
from compress.recipes.retrieval import eval_reqa
from compress.tasks import get_task

HELP = "evaluate a fine-tuned model (run folder or model folder) on a task's eval split"
EXAMPLES = """examples:
  compress eval --model artifacts/finetune/20261122-101500-sst2 --task sst2 --data-dir ../shared/data
"""


# Families whose evaluation differs from classification (recipes.finetune.run_eval scores the
# classification ones).
EVAL_FAMILIES: dict[str, Callable[..., dict]] = {
    "qa": eval_qa,
    "retrieval": eval_reqa,
    "embedding": eval_embedding,
}


def eval_task(cfg: EvalConfig) -> dict:
    """Re-evaluate a saved model on the task's eval split with its family's recipe; writes an eval
    run folder."""
    family = get_task(cfg.task).family
    if family in EVAL_FAMILIES:  # qa, retrieval, embedding
        return EVAL_FAMILIES[family](cfg)
    return run_eval(cfg)


def add_arguments(parser):
    # evaluation reads the eval split only and trains nothing: no training options
    add_config_args(parser, EvalConfig, {"model": "run folder or fine-tuned model folder"},
                    skip=("train_limit", *QA_TRAINING_ONLY))


def run(args):
    eval_task(config_from_args(EvalConfig, args))
    return 0
