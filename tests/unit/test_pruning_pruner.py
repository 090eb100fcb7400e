"""The stateful pruner: lifecycle, scopes on a real (tiny) BERT, masks kept under AdamW, integrity."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from compress.core.errors import IntegrityError
from compress.pruning.integrity import check_masks, load_masks, save_masks
from compress.pruning.pruner import (
    InformationDeletionHook,
    KeepMasksHook,
    PrunerStateError,
    PruningHook,
    ScheduledPruner,
    apply_masks,
)
from compress.pruning.schedules import GradualSchedule, OneShotSchedule
from compress.pruning.targets import select_targets
from compress.tasks.classification import load_sample
from compress.training.loop import TrainConfig, TrainHook, encode, train


def _model(seed=0, hidden=64, layers=2):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=500, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=4 * hidden, max_position_embeddings=64)
    return BertForSequenceClassification(cfg)


def _sparsities(pruner):
    return {n: float((~m).float().mean()) for n, m in pruner.masks.items()}


def test_lifecycle_order_is_enforced():
    m = _model()
    p = ScheduledPruner(select_targets(m), OneShotSchedule(0.4))
    with pytest.raises(PrunerStateError, match="before initialize"):
        p.apply_masks()
    with pytest.raises(PrunerStateError, match="step"):
        p.step(1)
    with pytest.raises(PrunerStateError, match="finalize"):
        p.finalize()
    p.initialize()
    with pytest.raises(PrunerStateError, match="twice"):
        p.initialize()
    p.step(1)
    p.finalize()
    with pytest.raises(PrunerStateError, match="step"):
        p.step(2)
    with pytest.raises(PrunerStateError, match="finalize"):
        p.finalize()


def test_local_scope_every_matrix_within_half_a_point():
    m = _model()
    p = ScheduledPruner(select_targets(m), OneShotSchedule(0.4))
    p.initialize()
    masks = p.finalize()
    for name, s in _sparsities(p).items():
        assert abs(s - 0.4) <= 0.005, name
        w = dict(m.named_parameters())["bert." + name]
        assert torch.equal(w == 0, ~masks[name])  # the zeros are exactly the mask
        # magnitude: every pruned weight was no larger than every kept one (now zero vs kept)
    assert len(masks) == 13


def test_global_scope_hits_target_overall_while_matrices_differ():
    m = _model()
    with torch.no_grad():  # trained matrices differ in scale; a random init does not
        m.bert.encoder.layer[1].intermediate.dense.weight.mul_(3.0)
    p = ScheduledPruner(select_targets(m), OneShotSchedule(0.4), scope="global")
    p.initialize()
    p.finalize()
    total = sum(x.numel() for x in p.masks.values())
    pruned = sum(int((~x).sum()) for x in p.masks.values())
    assert pruned == round(0.4 * total)
    s = _sparsities(p)
    assert max(s.values()) - min(s.values()) > 0.05  # one threshold, different sparsities
    assert min(s, key=s.get) == "encoder.layer.1.intermediate.dense.weight"


def test_random_criterion_same_sparsity_different_mask():
    mag = ScheduledPruner(select_targets(_model()), OneShotSchedule(0.4))
    rnd = ScheduledPruner(select_targets(_model()), OneShotSchedule(0.4), criterion="random", seed=3)
    for p in (mag, rnd):
        p.initialize()
        p.finalize()
    for n in mag.masks:
        assert int((~mag.masks[n]).sum()) == int((~rnd.masks[n]).sum())
        assert (mag.masks[n] == rnd.masks[n]).float().mean() < 0.7, n


def test_gradual_masks_are_nested_and_follow_the_schedule():
    m = _model()
    sched = GradualSchedule(0.5, span_steps=6, every=2)
    p = ScheduledPruner(select_targets(m), sched)
    p.initialize()
    prev = {n: x.clone() for n, x in p.masks.items()}
    for step in range(1, 9):
        with torch.no_grad():  # weights move between steps, as in training
            for w in p.params.values():
                w.add_(torch.randn_like(w) * 0.05)
        p.step(step)
        for n, x in p.masks.items():
            assert not (x & ~prev[n]).any()  # a pruned weight never comes back
        prev = {n: x.clone() for n, x in p.masks.items()}
    assert [h["step"] for h in p.history] == [0, 2, 4, 6]
    for h in p.history:
        assert abs(h["sparsity"] - sched.sparsity_at(h["step"])) < 1e-3


def test_finalize_reaches_target_when_training_stops_early():
    m = _model()
    p = ScheduledPruner(select_targets(m), GradualSchedule(0.4, span_steps=100, every=10))
    p.initialize()
    p.step(1)
    p.finalize()
    assert p.history[-1]["at_finalize"] and abs(p.history[-1]["sparsity"] - 0.4) < 1e-3


def test_initial_masks_stay_pruned():
    m = _model()
    targets = select_targets(m)
    name = "encoder.layer.0.attention.self.query.weight"
    init = {name: torch.ones_like(targets[name], dtype=torch.bool)}
    init[name][0, :] = False  # a row the magnitude criterion would not pick on its own
    with torch.no_grad():
        targets[name][0, :] = 10.0
    p = ScheduledPruner(targets, OneShotSchedule(0.2), initial_masks=init)
    p.initialize()
    assert not p.masks[name][0].any()
    assert (targets[name][0] == 0).all()


def test_check_masks_names_tensor_and_count():
    m = _model()
    p = ScheduledPruner(select_targets(m), OneShotSchedule(0.4))
    p.initialize()
    check_masks(m, p.masks)  # clean
    name = "encoder.layer.1.intermediate.dense.weight"
    w = p.params[name]
    idx = torch.nonzero(~p.masks[name])[:3]
    with torch.no_grad():
        for i, j in idx.tolist():
            w[i, j] = 1e-4
    with pytest.raises(IntegrityError, match=r"3 pruned weights are non-zero: "
                                             r"encoder\.layer\.1\.intermediate\.dense\.weight: 3 regrown"):
        check_masks(m, p.masks)


def test_hook_check_catches_a_replaced_parameter():
    # masks applied to a stale tensor leave the live module regrown: the per-step check sees it
    m = _model()
    p = ScheduledPruner(select_targets(m), OneShotSchedule(0.4))
    hook = PruningHook(p, m)
    hook.on_train_begin(m, 10)
    q = m.bert.encoder.layer[0].attention.self.query
    q.weight = torch.nn.Parameter(torch.ones_like(q.weight))
    with pytest.raises(IntegrityError, match="encoder.layer.0.attention.self.query.weight"):
        hook.on_step_end(m, 1)


def test_masks_roundtrip_safetensors(tmp_path):
    masks = {"a": torch.rand(3, 4) > 0.5, "b": torch.rand(5, 2) > 0.5}
    save_masks(masks, tmp_path / "m.safetensors")
    back = load_masks(tmp_path / "m.safetensors")
    assert back.keys() == masks.keys() and all(torch.equal(back[k], masks[k]) for k in masks)
    assert all(v.dtype == torch.bool for v in back.values())


def _train_with(hooks_for, tiny_bert, steps=12):
    from compress.models.loading import load_classifier

    model, tok, _ = load_classifier(str(tiny_bert), ("negative", "positive"))
    p = ScheduledPruner(select_targets(model), OneShotSchedule(0.5))
    p.initialize()
    masks = p.finalize()
    before = {n: w.detach().clone() for n, w in p.params.items()}
    cfg = TrainConfig(lr=5e-3, max_steps=steps, batch_size=8, max_length=32, weight_decay=0.1,
                      warmup_ratio=0.0)
    ds = load_sample(None, "train")
    train(model, AutoTokenizer.from_pretrained(tiny_bert), encode(tok, ds, 32), cfg, hooks_for(model, masks))
    return p.params, masks, before


def test_keep_masks_bit_identical_under_adamw_weight_decay(tiny_bert):
    params, masks, before = _train_with(lambda m, k: [KeepMasksHook(m, k, {})], tiny_bert)
    params = {n: w.detach().cpu() for n, w in params.items()}  # trained on the GPU when there is one
    for n, w in params.items():
        zero = w == 0
        assert torch.equal(zero, ~masks[n]), n  # exactly the masked entries are zero
        assert torch.equal(w.view(torch.int32)[~masks[n]],
                           torch.zeros(int((~masks[n]).sum()), dtype=torch.int32)), n  # +0.0 bits
    changed = sum(int((params[n] != before[n].cpu()).sum()) for n in params)
    assert changed > 0.4 * sum(int(m.sum()) for m in masks.values())  # training did move the rest


def test_information_deletion_lets_zeros_regrow(tiny_bert):
    params, masks, _ = _train_with(lambda m, k: [InformationDeletionHook(m, k, {})], tiny_bert)
    enc = [n for n in params if n.startswith("encoder.")]
    regrown = sum(int((params[n].detach()[~masks[n]] != 0).sum()) for n in enc)
    # every encoder weight gets a gradient, so nearly all zeros move (embeddings: only seen tokens)
    assert regrown > 0.9 * sum(int((~masks[n]).sum()) for n in enc)


def test_masks_follow_their_parameters_device():
    # Hooks build their masks before the trainer moves the model (to CUDA on a GPU machine); a
    # CPU mask against a CUDA weight fails in masked_fill_. "meta" stands in for the other device.
    w = torch.nn.Parameter(torch.randn(4, 4, device="meta"))
    masks = {"w": torch.rand(4, 4) > 0.5}
    pruned = {"w": ~masks["w"]}
    apply_masks({"w": w}, masks, pruned)
    assert masks["w"].device.type == "meta" and pruned["w"].device.type == "meta"
    cpu = {"w": torch.rand(4, 4) > 0.5}
    apply_masks({"w": w}, cpu)  # without the negated masks too
    assert cpu["w"].device.type == "meta"


def test_pruned_weights_get_no_gradient_before_clipping(tiny_bert):
    # Each hook sees the gradients between backward and the optimizer step: those of pruned weights
    # are zero there (they would otherwise count in the clipped norm), the others are untouched.
    seen = []

    class Probe(TrainHook):
        def __init__(self, params, masks):
            self.params, self.masks = params, masks

        def on_after_backward(self, model):
            grads = {n: p.grad.detach().clone() for n, p in self.params.items() if p.grad is not None}
            seen.append(sum(int(g[~self.masks[n]].count_nonzero()) for n, g in grads.items()))
            seen.append(sum(int(g[self.masks[n]].count_nonzero()) for n, g in grads.items()))

    def hooks(model, masks):
        keep = KeepMasksHook(model, masks, {})
        return [keep, Probe(keep.params, masks)]  # the probe runs after the pruning hook

    _train_with(hooks, tiny_bert, steps=3)
    pruned_nonzero, kept_nonzero = seen[0::2], seen[1::2]
    assert pruned_nonzero == [0, 0, 0] and all(k > 1000 for k in kept_nonzero)

    p = ScheduledPruner({"w": torch.nn.Parameter(torch.tensor([[1.0, -3.0], [0.5, 2.0]]))},
                        OneShotSchedule(0.5))
    with pytest.raises(PrunerStateError):
        p.mask_grads()
    p.initialize()
    p.params["w"].grad = torch.ones(2, 2)
    p.mask_grads()
    assert p.params["w"].grad.tolist() == [[0.0, 1.0], [0.0, 1.0]]  # 1.0 and 0.5 were pruned
