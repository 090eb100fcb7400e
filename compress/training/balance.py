"""Class-balanced training sets: a class far below its even share of the examples is drawn again
(with replacement, seeded) until it reaches ``floor`` times that share, so a fixed number of
training steps (a recovery after pruning) sees every class often enough to keep it.

    feats, report = oversample_small_classes(feats, n_classes=6, floor=0.5, seed=42)

Single-label examples only (``labels`` an int); a set whose classes all reach the floor comes back
unchanged, the same list object. Examples marked ``has_label`` False (teacher-only transfer
examples, ``compress.distill.transfer``) carry no class: they are neither counted nor drawn.
"""

from __future__ import annotations

import math
import random

from compress.core.errors import UsageError
from compress.training.loop import is_labelled


def oversample_small_classes(feats: list[dict], n_classes: int, floor: float, seed: int
                             ) -> tuple[list[dict], dict]:
    """``feats`` with the examples of every class whose count is below ``floor * len(feats) /
    n_classes`` repeated (drawn with replacement) up to that count; the repeats follow the
    originals. Returns the examples and ``{"floor", "classes": {label: [before, after]}}`` for the
    classes that were topped up. ``floor`` 0 turns it off."""
    if not 0 <= floor <= 1:
        raise UsageError(f"the class floor must be in [0, 1] (a share of the even share), got {floor}")
    if n_classes < 1:
        raise UsageError(f"n_classes must be at least 1, got {n_classes}")
    report: dict = {"floor": floor, "classes": {}}
    if floor == 0 or not feats:
        return feats, report
    by_class: dict[int, list[int]] = {}
    labelled = [i for i, f in enumerate(feats) if is_labelled(f)]
    for i in labelled:
        label = feats[i]["labels"]
        if not isinstance(label, int):
            raise UsageError("class balancing applies to single-label tasks; this one has multi-label "
                             "examples")
        by_class.setdefault(label, []).append(i)
    target = math.ceil(floor * len(labelled) / n_classes)
    rng = random.Random(seed)
    extra: list[dict] = []
    for label in sorted(by_class):
        members = by_class[label]
        if len(members) < target:
            extra += [feats[rng.choice(members)] for _ in range(target - len(members))]
            report["classes"][label] = [len(members), target]
    return (feats + extra if extra else feats), report
