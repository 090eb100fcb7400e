from collections.abc import Callable
from pathlib import Path

from compress.api.finetuning import FinetuneConfig, HookFactory
from compress.cli.common import add_config_args, config_from_args
from compress.core.errors import UsageError
from compress.recipes.finetune import run_finetune
from compress.recipes.qa import finetune_qa
from compress.recipes.retrieval import finetune_reqa
from compress.tasks import get_task

HELP = "fine-tune a model's task head end to end and evaluate it on the task's dev split"
EXAMPLES = """examples:
  compress finetune                                   # packaged MiniLM on the bundled sample
  compress finetune --task sst2 --data-dir ../shared/data --train-limit 20000 --epochs 1
  compress finetune --task reuters --data-dir ../shared/data --max-length 256 --lr 1e-4
  compress finetune --task csv --data-dir mydata --text-column review --label-column stars
  compress finetune --model artifacts/prune/RUN --teacher artifacts/finetune/DENSE --task sst2 ...
                                          # a pruned model recovers by distilling from the dense one
"""


# the task's family picks its fine-tuning recipe
FINETUNE_FAMILIES: dict[str, Callable[..., Path]] = {
    "classification": run_finetune,
    "multilabel": run_finetune,
    "qa": finetune_qa,
    "retrieval": finetune_reqa,
}
DISTILLABLE_FAMILIES = ("classification", "multilabel", "qa")  # the families --teacher applies to


def finetune_task(cfg: FinetuneConfig, command: str = "finetune",
                  hook_factory: HookFactory | None = None, extra_meta: dict | None = None) -> Path:
    """Fine-tune ``cfg.model`` on ``cfg.task`` with the recipe of the task's family
    (``FINETUNE_FAMILIES``); returns the finished run folder. ``hook_factory(model)`` adds training
    hooks (pruning, kept masks) without changing the loop."""
    family = get_task(cfg.task).family
    if family not in FINETUNE_FAMILIES:
        known = ", ".join(FINETUNE_FAMILIES)
        raise UsageError(f"task family '{family}' cannot be fine-tuned; known: {known}")
    if getattr(cfg, "teacher", None) and family not in DISTILLABLE_FAMILIES:
        raise UsageError(f"--teacher distils classification or span logits; '{cfg.task}' is a {family} "
                         "task, which does not support it yet (drop --teacher)")
    return FINETUNE_FAMILIES[family](cfg, command, hook_factory, extra_meta)


def add_arguments(parser):
    add_config_args(parser, FinetuneConfig)


def run(args):
    finetune_task(config_from_args(FinetuneConfig, args))
    return 0
