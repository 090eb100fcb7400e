"""KD losses against values computed by hand from the definitions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from compress.distill.losses import (
    KD_LOSSES,
    distillation_loss,
    kd_loss_name,
    kl_bernoulli,
    kl_single_label,
    logit_mse,
    task_loss,
)

LN3 = math.log(3.0)


def _kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


@pytest.mark.parametrize("t", [1.0, 2.0, 0.5])
def test_single_label_kl_hand_computed(t):
    # teacher logits (ln 3, 0): p_t = softmax((ln3/T, 0)); student logits (0, 0): uniform
    a = 3.0 ** (1 / t)
    p_t = [a / (a + 1), 1 / (a + 1)]
    expected = _kl(p_t, [0.5, 0.5]) * t * t
    got = kl_single_label(torch.tensor([[0.0, 0.0]]), torch.tensor([[LN3, 0.0]]), t)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_single_label_kl_numbers_at_t1_and_t2():
    s, te = torch.tensor([[0.0, 0.0]]), torch.tensor([[LN3, 0.0]])
    # T=1: 0.75 ln 1.5 + 0.25 ln 0.5
    assert kl_single_label(s, te, 1.0).item() == pytest.approx(0.1308120, abs=1e-6)
    # T=2: p_t = (0.633975, 0.366025), KL = 0.0363408, times T^2 = 4
    assert kl_single_label(s, te, 2.0).item() == pytest.approx(4 * 0.0363408, abs=1e-6)


def test_single_label_kl_is_batch_mean_and_zero_when_equal():
    s = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    te = torch.tensor([[LN3, 0.0], [1.0, 2.0]])
    assert kl_single_label(s, te, 1.0).item() == pytest.approx(0.1308120 / 2, abs=1e-6)
    assert kl_single_label(te, te, 3.0).item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("t", [1.0, 2.0])
def test_bernoulli_kl_hand_computed(t):
    # one example, two labels: teacher (0, 0) -> q_t = 0.5; student (ln 3, 0) -> q_s = (sigmoid(ln3/T), .5)
    q_s = 1 / (1 + math.exp(-LN3 / t))
    kl_label1 = 0.5 * math.log(0.5 / q_s) + 0.5 * math.log(0.5 / (1 - q_s))
    expected = (kl_label1 + 0.0) / 2 * t * t  # mean over the two labels
    got = kl_bernoulli(torch.tensor([[LN3, 0.0]]), torch.tensor([[0.0, 0.0]]), t)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    if t == 1.0:
        assert got.item() == pytest.approx(0.1438410 / 2, abs=1e-6)


def test_bernoulli_kl_stable_for_large_logits():
    got = kl_bernoulli(torch.tensor([[60.0, -60.0]]), torch.tensor([[60.0, -60.0]]), 1.0)
    assert torch.isfinite(got) and got.item() == pytest.approx(0.0, abs=1e-6)


def test_t_squared_keeps_gradient_scale():
    # d/ds of T^2 KL(softmax(t/T) || softmax(s/T)) = T (p_s - p_t); check against that
    s = torch.tensor([[0.3, -0.2, 0.5]], requires_grad=True)
    te = torch.tensor([[1.0, 0.0, -1.0]])
    t = 4.0
    kl_single_label(s, te, t).backward()
    expected = t * (F.softmax(s.detach() / t, -1) - F.softmax(te / t, -1))
    assert torch.allclose(s.grad, expected, atol=1e-6)


def test_task_loss_masks_unlabelled_rows():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]])
    labels = torch.tensor([0, 1, 1])
    mask = torch.tensor([True, True, False])
    expected = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-1))) / 2
    assert task_loss(logits, labels, mask, False).item() == pytest.approx(expected, rel=1e-6)
    assert task_loss(logits, labels, torch.zeros(3, dtype=torch.bool), False).item() == 0.0


def test_multilabel_task_loss_is_bce():
    logits = torch.tensor([[0.0, LN3]])
    y = torch.tensor([[1.0, 0.0]])
    # BCE: label 1: -ln 0.5; label 2: -ln(1 - 0.75); mean over labels
    expected = (math.log(2) + math.log(4)) / 2
    assert task_loss(logits, y, torch.tensor([True]), True).item() == pytest.approx(expected, rel=1e-6)


def test_total_loss_is_task_plus_lambda_distill():
    s = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    te = torch.tensor([[LN3, 0.0], [0.0, 0.0]])
    y = torch.tensor([0, 1])
    mask = torch.tensor([True, False])
    out = distillation_loss(s, te, y, mask, False, 2.0, 4.0)
    task = math.log(2)  # only row 0 has a label; uniform prediction
    assert out["task"].item() == pytest.approx(task, rel=1e-6)
    assert out["distill"].item() == pytest.approx(kl_single_label(s, te, 2.0).item(), rel=1e-6)
    assert out["loss"].item() == pytest.approx(task + 4.0 * out["distill"].item(), rel=1e-6)
    baseline = distillation_loss(s, None, y, mask, False, 2.0, 4.0)
    assert baseline["loss"].item() == pytest.approx(task, rel=1e-6)


def test_registry_picks_loss_by_family():
    assert KD_LOSSES[kd_loss_name(False)] is kl_single_label
    assert KD_LOSSES[kd_loss_name(True)] is kl_bernoulli
    assert KD_LOSSES[kd_loss_name(False, "mse")] is logit_mse
    assert KD_LOSSES[kd_loss_name(True, "mse")] is logit_mse


def test_logit_mse_hand_computed_and_in_the_total():
    s = torch.tensor([[1.0, -1.0], [0.5, 2.0]])
    te = torch.tensor([[3.0, 0.0], [0.5, -1.0]])
    # squared differences 4, 1, 0, 9 -> mean over examples and labels 14 / 4
    assert logit_mse(s, te).item() == pytest.approx(3.5)
    y = torch.tensor([0, 1])
    out = distillation_loss(s, te, y, torch.tensor([True, True]), False, 1.0, 2.0, kind="mse")
    ce = (F.cross_entropy(s, y)).item()
    assert out["distill"].item() == pytest.approx(3.5)
    assert out["loss"].item() == pytest.approx(ce + 2.0 * 3.5, rel=1e-6)
    # multi-label: the same squared error of the logits, not of the sigmoids
    out = distillation_loss(s, te, torch.zeros(2, 2), torch.tensor([True, True]), True, 1.0, 1.0, kind="mse")
    assert out["distill"].item() == pytest.approx(3.5)
