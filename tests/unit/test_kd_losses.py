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
    layerwise_mse,
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


def _layered_hidden_states():
    """(student, teacher) hidden states of one sequence of 3 tokens, the last one padding, hidden
    size 2: entry 0 the embeddings, entries 1-3 the outputs of encoder layers 0-2."""
    pad = [100.0, -100.0]  # differs wildly from the teacher's pad token: must never count
    student = [
        [[9.0, 9.0], [9.0, 9.0], pad],  # embeddings: never matched
        [[1.0, 2.0], [3.0, 4.0], pad],  # layer 0
        [[1.0, 1.0], [1.0, 1.0], pad],  # layer 1
        [[10.0, 10.0], [10.0, 10.0], pad],  # layer 2: excluded below
    ]
    teacher = [
        [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
        [[0.0, 2.0], [3.0, 2.0], [0.0, 0.0]],
        [[2.0, 1.0], [1.0, 4.0], [0.0, 0.0]],
        [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
    ]
    return ([torch.tensor([h]) for h in student], [torch.tensor([h]) for h in teacher],
            torch.tensor([[1, 1, 0]]))


def test_layerwise_mse_hand_computed_skips_padding_and_excluded_layers():
    s, t, mask = _layered_hidden_states()
    # layer 0: real tokens' squared differences (1, 0) and (0, 4) -> 5 / (2 tokens * 2 dims) = 1.25
    # layer 1: (1, 0) and (0, 9) -> 10 / 4 = 2.5; layer 2 excluded; mean over layers 0, 1
    assert float(layerwise_mse(s, t, mask, layers=[0, 1])) == pytest.approx((1.25 + 2.5) / 2)
    # every layer (layers None): layer 2 adds 4 * 100 / 4 = 100; the embeddings never count
    assert float(layerwise_mse(s, t, mask)) == pytest.approx((1.25 + 2.5 + 100.0) / 3)
    # one layer alone, and the pad token counted when there is no mask: (1 + 4 + 100^2 * 2) / 6
    assert float(layerwise_mse(s, t, mask, layers=[1])) == pytest.approx(2.5)
    assert float(layerwise_mse(s, t, None, layers=[0])) == pytest.approx((1 + 4 + 2 * 100.0 ** 2) / 6)


def test_layerwise_mse_pools_the_tokens_of_the_batch_and_equals_mse_without_padding():
    torch.manual_seed(0)
    s = [torch.randn(2, 4, 3) for _ in range(3)]
    t = [torch.randn(2, 4, 3) for _ in range(3)]
    ones = torch.ones(2, 4, dtype=torch.long)
    want = (F.mse_loss(s[1], t[1]) + F.mse_loss(s[2], t[2])) / 2
    assert float(layerwise_mse(s, t, ones)) == pytest.approx(float(want), rel=1e-6)
    # lengths 4 and 1: the mean is over the 5 real tokens, not a mean of per-example means
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    sq = (s[1] - t[1]).pow(2)
    pooled = (sq[0].sum() + sq[1, 0].sum()) / (5 * 3)
    assert float(layerwise_mse(s, t, mask, layers=[0])) == pytest.approx(float(pooled), rel=1e-6)
    assert float(layerwise_mse(t, t, mask)) == 0.0


def test_layerwise_mse_gradient_reaches_the_student_only_through_kept_real_tokens():
    s, t, mask = _layered_hidden_states()
    s = [h.clone().requires_grad_(True) for h in s]
    layerwise_mse(s, t, mask, layers=[0]).backward()
    assert s[1].grad[0, :2].abs().sum() > 0
    assert float(s[1].grad[0, 2].abs().sum()) == 0.0  # the pad token
    assert s[0].grad is None and s[2].grad is None and s[3].grad is None


@pytest.mark.parametrize("change, needle", [
    (lambda s, t: (s[:-1], t), "the student has 2 layers' hidden states, the teacher 3"),
    (lambda s, t: (s, [t[0], t[1][:, :2], t[2], t[3]]), r"layer 0: student hidden states \(1, 3, 2\)"),
])
def test_layerwise_mse_refuses_hidden_states_that_do_not_pair_up(change, needle):
    s, t, mask = _layered_hidden_states()
    s, t = change(s, t)
    with pytest.raises(ValueError, match=needle):
        layerwise_mse(s, t, mask)


@pytest.mark.parametrize("layers, needle", [([], "no layer to match"), ([0, 3], r"layers \[3\] are not"),
                                            ([-1], r"layers \[-1\] are not")])
def test_layerwise_mse_refuses_layers_outside_the_encoder(layers, needle):
    s, t, mask = _layered_hidden_states()
    with pytest.raises(ValueError, match=needle):
        layerwise_mse(s, t, mask, layers)
