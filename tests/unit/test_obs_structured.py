"""Structured removal with reconstruction (ZipLM's structured OBS): the update of one removed column
group against an independent least-squares solve, the removal order against brute force, the
recorded error against the measured output error, and the whole path on a tiny BERT whose biases
and LayerNorms are not the defaults."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from compress.core.errors import UsageError
from compress.models.architectures import encoder_layers
from compress.pruning.obs_groups import output_error, remove_groups
from compress.pruning.obs_structured import (
    apply_removal,
    obs_prune_structured,
    obs_prune_to_speedup,
    plan_for_speedup_obs,
    removal_database,
)


def perturb(model: torch.nn.Module, seed: int = 3) -> torch.nn.Module:
    """Non-zero biases and LayerNorms that are not the identity: a default-initialised model makes an
    empty block that returns its input exact, and hides what a bias or a LayerNorm would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
    return model


def tiny_bert(seed: int = 0, layers: int = 2) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=120, hidden_size=16, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=12, max_position_embeddings=32, num_labels=3)
    return perturb(BertForSequenceClassification(cfg).eval())


def batches(model, n: int = 3, size: int = 4, length: int = 10, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, model.config.vocab_size, (size, length), generator=g)
        mask = torch.ones_like(ids)
        mask[1, length - 3:] = 0
        ids[1, length - 3:] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def layer_problem(out: int = 5, cols: int = 12, tokens: int = 60, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, cols, generator=g, dtype=torch.float64)
    x[:, 3] *= 4  # features of unequal scale, as activations are
    w = torch.randn(out, cols, generator=g, dtype=torch.float64)
    return w, x


def lstsq_without(w: torch.Tensor, x: torch.Tensor, removed: list[int]) -> torch.Tensor:
    """The independent answer: the columns outside ``removed`` refitted by least squares to the
    full layer's outputs ``x w^T``, the removed columns zero."""
    keep = [j for j in range(w.shape[1]) if j not in removed]
    sol = torch.linalg.lstsq(x[:, keep], x @ w.T).solution  # [kept, out]
    new = torch.zeros_like(w)
    new[:, keep] = sol.T
    return new


@pytest.mark.parametrize("size", [1, 3])
def test_removing_one_group_gives_the_least_squares_update_and_the_least_error(size):
    w, x = layer_problem()
    gram = x.T @ x
    new, path = remove_groups(w, gram, size, remove=1, percdamp=0.0)
    g = path.order[0]
    removed = list(range(g * size, (g + 1) * size))
    expected = lstsq_without(w, x, removed)
    assert torch.allclose(new, expected, atol=1e-8)
    assert (new[:, removed] == 0).all()
    # no other group's removal, each refitted by least squares, has a smaller output error
    errors = [output_error(w, lstsq_without(w, x, list(range(k * size, (k + 1) * size))), gram)
              for k in range(w.shape[1] // size)]
    assert errors[g] == pytest.approx(min(errors), rel=1e-9)
    assert path.errors[1] == pytest.approx(errors[g], rel=1e-7)


def test_every_step_keeps_the_least_squares_optimum_of_the_groups_removed_so_far():
    w, x = layer_problem(cols=8)
    gram = x.T @ x
    for r in range(1, 8):
        new, path = remove_groups(w, gram, 1, remove=r, percdamp=0.0)
        assert torch.allclose(new, lstsq_without(w, x, list(path.order)), atol=1e-8)
        assert path.errors[r] == pytest.approx(output_error(w, new, gram), rel=1e-7)
    # a greedy path (only its first step is optimal over all choices): its errors rise with each step
    assert list(path.errors) == sorted(path.errors)


def test_the_recorded_error_is_the_measured_output_error_with_damping():
    w, x = layer_problem(cols=12)
    gram = x.T @ x
    for r in (1, 2, 4):
        new, path = remove_groups(w, gram, 3, remove=r, percdamp=0.01)
        measured = float(((x @ w.T - x @ new.T) ** 2).sum())
        assert path.errors[r] == pytest.approx(measured, rel=1e-6)
    _, path = remove_groups(w, gram, 3)
    assert path.errors[-1] == pytest.approx(float(((x @ w.T) ** 2).sum()), rel=1e-6)  # everything gone


def test_removing_nothing_leaves_the_weight_bit_identical():
    w, x = layer_problem()
    new, path = remove_groups(w, x.T @ x, 3, remove=0)
    assert new is w and path.errors == (0.0,)


def test_the_update_is_what_makes_the_error_small():
    """Zeroing the chosen columns without the update costs more: the update is not a no-op. The
    inputs are correlated, as activations are: what a removed column carried, others carry too."""
    w, x = layer_problem()
    g = torch.Generator().manual_seed(5)
    x = x[:, :4] @ torch.randn(4, 12, generator=g, dtype=torch.float64) + 0.1 * x
    gram = x.T @ x
    new, path = remove_groups(w, gram, 1, remove=4)
    zeroed = w.clone()
    zeroed[:, list(path.order)] = 0
    assert output_error(w, new, gram) < 0.8 * output_error(w, zeroed, gram)


def test_bad_groups_and_counts_are_refused():
    w, x = layer_problem(cols=12)
    with pytest.raises(UsageError, match="groups of 5"):
        remove_groups(w, x.T @ x, 5)
    with pytest.raises(UsageError, match="cannot remove 5 of 4"):
        remove_groups(w, x.T @ x, 3, remove=5)


def test_the_database_paths_and_the_removal_errors_match_the_model_outputs():
    model = tiny_bert()
    data = batches(model)
    db = removal_database(model, data)
    assert len(db.heads) == 2 and len(db.heads[0].errors) == 5 and len(db.neurons[0].errors) == 13
    assert db.tokens == sum(int(b["attention_mask"].sum()) for b in data)
    # layer 0's inputs are the same for the dense model and the pruned one: the removal of layer 0's
    # attention on them equals the database's error at that count
    pruned = copy.deepcopy(model)
    report = apply_removal(pruned, data, [2, 4], [12, 12])
    assert report["layer_error"]["attention"][0] == pytest.approx(db.heads[0].errors[2], rel=1e-6)
    assert report["layer_heads"] == [2, 4]


def test_the_removed_model_computes_what_the_updated_weights_compute():
    """The heads removed by ``remove_structured`` after the update leave the outputs of the
    zeroed-and-updated model unchanged, and the updated model is closer to the dense one than the
    same removal without the update."""
    model = tiny_bert(layers=3)
    data = batches(model, n=4)
    dense = copy.deepcopy(model)
    pruned = copy.deepcopy(model)
    report = apply_removal(pruned, data, [2, 3, 1], [6, 8, 4])
    # the same units removed with no update of what is kept
    plain = copy.deepcopy(model)
    from compress.pruning.structured import remove_structured

    remove_structured(plain, report["kept_heads"], report["kept_neurons"])
    def logits(m):
        return torch.cat([m(**b).logits for b in data])

    with torch.no_grad():
        ref, upd, raw = logits(dense), logits(pruned), logits(plain)
    assert float((upd - ref).pow(2).mean()) < float((raw - ref).pow(2).mean())


class FlatTable:
    """A latency model with known costs: 1 ms a head, 0.1 ms a neuron, 1 ms fixed."""

    base_ms, layer_fixed_ms, seq_len = 1.0, 0.0, 10

    def attention_ms(self, heads):
        return float(heads)

    def ffn_ms(self, width):
        return 0.1 * width

    def predict_ms(self, heads, ffn):
        return self.base_ms + sum(heads) + 0.1 * sum(ffn)


def test_the_plan_meets_the_target_at_the_least_database_error():
    model = tiny_bert()
    data = batches(model)
    db = removal_database(model, data)
    table = FlatTable()
    plan = plan_for_speedup_obs(db, ([4, 4], [12, 12]), table, 2.0, ffn_step=1)
    assert plan["predicted_ms"] <= table.predict_ms([4, 4], [12, 12]) / 2 + 1e-9
    # brute force over every count of every block
    budget = table.predict_ms([4, 4], [12, 12]) / 2
    best = None
    for h0, h1 in itertools.product(range(5), repeat=2):
        for f0, f1 in itertools.product(range(13), repeat=2):
            if table.predict_ms([h0, h1], [f0, f1]) > budget + 1e-9:
                continue
            loss = (db.heads[0].errors[4 - h0] + db.heads[1].errors[4 - h1] + db.neurons[0].errors[12 - f0]
                    + db.neurons[1].errors[12 - f1])
            best = loss if best is None else min(best, loss)
    assert plan["estimated_loss"] == pytest.approx(best, rel=1e-6)


def test_a_later_target_is_relative_to_the_dense_sizes():
    model = tiny_bert()
    data = batches(model)
    table = FlatTable()
    first = copy.deepcopy(model)
    obs_prune_to_speedup(first, data, table, 1.5)
    dense = ([4, 4], [12, 12])
    second = obs_prune_to_speedup(first, data, table, 2.5, dense_sizes=dense)
    assert second["dense_predicted_ms"] == table.predict_ms(*dense)
    assert second["predicted_ms"] <= table.predict_ms(*dense) / 2.5 + 1e-9


def test_flops_target_is_met_and_the_model_reloads(tmp_path):
    from compress.models.loading import load_classifier
    from compress.pruning.fisher_masks import unit_flops

    model = tiny_bert()
    data = batches(model)
    report = obs_prune_structured(model, data, 0.5, seq_len=10)
    per_head, per_neuron = unit_flops(model, 10)
    assert report["flops_reduction"] >= 0.5 - 1e-9
    flops = sum(report["layer_heads"]) * per_head + sum(report["layer_ffn"]) * per_neuron
    assert report["encoder_flops_after"] == flops
    model.save_pretrained(tmp_path / "m")
    reloaded = type(model).from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(**data[0]).logits, model(**data[0]).logits, atol=1e-5)
    assert load_classifier  # the package loader is exercised by the CLI tests


def test_a_non_finite_model_is_refused_before_any_change():
    model = tiny_bert()
    lay = encoder_layers(model)[1]
    with torch.no_grad():
        lay.linears["ffn_in"].weight[0, 0] = float("nan")
    before = lay.linears["attn_out"].weight.clone()
    with pytest.raises(UsageError, match="non-finite"):
        obs_prune_structured(model, batches(model), 0.5, seq_len=10)
    assert torch.equal(encoder_layers(model)[1].linears["attn_out"].weight, before)


def test_a_structured_target_without_a_criterion_goes_to_the_reconstruction():
    from compress.api.prune_stages import PruneConfig

    for target in ({"flops_reduction": 0.3}, {"speedup": (2.0,)}):
        cfg = PruneConfig(stage="post-training", structured=("heads", "ffn"), **target)
        assert cfg.criterion == "obs"
    assert PruneConfig(stage="post-training", structured=("heads", "ffn"), criterion="fisher",
                       flops_reduction=0.3).criterion == "fisher"
    # without a target, --structured ranks by L2 norm as before
    assert PruneConfig(structured=("heads", "ffn")).criterion == "magnitude"
    # sentence embeddings: the embedding Fisher kept more ReQA P@1 one-shot, so it is their default
    assert PruneConfig(stage="post-training", structured=("heads", "ffn"), task="embedding",
                       speedup=(2.0,)).criterion == "fisher"


class FixedCostTable(FlatTable):
    """A latency model whose layers cost a fixed 2 ms each (their LayerNorms), heads 0.2 ms each and
    neurons 0.3 ms each."""

    layer_fixed_ms = 2.0

    def attention_ms(self, heads):
        return 0.2 * heads

    def ffn_ms(self, width):
        return 0.3 * width

    def predict_ms(self, heads, ffn):
        return self.base_ms + len(heads) * self.layer_fixed_ms + 0.2 * sum(heads) + 0.3 * sum(ffn)


@pytest.mark.parametrize("speedup", [1.1, 1.5])
def test_the_plan_is_the_least_error_layout_when_layers_have_a_fixed_cost(speedup):
    """Brute force over every count of every block (the full head count and the empty block
    included), against a table that charges each layer a fixed cost: the plan fits the target and
    its database error is the least of the layouts that fit. The search rounds each of the four
    blocks' times up to a 2000th of the time left to the blocks, so a layout within four such steps
    of the target may be passed over: the plan's error lies between the least error of all the
    layouts that fit and that of those that fit with that margin."""
    model = tiny_bert()
    db = removal_database(model, batches(model))
    table = FixedCostTable()
    plan = plan_for_speedup_obs(db, ([4, 4], [12, 12]), table, speedup, ffn_step=1)
    target = table.predict_ms([4, 4], [12, 12]) / speedup
    margin = 4 * (target - table.base_ms - 2 * table.layer_fixed_ms) / 2000
    best, best_within_margin = float("inf"), float("inf")
    for h0, h1 in itertools.product(range(5), repeat=2):
        for f0, f1 in itertools.product(range(13), repeat=2):
            ms = table.predict_ms([h0, h1], [f0, f1])
            loss = (db.heads[0].errors[4 - h0] + db.heads[1].errors[4 - h1] + db.neurons[0].errors[12 - f0]
                    + db.neurons[1].errors[12 - f1])
            if ms <= target + 1e-9:
                best = min(best, loss)
            if ms <= target - margin:
                best_within_margin = min(best_within_margin, loss)
    assert plan["predicted_ms"] <= target + 1e-9
    assert best - 1e-12 <= plan["estimated_loss"] <= best_within_margin + 1e-12
    if speedup < 1.2:
        assert 4 in plan["layer_heads_planned"]  # where the budget allows, a layer keeps every head
