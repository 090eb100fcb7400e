"""Transfer sets larger than the labelled split, for a model that recovers from a teacher.

A recovery after pruning trains a fixed number of steps; at 500 steps of 32 it sees 16,000
examples, fewer than the 20,000 labelled ones, and a longer recovery repeats them. A teacher can
label any text of the task, so the transfer set grows with examples that carry the teacher's
logits only (Tang et al. 2019; Hinton et al. 2015's "transfer set"):

- ``unlabeled``: the task's own training texts beyond ``--train-limit`` (real in-domain text, their
  gold labels never read);
- ``augmented``: copies of the labelled examples made by ``compress.distill.augment`` (masking,
  POS-guided replacement, n-gram sampling), the transfer set ``compress distill --augment`` builds.

Each such example is marked ``has_label`` False: the task term of the loss skips it
(``compress.distill.losses.task_loss`` averages over the labelled examples of a batch) and the KD
term covers it. Its ``labels`` field holds a placeholder of the right type (0, or a zero vector for
multi-label tasks) so the padding collate can stack it; class balancing ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress.tasks.base import TextDataset
from compress.training.loop import HAS_LABEL


@dataclass(frozen=True)
class TransferExtras:
    """The teacher-only texts of a transfer set and where they came from."""

    texts: TextDataset
    unlabeled: int
    augmented: int

    def __len__(self) -> int:
        return len(self.texts)

    def summary(self) -> dict:
        return {"unlabeled": self.unlabeled, "augmented": self.augmented}


def teacher_only(ds: TextDataset) -> TextDataset:
    """``ds``'s texts with placeholder labels (index 0, or no label of a multi-label task): what the
    teacher labels and the student learns from through the KD term only."""
    labels = [[] if ds.multilabel else 0 for _ in range(len(ds))]
    return TextDataset(list(ds.texts), labels, ds.label_names,
                       None if ds.pairs is None else list(ds.pairs), ds.multilabel)


def concat(first: TextDataset, second: TextDataset) -> TextDataset:
    """``first``'s examples then ``second``'s (same labels and text layout)."""
    same_layout = (first.pairs is None) == (second.pairs is None)
    if tuple(first.label_names) != tuple(second.label_names) or not same_layout:
        raise ValueError("the two sets have other labels or another text layout (single vs pair)")
    return TextDataset(first.texts + second.texts, first.labels + second.labels, first.label_names,
                       None if first.pairs is None else first.pairs + second.pairs, first.multilabel)


def transfer_extras(labelled: TextDataset, unlabeled: TextDataset | None, augment_cfg=None
                    ) -> TransferExtras | None:
    """The teacher-only examples: ``unlabeled`` (texts of the task beyond the labelled ones), then
    ``augment_cfg.copies`` augmented copies of every labelled example (``compress.distill.augment``);
    None when there are neither."""
    parts: list[TextDataset] = []
    n_unlabeled = n_augmented = 0
    if unlabeled is not None and len(unlabeled):
        parts.append(teacher_only(unlabeled))
        n_unlabeled = len(unlabeled)
    if augment_cfg is not None and augment_cfg.copies:
        from compress.distill.augment import augment_texts

        texts, pairs = augment_texts(labelled.texts, labelled.pairs, augment_cfg)
        parts.append(teacher_only(TextDataset(texts, [0] * len(texts), labelled.label_names, pairs,
                                              labelled.multilabel)))
        n_augmented = len(texts)
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = concat(out, p)
    return TransferExtras(out, n_unlabeled, n_augmented)


def mark_teacher_only(feats: list[dict]) -> list[dict]:
    """Copies of encoded examples marked ``has_label`` False."""
    return [{**f, HAS_LABEL: False} for f in feats]
