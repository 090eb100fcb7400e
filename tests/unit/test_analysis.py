"""Known-answer tests of compress.report.analysis: every expected number is worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from compress.report import analysis as A


def test_pretrain_loss_by_sparsity_adds_dense_point_to_each_curve():
    rows = [{"criterion": "magnitude", "sparsity": 0.4, "loss": 3.0},
            {"criterion": "none", "sparsity": 0.0, "loss": 2.0},
            {"criterion": "random", "sparsity": 0.4, "loss": 5.0},
            {"criterion": "magnitude", "sparsity": 0.2, "loss": 2.5}]
    out = A.pretrain_loss_by_sparsity(rows)
    assert out == {"magnitude": [(0.0, 2.0), (0.2, 2.5), (0.4, 3.0)],
                   "random": [(0.0, 2.0), (0.4, 5.0)]}


def test_best_metric_picks_best_lr_and_counts_rates():
    rows = [{"task": "sst2", "variant": "magnitude", "sparsity": 0.2, "lr": 5e-5, "score": 0.80},
            {"task": "sst2", "variant": "magnitude", "sparsity": 0.2, "lr": 2e-5, "score": 0.85},
            {"task": "sst2", "variant": "magnitude", "sparsity": 0.2, "lr": 1e-4, "score": 0.85},
            {"task": "sst2", "variant": "random", "sparsity": 0.2, "lr": 5e-5, "score": 0.6}]
    best = A.best_metric(rows)
    # tie between 2e-5 and 1e-4 goes to the smaller rate
    assert best[("sst2", "magnitude", 0.2)] == {"score": 0.85, "lr": 2e-5, "n_lrs": 3}
    assert best[("sst2", "random", 0.2)] == {"score": 0.6, "lr": 5e-5, "n_lrs": 1}


def test_mask_difference_of_hand_made_masks():
    a = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 1]])  # prunes positions 1, 2, 6
    b = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 1]])  # prunes positions 1, 4, 6
    d = A.mask_difference(a, b)
    assert d["differ"] == pytest.approx(2 / 8)      # positions 2 and 4
    assert d["only_a"] == pytest.approx(1 / 8)      # position 2
    assert d["only_b"] == pytest.approx(1 / 8)      # position 4
    assert d["pruned_overlap"] == pytest.approx(2 / 4)  # {1,6} of {1,2,4,6}
    same = A.mask_difference(a, a)
    assert same["differ"] == 0 and same["pruned_overlap"] == 1
    with pytest.raises(ValueError):
        A.mask_difference(a, b.flatten())


def test_mask_difference_all_weights_by_size():
    ma = {"x": torch.tensor([1, 0]), "y": torch.ones(6), "z": torch.ones(3)}
    mb = {"x": torch.tensor([0, 1]), "y": torch.ones(6)}
    d = A.mask_difference_all(ma, mb)
    assert d["overall"]["differ"] == pytest.approx(2 / 8)  # 2 differing of 2 + 6 shared weights
    assert d["only_in_a"] == ["z"] and d["only_in_b"] == []


def test_sort_order_movement_of_hand_permuted_matrix():
    before = torch.tensor([[0.1, -0.2], [0.3, 0.4]])  # ranks 0 1 2 3
    after = torch.tensor([[0.4, 0.3], [-0.2, 0.1]])   # ranks 3 2 1 0: full reversal
    m = A.sort_order_movement(before, after, sparsity=0.5)
    assert m["mean_shift"] == pytest.approx((3 + 1 + 1 + 3) / 4 / 4)
    assert m["max_shift"] == pytest.approx(3 / 4)
    # pruned at 50% before: positions 0,1; after: positions 2,3 -> both left the pruned set
    assert m["crossed"] == pytest.approx(1.0)
    still = A.sort_order_movement(before, before * 2, sparsity=0.5)  # scaling keeps the order
    assert still["mean_shift"] == 0 and still["crossed"] == 0


def test_sort_order_movement_swap_of_two():
    before = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    after = torch.tensor([2.0, 1.0, 3.0, 4.0, 5.0])  # swap the two smallest
    m = A.sort_order_movement(before, after, sparsity=0.2)
    assert m["mean_shift"] == pytest.approx(2 / 5 / 5)
    assert m["crossed"] == pytest.approx(1.0)  # the one pruned weight is now the second smallest
    assert A.sort_order_movement(before, after, sparsity=0.4)["crossed"] == 0  # same pair pruned


def test_magnitude_ranks_uses_absolute_values():
    assert A.magnitude_ranks(torch.tensor([-3.0, 1.0, 2.0])).tolist() == [2, 0, 1]


def test_per_head_sparsity_rows_and_columns():
    w = torch.ones(4, 4)
    w[0:2, 0] = 0  # head 0 of 2 (rows 0-1): 2 zeros of 8
    w[2:4, :] = 0  # head 1 (rows 2-3): all 8 zero
    assert A.per_head_sparsity(w, 2, 0) == [0.25, 1.0]
    # along columns: head 0 = cols 0-1 has zeros at (0,0),(1,0),(2,0),(2,1),(3,0),(3,1) = 6 of 8
    assert A.per_head_sparsity(w, 2, 1) == [0.75, 0.5]
    with pytest.raises(ValueError):
        A.per_head_sparsity(w, 3, 0)


def test_head_sparsity_by_layer_averages_the_four_matrices():
    h, heads = 4, 2
    q = torch.ones(h, h)
    q[0:2] = 0  # head 0 fully zero in Q
    state = {"encoder.layer.0.attention.self.query.weight": q,
             "encoder.layer.0.attention.self.key.weight": torch.ones(h, h),
             "encoder.layer.0.attention.self.value.weight": torch.ones(h, h),
             "encoder.layer.0.attention.output.dense.weight": torch.ones(h, h),
             "encoder.layer.0.intermediate.dense.weight": torch.zeros(8, h)}  # not attention
    out = A.head_sparsity_by_layer(state, heads)
    assert out[0]["per_head"] == [0.25, 0.0]
    assert out[0]["min"] == 0.0 and out[0]["max"] == 0.25 and out[0]["mean"] == pytest.approx(0.125)


def test_min_mean_max():
    assert A.min_mean_max([0.5, 0.1, 0.3]) == {"min": 0.1, "mean": pytest.approx(0.3), "max": 0.5}
    with pytest.raises(ValueError):
        A.min_mean_max([])


def test_layerwise_cosine_identical_opposite_and_orthogonal():
    torch.manual_seed(0)
    h = [torch.randn(2, 3, 8) for _ in range(3)]
    assert A.layerwise_cosine(h, h) == pytest.approx([1.0, 1.0, 1.0])
    assert A.layerwise_cosine(h, [-x for x in h]) == pytest.approx([-1.0, -1.0, -1.0])
    a = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    b = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])  # token 0 orthogonal, token 1 identical
    assert A.layerwise_cosine([a], [b]) == pytest.approx([0.5])
    # masking out token 1 leaves only the orthogonal pair
    assert A.layerwise_cosine([a], [b], torch.tensor([[1, 0]])) == pytest.approx([0.0])


def test_feature_similarity_of_a_model_with_itself_is_one(tiny_bert):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_bert).eval()
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    texts = ["a short sentence", "another, somewhat longer sentence about pruning", "x"]
    sims = A.feature_similarity(model, model, tok, texts, batch_size=2)
    assert len(sims) == model.config.num_hidden_layers + 1
    assert sims == pytest.approx([1.0] * len(sims))
    other = AutoModel.from_pretrained(tiny_bert).eval()
    with torch.no_grad():
        other.encoder.layer[1].output.dense.weight.mul_(-50)
    changed = A.feature_similarity(model, other, tok, texts, batch_size=2)
    assert changed[:2] == pytest.approx([1.0, 1.0])  # embeddings and layer 0 untouched
    assert changed[2] < 0.99


def test_linear_fit_of_exact_line_and_noisy_points():
    fit = A.linear_fit([1.0, 2.0, 3.0, 4.0], [1.0, -1.0, -3.0, -5.0])  # y = -2x + 3
    assert fit["slope"] == pytest.approx(-2.0) and fit["intercept"] == pytest.approx(3.0)
    assert fit["r2"] == pytest.approx(1.0)
    # (0,0),(1,1),(2,0): slope 0, intercept 1/3, ss_res = 2/9+4/9+1/9... = 6/9, ss_tot = 6/9 -> r2 0
    noisy = A.linear_fit([0.0, 1.0, 2.0], [0.0, 1.0, 0.0])
    assert noisy["slope"] == pytest.approx(0.0) and noisy["intercept"] == pytest.approx(1 / 3)
    assert noisy["r2"] == pytest.approx(0.0)
    with pytest.raises(ValueError):
        A.linear_fit([1.0, 1.0], [2.0, 3.0])


def test_distillation_table_ratios_against_teacher():
    rows = [{"model": "bilstm", "params": 1_000_000, "flops": 2e6, "latency_ms": 2.0, "score": 0.8},
            {"model": "bert", "params": 100_000_000, "flops": 2e9, "latency_ms": 50.0, "score": 0.9},
            {"model": "logreg", "params": 10_000, "flops": None, "latency_ms": None, "score": 0.7}]
    t = A.distillation_table(rows)
    assert [r["model"] for r in t] == ["bert", "bilstm", "logreg"]
    assert t[1]["params_ratio"] == pytest.approx(0.01) and t[1]["speedup"] == pytest.approx(25.0)
    assert t[2]["speedup"] is None
    t2 = A.distillation_table(rows, reference="bilstm")
    assert t2[0]["params_ratio"] == pytest.approx(100.0)


def test_paired_comparison_against_hand_computed_t_test():
    kd = {1: 0.80, 2: 0.85, 3: 0.90}
    base = {1: 0.78, 2: 0.86, 3: 0.86, 4: 0.50}  # seed 4 has no partner and is left out
    c = A.paired_comparison(kd, base)
    assert c["seeds"] == [1, 2, 3]
    assert c["differences"] == pytest.approx([0.02, -0.01, 0.04])
    mean = 0.05 / 3
    sd = math.sqrt(((0.02 - mean) ** 2 + (-0.01 - mean) ** 2 + (0.04 - mean) ** 2) / 2)
    assert c["mean_difference"] == pytest.approx(mean) and c["sd_difference"] == pytest.approx(sd)
    assert (c["wins"], c["losses"], c["ties"]) == (2, 1, 0)
    t = mean / (sd / math.sqrt(3))
    assert c["t"] == pytest.approx(t)
    # Student's t with 2 degrees of freedom has the closed form P(|T| > t) = 1 - t / sqrt(2 + t^2)
    assert c["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))


def test_paired_comparison_one_seed_and_no_shared_seed():
    c = A.paired_comparison({"a": 0.7}, {"a": 0.7})
    assert (c["ties"], c["sd_difference"], c["t"], c["p"]) == (1, 0.0, None, None)
    with pytest.raises(ValueError, match="share no seed"):
        A.paired_comparison({1: 0.5}, {2: 0.5})


def test_hidden_size_curve_keeps_best_per_size():
    rows = [{"hidden": 256, "score": 0.8}, {"hidden": 64, "score": 0.7}, {"hidden": 256, "score": 0.82}]
    assert A.hidden_size_curve(rows) == [(64, 0.7), (256, 0.82)]


def test_pareto_front_hand_made_points():
    pts = [(10.0, 0.90), (5.0, 0.85), (6.0, 0.80), (1.0, 0.50), (10.0, 0.88), (5.0, 0.85)]
    # (6,0.80) is beaten by (5,0.85); (10,0.88) by (10,0.90); the two (5,0.85) tie and both stay
    assert A.pareto_front(pts) == [3, 1, 5, 0]
    assert A.pareto_front([]) == []
    assert not math.isnan(pts[0][0])
