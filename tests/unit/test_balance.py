"""Class-balanced recovery sets: counts against a hand count."""

from __future__ import annotations

import pytest

from compress.core.errors import UsageError
from compress.training.balance import oversample_small_classes


def test_a_class_below_the_floor_is_topped_up_to_it_and_the_others_are_kept():
    feats = [{"labels": 0, "i": i} for i in range(90)] + [{"labels": 1, "i": 90 + i} for i in range(7)] + \
        [{"labels": 2, "i": 97 + i} for i in range(3)]
    out, report = oversample_small_classes(feats, n_classes=3, floor=0.5, seed=1)
    # 100 examples, 3 classes: the even share is 33.3, half of it 16.67 -> 17
    counts = [sum(f["labels"] == c for f in out) for c in range(3)]
    assert counts == [90, 17, 17]
    assert report["classes"] == {1: [7, 17], 2: [3, 17]}
    assert out[:100] == feats  # the originals first, in order
    assert {f["i"] for f in out[100:] if f["labels"] == 2} <= {97, 98, 99}  # repeats of its own examples


def test_a_balanced_set_and_floor_zero_come_back_unchanged():
    feats = [{"labels": i % 2} for i in range(10)]
    assert oversample_small_classes(feats, 2, 0.5, 0)[0] is feats
    skewed = [{"labels": 0}] * 9 + [{"labels": 1}]
    assert oversample_small_classes(skewed, 2, 0.0, 0)[0] is skewed


def test_the_draw_is_seeded():
    feats = [{"labels": 0, "i": i} for i in range(50)] + [{"labels": 1, "i": 50 + i} for i in range(5)]
    a, _ = oversample_small_classes(feats, 2, 1.0, seed=3)
    b, _ = oversample_small_classes(feats, 2, 1.0, seed=3)
    assert a == b and sum(f["labels"] == 1 for f in a) == 28


@pytest.mark.parametrize("feats, n, floor, words", [
    ([{"labels": [1, 0]}], 2, 0.5, "single-label"),
    ([{"labels": 0}], 2, 1.5, r"in \[0, 1\]"),
])
def test_bad_input_is_one_clear_error(feats, n, floor, words):
    with pytest.raises(UsageError, match=words):
        oversample_small_classes(feats, n, floor, 0)


def test_teacher_only_examples_are_neither_counted_nor_drawn():
    labelled = [{"labels": 0}] * 9 + [{"labels": 1}]
    teacher_only = [{"labels": 0, "has_label": False}] * 90  # placeholders, not a class
    out, report = oversample_small_classes(labelled + teacher_only, n_classes=2, floor=1.0, seed=0)
    # the even share of the 10 labelled examples is 5: class 1 drawn 4 more times, from itself
    assert report["classes"] == {1: [1, 5]}
    assert out[100:] == [{"labels": 1}] * 4
