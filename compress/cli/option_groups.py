"""The argument group of every config field the commands turn into flags, and their order.

A field's help text and choices live on the field itself (``compress.core.config.option``, Hugging
Face's ``field(metadata={"help": ..., "choices": ...})`` convention); a command's own ``HELPS`` may
say it more precisely for that command. This module only places the flags: model and task first,
then data, training, pruning, distillation, question answering, output.
"""

from __future__ import annotations

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
