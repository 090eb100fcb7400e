"""Task contract: a spec that knows its format, splits, label set, head and metric."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from compress.core.errors import DataError, UsageError


@dataclass(frozen=True)
class DataOptions:
    """Where data comes from. ``data_dir`` None means: the hub (or the bundled sample)."""

    data_dir: Path | None = None
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"


@dataclass
class TextDataset:
    """Texts (and optional second texts) with labels.

    ``labels`` holds one index per example for single-label tasks and a list of indices per example
    for multi-label tasks; ``label_names[i]`` names index ``i``.
    """

    texts: list[str]
    labels: list
    label_names: tuple[str, ...]
    pairs: list[str] | None = None
    multilabel: bool = False

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, n: int | None) -> TextDataset:
        if n is None or n >= len(self):
            return self
        return TextDataset(self.texts[:n], self.labels[:n], self.label_names,
                           None if self.pairs is None else self.pairs[:n], self.multilabel)

    def select(self, indices: list[int]) -> TextDataset:
        """The examples at ``indices``, in that order."""
        return TextDataset([self.texts[i] for i in indices], [self.labels[i] for i in indices],
                           self.label_names,
                           None if self.pairs is None else [self.pairs[i] for i in indices],
                           self.multilabel)


@dataclass(frozen=True)
class TaskSpec:
    """A registered task.

    ``family`` picks the head: ``classification`` (single label, sentence or pair), ``multilabel``
    (sigmoid per label, BCE), and later ``qa`` and ``retrieval``. ``load(opts, split)`` returns the
    family's dataset type. ``metric`` is the primary metric reported as the run's score.
    """

    name: str
    family: str
    metric: str
    load: Callable[[DataOptions, str], TextDataset]
    train_split: str = "train"
    eval_split: str = "dev"
    labels: tuple[str, ...] | None = None
    pair: bool = False
    hub: str | None = None
    description: str = ""
    local_dirs: tuple[str, ...] = field(default_factory=tuple)
    #: its loader reads the --text-column, --text-pair-column and --label-column of the user's files
    reads_columns: bool = False


COLUMN_OPTIONS = ("text_column", "text_pair_column", "label_column")


def refuse_column_options(opts: DataOptions, task: str) -> None:
    """UsageError for a column option (--text-column, --text-pair-column, --label-column) set to
    other than its default for ``task``, whose loader reads its own layout and would ignore it
    (a pair column on the sentiment sample would train on single sentences without a word)."""
    for name in COLUMN_OPTIONS:
        value = getattr(opts, name)
        if value != DataOptions.__dataclass_fields__[name].default:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value} does not apply to task {task}, which reads its own "
                             f"columns; it names a column of your files with --task csv or jsonl "
                             f"(drop {flag})")


def data_dir_from_env(data_dir: str | Path | None) -> Path | None:
    """``--data-dir`` wins, then ``COMPRESS_DATA_DIR``; None means no local copy."""
    if data_dir is None:
        data_dir = os.environ.get("COMPRESS_DATA_DIR") or None
    if data_dir is None:
        return None
    p = Path(data_dir)
    if not p.is_dir():
        raise DataError(f"data directory not found: {p} (pass an existing folder to --data-dir)")
    return p


def task_folder(opts: DataOptions, spec_dirs: tuple[str, ...], required: tuple[str, ...]) -> Path:
    """Find the task's folder: ``<data_dir>/<one of spec_dirs>`` or ``<data_dir>`` itself."""
    assert opts.data_dir is not None
    candidates = [opts.data_dir / d for d in spec_dirs] + [opts.data_dir]
    for c in candidates:
        if c.is_dir() and any((c / r).exists() for r in required):
            return c
    names = " or ".join(spec_dirs)
    raise DataError(
        f"no {names} data under {opts.data_dir}: expected {names}/{required[0]} "
        f"(see README 'Data directory layout')"
    )


def check_label(value, label_names: tuple[str, ...], where: str) -> int:
    """Map a raw label (index or name) to its index; out-of-set labels are a data error."""
    s = str(value).strip()
    if s in label_names:
        return label_names.index(s)
    try:
        i = int(s)
    except ValueError:
        i = None
    if i is not None and 0 <= i < len(label_names) and str(i) == s:
        return i
    raise DataError(f"{where}: label '{s}' is not in the label set {list(label_names)} "
                    "(fix the row or the --label-column)")
