"""Distillation-aware pruning's loss and plumbing: the combined loss against a hand computation, the
teacher stays frozen, bad options are refused."""

from __future__ import annotations

import math

import pytest
import torch

from compress.core.errors import UsageError
from compress.distill.teacher_kd import (
    TEACHER_LOGITS,
    TeacherKDOptions,
    TeacherLogitsLoss,
    agreement,
    attach_teacher_logits,
    teacher_logits_collate,
)


class _Out:
    def __init__(self, logits, hidden=None):
        self.logits, self.hidden_states = logits, hidden


class _Fixed(torch.nn.Module):
    """A 'model' whose logits are a parameter, so the loss can be checked by hand."""

    def __init__(self, logits, hidden=None):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor(logits))
        self.hidden = None if hidden is None else torch.nn.Parameter(torch.tensor(hidden))

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        return _Out(self.logits, (self.hidden,) if output_hidden_states else None)


def _log_softmax(row):
    z = math.log(sum(math.exp(x) for x in row))
    return [x - z for x in row]


def test_combined_loss_equals_a_hand_computation():
    s, t, y = [[1.0, -1.0, 0.5], [0.0, 2.0, -1.0]], [[2.0, 0.0, 0.0], [-1.0, 1.0, 3.0]], [0, 2]
    temp, lam = 2.0, 3.0
    ce = -sum(_log_softmax(s[i])[y[i]] for i in range(2)) / 2
    kl = 0.0
    for i in range(2):
        ls, lt = _log_softmax([x / temp for x in s[i]]), _log_softmax([x / temp for x in t[i]])
        kl += sum(math.exp(lt[j]) * (lt[j] - ls[j]) for j in range(3))
    expected = ce + lam * temp * temp * kl / 2
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "labels": torch.tensor(y),
             TEACHER_LOGITS: torch.tensor(t)}
    loss, extra = TeacherLogitsLoss(False, lam, temp)(_Fixed(s), batch)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert extra["task_loss"] == pytest.approx(ce, rel=1e-6)
    assert extra["kd_loss"] == pytest.approx(temp * temp * kl / 2, rel=1e-6)


def test_multilabel_uses_bernoulli_kl_and_lambda_zero_is_the_task_loss():
    s, t, y = [[0.5, -2.0]], [[1.0, 1.0]], [[1.0, 0.0]]
    batch = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "labels": torch.tensor(y),
             TEACHER_LOGITS: torch.tensor(t)}

    def sig(x):
        return 1 / (1 + math.exp(-x))

    bce = -(math.log(sig(0.5)) + math.log(1 - sig(-2.0))) / 2
    bern = sum(sig(b) * math.log(sig(b) / sig(a)) + (1 - sig(b)) * math.log((1 - sig(b)) / (1 - sig(a)))
               for a, b in zip(s[0], t[0])) / 2
    loss, _ = TeacherLogitsLoss(True, 1.0, 1.0)(_Fixed(s), batch)
    assert float(loss.detach()) == pytest.approx(bce + bern, rel=1e-6)
    loss0, _ = TeacherLogitsLoss(True, 0.0, 1.0)(_Fixed(s), batch)
    plain = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(s), torch.tensor(y))
    assert torch.equal(loss0.detach(), plain)


def test_hidden_state_term_and_the_teacher_is_never_updated():
    student = _Fixed([[1.0, 0.0]], hidden=[[[1.0, 2.0], [3.0, 4.0]]])
    teacher = _Fixed([[0.0, 1.0]], hidden=[[[0.0, 2.0], [3.0, 2.0]]])
    before = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    fn = TeacherLogitsLoss(False, 0.0, 1.0, hidden_weight=2.0, teacher=teacher)
    batch = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "labels": torch.tensor([0])}
    opt = torch.optim.SGD(student.parameters(), lr=0.5)
    loss, extra = fn(student, batch)
    assert extra["hidden_mse"] == pytest.approx((1 + 0 + 0 + 4) / 4)
    ce = -_log_softmax([1.0, 0.0])[0]
    assert float(loss.detach()) == pytest.approx(ce + 2.0 * 1.25, rel=1e-6)
    for _ in range(3):
        loss, _ = fn(student, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(not p.requires_grad for p in teacher.parameters())
    for n, p in teacher.named_parameters():
        assert torch.equal(p, before[n]), n


def test_teacher_logits_travel_with_examples_through_the_collate():
    feats = [{"input_ids": [1, 2], "labels": 0}, {"input_ids": [3], "labels": 1}]
    rows = attach_teacher_logits(feats, [[0.5, -0.5], [1.0, 2.0]])
    assert TEACHER_LOGITS not in feats[0]  # copies, the originals are untouched

    def base(rs):
        assert all(TEACHER_LOGITS not in r for r in rs)
        return {"n": torch.tensor(len(rs))}

    batch = teacher_logits_collate(base)(rows)
    assert torch.equal(batch[TEACHER_LOGITS], torch.tensor([[0.5, -0.5], [1.0, 2.0]]))
    with pytest.raises(ValueError):
        attach_teacher_logits(feats, [[0.0, 0.0]])


def test_agreement():
    s = [[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]
    t = [[1.0, 0.0], [1.0, 0.0], [0.0, 3.0]]
    assert agreement(s, t, multilabel=False) == pytest.approx(1 / 3)
    assert agreement([[1.0, -1.0]], [[1.0, 1.0]], multilabel=True) == 0.5


@pytest.mark.parametrize("kw, needle", [
    (dict(kd_lambda=2.0), "--kd-lambda applies with --teacher only"),
    (dict(teacher="x", kd_lambda=-1.0), "--kd-lambda must be in"),
    (dict(teacher="x", temperature=0.0), "--temperature must be in"),
    (dict(kd_hidden=1.0), "--kd-hidden applies with --teacher only"),
    (dict(teacher="x", temperature=100.5), r"--temperature must be in \(0, 100.0\], got 100.5"),
    (dict(teacher="x", temperature=float("inf")), "--temperature must be in"),
    (dict(teacher="x", kd_lambda=1e4 + 1), r"--kd-lambda must be in \[0, 10000.0\]"),
    (dict(teacher=""), "--teacher '' is empty"),
    (dict(teacher=" \t"), r"--teacher ' \\t' is empty"),
])
def test_bad_options(kw, needle):
    with pytest.raises(UsageError, match=needle):
        TeacherKDOptions(**kw)


def test_bounds_are_inclusive_where_documented():
    TeacherKDOptions(teacher="x", temperature=100.0, kd_lambda=1e4)
    TeacherKDOptions(teacher="x", kd_lambda=0.0)


def test_lambda_defaults_follow_compress_distill():
    assert TeacherKDOptions(teacher="x").lambda_for(False) == 4.0
    assert TeacherKDOptions(teacher="x").lambda_for(True) == 1.0
    assert TeacherKDOptions(teacher="x", kd_lambda=0.5).lambda_for(True) == 0.5


def test_span_kd_loss_equals_a_hand_computation():
    import numpy as np

    from compress.distill.teacher_kd import span_kd_loss

    s_start, s_end = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([[0.5, 0.5, 0.0]])
    t_start, t_end = torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([[1.0, -1.0, 0.0]])
    T = 2.0

    def kl(s, t):  # KL(softmax(t/T) || softmax(s/T)) by hand
        p = np.exp(t / T) / np.exp(t / T).sum()
        q = np.exp(s / T) / np.exp(s / T).sum()
        return float((p * np.log(p / q)).sum())

    want = T ** 2 * (kl(s_start.numpy()[0], t_start.numpy()[0]) + kl(s_end.numpy()[0], t_end.numpy()[0])) / 2
    assert float(span_kd_loss(s_start, s_end, t_start, t_end, T)) == pytest.approx(want, rel=1e-6)
    assert float(span_kd_loss(t_start, t_end, t_start, t_end, T)) == pytest.approx(0.0, abs=1e-7)


def test_span_distillation_lambda_zero_is_the_plain_objective_and_the_teacher_stays_out():
    from transformers import BertConfig, BertForQuestionAnswering

    from compress.distill.teacher_kd import SpanDistillation
    from compress.qa.objectives import PlainObjective

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    student, teacher = BertForQuestionAnswering(cfg), BertForQuestionAnswering(cfg)
    batch = {"input_ids": torch.randint(0, 50, (3, 7)), "attention_mask": torch.ones(3, 7, dtype=torch.long),
             "start_positions": torch.tensor([1, 2, 3]), "end_positions": torch.tensor([2, 2, 5])}
    plain, _ = PlainObjective().loss(student, batch)
    kd0, extra = SpanDistillation(teacher, 0.0, 1.0).loss(student, batch)
    assert torch.equal(plain, kd0) and extra["kd_loss"] > 0
    kd = SpanDistillation(teacher, 3.0, 1.0)
    loss, extra = kd.loss(student, batch)
    assert float(loss) == pytest.approx(float(plain) + 3.0 * extra["kd_loss"], rel=1e-4)
    # the teacher is no parameter, state or trainable part of the objective, and does not train
    assert list(kd.parameters()) == [] and kd.state_dict() == {} and kd.trainable_parameters() == []
    t_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(t_before[k], v) for k, v in teacher.state_dict().items())


def test_a_teacher_that_does_not_fit_is_a_model_error_whatever_the_mismatch():
    """Other labels and another tokenizer are the same kind of error (a model that does not fit,
    exit 1), not one a usage error (exit 2) and the other a model error."""
    from compress.core.errors import ModelError
    from compress.distill.teacher_kd import check_teacher_fits

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab
            self.all_special_ids = [0]

        def get_vocab(self):
            return dict(self.vocab)

        def __len__(self):
            return len(self.vocab)

    same, other = Tok({"[PAD]": 0, "a": 1}), Tok({"<pad>": 0, "a": 1, "b": 2})
    check_teacher_fits(same, Tok({"[PAD]": 0, "a": 1}), ("neg", "pos"), ("neg", "pos"), "t")
    errors = []
    for args in ((same, same, ("neg", "pos"), ("a", "b", "c")),
                 (other, same, ("neg", "pos"), ("neg", "pos"))):
        with pytest.raises(ModelError) as err:
            check_teacher_fits(*args, "t")
        errors.append(err.value)
    assert [e.exit_code for e in errors] == [1, 1]
    assert "predicts labels" in str(errors[0]) and "another tokenizer" in str(errors[1])
