"""The latency-constrained structured search: loss estimates, the dynamic programme against brute
force, the budget it promises, and why a FLOPs-only search does not meet a latency target."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from compress.core.errors import UsageError
from compress.pruning.fisher_masks import FisherImportance, fisher_importance, unit_flops
from compress.pruning.fisher_search import removal_cost, search_masks
from compress.pruning.latency_search import (
    BlockOptions,
    brute_force,
    removal_losses,
    search_latency,
    width_counts,
)
from compress.pruning.latency_structured import plan_for_speedup, prune_to_speedup
from compress.pruning.structured import layer_sizes


@dataclass(frozen=True)
class AffineTable:
    """A latency model with a fixed cost per non-empty block and a cost per unit (hand-checkable)."""

    heads: int
    width: int
    layers: int
    base_ms: float = 2.0
    layer_fixed_ms: float = 0.5
    block_ms: float = 4.0
    head_ms: float = 0.5
    neuron_ms: float = 0.01

    def attention_ms(self, h: int) -> float:
        return 0.0 if h == 0 else self.block_ms + self.head_ms * h

    def ffn_ms(self, w: int) -> float:
        return 0.0 if w == 0 else self.block_ms + self.neuron_ms * w

    def predict_ms(self, layer_heads, layer_ffn) -> float:
        return (self.base_ms + self.layers * self.layer_fixed_ms
                + sum(self.attention_ms(h) + self.ffn_ms(w) for h, w in zip(layer_heads, layer_ffn)))


@dataclass(frozen=True)
class ScaledTable(AffineTable):
    """AffineTable with every prediction multiplied by ``dense_scale`` (as the latency table charges the
    dense time its blocks do not explain)."""

    dense_scale: float = 1.0

    def predict_ms(self, layer_heads, layer_ffn) -> float:
        return self.dense_scale * super().predict_ms(layer_heads, layer_ffn)


def test_removal_losses_equal_the_block_fisher_cost_of_removing_the_least_important():
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(7, 5, generator=g)
    importance = grads.pow(2).sum(0)
    losses = removal_losses(grads, importance)
    order = torch.argsort(importance, stable=True)
    for r in range(6):
        removed = torch.zeros(5, dtype=torch.bool)
        removed[order[:r]] = True
        assert losses[r].item() == pytest.approx(removal_cost(grads, removed), rel=1e-9, abs=1e-12)
    # removing everything: (sum over units of each example's gradient)^2, summed over examples
    assert losses[5].item() == pytest.approx(float((grads.double().sum(1) ** 2).sum()))


def _random_blocks(seed: int) -> list[BlockOptions]:
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for b in range(4):
        n = 4
        ms = [0] + sorted(int(x) for x in torch.randint(1, 9, (n - 1,), generator=g))
        loss = sorted((torch.rand(n, generator=g) * 10).tolist(), reverse=True)
        loss[-1] = 0.0  # the full block: no loss
        blocks.append(BlockOptions("attention" if b % 2 == 0 else "ffn", b // 2, tuple(range(n)),
                                   tuple(float(m) for m in ms), tuple(loss)))
    return blocks


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [5, 11, 17, 30])
def test_the_dynamic_programme_matches_brute_force(seed, budget):
    blocks = _random_blocks(seed)
    # integer milliseconds and one quantum per millisecond: the programme is exact here
    choices, ms, loss = search_latency(blocks, float(budget), resolution=budget)
    best_choices, best_loss = brute_force(blocks, float(budget))
    assert loss == pytest.approx(best_loss)
    assert ms <= budget
    assert sum(b.loss[j] for b, j in zip(blocks, choices)) == pytest.approx(loss)


def test_quantised_times_never_exceed_the_budget():
    blocks = [BlockOptions("ffn", i, (0, 1, 2, 3), (0.0, 1.37, 2.71, 3.33), (9.0, 4.0, 1.0, 0.0))
              for i in range(5)]
    for budget in (2.0, 6.5, 9.99, 14.0):
        _, ms, _ = search_latency(blocks, budget, resolution=37)
        assert ms <= budget + 1e-9


def test_an_unreachable_target_is_refused():
    blocks = [BlockOptions("ffn", 0, (1, 2), (3.0, 4.0), (1.0, 0.0))]
    with pytest.raises(UsageError, match="smaller --speedup"):
        search_latency(blocks, 2.0)
    with pytest.raises(UsageError, match="smaller --speedup"):
        search_latency(blocks, -1.0)


def test_width_counts():
    assert width_counts(10, 4, True) == [0, 4, 8, 10]
    assert width_counts(10, 4, False) == [1, 4, 8, 10]


def _fisher(layers=3, heads=4, width=64, seed=0) -> FisherImportance:
    g = torch.Generator().manual_seed(seed)
    hg = [torch.randn(16, heads, generator=g) * (1 + layer) for layer in range(layers)]
    ng = [torch.randn(16, width, generator=g) * 0.1 * (1 + layer) for layer in range(layers)]
    return FisherImportance([x.pow(2).sum(0) for x in hg], [x.pow(2).sum(0) for x in ng], hg, ng, "test")


def test_the_plan_meets_its_predicted_target():
    fisher = _fisher()
    table = AffineTable(heads=4, width=64, layers=3)
    for speedup in (1.5, 2.0, 3.0):
        plan = plan_for_speedup(fisher, table, speedup, ffn_step=8)
        heads = [len(k) for k in plan["keep_heads"]]
        ffn = [len(k) for k in plan["keep_neurons"]]
        assert plan["predicted_ms"] == pytest.approx(table.predict_ms(heads, ffn))
        assert table.predict_ms([4] * 3, [64] * 3) / table.predict_ms(heads, ffn) >= speedup - 1e-9


def test_the_target_holds_when_the_table_charges_unexplained_time():
    fisher = _fisher()
    table = AffineTable(heads=4, width=64, layers=3)
    charged = ScaledTable(heads=4, width=64, layers=3, dense_scale=1.2)
    for speedup in (1.5, 2.0):
        plan = plan_for_speedup(fisher, charged, speedup, ffn_step=8)
        heads = [len(k) for k in plan["keep_heads"]]
        ffn = [len(k) for k in plan["keep_neurons"]]
        assert charged.predict_ms([4] * 3, [64] * 3) / charged.predict_ms(heads, ffn) >= speedup - 1e-9
        # a scale on every prediction leaves the speedup a ratio of sums: the same plan as unscaled
        plain = plan_for_speedup(fisher, table, speedup, ffn_step=8)
        assert plan["keep_heads"] == plain["keep_heads"] and plan["keep_neurons"] == plain["keep_neurons"]
        assert plan["predicted_ms"] == pytest.approx(1.2 * plain["predicted_ms"])


def test_a_flops_only_search_misses_the_latency_target_the_latency_search_meets():
    """With a fixed cost per block, equal FLOPs savings are not equal time savings: the FLOPs search
    spreads its cuts over every block and keeps paying each block's fixed cost."""
    fisher = _fisher(layers=3, heads=4, width=64)
    table = AffineTable(heads=4, width=64, layers=3, block_ms=6.0)
    speedup = 2.5
    target = table.predict_ms([4] * 3, [64] * 3) / speedup
    plan = plan_for_speedup(fisher, table, speedup, ffn_step=8)
    assert plan["predicted_ms"] <= target
    # the FLOPs search at the same fraction of the dense FLOPs (per head / per neuron costs of the
    # table's linear parts)
    per_head, per_neuron = 50, 1
    dense_flops = 3 * (4 * per_head + 64 * per_neuron)
    keep_h, keep_n = search_masks(fisher.heads, fisher.neurons, per_head, per_neuron, dense_flops / speedup)
    flops_ms = table.predict_ms([len(k) for k in keep_h], [len(k) for k in keep_n])
    assert flops_ms > target  # what a search that ignores the latency table gives


def tiny_classifier(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2)
    return BertForSequenceClassification(cfg).eval()


def _batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 200, (8, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[0, 9:] = 0
        labels = torch.randint(0, 2, (8,), generator=g)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def test_prune_to_speedup_removes_what_the_plan_says_and_reloads(tmp_path):
    model = tiny_classifier()
    table = AffineTable(heads=4, width=64, layers=3, block_ms=6.0)
    batches = _batches()
    fisher = fisher_importance(model, batches)
    dense = copy.deepcopy(model)
    report = prune_to_speedup(model, batches, table, 2.5, fisher=fisher)
    sizes = layer_sizes(model)
    assert report["predicted_speedup"] >= 2.5
    assert table.predict_ms([4] * 3, [64] * 3) / table.predict_ms(sizes["heads"], sizes["ffn"]) >= 2.5
    assert sizes["heads"] == report["layer_heads"] and sizes["ffn"] == report["layer_ffn"]
    assert 0 < report["encoder_flops_after"] < report["encoder_flops_before"]
    model.save_pretrained(tmp_path / "m")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        x = {k: v for k, v in batches[0].items() if k != "labels"}
        assert torch.equal(again(**x).logits, model(**x).logits)
    # the same Fisher serves a second target on a fresh copy (one calibration, a family)
    second = prune_to_speedup(dense, batches, table, 1.5, fisher=fisher)
    assert second["predicted_ms"] >= report["predicted_ms"]
    assert unit_flops(model, 12)[0] > 0


def test_blocks_are_kept_where_the_architecture_cannot_remove_them(tiny_encoder):
    folder = tiny_encoder("distilbert")
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    sizes = layer_sizes(model)
    table = AffineTable(heads=sizes["heads"][0], width=sizes["ffn"][0], layers=len(sizes["heads"]),
                        block_ms=1.0)
    report = prune_to_speedup(model, _batches(2), table, 1.3, tune=False)
    assert report["blocks_removable"] is False
    assert min(layer_sizes(model)["heads"]) >= 1 and min(layer_sizes(model)["ffn"]) >= 1


def test_the_loss_of_a_count_is_the_loss_of_removing_exactly_the_units_not_kept():
    """Ties included: the units a count keeps (top_units) and those its loss estimate removes are
    complements."""
    from compress.pruning.latency_search import top_units

    importance = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0])  # three tied units
    grads = torch.tensor([[1.0, 0.0, 2.0, 4.0, 0.0], [0.0, 1.0, -1.0, 1.0, 1.0]])
    losses = removal_losses(grads, importance)
    for k in range(6):
        removed = torch.ones(5, dtype=torch.bool)
        removed[top_units(importance, k)] = False
        assert losses[5 - k].item() == pytest.approx(removal_cost(grads, removed)), k


def test_each_options_loss_is_the_loss_of_removing_exactly_the_units_it_does_not_keep():
    from compress.pruning.latency_search import block_options, top_units

    g = torch.Generator().manual_seed(3)
    grads = torch.randn(6, 5, generator=g)
    importance = grads.pow(2).sum(0)
    counts = [0, 1, 2, 3, 4, 5]
    block = block_options("attention", 0, grads, importance, counts, lambda k: 1.0 + k)
    for k, ms, loss in zip(block.counts, block.ms, block.loss):
        removed = torch.ones(5, dtype=torch.bool)
        removed[top_units(importance, k)] = False
        assert loss == pytest.approx(removal_cost(grads, removed)), k
        assert ms == (0.0 if k == 0 else 1.0 + k)
    assert block.loss[-1] == 0.0 and block.loss[0] > block.loss[1] > 0


@pytest.mark.parametrize("speedup", [1.3, 1.7, 2.4])
def test_the_plan_is_the_least_loss_layout_within_the_target_by_brute_force(speedup):
    """Every layout of a 2-layer model (0-3 heads, 0/8/16 neurons per layer) on a table whose layers
    cost a fixed 2 ms each: the plan is the feasible layout of least summed removal loss, computed
    here from the removed units' per-example gradients (removal_cost). The heads matter most and
    the full head count is an option, so the plan keeps every head where the budget allows."""
    from itertools import product

    from compress.pruning.latency_search import top_units

    fisher = _fisher(layers=2, heads=3, width=16, seed=1)
    table = AffineTable(heads=3, width=16, layers=2, layer_fixed_ms=2.0, block_ms=1.0, neuron_ms=0.2)
    target = table.predict_ms([3, 3], [16, 16]) / speedup

    def loss(grads, importance, k):
        removed = torch.ones(len(importance), dtype=torch.bool)
        removed[top_units(importance, k)] = False
        return removal_cost(grads, removed)

    best = None
    for h0, h1, w0, w1 in product(range(4), range(4), (0, 8, 16), (0, 8, 16)):
        if table.predict_ms([h0, h1], [w0, w1]) > target + 1e-9:
            continue
        total = sum(loss(fisher.head_grads[i], fisher.heads[i], h) for i, h in enumerate((h0, h1)))
        total += sum(loss(fisher.neuron_grads[i], fisher.neurons[i], w) for i, w in enumerate((w0, w1)))
        best = min(best or (float("inf"), None), (total, ((h0, h1), (w0, w1))))
    plan = plan_for_speedup(fisher, table, speedup, ffn_step=8)
    heads = tuple(len(k) for k in plan["keep_heads"])
    ffn = tuple(len(k) for k in plan["keep_neurons"])
    assert plan["predicted_ms"] <= target + 1e-9
    assert plan["estimated_loss"] == pytest.approx(best[0], rel=1e-9)
    assert (heads, ffn) == best[1]
    if speedup < 2:
        assert heads == (3, 3)


def test_the_speedup_path_holds_the_tuned_scales_within_the_bound():
    """prune_to_speedup passes its scale bound to the least-squares tuning: at a bound of 1 no
    folded scale exceeds 1, where the unbounded fit of the same plan goes above it."""
    batches = _batches()
    table = AffineTable(heads=4, width=64, layers=3, block_ms=6.0)
    fisher = fisher_importance(tiny_classifier(), batches)
    free = prune_to_speedup(tiny_classifier(), batches, table, 2.0, fisher=fisher, scale_bound=None)
    bounded = prune_to_speedup(tiny_classifier(), batches, table, 2.0, fisher=fisher, scale_bound=1.0)

    def largest(report):
        return max(abs(s) for masks in report["head_masks"] + report["neuron_masks"] for s in masks)

    assert largest(free) > 1.0
    assert largest(bounded) <= 1.0 + 1e-6 and bounded["scale_bound"] == 1.0


def test_the_prune_recipe_passes_its_scale_bound_on_the_speedup_path(monkeypatch):
    import compress.measure.latency_table as lt
    from compress.api.prune_stages import PruneConfig, structured_prune
    from tests.unit.test_latency_table import hand_table

    shapes = []
    monkeypatch.setattr(lt, "latency_table", lambda module, runtime, batch, tokens: shapes.append(
        (runtime, batch, tokens)) or dataclasses.replace(hand_table(), num_layers=3))
    cfg = PruneConfig(stage="post-training", structured=("heads", "ffn"), criterion="fisher", speedup=(1.5,),
                      latency_shape="2x12", scale_bound=1.0)
    report = structured_prune(tiny_classifier(), cfg, _batches())
    assert shapes == [("ort-int8", 2, 12)]
    assert report["scale_bound"] == 1.0 and report["tuned"]
    assert max(abs(s) for masks in report["head_masks"] + report["neuron_masks"] for s in masks) <= 1.0 + 1e-6
