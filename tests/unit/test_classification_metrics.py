"""Classification metrics: macro-F1 beside accuracy for every label count, so a model that loses a
small class shows it even when accuracy hardly moves."""

from __future__ import annotations

import numpy as np
import pytest

from compress.tasks.metrics import classification_metrics


def test_a_binary_model_that_never_predicts_the_small_class_has_half_the_macro_f1():
    labels = np.array([0, 0, 0, 1])
    logits = np.array([[1.0, 0.0]] * 4)  # always class 0
    m = classification_metrics(logits, labels)
    assert m["accuracy"] == pytest.approx(0.75)
    # class 0: precision 3/4, recall 1 -> F1 6/7; class 1: no prediction -> F1 0
    assert m["macro_f1"] == pytest.approx((6 / 7 + 0) / 2)
    assert m["f1"] == 0.0


def test_three_classes_macro_f1_by_hand():
    labels = np.array([0, 0, 1, 1, 2, 2])
    pred = np.array([0, 1, 1, 1, 2, 0])
    logits = np.eye(3)[pred]
    m = classification_metrics(logits, labels)
    # class 0: P 1/2 R 1/2 F 1/2; class 1: P 2/3 R 1 F 4/5; class 2: P 1 R 1/2 F 2/3
    assert m["macro_f1"] == pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)
    assert m["accuracy"] == pytest.approx(4 / 6)
