"""Student-teacher agreement against counts worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from compress.report.distillation import teacher_agreement


def test_single_label_agreement_and_split_accuracy():
    gold = np.array([0, 1, 1, 0, 2])
    teacher = np.eye(3)[[0, 1, 0, 0, 1]]  # right on 0, 1, 3; wrong on 2, 4
    student = np.eye(3)[[0, 0, 1, 0, 1]]  # same as teacher on 0, 3, 4
    r = teacher_agreement(student * 5.0, teacher * 2.0, gold, multilabel=False)
    assert r["agreement"] == pytest.approx(3 / 5)
    assert (r["teacher_right"], r["teacher_wrong"]) == (3, 2)
    assert r["student_accuracy_where_teacher_right"] == pytest.approx(2 / 3)  # 0 and 3, not 1
    assert r["student_accuracy_where_teacher_wrong"] == pytest.approx(1 / 2)  # 2, not 4


def test_single_label_empty_side_is_none():
    gold = np.array([0, 1])
    teacher = np.eye(2)[[0, 1]]
    r = teacher_agreement(teacher, teacher, gold, multilabel=False)
    assert r["agreement"] == 1.0 and r["student_accuracy_where_teacher_wrong"] is None


def test_multilabel_agreement_per_decision_and_per_example():
    teacher = np.array([[1.0, -1.0, 2.0], [-3.0, -1.0, 0.5]])  # {0, 2}, {2}
    student = np.array([[0.2, -0.1, 1.0], [-1.0, 0.3, 0.1]])  # {0, 2}, {1, 2}
    r = teacher_agreement(student, teacher, np.zeros((2, 3)), multilabel=True)
    assert r["agreement"] == pytest.approx(5 / 6)
    assert r["exact_agreement"] == pytest.approx(1 / 2)


def test_bert_flops_formula_reads_distilbert_configs():
    """DistilBERT names the FFN width hidden_dim; the formula then equals a BERT of the same sizes:
    2 layers x (8 x (4 x 32^2 + 2 x 32 x 64) + 2 x 8^2 x 32) + 32^2 + 32 x 2 MACs."""
    from transformers import BertConfig, DistilBertConfig

    from compress.report.distillation import bert_flops_formula

    macs = 2 * (8 * (4 * 32 * 32 + 2 * 32 * 64) + 2 * 64 * 32) + 32 * 32 + 32 * 2
    distil = DistilBertConfig(n_layers=2, dim=32, n_heads=4, hidden_dim=64)
    bert = BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64)
    assert bert_flops_formula(distil, 8, 2) == bert_flops_formula(bert, 8, 2) == 2 * macs


@pytest.mark.parametrize("flops, text", [
    (0, "0 FLOPs"), (924, "924 FLOPs"), (411_200, "411.2 kFLOPs"), (22_300_000, "22.3 MFLOPs"),
    (2_700_000_000, "2.7 GFLOPs"), (1.5e12, "1.5 TFLOPs"),
])
def test_flops_are_printed_in_the_unit_that_fits(flops, text):
    from compress.measure.verdict import format_flops

    assert format_flops(flops) == text


def test_distill_table_states_the_length_and_prints_a_logreg_in_flops():
    from compress.report.distillation import format_table

    rows = [{"model": "teacher (run)", "score": 0.9, "params": 22_000_000, "flops": 2_700_000_000,
             "flops_ratio": 1.0},
            {"model": "logreg (kd)", "score": 0.8, "params": 300_000, "flops": 924,
             "flops_ratio": 2_700_000_000 / 924}]
    table = format_table(rows, "accuracy", seq_len=10)
    assert "2.7 GFLOPs" in table.splitlines()[2] and "924 FLOPs" in table.splitlines()[3]
    assert "one example of 10 tokens" in table.splitlines()[-1]
    assert "0.0000" not in table


def test_measure_prints_a_students_flops_in_a_unit_that_fits(tmp_path, capsys):
    import torch

    from compress.cli.main import main
    from students.registry import build_student, save_student, student_config

    torch.manual_seed(0)
    model = build_student("logreg", student_config("logreg", {"bigram_buckets": 64}), 500)
    model.prepare([[5, 6, 7], [8, 9]])
    save_student(model, "logreg", tmp_path / "logreg", {"task": "sst2"})
    assert main(["measure", str(tmp_path / "logreg"), "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    dense = next(line for line in out.splitlines() if line.strip().startswith("dense"))
    assert "FLOPs per example at length 8" in out and "0.0000" not in dense
    assert dense.split()[2] in ("FLOPs", "kFLOPs"), dense
