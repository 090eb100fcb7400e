"""QA loss plug-ins: PFA perturbation/alignment/critic and hard learning + answer-aware contrast."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from compress.qa.objectives import (
    OBJECTIVES,
    EmbeddingPerturbation,
    PFAObjective,
    answer_aware_contrastive_loss,
    cosine_alignment,
    gradient_penalty,
    hard_learning_loss,
    js_alignment,
    kl_alignment,
    make_objective,
    span_representation,
    topk_spans,
)
from compress.qa.options import QAOptions


def test_perturbation_keeps_shape_and_has_relative_size_epsilon():
    torch.manual_seed(0)
    p = EmbeddingPerturbation(hidden=12, bottleneck=8, epsilon=0.1)
    x = torch.randn(2, 5, 12)
    y = p(x)
    assert y.shape == x.shape
    ratio = (y - x).norm(dim=-1) / x.norm(dim=-1)
    assert torch.allclose(ratio, torch.full_like(ratio, 0.1), atol=1e-4)


def test_perturbation_is_adversarial_through_gradient_reversal():
    torch.manual_seed(0)
    p = EmbeddingPerturbation(hidden=4, bottleneck=3, epsilon=0.5)
    x = torch.randn(1, 3, 4)
    target = torch.randn(1, 3, 4)
    loss = ((p(x) - target) ** 2).sum()
    loss.backward()
    g_adv = p.mlp[0].weight.grad.clone()
    p.zero_grad()
    loss2 = ((p(x, adversarial=False) - target) ** 2).sum()
    loss2.backward()
    assert torch.allclose(g_adv, -p.mlp[0].weight.grad)


@pytest.mark.parametrize("fn", [cosine_alignment, kl_alignment, js_alignment])
def test_alignment_decreases_to_zero_for_identical_inputs(fn):
    torch.manual_seed(0)
    a = torch.randn(2, 6, 8)
    noise = torch.randn(2, 6, 8)
    values = [float(fn(a, a + t * noise)) for t in (2.0, 1.0, 0.5, 0.1)]
    assert all(v1 > v2 > 0 for v1, v2 in zip(values, values[1:]))
    assert float(fn(a, a.clone())) == pytest.approx(0.0, abs=1e-6)


def test_alignment_mask_ignores_padding():
    a = torch.zeros(1, 3, 4)
    a[..., 0] = 1
    b = a.clone()
    b[0, 2] = torch.tensor([0.0, 1.0, 0, 0])  # differs only at a padded position
    mask = torch.tensor([[1, 1, 0]])
    assert float(cosine_alignment(a, b, mask)) == pytest.approx(0.0, abs=1e-6)
    assert float(cosine_alignment(a, b)) == pytest.approx(1 / 3)


def test_js_is_symmetric_and_bounded_by_log2():
    torch.manual_seed(1)
    a, b = torch.randn(1, 4, 5) * 10, torch.randn(1, 4, 5) * 10
    assert float(js_alignment(a, b)) == pytest.approx(float(js_alignment(b, a)), rel=1e-5)
    assert float(js_alignment(a, b)) <= math.log(2) + 1e-6


def test_w1_alignment_is_zero_for_identical_features():
    torch.manual_seed(0)
    obj = PFAObjective(hidden=8, alignment="w1")
    a = torch.randn(2, 3, 8)
    assert float(obj.align(a, a.clone(), None).detach()) == pytest.approx(0.0, abs=1e-6)


def test_gradient_penalty_of_a_linear_critic_is_hand_computable():
    critic = nn.Linear(3, 1)
    with torch.no_grad():
        critic.weight.copy_(torch.tensor([[3.0, 4.0, 0.0]]))  # |grad| = 5 everywhere
    real, fake = torch.randn(7, 3), torch.randn(7, 3)
    assert float(gradient_penalty(critic, real, fake).detach()) == pytest.approx((5 - 1) ** 2)


def test_gradient_penalty_is_taken_on_interpolates():
    seen = []

    class Recorder(nn.Module):
        def forward(self, x):
            seen.append(x.detach().clone())
            return (x ** 2).sum(-1)

    real = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    fake = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
    gp = gradient_penalty(Recorder(), real, fake, generator=torch.Generator().manual_seed(0))
    x = seen[0]
    # every point lies on its segment real -> fake, strictly between for a continuous u
    u = (x - fake) / (real - fake).where(real != fake, torch.ones_like(real))
    for i, col in ((0, 0), (1, 1)):
        assert 0.0 < float(u[i, col]) < 1.0
    assert float(x[0, 1]) == 0.0 and float(x[1, 0]) == 1.0  # coordinates where real == fake
    expected = (((2 * x).norm(dim=-1) - 1) ** 2).mean()  # grad of |x|^2 is 2x
    assert float(gp.detach()) == pytest.approx(float(expected), rel=1e-5)


def test_w1_critic_trains_on_the_side_and_is_not_a_model_parameter():
    torch.manual_seed(0)
    obj = PFAObjective(hidden=6, alignment="w1", critic_lr=1e-2)
    obj.train()
    before = [p.detach().clone() for p in obj.critic.parameters()]
    a, b = torch.randn(2, 4, 6), torch.randn(2, 4, 6) + 1.0
    obj.align(a, b, torch.ones(2, 4))
    assert any(not torch.equal(x, p) for x, p in zip(before, obj.critic.parameters()))
    ids = {id(p) for p in obj.trainable_parameters()}
    assert not ids & {id(p) for p in obj.critic.parameters()}


def test_w1_critic_optimizer_state_travels_with_the_state_dict():
    torch.manual_seed(0)
    obj = PFAObjective(hidden=6, alignment="w1", critic_lr=1e-2)
    obj.train()
    obj.align(torch.randn(2, 4, 6), torch.randn(2, 4, 6) + 1.0, torch.ones(2, 4))
    state = obj.state_dict()  # what a training checkpoint saves
    torch.manual_seed(1)
    other = PFAObjective(hidden=6, alignment="w1", critic_lr=1e-2)
    other.load_state_dict(state)
    a, b = other._critic_opt.state_dict(), obj._critic_opt.state_dict()
    assert a["state"].keys() == b["state"].keys() and len(a["state"]) == 4
    assert all(torch.equal(a["state"][i]["exp_avg"], b["state"][i]["exp_avg"]) for i in a["state"])
    assert PFAObjective(hidden=6).state_dict()["_extra_state"] == {}  # no critic, nothing extra


def test_topk_spans_hand_made():
    start = torch.tensor([[0.0, 5.0, 1.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 4.0, 3.0]])
    valid = torch.tensor([[False, True, True, True]])
    s, e, sc = topk_spans(start, end, k=3, max_answer_length=2, valid=valid)
    # spans (start,end): (1,2)=9, (1,3) too long, (1,1)=5, (2,2)=5, (2,3)=4, (3,3)=3
    assert (s[0, 0].item(), e[0, 0].item(), sc[0, 0].item()) == (1, 2, 9.0)
    assert sorted(zip(s[0, 1:].tolist(), e[0, 1:].tolist())) == [(1, 1), (2, 2)]


def test_hard_learning_is_softmax_over_gold_and_top_k():
    start = torch.tensor([[0.0, 2.0, 1.0], [0.0, 1.0, 1.0]])
    end = torch.tensor([[0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    top_s = torch.tensor([[1, 2], [1, 1]])
    top_e = torch.tensor([[2, 2], [1, 2]])
    gold_s, gold_e = torch.tensor([2, 0]), torch.tensor([2, 0])  # row 1: answer outside the window
    loss = hard_learning_loss(start, end, gold_s, gold_e, top_s, top_e)
    # row 0: gold (2,2) score 4; candidates (1,2)=5 and (2,2) is the gold itself (removed)
    expected = -math.log(math.exp(4) / (math.exp(4) + math.exp(5)))
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_contrastive_uses_the_most_similar_wrong_span():
    h = torch.zeros(1, 5, 2)
    h[0, 0] = torch.tensor([1.0, 0.0])  # anchor ([CLS])
    h[0, 1] = torch.tensor([1.0, 0.0])  # gold span token
    h[0, 2] = torch.tensor([0.8, 0.6])  # wrong span, close to gold
    h[0, 3] = torch.tensor([0.0, 1.0])  # wrong span, far from gold
    top_s, top_e = torch.tensor([[3, 1, 2]]), torch.tensor([[3, 1, 2]])
    loss = answer_aware_contrastive_loss(h, torch.tensor([1]), torch.tensor([1]), top_s, top_e, tau=0.5)
    pos, neg = 1.0 / 0.5, 0.8 / 0.5  # cos(anchor, gold) = 1, cos(anchor, nearest wrong) = 0.8
    assert float(loss) == pytest.approx(-math.log(math.exp(pos) / (math.exp(pos) + math.exp(neg))), rel=1e-6)


def test_span_representation_means_over_span_tokens():
    h = torch.arange(12, dtype=torch.float32).reshape(1, 4, 3)
    r = span_representation(h, torch.tensor([[1, 0]]), torch.tensor([[2, 0]]))
    assert r.shape == (1, 2, 3)
    assert r[0, 0].tolist() == [4.5, 5.5, 6.5] and r[0, 1].tolist() == [0.0, 1.0, 2.0]


@pytest.fixture(scope="module")
def tiny_qa(tiny_bert):
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    return AutoModelForQuestionAnswering.from_pretrained(tiny_bert)


@pytest.mark.parametrize("name, align", [("plain", "cosine"), ("pfa", "cosine"), ("pfa", "kl"),
                                         ("pfa", "js"), ("pfa", "w1"), ("hl-aacl", "cosine")])
def test_every_objective_gives_a_finite_differentiable_loss(tiny_qa, name, align):
    assert set(OBJECTIVES) == {"plain", "pfa", "hl-aacl"}
    obj = make_objective(name, tiny_qa, QAOptions(objective=name, pfa_alignment=align))
    obj.train()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1000, 2000, (3, 16), generator=g),
             "token_type_ids": torch.cat([torch.zeros(3, 6), torch.ones(3, 10)], 1).long(),
             "attention_mask": torch.ones(3, 16, dtype=torch.long),
             "start_positions": torch.tensor([7, 0, 9]), "end_positions": torch.tensor([8, 0, 12])}
    tiny_qa.zero_grad()
    loss, logs = obj.loss(tiny_qa, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert tiny_qa.qa_outputs.weight.grad is not None and tiny_qa.qa_outputs.weight.grad.abs().sum() > 0
    if name == "pfa":
        assert {"loss_original", "loss_perturbed", "alignment"} <= set(logs)
        # the perturbation changed the features (a W1 estimate by an untrained critic may be < 0)
        assert logs["alignment"] > 0 if align != "w1" else logs["alignment"] != 0
        assert any(p.grad is not None for p in obj.trainable_parameters())
