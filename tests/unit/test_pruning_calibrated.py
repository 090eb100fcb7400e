"""Data-aware pruning: SparseGPT's reconstruction against the closed-form optimal-brain-surgeon
solution, the error order SparseGPT < Wanda < magnitude on layers with fixed inputs, N:M after
reconstruction, and the layer-wise calibration driver on a tiny BERT."""

from __future__ import annotations

import copy

import pytest
import torch

from compress.core.errors import ModelError, UsageError
from compress.pruning.calibration import calibration_sample, gather_stats, prune_calibrated
from compress.pruning.criteria import CRITERIA, LayerStats, get_criterion, weight_only
from compress.pruning.masks import NMPattern, keep_mask_flat
from compress.pruning.sparsegpt import damped_inverse, sparsegpt_prune


def _inputs(seed: int, tokens: int = 256, features: int = 16) -> torch.Tensor:
    """Correlated inputs with unequal feature scales in no particular order, as hidden states have."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(tokens, features, generator=g, dtype=torch.float64)
    mix = torch.randn(features, features, generator=g, dtype=torch.float64) * 0.5 + torch.eye(features)
    scale = torch.logspace(-1, 0.7, features, dtype=torch.float64)[torch.randperm(features, generator=g)]
    return z @ mix * scale


def _out_error(w: torch.Tensor, w_new: torch.Tensor, x: torch.Tensor) -> float:
    return float(((w - w_new) @ x.T).pow(2).sum())


def test_reconstruction_equals_the_closed_form_obs_solution():
    """Pruning the first columns of every row: the optimal kept weights for w_P = 0 minimise
    (w - w') H (w - w')^T, so w'_R = w_R + H_RR^-1 H_RP w_P (H damped as the code damps it)."""
    x = _inputs(0, features=8)
    gram = x.T @ x
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 8, generator=g, dtype=torch.float64)
    w[:, :2] *= 1e-4  # the two smallest-saliency columns of every row: these go
    new, keep, _ = sparsegpt_prune(w, gram, prune_count=6, blocksize=8, percdamp=0.01)
    assert not keep[:, :2].any() and keep[:, 2:].all()
    h = torch.inverse(damped_inverse(gram, w, 0.01))  # the damped H itself
    p, r = slice(0, 2), slice(2, 8)
    expected = w[:, r] + (torch.linalg.solve(h[r, r], h[r, p] @ w[:, p].T)).T
    torch.testing.assert_close(new[:, r], expected, rtol=1e-8, atol=1e-10)
    assert (new[:, p] == 0).all()


def test_one_weight_obs_update():
    """One pruned weight (column 0) moves the row by -w_q / [H^-1]_qq * H^-1[q, :]."""
    x = _inputs(2, features=6)
    gram = x.T @ x
    w = torch.tensor([[1e-5, 0.7, -1.2, 0.4, 2.0, -0.9]], dtype=torch.float64)
    new, keep, err = sparsegpt_prune(w, gram, prune_count=1, blocksize=6)
    hinv = damped_inverse(gram, w, 0.01)
    expected = w - w[0, 0] / hinv[0, 0] * hinv[0]
    torch.testing.assert_close(new, expected.masked_fill(~keep, 0.0), rtol=1e-9, atol=1e-12)
    assert keep.sum() == 5 and err == pytest.approx(float(w[0, 0] ** 2 / hinv[0, 0] / 2), rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_output_error_sparsegpt_below_wanda_below_magnitude(seed):
    x = _inputs(10 + seed, tokens=512, features=32)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(24, 32, generator=g, dtype=torch.float64)
    stats = LayerStats(input_gram=x.T @ x, input_sq=(x * x).sum(0), tokens=x.shape[0])
    k = w.numel() // 2
    mag = w.masked_fill(~keep_mask_flat(w.abs(), k).reshape(w.shape), 0.0)
    wanda_scores = get_criterion("wanda").score(w, stats, torch.Generator()).double()
    wanda_keep = torch.stack([keep_mask_flat(row, 16) for row in wanda_scores])
    wanda = w.masked_fill(~wanda_keep, 0.0)
    sgpt, keep, _ = sparsegpt_prune(w, stats.input_gram, prune_count=k, blocksize=32)  # one block
    assert int((~keep).sum()) == k and int((sgpt == 0).sum()) == k
    e_mag, e_wanda, e_sgpt = (_out_error(w, v, x) for v in (mag, wanda, sgpt))
    assert e_sgpt < e_wanda < e_mag, (e_sgpt, e_wanda, e_mag)


def test_nm_pattern_holds_after_reconstruction_and_forced_zeros_stay():
    x = _inputs(5, features=16)
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    forced = torch.zeros_like(w, dtype=torch.bool)
    forced[0, 5] = forced[3, 12] = True
    new, keep, _ = sparsegpt_prune(w, x.T @ x, pattern=(2, 4), forced=forced, blocksize=6)
    groups_zero = (new.reshape(-1, 4) == 0).sum(dim=1)
    assert (groups_zero >= 2).all()
    assert ((~keep).reshape(-1, 4).sum(dim=1) == 2).all()  # exactly N of every M in the mask
    assert not keep[0, 5] and not keep[3, 12]
    assert (new[~keep] == 0).all() and (new[keep] != 0).all()


def test_registry_declares_what_each_criterion_needs():
    assert set(CRITERIA) == {"magnitude", "random", "wanda", "sparsegpt", "fisher", "obs"}
    assert not CRITERIA["magnitude"].data_aware and CRITERIA["sparsegpt"].reconstructs
    assert CRITERIA["obs"].structured_only and CRITERIA["obs"].needs == {"input_gram"}
    assert CRITERIA["wanda"].needs == {"input_sq"} and CRITERIA["wanda"].compare == "row"
    with pytest.raises(UsageError, match="post-training"):
        weight_only("sparsegpt")
    with pytest.raises(UsageError, match="unknown criterion 'ziplm'.*magnitude, random, wanda, sparsegpt"):
        get_criterion("ziplm")


def test_calibration_sample_is_seeded_distinct_and_capped():
    a, b = calibration_sample(100, 10, seed=3), calibration_sample(100, 10, seed=3)
    assert a == b and len(set(a)) == 10 and a == sorted(a)
    assert calibration_sample(100, 10, seed=4) != a
    assert calibration_sample(5, 10, seed=0) == [0, 1, 2, 3, 4]
    with pytest.raises(UsageError, match="calibration-samples"):
        calibration_sample(5, 0, seed=0)


# ------------------------------------------------------------------------- the driver on a model


@pytest.fixture(scope="module")
def tiny_classifier():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2)
    return BertForSequenceClassification(cfg).eval()


def _batches(n: int = 4, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 120, (4, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[0, 8:] = 0  # one padded row: padding must not count as calibration tokens
        out.append({"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(4, dtype=torch.long)})
    return out


def _targets(model):
    from compress.pruning.targets import select_targets

    return select_targets(model, (), ())


def test_gather_stats_counts_only_real_tokens_and_sums_the_gram(tiny_classifier):
    model = tiny_classifier
    lin = model.bert.encoder.layer[0].attention.self.query
    seen = []
    h = lin.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    batches = _batches(2)
    stats = gather_stats(model, batches, {"q": lin}, {"input_gram", "input_sq"},
                         stop_after=model.bert.encoder.layer[0])
    h.remove()
    xs = torch.cat([x[b["attention_mask"].bool()] for x, b in zip(seen, batches)]).double()
    assert stats["q"].tokens == xs.shape[0] == 2 * (4 * 12 - 4)
    torch.testing.assert_close(stats["q"].input_gram, xs.T @ xs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["q"].input_sq, (xs * xs).sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("criterion", ["magnitude", "wanda", "sparsegpt"])
def test_prune_calibrated_reaches_the_sparsity_and_zeros_match_masks(tiny_classifier, criterion):
    model = copy.deepcopy(tiny_classifier)
    targets = _targets(model)
    masks, report = prune_calibrated(model, targets, _batches(), criterion, 0.5)
    for name, p in targets.items():
        assert (p[~masks[name]] == 0).all(), name
        assert abs(float((~masks[name]).float().mean()) - 0.5) < 0.02, name
    assert report["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert report["outside_layers"]["matrices"] == ["embeddings.word_embeddings.weight"]
    assert report["calibration_tokens"] == (4 * (4 * 12 - 4) if criterion != "magnitude" else 0)


def test_the_same_calibration_gives_the_same_masks_and_weights(tiny_classifier):
    runs = []
    for _ in range(2):
        model = copy.deepcopy(tiny_classifier)
        masks, _ = prune_calibrated(model, _targets(model), _batches(), "sparsegpt", 0.6)
        runs.append((masks, {n: p.detach().clone() for n, p in _targets(model).items()}))
    assert all(torch.equal(runs[0][0][n], runs[1][0][n]) for n in runs[0][0])
    assert all(torch.equal(runs[0][1][n], runs[1][1][n]) for n in runs[0][1])


def test_layers_see_the_pruned_layers_before_them(tiny_classifier, monkeypatch):
    """Layer 1's statistics come from a model whose layer 0 is already pruned: its input Gram
    matrix equals the one gathered on a copy pruned by hand at layer 0 only."""
    import compress.pruning.calibration as cal

    model = copy.deepcopy(tiny_classifier)
    grams = []
    real = cal.gather_stats

    def spy(m, batches, linears, needs, stop_after=None):
        stats = real(m, batches, linears, needs, stop_after)
        grams.append({n: s.input_gram for n, s in stats.items()})
        return stats

    monkeypatch.setattr(cal, "gather_stats", spy)
    targets = _targets(model)
    masks, _ = prune_calibrated(model, targets, _batches(), "sparsegpt", 0.5)
    # rebuild: dense copy, layer 0 weights taken from the pruned model, layer 1 dense
    ref = copy.deepcopy(tiny_classifier)
    ref.bert.encoder.layer[0].load_state_dict(model.bert.encoder.layer[0].state_dict())
    q1 = "encoder.layer.1.attention.self.query.weight"
    stats = real(ref, _batches(), {q1: ref.bert.encoder.layer[1].attention.self.query}, {"input_gram"})
    torch.testing.assert_close(grams[1][q1], stats[q1].input_gram)
    q1_dense = tiny_classifier.bert.encoder.layer[1].attention.self.query
    dense = real(tiny_classifier, _batches(), {q1: q1_dense}, {"input_gram"})
    assert not torch.allclose(grams[1][q1], dense[q1].input_gram)


def test_global_scope_and_nm_pattern_on_a_model(tiny_classifier):
    model = copy.deepcopy(tiny_classifier)
    targets = _targets(model)
    masks, report = prune_calibrated(model, targets, _batches(), "sparsegpt", 0.5, scope="global")
    enc = [n for n in masks if n.startswith("encoder.")]
    pruned = sum(int((~masks[n]).sum()) for n in enc)
    assert pruned == round(0.5 * sum(masks[n].numel() for n in enc))
    assert len({round(float((~masks[n]).float().mean()), 3) for n in enc}) > 1  # matrices differ
    model = copy.deepcopy(tiny_classifier)
    targets = _targets(model)
    masks, _ = prune_calibrated(model, targets, _batches(), "wanda", 0.5, pattern=NMPattern(2, 4))
    for n, p in targets.items():
        assert ((p.detach().reshape(-1, 4) == 0).sum(dim=1) >= 2).all(), n


def test_initial_masks_stay_pruned(tiny_classifier):
    model = copy.deepcopy(tiny_classifier)
    targets = _targets(model)
    name = "encoder.layer.0.attention.self.query.weight"
    initial = {name: torch.rand(targets[name].shape, generator=torch.Generator().manual_seed(0)) > 0.3}
    masks, _ = prune_calibrated(model, targets, _batches(), "sparsegpt", 0.5, initial_masks=initial)
    assert not (masks[name] & ~initial[name]).any()


def test_a_data_aware_criterion_without_batches_is_refused(tiny_classifier):
    model = copy.deepcopy(tiny_classifier)
    with pytest.raises(UsageError, match="needs calibration batches"):
        prune_calibrated(model, _targets(model), [], "wanda", 0.5)


# ------------------------------------------------------------------------- re-pruning, blocks, draws


def test_later_column_blocks_take_the_error_of_the_earlier_ones():
    """16 columns in blocks of 4, the first 6 columns of every row pruned (forced, so the mask is
    known): the kept weights must equal the closed-form optimum w'_R = w_R + H_RR^-1 H_RP w_P,
    which moves the columns of blocks 2-4 too; without the update of the later blocks
    (w[:, i2:] -= err1 @ u[i1:i2, i2:]) they would stay as they were."""
    x = _inputs(7, features=16)
    gram = x.T @ x
    w = torch.randn(5, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    forced = torch.zeros_like(w, dtype=torch.bool)
    forced[:, :6] = True
    new, keep, _ = sparsegpt_prune(w, gram, prune_count=30, forced=forced, blocksize=4, percdamp=0.01)
    assert torch.equal(keep, ~forced)
    h = torch.inverse(damped_inverse(gram, w, 0.01))
    p, r = slice(0, 6), slice(6, 16)
    expected = w[:, r] + (torch.linalg.solve(h[r, r], h[r, p] @ w[:, p].T)).T
    torch.testing.assert_close(new[:, r], expected, rtol=1e-8, atol=1e-10)
    assert not torch.allclose(new[:, 8:], w[:, 8:])  # the blocks after the pruned ones moved


@pytest.mark.parametrize("split", ["uniform", "saliency"])
def test_re_pruning_counts_the_old_zeros_toward_the_matrix_target(split):
    """70% -> 70%: the old zeros sit unevenly (90% of the first block, 63% of the rest); the matrix
    ends at exactly 70% (no block keeps more than its old zeros), every old zero stays."""
    x = _inputs(3, features=32)
    w = torch.randn(10, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    forced = torch.zeros_like(w, dtype=torch.bool)
    forced[:, :8] = torch.rand(10, 8, generator=g) < 0.9
    rest = int(round(0.7 * w.numel())) - int(forced.sum())
    idx = torch.randperm(10 * 24, generator=g)[:rest]
    tail = torch.zeros(10 * 24, dtype=torch.bool)
    tail[idx] = True
    forced[:, 8:] = tail.reshape(10, 24)
    target = int(round(0.7 * w.numel()))
    assert int(forced.sum()) == target and float(forced[:, :8].float().mean()) > 0.8
    new, keep, _ = sparsegpt_prune(w, x.T @ x, prune_count=target, forced=forced, blocksize=8,
                                   block_split=split)
    assert int((~keep).sum()) == target and torch.equal(~keep, forced)
    # 50% -> 70%: the new zeros come on top of the old ones, and the total is the target
    half = torch.zeros(w.numel(), dtype=torch.bool)
    half[torch.randperm(w.numel(), generator=g)[:w.numel() // 2]] = True
    half = half.reshape(w.shape)
    new, keep, _ = sparsegpt_prune(w, x.T @ x, prune_count=target, forced=half, blocksize=8,
                                   block_split=split)
    assert int((~keep).sum()) == target and not (keep & half).any()
    assert (new[~keep] == 0).all()


def test_block_counts_split_uniformly_without_old_zeros():
    from compress.pruning.sparsegpt import _block_counts

    sal = torch.rand(6, 20, generator=torch.Generator().manual_seed(0))
    counts = _block_counts(sal, 61, 8, "uniform")
    assert counts == [round(61 * b / 20) - round(61 * a / 20) for a, b in ((0, 8), (8, 16), (16, 20))]
    forced = torch.zeros(6, 20, dtype=torch.bool)
    forced[:, :8] = True  # 48 old zeros in the first block, 13 more to spread over the other 72
    counts = _block_counts(sal, 61, 8, "uniform", forced)
    assert sum(counts) == 61 and counts[0] == 48 and counts[1] == 9 and counts[2] == 4


def _embedding_and_layer_masks(model, sparsity: float, seed: int) -> dict:
    from compress.pruning.targets import named_weights

    params = named_weights(model)
    g = torch.Generator().manual_seed(seed)
    names = ["embeddings.word_embeddings.weight", "encoder.layer.0.intermediate.dense.weight",
             "encoder.layer.1.attention.self.query.weight"]
    return {n: torch.rand(params[n].shape, generator=g) >= sparsity for n in names}


@pytest.mark.parametrize("criterion", ["sparsegpt", "wanda", "magnitude"])
def test_old_zeros_stay_in_every_matrix_in_the_targets_or_not(tiny_classifier, criterion):
    """An already pruned model (70% of the word embeddings, an FFN and a query matrix) pruned again
    at 50% without the embeddings and the FFN-in matrices: every old zero is still zero in the
    weights and in the returned masks, the embeddings' and FFN's masks included."""
    from compress.pruning.targets import named_weights, select_targets

    model = copy.deepcopy(tiny_classifier)
    initial = _embedding_and_layer_masks(model, 0.7, seed=1)
    params = named_weights(model)
    with torch.no_grad():
        for n, m in initial.items():
            params[n].masked_fill_(~m, 0.0)
    targets = select_targets(model, (), ("role:ffn_in",), word_embeddings=False)
    assert "embeddings.word_embeddings.weight" not in targets
    masks, report = prune_calibrated(model, targets, _batches(), criterion, 0.5, initial_masks=initial)
    for n, m in initial.items():
        assert n in masks, n
        assert not (masks[n] & ~m).any(), n  # no old zero is kept
        assert (params[n][~m] == 0).all(), n
    assert report["masks_kept_outside_targets"] == ["embeddings.word_embeddings.weight",
                                                    "encoder.layer.0.intermediate.dense.weight"]
    # the query matrix was at 70%, asked 50%: it stays at 70% (old zeros win), exactly
    q = "encoder.layer.1.attention.self.query.weight"
    assert int((~masks[q]).sum()) == int((~initial[q]).sum())


def test_old_zeros_of_the_word_embeddings_stay_when_they_are_pruned_again(tiny_classifier):
    """The embeddings are outside the encoder layers (pruned by magnitude): at 70% before and 50%
    asked, all their old zeros stay in the mask (before, those past the 50% budget were marked kept)."""
    from compress.pruning.targets import select_targets

    model = copy.deepcopy(tiny_classifier)
    emb = "embeddings.word_embeddings.weight"
    initial = {emb: _embedding_and_layer_masks(model, 0.7, seed=2)[emb]}
    targets = select_targets(model, ("role:word_embeddings",), (), word_embeddings=False)
    with torch.no_grad():
        targets[emb].masked_fill_(~initial[emb], 0.0)
    masks, _ = prune_calibrated(model, targets, _batches(), "sparsegpt", 0.5, initial_masks=initial)
    assert not (masks[emb] & ~initial[emb]).any()
    assert (targets[emb][~masks[emb]] == 0).all()


def test_calibration_draw_is_stratified_by_label_and_seeded():
    """95 examples of label 0, 5 of label 1: a draw of 20 holds 1 of label 1 at least, shares in
    proportion (19 and 1), the same set for the same seed, another for another seed."""
    labels = [0] * 95 + [1] * 5
    perm = torch.randperm(100, generator=torch.Generator().manual_seed(0)).tolist()
    labels = [labels[i] for i in perm]
    for seed in range(20):
        draw = calibration_sample(100, 20, seed, labels)
        assert len(draw) == len(set(draw)) == 20 and draw == sorted(draw)
        assert sum(labels[i] for i in draw) == 1, seed
        assert draw == calibration_sample(100, 20, seed, labels)
    assert calibration_sample(100, 20, 0, labels) != calibration_sample(100, 20, 1, labels)
    # three labels, the rarest's share rounds to 0: it takes one from the largest
    three = [0] * 90 + [1] * 8 + [2] * 2
    draw = calibration_sample(100, 10, 0, three)
    assert sorted(three[i] for i in draw) == [0] * 8 + [1] + [2]
    assert calibration_sample(5, 10, 0, [0, 1, 0, 1, 0]) == [0, 1, 2, 3, 4]
    multi = [(1.0, 0.0)] * 30 + [(0.0, 1.0)] * 3  # multi-label rows as tuples
    assert sum(multi[i] == (0.0, 1.0) for i in calibration_sample(33, 11, 0, multi)) == 1


def test_deberta_shared_position_keys_give_statistics_that_do_not_depend_on_the_batch_size(tiny_encoder):
    """With share_att_key the query/key projections also run on the relative-position embeddings,
    once per forward: those rows weigh the batch size, so 8 examples in batches of 4 or of 2 give
    the same statistics."""
    from transformers import AutoModel

    from compress.pruning.calibration import gather_stats

    model = AutoModel.from_pretrained(tiny_encoder("deberta-v2")).eval()
    assert model.config.share_att_key
    layer = model.encoder.layer[0].attention.self
    linears = {"query": layer.query_proj, "key": layer.key_proj, "value": layer.value_proj}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (8, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[3, 8:] = 0

    def stats(size):
        batches = [{"input_ids": ids[i:i + size], "attention_mask": mask[i:i + size]}
                   for i in range(0, 8, size)]
        return gather_stats(model, batches, linears, ("input_gram", "input_sq"))

    four, two = stats(4), stats(2)
    for name in linears:
        assert torch.allclose(four[name].input_gram, two[name].input_gram, rtol=1e-5, atol=1e-4), name
        assert torch.allclose(four[name].input_sq, two[name].input_sq, rtol=1e-5, atol=1e-4), name
        assert four[name].tokens == two[name].tokens
    # value_proj sees tokens only: 8 x 12 positions less the 4 padded ones
    assert four["value"].tokens == 8 * 12 - 4


def test_token_rows_drop_padding_the_model_adds_inside_and_read_transposed_inputs():
    from compress.pruning.calibration import _token_rows

    x = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(2, 8, 3)  # padded inside from 5 to 8
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    rows, weight = _token_rows(x, mask, "m", padded_inside=True)
    expected = torch.cat([x[0, :5], x[1, :3]])
    assert weight == 1 and torch.equal(rows, expected)
    rows, weight = _token_rows(x.transpose(0, 1), mask, "m", True)  # [positions, batch, in] (Longformer)
    assert weight == 1 and torch.equal(rows, expected)
    with pytest.raises(ModelError, match="sees 4 of the batch's 5 positions"):
        _token_rows(x[:, :4], mask, "m", True)  # fewer positions than the batch: chunked, refused
    # a model that does not pad inside (pads_inside False): more positions than the batch's are
    # not taken for padding, whatever the batch size
    with pytest.raises(ModelError, match="sees 8 of the batch's 5 positions"):
        _token_rows(x[:1], mask[:1], "m", padded_inside=False)
