"""Fisher-guided structured pruning (Kwon et al. 2022): importances against an independent
autograd computation, the search against brute force, least-squares tuning on a known answer, and
the whole path on BERT, DistilBERT, RoBERTa, ELECTRA, ModernBERT and ALBERT."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch.func import functional_call
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from compress.core.errors import UsageError
from compress.measure.flops import count_flops
from compress.models.architectures import encoder_layers, head_layout
from compress.pruning.fisher_search import MAX_SWAPS, rearrange_masks, removal_cost, search_masks
from compress.pruning.fisher_structured import (
    SCALE_BOUND,
    fisher_importance,
    fisher_prune_structured,
    tune_masks_least_squares,
    unit_flops,
    unit_masks,
)
from compress.pruning.fisher_tuning import _bounded_solve, _solve
from tests.tiny_encoders import build


def tiny_bert(seed: int = 0, layers: int = 2) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=12, max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


def tiny_arch(arch: str, seed: int = 0):
    cfg, _ = build(arch)
    cfg.num_labels = 3
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(cfg).eval()


def make_batches(model, n_batches: int = 3, size: int = 4, length: int = 10, labels: bool = True,
                 seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Random ids above the special tokens; one padded row per batch; random labels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(5, model.config.vocab_size, (size, length), generator=g)
        mask = torch.ones_like(ids)
        mask[1, length - 3:] = 0
        ids[1, length - 3:] = model.config.pad_token_id
        batch = {"input_ids": ids, "attention_mask": mask}
        if labels:
            batch["labels"] = torch.randint(0, model.config.num_labels, (size,), generator=g)
        out.append(batch)
    return out


def explicit_mask_gradients(model, batches):
    """Independent of the pruner's hooks: per example, run the model alone (batch size 1) with its
    own loss, the attention-output and FFN-output weights replaced by ``W * mask`` (mask on the
    columns, an explicit parameter), and take d loss / d mask by autograd."""
    _, d = head_layout(model)
    heads, neurons = [], []
    params = dict(model.named_parameters())
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            masks, overrides = [], {}
            for lay in encoder_layers(model):
                for role, width in (("attn_out", d), ("ffn_out", 1)):
                    lin = lay.linears[role]
                    name = next(n for n, p in params.items() if p is lin.weight)
                    m = torch.ones(lin.in_features // width, dtype=lin.weight.dtype, requires_grad=True)
                    overrides[name] = lin.weight * m.repeat_interleave(width)
                    masks.append(m)
            loss = functional_call(model, overrides, args=(), kwargs=one).loss
            grads = torch.autograd.grad(loss, masks)
            heads.append(torch.stack([g for g in grads[0::2]]))
            neurons.append(torch.stack([g for g in grads[1::2]]))
    return torch.stack(heads), torch.stack(neurons)  # [examples, layers, units]


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_fisher_importance_equals_per_example_gradients_of_an_explicit_mask(arch):
    model = (tiny_bert() if arch == "bert" else tiny_arch("distilbert")).double()
    batches = make_batches(model)
    fisher = fisher_importance(model, batches)
    heads, neurons = explicit_mask_gradients(model, batches)
    for layer in range(heads.shape[1]):
        torch.testing.assert_close(fisher.head_grads[layer].double(), heads[:, layer], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(fisher.neurons[layer].double(), neurons[:, layer].pow(2).sum(0),
                                   rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(fisher.heads[layer].double(), heads[:, layer].pow(2).sum(0),
                                   rtol=1e-5, atol=1e-9)
    assert fisher.loss == "task loss on the labels"
    # finite differences on one head of one example, zeroing nothing but scaling its columns
    lay = encoder_layers(model)[1]
    _, d = head_layout(model)
    one = {k: v[2:3] for k, v in batches[0].items()}

    def loss_at(scale):
        w = lay.linears["attn_out"].weight
        saved = w.detach().clone()
        with torch.no_grad():
            w[:, d:2 * d] *= scale
            out = model(**one).loss.item()
            w.copy_(saved)
        return out

    eps = 1e-5
    fd = (loss_at(1 + eps) - loss_at(1 - eps)) / (2 * eps)
    assert abs(fd - heads[2, 1, 1].item()) < 1e-6 * max(1.0, abs(fd))
    assert abs(fd) > 1e-8  # the gradient compared is not trivially zero


def test_without_labels_the_loss_is_cross_entropy_against_the_models_own_argmax():
    model = tiny_bert().double()
    unlabelled = make_batches(model, labels=False)
    with torch.no_grad():
        argmax = [dict(b, labels=model(**b).logits.argmax(-1)) for b in unlabelled]
    a, b = fisher_importance(model, unlabelled), fisher_importance(model, argmax)
    assert a.loss == "cross-entropy against the model's own argmax"
    for x, y in zip(a.head_grads + a.neuron_grads, b.head_grads + b.neuron_grads):
        torch.testing.assert_close(x, y)
    assert all(g.abs().sum() > 0 for g in a.head_grads)


def _brute_force(head_imp, neuron_imp, fph, fpn, budget):
    """Best total importance over every pair of head/neuron subsets with >= 1 unit per layer."""
    def options(imp, cost):
        units = [(layer, j) for layer, v in enumerate(imp) for j in range(len(v))]
        out = []
        for bits in itertools.product((0, 1), repeat=len(units)):
            kept = [u for u, b in zip(units, bits) if b]
            if all(any(u[0] == layer for u in kept) for layer in range(len(imp))):
                out.append((len(kept) * cost, sum(float(imp[layer][j]) for layer, j in kept)))
        return out

    best = None
    for ch, sh in options(head_imp, fph):
        for cn, sn in options(neuron_imp, fpn):
            if ch + cn <= budget and (best is None or sh + sn > best):
                best = sh + sn
    return best


@pytest.mark.parametrize("seed", range(4))
def test_search_respects_the_flops_budget_and_is_optimal_against_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    head_imp = [torch.rand(3, generator=g) for _ in range(2)]
    neuron_imp = [torch.rand(4, generator=g) ** 3 for _ in range(2)]
    fph, fpn = 7, 2
    for budget in (2 * fph + 2 * fpn, 25, 30, 41, 6 * fph + 8 * fpn):
        heads, neurons = search_masks(head_imp, neuron_imp, fph, fpn, budget)
        cost = sum(map(len, heads)) * fph + sum(map(len, neurons)) * fpn
        assert cost <= budget
        assert all(heads) and all(neurons)  # at least one of each per layer
        got = sum(float(head_imp[i][j]) for i, k in enumerate(heads) for j in k) + sum(
            float(neuron_imp[i][j]) for i, k in enumerate(neurons) for j in k)
        best = _brute_force(head_imp, neuron_imp, fph, fpn, budget)
        assert got == pytest.approx(best, abs=1e-9), (seed, budget)
    with pytest.raises(UsageError, match="cannot hold 2 heads and 2 FFN neurons"):
        search_masks(head_imp, neuron_imp, fph, fpn, 2 * fph + 2 * fpn - 1)
    # only FFN neurons are searched: every head stays and counts against the budget
    heads, neurons = search_masks(head_imp, neuron_imp, fph, fpn, 6 * fph + 4 * fpn, ("ffn",))
    assert heads == [[0, 1, 2], [0, 1, 2]] and sum(map(len, neurons)) == 4


def test_rearrangement_uses_the_off_diagonal_fisher_and_never_raises_the_cost():
    # units 0 and 1 have the largest squared gradients but cancel exactly: removing both costs
    # nothing, while the diagonal ranking keeps unit 0 and removes 1 and 2
    g = torch.tensor([[2.0, -2.0, 1.0], [1.0, -1.0, -1.0], [3.0, -3.0, 0.5]])
    heads, _ = rearrange_masks([[0]], [[0]], [g], [torch.zeros(3, 1)])
    assert heads == [[2]]
    assert removal_cost(g, torch.tensor([True, True, False])) == 0.0
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        grads = torch.randn(16, 12, generator=gen) @ torch.randn(12, 12, generator=gen)
        keep = sorted(torch.randperm(12, generator=gen)[:5].tolist())
        new, _ = rearrange_masks([keep], [[0]], [grads], [torch.zeros(16, 1)])
        assert len(new[0]) == 5

        def cost(k, grads=grads):
            removed = torch.ones(12, dtype=torch.bool)
            removed[k] = False
            return removal_cost(grads, removed)

        assert cost(new[0]) <= cost(keep) + 1e-9


def _block_cost(grads, keep):
    removed = torch.ones(grads.shape[1], dtype=torch.bool)
    removed[keep] = False
    return removal_cost(grads, removed)


def test_rearrangement_runs_to_convergence_below_the_twenty_swap_result():
    # a 600-unit block whose gradients share a few directions, so that units cancel each other and
    # the diagonal ranking is far from the best set of its size
    gen = torch.Generator().manual_seed(3)
    grads = (torch.randn(96, 8, generator=gen) @ torch.randn(8, 600, generator=gen)
             + 0.3 * torch.randn(96, 600, generator=gen))
    keep = sorted(torch.argsort(-grads.pow(2).sum(0))[:240].tolist())
    twenty, _ = rearrange_masks([keep], [[0]], [grads], [torch.zeros(4, 1)], max_swaps=20)
    converged, _ = rearrange_masks([keep], [[0]], [grads], [torch.zeros(4, 1)])
    assert len(converged[0]) == len(twenty[0]) == 240
    start, after_20, after_all = (_block_cost(grads, k) for k in (keep, twenty[0], converged[0]))
    assert after_all < 0.9 * after_20 and after_20 < start
    # converged: no single swap of a kept and a removed unit lowers the cost any further
    kept = converged[0]
    gone = [j for j in range(600) if j not in set(kept)]
    for k in kept[::12]:
        for j in gone[::12]:
            assert _block_cost(grads, [u for u in kept if u != k] + [j]) >= after_all * (1 - 1e-9)
    # within the cap; 0 swaps leaves the search's lists alone
    assert MAX_SWAPS >= 1000
    assert rearrange_masks([keep], [[0]], [grads], [torch.zeros(4, 1)], max_swaps=0)[0] == [keep]
    with pytest.raises(UsageError, match="max_swaps"):
        rearrange_masks([keep], [[0]], [grads], [torch.zeros(4, 1)], max_swaps=-1)


def test_bounded_solve_is_the_box_constrained_optimum():
    # brute force: every assignment of each variable to free / -bound / +bound, solved and kept
    # when feasible; the best of them is the box-constrained optimum
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        m = torch.randn(7, 4, generator=gen, dtype=torch.float64)
        a = m.T @ m + 1e-3 * torch.eye(4, dtype=torch.float64)
        b = 6 * torch.randn(4, generator=gen, dtype=torch.float64)
        bound = 2.0

        def objective(s, a=a, b=b):
            return float(s @ a @ s - 2 * s @ b)

        best = None
        for states in itertools.product((None, -bound, bound), repeat=4):
            fixed = torch.tensor([v is not None for v in states])
            s = torch.tensor([0.0 if v is None else v for v in states], dtype=torch.float64)
            if (~fixed).any():
                free = ~fixed
                s[free] = torch.linalg.solve(a[free][:, free], b[free] - a[free][:, fixed] @ s[fixed])
            if bool((s.abs() <= bound + 1e-12).all()) and (best is None or objective(s) < best):
                best = objective(s)
        s = _bounded_solve(a, b, bound)
        assert bool((s.abs() <= bound).all())
        assert objective(s) == pytest.approx(best, rel=1e-9, abs=1e-9), trial


def test_solve_bounds_the_scales_and_still_lowers_the_error():
    # two units; the target is 20 x unit 0's contribution plus unit 1's: unbounded least squares
    # gives scale 20, which the bound cuts to 10 while unit 1 stays at its exact 1
    contrib = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # [tokens, units]
    target = contrib @ torch.tensor([20.0, 1.0], dtype=torch.float64)
    gram, rhs, const = contrib.T @ contrib, contrib.T @ target, float(target @ target)
    free, before, free_err = _solve(gram, rhs, const, 1e-12)
    assert free[0].item() == pytest.approx(20.0, rel=1e-6) and free_err < 1e-6 * before
    bounded, before_b, after = _solve(gram, rhs, const, 1e-12, bound=10.0)
    assert before_b == before
    assert bounded.tolist() == pytest.approx([10.0, 6.0], rel=1e-6)  # unit 1 takes up some
    assert free_err < after < before
    within, _, _ = _solve(gram, rhs, const, 1e-12, bound=25.0)  # not binding: the free solution
    assert torch.equal(within, free)


def _layer_outputs(model, batches, heads=None, neurons=None):
    """Every layer's attention-output and FFN-output activations, non-padded tokens only."""
    out, hooks = {}, []
    for lay in encoder_layers(model):
        for role in ("attn_out", "ffn_out"):
            hooks.append(lay.linears[role].register_forward_hook(
                lambda m, a, o, key=(lay.index, role): out.setdefault(key, []).append(o)))
    with torch.no_grad():
        if heads is None:
            for b in batches:
                model(**b)
        else:
            with unit_masks(model, heads, neurons):
                for b in batches:
                    model(**b)
    for h in hooks:
        h.remove()
    return {k: torch.cat([o[b["attention_mask"].bool()] for o, b in zip(v, batches)]) for k, v in out.items()}


def test_tuning_never_raises_the_layer_error_and_recovers_a_duplicated_head_and_neuron():
    model = tiny_bert(3).double()
    lay = encoder_layers(model)[0]
    _, d = head_layout(model)
    with torch.no_grad():  # head 1 and neuron 7 of layer 0 become copies of head 0 and neuron 3
        for role in ("query", "key", "value"):
            lay.linears[role].weight[d:2 * d] = lay.linears[role].weight[:d]
            lay.linears[role].bias[d:2 * d] = lay.linears[role].bias[:d]
        lay.linears["attn_out"].weight[:, d:2 * d] = lay.linears["attn_out"].weight[:, :d]
        lay.linears["ffn_in"].weight[7] = lay.linears["ffn_in"].weight[3]
        lay.linears["ffn_in"].bias[7] = lay.linears["ffn_in"].bias[3]
        lay.linears["ffn_out"].weight[:, 7] = lay.linears["ffn_out"].weight[:, 3]
    batches = make_batches(model, labels=False)
    keep_heads = [[0, 2, 3], [1, 2]]
    keep_neurons = [[j for j in range(12) if j != 7], [0, 1, 2, 5, 8, 9]]
    tuned = tune_masks_least_squares(model, batches, keep_heads, keep_neurons, damping=1e-10)
    # the removed copy is taken over by doubling the original
    assert tuned["heads"][0][0].item() == pytest.approx(2.0, abs=1e-4)
    assert tuned["neurons"][0][3].item() == pytest.approx(2.0, abs=1e-4)
    for before, after in tuned["attn_error"][:1] + tuned["ffn_error"][:1]:
        assert before > 1e-5 and after < 1e-6 * before  # float32 products
    for before, after in tuned["attn_error"] + tuned["ffn_error"]:
        assert after <= before
    # the reported errors are what the layers do: measured independently on layer 0
    dense = _layer_outputs(model, batches)
    ones = [torch.zeros(n).index_fill_(0, torch.tensor(k), 1.0) for n, k in zip((4, 4), keep_heads)]
    ones_n = [torch.zeros(12).index_fill_(0, torch.tensor(k), 1.0) for k in keep_neurons]
    untuned = _layer_outputs(model, batches, ones, ones_n)
    tuned_out = _layer_outputs(model, batches, tuned["heads"], tuned["neurons"])
    err_before = (untuned[(0, "attn_out")] - dense[(0, "attn_out")]).pow(2).sum().item()
    err_after = (tuned_out[(0, "attn_out")] - dense[(0, "attn_out")]).pow(2).sum().item()
    assert err_before == pytest.approx(tuned["attn_error"][0][0], rel=1e-6)
    assert err_after <= 1e-6 * err_before
    # on random layers with no exact answer the error still never rises
    model = tiny_bert(4)
    batches = make_batches(model, labels=False, seed=5)
    tuned = tune_masks_least_squares(model, batches, [[0, 3], [1]], [[1, 4, 5, 9], [0, 2, 11]])
    assert all(a <= b * (1 + 1e-9) for b, a in tuned["attn_error"] + tuned["ffn_error"])
    assert any(a < 0.99 * b for b, a in tuned["attn_error"] + tuned["ffn_error"])


def test_tuned_scales_stay_within_the_bound_where_least_squares_leaves_it():
    # layer 0's neuron 7 computes neuron 3's activation and writes it with 19x its output column,
    # head 1 copies head 0 with -14x its columns: with 7 and head 1 removed, unbounded least
    # squares scales neuron 3 by 20 and head 0 by -13; the bound holds both to [-10, 10]
    model = tiny_bert(3).double()
    lay = encoder_layers(model)[0]
    _, d = head_layout(model)
    with torch.no_grad():
        for role in ("query", "key", "value"):
            lay.linears[role].weight[d:2 * d] = lay.linears[role].weight[:d]
            lay.linears[role].bias[d:2 * d] = lay.linears[role].bias[:d]
        lay.linears["attn_out"].weight[:, d:2 * d] = -14 * lay.linears["attn_out"].weight[:, :d]
        lay.linears["ffn_in"].weight[7] = lay.linears["ffn_in"].weight[3]
        lay.linears["ffn_in"].bias[7] = lay.linears["ffn_in"].bias[3]
        lay.linears["ffn_out"].weight[:, 7] = 19 * lay.linears["ffn_out"].weight[:, 3]
    batches = make_batches(model, labels=False)
    keep_heads = [[0, 2, 3], [1, 2]]
    keep_neurons = [[j for j in range(12) if j != 7], [0, 1, 2, 5, 8, 9]]
    free = tune_masks_least_squares(model, batches, keep_heads, keep_neurons, damping=1e-10, bound=None)
    assert free["heads"][0][0].item() == pytest.approx(-13.0, abs=1e-3)
    assert free["neurons"][0][3].item() == pytest.approx(20.0, abs=1e-3)
    assert SCALE_BOUND == 10.0
    tuned = tune_masks_least_squares(model, batches, keep_heads, keep_neurons, damping=1e-10)
    for bound, out in ((SCALE_BOUND, tuned),
                       (2.0, tune_masks_least_squares(model, batches, keep_heads, keep_neurons,
                                                      damping=1e-10, bound=2.0))):
        scales = torch.cat([v for v in out["heads"] + out["neurons"]])
        assert scales.abs().max().item() <= bound
        assert out["heads"][0][0].item() == pytest.approx(-bound)
        assert out["neurons"][0][3].item() == pytest.approx(bound)
        for before, after in out["attn_error"] + out["ffn_error"]:
            assert after <= before
    # the bound costs layer 0 some of its fit, and nothing where the free fit was within it
    assert tuned["ffn_error"][0][1] > free["ffn_error"][0][1]
    assert tuned["attn_error"][0][1] > free["attn_error"][0][1]


@pytest.mark.parametrize("arch", ["bert", "distilbert", "roberta", "electra", "modernbert"])
def test_fisher_prune_structured_end_to_end(arch, tmp_path):
    model = tiny_arch(arch)
    original = copy.deepcopy(model)
    batches = make_batches(model, length=12)
    report = fisher_prune_structured(model, batches, 0.4, seq_len=12)
    # physically smaller, recorded in the config
    assert model.config.model_type == f"compress_{original.config.model_type}"
    assert report["params_after"] == sum(p.numel() for p in model.parameters()) < report["params_before"]
    assert model.config.layer_heads == report["layer_heads"]
    assert model.config.layer_intermediate == report["layer_ffn"]
    per_head, per_neuron = unit_flops(original, 12)
    assert report["encoder_flops_after"] == (sum(report["layer_heads"]) * per_head
                                             + sum(report["layer_ffn"]) * per_neuron)
    # at least the reduction asked for, and not more than one neuron beyond it
    assert 0.4 <= report["flops_reduction"] <= 0.4 + per_neuron / report["encoder_flops_before"]
    # the FLOPs the report removes are the FLOPs the traced graph loses
    one = {k: v[:1] for k, v in batches[0].items() if k != "labels"}
    one["attention_mask"] = torch.ones_like(one["attention_mask"])
    saved = count_flops(original, one)["dense_flops"] - count_flops(model, one)["dense_flops"]
    assert saved == report["encoder_flops_before"] - report["encoder_flops_after"]
    # tuning changed the kept units' scales, and the pruned model computes the masked-and-scaled one
    assert report["tuned"] and any(0 < abs(v - 1) for m in report["head_masks"] for v in m if v)
    inputs = {k: v for k, v in batches[1].items() if k != "labels"}
    heads = [torch.tensor(v) for v in report["head_masks"]]
    neurons = [torch.tensor(v) for v in report["neuron_masks"]]
    with torch.no_grad(), unit_masks(original, heads, neurons):
        expected = original(**inputs).logits
    with torch.no_grad():
        logits = model(**inputs).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert sorted(report["seconds"]) == ["fisher", "rearrange", "remove", "search", "tune"]
    # the rearrangement never raises the block-Fisher cost; the scales keep to the bound
    assert report["removal_cost"]["kept"] <= report["removal_cost"]["searched"] * (1 + 1e-12)
    assert report["scale_bound"] == SCALE_BOUND and report["max_swaps"] == MAX_SWAPS
    assert all(abs(v) <= SCALE_BOUND for m in report["head_masks"] + report["neuron_masks"] for v in m)
    model.save_pretrained(tmp_path / "m")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    assert type(again) is type(model)
    with torch.no_grad():
        assert torch.equal(again(**inputs).logits, logits)


def test_albert_shared_layer_is_pruned_once_and_counted_per_pass():
    model = tiny_arch("albert")
    original = copy.deepcopy(model)
    batches = make_batches(model, length=12)
    report = fisher_prune_structured(model, batches, 0.3, seq_len=12)
    assert len(report["layer_heads"]) == 1 and report["tuned"] is False and "tune_skipped" in report
    # a head's FLOPs count once for each of the 2 passes through the shared layer
    per_head, _ = unit_flops(original, 12)
    assert per_head == 2 * 2 * (12 * 4 * 32 * 8 + 2 * 12 * 12 * 8)
    assert report["flops_reduction"] >= 0.3
    inputs = {k: v for k, v in batches[0].items() if k != "labels"}
    heads = [torch.tensor(v) for v in report["head_masks"]]
    neurons = [torch.tensor(v) for v in report["neuron_masks"]]
    with torch.no_grad(), unit_masks(original, heads, neurons):
        expected = original(**inputs).logits
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=1e-5)


def test_bad_requests_are_refused_before_the_model_changes():
    model = tiny_bert()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    batches = make_batches(model, n_batches=1)
    with pytest.raises(UsageError, match="flops_reduction must be in"):
        fisher_prune_structured(model, batches, 1.0, 10)
    with pytest.raises(UsageError, match="unknown structured target 'neurons'"):
        fisher_prune_structured(model, batches, 0.3, 10, targets=("neurons",))
    with pytest.raises(UsageError, match="cannot hold"):
        fisher_prune_structured(model, batches, 0.99, 10)
    with pytest.raises(UsageError, match="scale_bound must be >= 1"):
        fisher_prune_structured(model, batches, 0.3, 10, scale_bound=0.5)
    with pytest.raises(UsageError, match="max_swaps must be >= 0"):
        fisher_prune_structured(model, batches, 0.3, 10, max_swaps=-1)
    assert type(model) is BertForSequenceClassification
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


class _OnAnotherDevice(torch.Tensor):
    """A CPU tensor standing for one on a device the model is not on: only ``.to(device)`` turns it
    into a plain tensor the model may take (so the test runs without a GPU)."""

    def to(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).to(*args, **kwargs)


def test_the_fisher_and_tuning_passes_move_each_batch_to_the_models_device():
    model = tiny_bert()
    batches = [{k: v.as_subclass(_OnAnotherDevice) for k, v in b.items()} for b in make_batches(model)]
    seen = []

    def check(module, args, kwargs):
        seen.append(type(kwargs["input_ids"]))
        moved = all(not isinstance(v, _OnAnotherDevice) for v in (*args, *kwargs.values()))
        assert moved, "a batch reached the model without .to(the model's device)"

    handle = model.register_forward_pre_hook(check, with_kwargs=True)
    try:
        fisher = fisher_importance(model, batches)
        tune_masks_least_squares(model, batches, [[0, 1, 2], [1, 2]], [list(range(8)), list(range(6))])
    finally:
        handle.remove()
    assert seen and all(t is torch.Tensor for t in seen)
    assert fisher.loss == "task loss on the labels"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fisher_prune_structured_on_a_gpu_model_takes_cpu_batches():
    model = tiny_bert().cuda()
    report = fisher_prune_structured(model, make_batches(model), 0.3, seq_len=10)
    assert report["flops_reduction"] >= 0.3


def test_mask_tuning_memory_does_not_grow_with_depth(tmp_path):
    """The tuning holds the dense targets of one layer at a time: on a 12-layer model its peak
    grows by a depth-independent number of activations (measured here: 98 MB, about 12
    activations with the layer's own temporaries; holding every layer's targets, as before, grew
    it by 226 MB)."""
    import subprocess
    import sys

    code = (
        "import resource, torch\n"
        "from transformers import BertConfig, BertForSequenceClassification\n"
        "from compress.pruning.fisher_tuning import tune_masks_least_squares\n"
        "torch.manual_seed(0); torch.set_num_threads(1)\n"
        "cfg = BertConfig(vocab_size=100, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,\n"
        "                 intermediate_size=512, max_position_embeddings=512, num_labels=2)\n"
        "m = BertForSequenceClassification(cfg).eval()\n"
        "bs = [{'input_ids': torch.randint(5, 100, (16, 256)),\n"
        "       'attention_mask': torch.ones(16, 256, dtype=torch.long)} for _ in range(2)]\n"
        "with torch.no_grad():\n"
        "    [m(**b) for b in bs]\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "tune_masks_least_squares(m, bs, [[0, 1]] * 12, [list(range(0, 512, 4))] * 12)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    grown = int(proc.stdout.strip().splitlines()[-1])
    activation = 2 * 16 * 256 * 256 * 4  # one [tokens, hidden] float32 activation of both batches
    assert grown < 18 * activation, f"peak grew by {grown / 2**20:.0f} MB"
