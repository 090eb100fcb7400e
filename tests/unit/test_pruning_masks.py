"""Masks on hand-made matrices: local, global, ties, random."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compress.core.errors import UsageError
from compress.pruning.criteria import CRITERIA, get_criterion, random_scores
from compress.pruning.masks import (
    SCOPES,
    get_scope,
    global_masks,
    local_masks,
    mask_from_scores,
)


def test_local_mask_hand_made():
    w = torch.tensor([[0.5, -0.1, 0.3], [0.2, -0.4, 0.6]])
    m = mask_from_scores(w.abs(), 0.5)  # prune 3: |w| 0.1, 0.2, 0.3
    assert m.tolist() == [[True, False, False], [False, True, True]]


def test_ties_break_by_lower_flat_index():
    assert mask_from_scores(torch.ones(4), 0.5).tolist() == [False, False, True, True]
    assert mask_from_scores(torch.tensor([2.0, 1.0, 1.0, 3.0]), 0.25).tolist() == [True, False, True, True]
    # threshold value shared between pruned and kept entries
    s = torch.tensor([0.5, 0.2, 0.5, 0.5, 0.9])
    assert mask_from_scores(s, 0.6).tolist() == [False, False, False, True, True]


def test_zero_sparsity_and_rounding():
    assert mask_from_scores(torch.rand(7), 0.0).all()
    assert int((~mask_from_scores(torch.rand(10), 0.34)).sum()) == 3
    assert int((~mask_from_scores(torch.rand(1000), 0.4)).sum()) == 400


def test_local_vs_global_hand_made():
    scores = {"b": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "a": torch.tensor([[0.1, 0.2], [0.3, 0.4]])}
    loc = local_masks(scores, 0.5)
    assert loc["a"].tolist() == [[False, False], [True, True]]
    assert loc["b"].tolist() == [[False, False], [True, True]]
    glo = global_masks(scores, 0.5)
    assert glo["a"].tolist() == [[False, False], [False, False]]
    assert glo["b"].tolist() == [[True, True], [True, True]]


def test_global_ties_break_by_name_then_index():
    scores = {"b": torch.ones(2), "a": torch.ones(2)}
    glo = global_masks(scores, 0.75)
    assert glo["a"].tolist() == [False, False] and glo["b"].tolist() == [False, True]


def test_random_criterion_same_count_different_mask_seeded():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    mag = mask_from_scores(get_criterion("magnitude").score(w, None, torch.Generator()), 0.4)
    r1 = mask_from_scores(random_scores(w, None, torch.Generator().manual_seed(7)), 0.4)
    r2 = mask_from_scores(random_scores(w, None, torch.Generator().manual_seed(7)), 0.4)
    r3 = mask_from_scores(random_scores(w, None, torch.Generator().manual_seed(8)), 0.4)
    assert int((~mag).sum()) == int((~r1).sum()) == round(0.4 * 64 * 64)
    assert torch.equal(r1, r2) and not torch.equal(r1, r3)
    # about 60% agreement expected by chance (0.4^2 + 0.6^2 = 0.52), far from identical
    assert (mag == r1).float().mean() < 0.7


def test_registries_and_unknown_names():
    assert set(CRITERIA) == {"magnitude", "random", "wanda", "sparsegpt", "fisher", "obs"}
    assert set(SCOPES) == {"local", "global"}
    with pytest.raises(UsageError, match="unknown criterion 'snip'; choose one of: magnitude, random, wanda"):
        get_criterion("snip")
    with pytest.raises(UsageError, match="unknown scope 'row'; choose one of: local, global"):
        get_scope("row")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 200), s=st.floats(0, 0.99), seed=st.integers(0, 10_000),
       levels=st.integers(1, 5))
def test_mask_prunes_exactly_k_lowest(n, s, seed, levels):
    # few distinct levels force many ties
    scores = torch.randint(0, levels, (n,), generator=torch.Generator().manual_seed(seed)).float()
    m = mask_from_scores(scores, s)
    k = round(s * n)
    assert int((~m).sum()) == k
    if 0 < k < n:
        assert scores[~m].max() <= scores[m].min()
        # among the entries at the threshold, the pruned ones come first by index
        t = scores[~m].max()
        at = torch.nonzero(scores == t).reshape(-1).tolist()
        pruned_at = [i for i in at if not m[i]]
        assert pruned_at == at[:len(pruned_at)]
