"""Which task, which data and which model (``TaskDataConfig``), shared by every command that trains or
evaluates, and the task's splits loaded once (``load_task_data``) for whatever runs on them."""

from __future__ import annotations

from dataclasses import dataclass

from compress.core.config import option
from compress.core.errors import UsageError
from compress.tasks import DataOptions, TaskSpec, data_dir_from_env, get_task, load_split, task_choices
from compress.tasks.base import TextDataset


@dataclass(frozen=True)
class TaskDataConfig:
    """Which task, which data and which model; shared by every command that trains or evaluates."""

    task: str = option("sample", choices=task_choices,
                       help="the task to train or evaluate on")
    model: str = option("minilm", help="minilm (the packaged default), a model folder, a run folder "
                                       "or a hub name")
    data_dir: str | None = option(None, help="folder holding the task's files (else "
                                             "$COMPRESS_DATA_DIR, else the hub)")
    text_column: str = option("text", help="csv/jsonl: the column holding the text")
    text_pair_column: str | None = option(None, help="csv/jsonl: the column holding the second "
                                                     "text of a pair task")
    label_column: str = option("label", help="csv/jsonl: the column holding the label")
    train_limit: int | None = option(None, help="use only the first N training examples")
    eval_limit: int | None = option(None, help="score only the first N eval examples")
    out: str | None = option(None, help="run folder to create (default: "
                                        "artifacts/<command>/<time>-<name>)")
    name: str | None = option(None, help="name of the run folder under artifacts/<command>/ "
                                         "(default: from the task and options)")

    def data_options(self) -> DataOptions:
        return DataOptions(data_dir_from_env(self.data_dir), self.text_column,
                           self.text_pair_column, self.label_column)


def load_task_data(cfg: TaskDataConfig, splits: tuple[str, ...] = ("train", "eval")
                   ) -> tuple[TaskSpec, dict[str, TextDataset]]:
    """Validate the task and load its splits before anything is written."""
    spec = get_task(cfg.task)
    if spec.family not in ("classification", "multilabel"):
        raise UsageError(f"task '{spec.name}' ({spec.family}) is not a classification task")
    opts = cfg.data_options()
    out = {}
    for s in splits:
        split = spec.train_split if s == "train" else spec.eval_split
        ds = load_split(spec, opts, split)
        out[s] = ds.subset(cfg.train_limit if s == "train" else cfg.eval_limit)
    return spec, out
