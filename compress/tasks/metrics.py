"""Task metrics, computed with scikit-learn."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from compress.core.errors import UsageError


def classification_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    pred = logits.argmax(-1)
    out = {"accuracy": float(accuracy_score(labels, pred)),
           "matthews": float(matthews_corrcoef(labels, pred))}
    if logits.shape[-1] == 2:
        out["f1"] = float(f1_score(labels, pred, zero_division=0))
    # every class counts alike: a pruned model that loses a small class shows it here, not in accuracy
    out["macro_f1"] = float(f1_score(labels, pred, average="macro", zero_division=0))
    return out


def multilabel_metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Labels are multi-hot; a label is predicted when its logit > 0 (probability > 0.5)."""
    pred = (logits > 0).astype(int)
    labels = labels.astype(int)
    return {"micro_f1": float(f1_score(labels, pred, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(labels, pred, average="macro", zero_division=0)),
            "subset_accuracy": float((pred == labels).all(axis=1).mean())}


METRIC_FUNCTIONS = {"classification": classification_metrics, "multilabel": multilabel_metrics}


def compute_metrics(family: str, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    if family not in METRIC_FUNCTIONS:
        raise UsageError(f"no metrics for task family '{family}'; known: {', '.join(METRIC_FUNCTIONS)}")
    return METRIC_FUNCTIONS[family](logits, labels)
