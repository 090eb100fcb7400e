"""FLOPs per example and the distillation report table.

FLOPs come from ``compress.measure.flops.count_flops`` (fvcore tracing, dense count, 1 MAC = 2 FLOPs)
on one example of the evaluation set's mean token length. If tracing fails, documented analytic
formulas are used instead and the report says so (``flops_source``):

- BERT teacher, per example of length L, hidden h, FFN f, layers n: MACs = n * (L * (4 h^2 + 2 h f)
  + 2 L^2 h) + h^2 (pooler) + h * labels; embeddings, layer norms, softmax and GELU not counted.
- students: ``Student.flops_per_example`` (see each student's docstring).

``teacher_agreement`` measures fidelity (how often the student decides as the teacher does) beside
accuracy: distillation can raise the one without the other when the student copies the teacher's
mistakes as readily as its successes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def bert_flops_formula(config, seq_len: int, num_labels: int) -> int:
    """The BERT formula above for any encoder config: the FFN width is ``intermediate_size``, or
    DistilBERT's ``hidden_dim`` (its ``hidden_size`` and ``num_hidden_layers`` are aliases)."""
    h, n = config.hidden_size, config.num_hidden_layers
    f = getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", None) or 4 * h
    macs = n * (seq_len * (4 * h * h + 2 * h * f) + 2 * seq_len * seq_len * h) + h * h + h * num_labels
    return 2 * macs


def measure_flops(model: torch.nn.Module, inputs: dict[str, torch.Tensor], formula: int
                  ) -> tuple[int, str]:
    """(FLOPs per example, source): the measured dense count, else ``formula``."""
    try:
        from compress.measure.flops import count_flops
    except ImportError:
        return int(formula), "formula"
    try:
        was_training = model.training
        model.eval()
        result = count_flops(model, inputs)
        model.train(was_training)
        return int(result["dense_flops"]), "compress.measure.flops (fvcore)"
    except Exception:  # noqa: BLE001 - a model fvcore cannot trace falls back to the formula
        return int(formula), "formula"


def format_table(rows: list[dict[str, Any]], metric: str, seq_len: int) -> str:
    """A fixed-width table: model, metric, parameters, FLOPs/example (in the unit that fits) and
    FLOPs ratio to the teacher, then a line saying the length the FLOPs were counted at."""
    from compress.measure.verdict import format_flops

    head = f"{'model':<28} {metric:>9} {'params':>12} {'FLOPs/example':>15} {'teacher/model':>14}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = r.get("flops_ratio")
        lines.append(f"{r['model']:<28} {r['score']:>9.4f} {r['params']:>12,} {format_flops(r['flops']):>15} "
                     f"{'' if ratio is None else f'{ratio:.1f}x':>14}")
    lines.append(f"FLOPs/example: dense, one example of {seq_len} tokens (the eval set's mean length), "
                 "1 multiply-add = 2 FLOPs")
    return "\n".join(lines)


def teacher_agreement(student_logits: np.ndarray, teacher_logits: np.ndarray, gold: np.ndarray,
                      multilabel: bool) -> dict[str, Any]:
    """How the student's decisions relate to the teacher's on the evaluation set.

    single-label (argmax): ``agreement`` = share of examples where student and teacher predict the
    same label; ``student_accuracy_where_teacher_right`` / ``..._wrong`` split the student's accuracy
    by whether the teacher got the example right (None for an empty side), with the counts.
    multi-label (logit > 0 per label): ``agreement`` = share of (example, label) decisions that match;
    ``exact_agreement`` = share of examples whose whole predicted label sets match."""
    s, t = np.asarray(student_logits), np.asarray(teacher_logits)
    if multilabel:
        ds, dt = s > 0, t > 0
        return {"agreement": float((ds == dt).mean()),
                "exact_agreement": float((ds == dt).all(axis=1).mean())}
    ps, pt, y = s.argmax(1), t.argmax(1), np.asarray(gold)
    right = pt == y

    def acc(sel):
        return float((ps[sel] == y[sel]).mean()) if sel.any() else None

    return {"agreement": float((ps == pt).mean()),
            "student_accuracy_where_teacher_right": acc(right),
            "student_accuracy_where_teacher_wrong": acc(~right),
            "teacher_right": int(right.sum()), "teacher_wrong": int((~right).sum())}
