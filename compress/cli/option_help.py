"""Help text, choices and argument group of every config field the commands turn into flags.

One home for each text: a field shared by several commands (``--lr``, ``--task``, ``--doc-stride``)
is described once here; a command's own ``HELPS`` may say it more precisely for that command, and
a field may carry its help itself (``field(metadata={"help": ..., "choices": ...})``, the Hugging
Face argument-parser convention), which wins over both. Choices are read from the registries, so a
new task, student or criterion shows up in ``--help`` without an edit here.
"""

from __future__ import annotations

from collections.abc import Callable

# --------------------------------------------------------------------------------------- choices


def _tasks() -> list[str]:
    from compress.tasks import TASKS

    return [f"{name} ({spec.description})" for name, spec in TASKS.items()]


def _students() -> list[str]:
    from students.registry import STUDENTS

    # the retrieval student lives with its task (compress.retrieval), not in the registry
    return [*STUDENTS, "dual-encoder (--task reqa only)"]


def _objectives() -> list[str]:
    from compress.qa.options import QA_OBJECTIVE_NAMES

    return list(QA_OBJECTIVE_NAMES)


def _pfa_alignments() -> list[str]:
    from compress.qa.options import PFA_ALIGNMENTS

    return list(PFA_ALIGNMENTS)


def _criteria() -> list[str]:
    from compress.pruning.masks import CRITERIA

    return list(CRITERIA)


def _scopes() -> list[str]:
    from compress.pruning.masks import SCOPES

    return list(SCOPES)


def _schedules() -> list[str]:
    from compress.pruning.schedules import SCHEDULES

    return list(SCHEDULES)


def _stages() -> list[str]:
    return ["pretrain", "finetune", "after-finetune"]


def _trackers() -> list[str]:
    from compress.trackers import REPORT_TO

    return list(REPORT_TO)


def _kd_losses() -> list[str]:
    from compress.distill.losses import KD_LOSS_CHOICES

    return list(KD_LOSS_CHOICES)


CHOICES: dict[str, Callable[[], list[str]]] = {
    "task": _tasks,
    "student": _students,
    "objective": _objectives,
    "pfa_alignment": _pfa_alignments,
    "criterion": _criteria,
    "scope": _scopes,
    "schedule": _schedules,
    "stage": _stages,
    "kd_loss": _kd_losses,
    "report_to": _trackers,
}

# ------------------------------------------------------------------------------------------ help

FIELD_HELP: dict[str, str] = {
    # model, task, data, output
    "task": "the task to train or evaluate on",
    "model": "minilm (the packaged default), a model folder, a run folder or a hub name",
    "data_dir": "folder holding the task's files (else $COMPRESS_DATA_DIR, else the hub)",
    "text_column": "csv/jsonl: the column holding the text",
    "text_pair_column": "csv/jsonl: the column holding the second text of a pair task",
    "label_column": "csv/jsonl: the column holding the label",
    "train_limit": "use only the first N training examples",
    "eval_limit": "score only the first N eval examples",
    "out": "run folder to create (default: artifacts/<command>/<time>-<name>)",
    "name": "name of the run folder under artifacts/<command>/ (default: from the task and options)",
    "resume": "continue an interrupted run in --out from its last checkpoint (same options)",
    # training loop
    "lr": "AdamW learning rate of the encoder",
    "head_lr": "learning rate of the freshly initialised task head (unset: --lr)",
    "epochs": "passes over the training data (fractions allowed)",
    "max_steps": "optimizer steps; overrides --epochs",
    "batch_size": "examples per optimizer step",
    "eval_batch_size": "examples per batch when evaluating",
    "max_length": "tokens per example (longer inputs are truncated)",
    "warmup_ratio": "share of the steps over which the learning rate warms up linearly",
    "weight_decay": "AdamW weight decay (not on biases and LayerNorms)",
    "max_grad_norm": "clip the gradient norm to this (0 = no clipping)",
    "seed": "seed of the head initialisation, data order and dropout",
    "log_every": "log the mean loss every N steps to metrics.jsonl",
    "checkpoint_every": "save a resumable checkpoint every N steps (0 = never; needs --out)",
    "rank_check_every": "multi-process runs: check every N steps that all ranks hold the same masks "
                        "(0 = off)",
    "report_to": "also send the logged loss, learning rate, sparsity (at each pruning step) and eval "
                 "metrics to an experiment tracker, its files in <run>/trackers/ (mlflow: a SQLite "
                 "store there unless MLFLOW_TRACKING_URI is set); needs its package installed",
    "information_deletion": "fine-tuning a pruned model: zero its pruned weights once and let them "
                            "regrow (Gordon et al.'s control) instead of keeping the masks",
    # question answering / retrieval
    "doc_stride": "squad: token overlap between windows of a long context (unset: --max-length // 3)",
    "n_best": "squad: start and end candidates kept per window when decoding answers",
    "max_answer_length": "squad: longest answer span in tokens",
    "split_by_article": "squad/reqa: TRAIN/EVAL article counts of one SQuAD file, e.g. 38/10 (the "
                        "first 38 articles train, the next 10 evaluate)",
    "skip_bad_examples": "squad: skip examples whose answer cannot be located instead of stopping",
    "objective": "squad: the training loss",
    "objective_alpha": "squad: weight of the pfa alignment / hl-aacl contrastive term",
    "pfa_alignment": "squad --objective pfa: how perturbed and clean outputs are aligned",
    "pfa_epsilon": "squad --objective pfa: size of the embedding perturbation, relative to its norm",
    "hl_top_k": "squad --objective hl-aacl: hard negatives kept per example",
    "aacl_tau": "squad --objective hl-aacl: temperature of the contrastive term",
    "retrieval_scale": "reqa: scale of the cosine in the dual encoder's in-batch softmax",
    # export / distill extras without a command-specific text
    "opset": "ONNX opset version of the export",
    "teacher_lr": "learning rate when fine-tuning the teacher first (--teacher minilm)",
    "teacher_batch_size": "batch size when fine-tuning the teacher first",
    "teacher_eval_batch_size": "batch size when the teacher labels the transfer set",
}

# ---------------------------------------------------------------------------------------- groups

GROUP_ORDER = ("model and task", "data", "training", "pruning", "distillation",
               "question answering (--task squad, reqa)", "output and resuming")
FIELD_GROUP: dict[str, str] = {
    **{f: "model and task" for f in ("task", "model", "teacher", "student", "stage", "sparsity")},
    **{f: "data" for f in ("data_dir", "text_column", "text_pair_column", "label_column", "train_limit",
                           "eval_limit", "corpus", "unlabeled_examples", "val_fraction", "data_seed")},
    **{f: "training" for f in ("lr", "head_lr", "epochs", "max_steps", "batch_size", "eval_batch_size",
                               "max_length", "warmup_ratio", "weight_decay", "lr_schedule",
                               "max_grad_norm", "seed", "log_every")},
    **{f: "output and resuming" for f in ("out", "name", "resume", "checkpoint_every", "report_to")},
}
CLASS_GROUP: dict[str, str] = {
    "TrainConfig": "training",
    "QAOptions": "question answering (--task squad, reqa)",
    "TeacherKDOptions": "distillation",
    "PruneConfig": "pruning",
    "DistillConfig": "distillation",
}
# QA options that only shape training; evaluation does not offer them
QA_TRAINING_ONLY = ("objective", "objective_alpha", "pfa_alignment", "pfa_epsilon",
                    "hl_top_k", "aacl_tau")


# mixed-in option sets whose fields stay together whatever their names
MIXIN_GROUP = {k: CLASS_GROUP[k] for k in ("QAOptions", "TeacherKDOptions")}


def _owner(cls: type, field_name: str) -> str | None:
    for klass in cls.__mro__:
        if field_name in klass.__dict__.get("__annotations__", {}):
            return klass.__name__
    return None


def group_of(cls: type, field_name: str) -> str | None:
    """The argument group of ``field_name`` of config class ``cls`` (None: the command's own)."""
    owner = _owner(cls, field_name)
    if owner in MIXIN_GROUP:
        return MIXIN_GROUP[owner]
    if field_name in FIELD_GROUP:
        return FIELD_GROUP[field_name]
    return CLASS_GROUP.get(owner) if owner else None
