"""The training loop and its checkpoints, in process, on a tiny BERT classifier."""

from __future__ import annotations

import errno
import io
import random
import shutil

import numpy as np
import pytest
import torch

import compress.training.loop as T
from compress.core.errors import CompressError, IntegrityError, UsageError
from compress.tasks import TASKS, DataOptions
from compress.training.loop import (
    TrainConfig,
    TrainHook,
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint,
    rank_batches,
    save_checkpoint,
    steps_per_epoch,
    train,
)


def _model(seed: int = 0, dropout: float = 0.1):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, num_labels=2, hidden_dropout_prob=dropout,
                     attention_probs_dropout_prob=dropout)
    return BertForSequenceClassification(cfg)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from compress.models.loading import packaged_model_path

    return AutoTokenizer.from_pretrained(packaged_model_path("minilm"))


@pytest.fixture(scope="module")
def feats(tok):
    ds = TASKS["sample"].load(DataOptions(), "train").subset(40)
    return T.encode(tok, ds, 24)


class CountingMaskHook(TrainHook):
    """Zeroes the classifier's smallest weights; its state (mask + a counter) must survive resume."""

    def __init__(self):
        self.mask = None
        self.calls = 0

    def on_train_begin(self, model, total_steps):
        if self.mask is None:
            w = model.classifier.weight
            self.mask = w.abs() > w.abs().median()

    def on_step_end(self, model, step):
        self.calls += 1
        w = model.classifier.weight
        self.mask = self.mask.to(w.device)  # a resumed state is loaded on the CPU
        with torch.no_grad():
            w.mul_(self.mask)

    def state_dict(self):
        return {"mask": self.mask.clone(), "calls": self.calls}

    def load_state_dict(self, state):
        self.mask, self.calls = state["mask"].clone(), state["calls"]


CFG = dict(lr=1e-3, max_steps=9, batch_size=8, max_length=24, log_every=2, warmup_ratio=0.3, seed=5)


def _params(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor)}


# ---------------------------------------------------------------------------------------------------
# batching


@pytest.mark.parametrize("n, bs, world", [(40, 8, 1), (41, 8, 2), (9, 4, 2), (7, 3, 3), (1, 5, 2)])
def test_rank_batches_equal_counts_and_cover_the_epoch(n, bs, world):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
    per = [rank_batches(order, bs, r, world) for r in range(world)]
    expected = steps_per_epoch(n, bs, world)
    assert all(len(p) == expected for p in per)  # no rank runs out of batches before another
    assert all(b for p in per for b in p)  # and none gets an empty one
    seen = {i for p in per for b in p for i in b}
    assert seen == set(range(n))
    if world == 1:
        assert per[0] == [order[i:i + bs] for i in range(0, n, bs)]


def test_rank_batches_of_two_ranks_union_to_the_single_process_batch():
    order = list(range(32))
    one = rank_batches(order, 8, 0, 1)
    two = [rank_batches(order, 4, r, 2) for r in range(2)]
    for b in range(4):
        assert sorted(two[0][b] + two[1][b]) == sorted(one[b])


# ---------------------------------------------------------------------------------------------------
# determinism and resume


def test_same_seed_same_losses_and_weights_different_seed_differs(tok, feats):
    runs = []
    for seed in (5, 5, 6):
        model, logs = _model(), []
        train(model, tok, feats, TrainConfig(**{**CFG, "seed": seed}), [CountingMaskHook()], log=logs.append)
        runs.append((logs, _params(model)))
    (l1, p1), (l2, p2), (l3, p3) = runs
    assert l1 == l2 and all(torch.equal(p1[k], p2[k]) for k in p1)
    assert l1 != l3  # the seed drives data order and dropout


def test_resume_from_checkpoint_replays_dropout_scheduler_and_hook_state(tok, feats, tmp_path):
    # uninterrupted, checkpointing every 3 steps (so the loss window of log_every=2 is split)
    ref_model, ref_logs, ref_hook = _model(), [], CountingMaskHook()
    cfg = TrainConfig(**CFG, checkpoint_every=3)
    train(ref_model, tok, feats, cfg, [ref_hook], log=ref_logs.append, checkpoint_dir=tmp_path / "a")
    assert [p.name for p in checkpoint_dirs(tmp_path / "a")] == ["step-00000003", "step-00000006"]

    # a fresh process would start from a different model and RNG; resuming must not care
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)
    model, logs, hook = _model(seed=123), [], CountingMaskHook()
    out = train(model, tok, feats, cfg, [hook], log=logs.append, checkpoint_dir=tmp_path / "a", resume=True)
    assert out["resumed_from"] == 6 and out["steps"] == 9
    assert logs == [r for r in ref_logs if r["step"] > 6]  # losses (incl. the split window) and lr
    assert hook.calls == ref_hook.calls == 9 and torch.equal(hook.mask, ref_hook.mask)
    p, q = _params(model), _params(ref_model)
    assert all(torch.equal(p[k], q[k]) for k in p)


def test_rng_state_round_trip_including_numpy_gauss_cache(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    np.random.seed(1)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    random.seed(2)
    torch.manual_seed(3)
    save_checkpoint(tmp_path, model, opt, sched, [], 1)
    want = (torch.rand(3), np.random.standard_normal(3), random.random())
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    load_checkpoint(tmp_path, model, opt, sched, [])
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


# ---------------------------------------------------------------------------------------------------
# plug-ins: collate, loss_fn, extra modules, hook_module (how squad and reqa use the same loop)


class ScaledLoss(torch.nn.Module):
    """A loss plug-in with a trainable layer of its own and a counter kept in its extra state."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Linear(2, 2)
        self.frozen = torch.nn.Linear(2, 2)  # not handed to the loop's optimizer
        self.calls = 0

    def trainable_parameters(self):
        return list(self.scale.parameters())

    def get_extra_state(self):
        return {"calls": self.calls}

    def set_extra_state(self, state):
        self.calls = state["calls"]

    def loss(self, model, batch):
        self.calls += 1
        logits = self.scale(model(input_ids=batch["ids"], attention_mask=batch["mask"]).logits)
        return torch.nn.functional.cross_entropy(logits, batch["y"]), {"calls": float(self.calls)}


def _rows_collate(tok):
    """A collate of its own: other key names than the model's, which only the loss plug-in knows."""
    def collate(rows):
        batch = tok.pad([{"input_ids": r["input_ids"]} for r in rows], return_tensors="pt")
        return {"ids": batch["input_ids"], "mask": batch["attention_mask"],
                "y": torch.tensor([r["labels"] for r in rows])}
    return collate


class SeesHook(TrainHook):
    def __init__(self):
        self.seen = []

    def on_train_begin(self, model, total_steps):
        self.seen.append(type(model).__name__)

    def on_step_end(self, model, step):
        self.seen.append(type(model).__name__)


def _plugged(tok, feats, cfg, folder=None, resume=False, model=None, obj=None):
    model, obj, logs, hook = model or _model(), obj or ScaledLoss(), [], SeesHook()
    out = train(model, tok, feats, cfg, [hook], log=logs.append, checkpoint_dir=folder, resume=resume,
                collate=_rows_collate(tok), loss_fn=obj.loss, extra_modules=[obj],
                hook_module=lambda m: m.bert)
    return out, model, obj, logs, hook


def test_loss_plugin_trains_its_own_layer_logs_its_extras_and_hooks_see_the_selected_module(tok, feats):
    cfg = TrainConfig(**CFG)
    obj = ScaledLoss()
    init = _params(obj)
    out, model, obj, logs, hook = _plugged(tok, feats, cfg, obj=obj)
    assert out["steps"] == 9 and obj.calls == 9 and obj.training
    # its trainable layer moved, the layer it keeps out of trainable_parameters() did not
    now = _params(obj)
    assert not torch.equal(now["scale.weight"], init["scale.weight"])
    assert torch.equal(now["frozen.weight"], init["frozen.weight"])
    assert torch.equal(now["frozen.bias"], init["frozen.bias"])
    # extras are logged as means over the log window, like the loss: calls (1, 2) -> 1.5, ...
    assert [r["step"] for r in logs] == [2, 4, 6, 8] and [r["calls"] for r in logs] == [1.5, 3.5, 5.5, 7.5]
    assert set(logs[0]) == {"step", "loss", "lr", "calls"}
    assert hook.seen == ["BertModel"] * 10  # on_train_begin + 9 steps, given model.bert


def test_loss_plugin_resume_restores_the_extra_module_and_equals_uninterrupted(tok, feats, tmp_path):
    cfg = TrainConfig(**CFG, checkpoint_every=3)
    torch.manual_seed(0)
    _, ref_model, ref_obj, ref_logs, _ = _plugged(tok, feats, cfg, tmp_path / "a")
    state = torch.load(tmp_path / "a" / "step-00000006" / "state.pt", weights_only=True)
    assert state["extra_modules"][0]["_extra_state"] == {"calls": 6}
    # a different start: the model, the plug-in's layer and the global RNGs
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)
    out, model, obj, logs, _ = _plugged(tok, feats, cfg, tmp_path / "a", resume=True, model=_model(seed=3))
    assert out["resumed_from"] == 6 and obj.calls == ref_obj.calls == 9
    assert logs == [r for r in ref_logs if r["step"] > 6]
    for a, b in ((model, ref_model), (obj, ref_obj)):
        p, q = _params(a), _params(b)
        assert all(torch.equal(p[k], q[k]) for k in p)


def test_resume_inside_a_log_window_logs_the_same_extra_means(tok, feats, tmp_path):
    """A checkpoint at step 3 lies inside the log window 3-4: the partial sums of the loss and of the
    extras travel with it, so the resumed run logs what the uninterrupted one logged."""
    cfg = TrainConfig(**CFG, checkpoint_every=3)
    torch.manual_seed(0)
    _, _, _, ref_logs, _ = _plugged(tok, feats, cfg, tmp_path / "a")
    shutil.rmtree(tmp_path / "a" / "step-00000006")
    state = torch.load(tmp_path / "a" / "step-00000003" / "state.pt", weights_only=True)
    assert state["loop"]["running_extra"] == {"calls": 3.0}  # step 3 of the window 3-4
    out, _, _, logs, _ = _plugged(tok, feats, cfg, tmp_path / "a", resume=True, model=_model(seed=3))
    assert out["resumed_from"] == 3
    assert logs == [r for r in ref_logs if r["step"] > 3] and logs[0]["calls"] == 3.5


def test_default_checkpoint_has_no_extra_module_entry_and_a_mismatch_is_one_line(tok, feats, tmp_path):
    cfg = TrainConfig(**{**CFG, "max_steps": 4}, checkpoint_every=3)
    train(_model(), tok, feats, cfg, [], checkpoint_dir=tmp_path)
    state = torch.load(tmp_path / "step-00000003" / "state.pt", weights_only=True)
    assert set(state) == {"step", "loop", "model", "optimizer", "scheduler", "rng", "hooks"}
    with pytest.raises(CompressError, match="state of 0 extra module"):
        _plugged(tok, feats, cfg, tmp_path, resume=True)


def test_a_hook_that_replaces_the_loss_is_refused_beside_a_loss_plugin(tok, feats):
    class Replaces(TrainHook):
        def compute_loss(self, model, batch, outputs):
            return outputs.loss * 2

    with pytest.raises(ValueError, match="Replaces replace the loss"):
        train(_model(), tok, feats, TrainConfig(**CFG), [Replaces()], loss_fn=ScaledLoss().loss)


# ---------------------------------------------------------------------------------------------------
# atomic, verified checkpoints


def _save(folder, step, model=None):
    model = model or _model()
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return save_checkpoint(folder, model, opt, sched, [], step), (model, opt, sched)


@pytest.mark.parametrize("fault", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_interrupted_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch, fault):
    _save(tmp_path, 2)
    before = (tmp_path / "step-00000002" / "state.pt").read_bytes()
    real = torch.save

    def half_then_fail(obj, f, *a, **k):
        buf = io.BytesIO()
        real(obj, buf, *a, **k)
        f.write(buf.getvalue()[:1000])  # some bytes reached the disk
        raise fault

    monkeypatch.setattr(T.torch, "save", half_then_fail)
    with pytest.raises(type(fault)):
        _save(tmp_path, 4)
    monkeypatch.setattr(T.torch, "save", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002"]  # no partial folder left
    assert (tmp_path / "step-00000002" / "state.pt").read_bytes() == before
    assert latest_checkpoint(tmp_path).name == "step-00000002"


def test_keeps_the_last_two_and_falls_back_when_the_newest_is_corrupt(tmp_path, caplog):
    model = _model()
    for s in (2, 4, 6):
        _, (m, opt, sched) = _save(tmp_path, s, model)
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step-00000004", "step-00000006"]
    newest = tmp_path / "step-00000006" / "state.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    newest.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="compress.core.checkpoints"):
        assert latest_checkpoint(tmp_path).name == "step-00000004"
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint step-00000006 does not match its SHA-256; resuming from step-00000004 instead"]
    assert load_checkpoint(tmp_path, m, opt, sched, [])["step"] == 4
    older = tmp_path / "step-00000004" / "state.pt"
    older.write_bytes(older.read_bytes()[:100])  # truncated
    caplog.clear()
    with caplog.at_level("WARNING", logger="compress.core.checkpoints"):
        with pytest.raises(IntegrityError, match="every checkpoint .* is corrupt"):
            latest_checkpoint(tmp_path)
    assert caplog.records == []  # the error's one line says it all: no warning before it


def test_checkpoint_of_another_shape_or_hook_count_is_one_line_error(tmp_path):
    _save(tmp_path, 1)
    big = _model()
    big.classifier = torch.nn.Linear(16, 3)
    opt = torch.optim.AdamW(big.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(CompressError, match="does not fit this model") as e:
        load_checkpoint(tmp_path, big, opt, sched, [])
    assert "\n" not in str(e.value)
    m = _model()
    opt = torch.optim.AdamW(m.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(CompressError, match="state of 0 hook"):
        load_checkpoint(tmp_path, m, opt, sched, [CountingMaskHook()])


def test_no_checkpoint_at_the_last_step_and_resume_without_one_starts_at_zero(tok, feats, tmp_path):
    cfg = TrainConfig(**{**CFG, "max_steps": 6}, checkpoint_every=3)
    out = train(_model(), tok, feats, cfg, [], checkpoint_dir=tmp_path / "c", resume=True)
    assert out["resumed_from"] is None and out["steps"] == 6
    assert [p.name for p in checkpoint_dirs(tmp_path / "c")] == ["step-00000003"]


@pytest.mark.parametrize("field, value", [("lr", float("nan")), ("lr", float("inf")), ("seed", -1),
                                          ("log_every", 0), ("checkpoint_every", -2),
                                          ("rank_check_every", -1), ("eval_batch_size", 0)])
def test_train_config_refuses(field, value):
    with pytest.raises(UsageError, match=f"--{field.replace('_', '-')}"):
        TrainConfig(**{field: value})


def test_param_groups_put_the_head_at_its_own_lr_and_skip_decay_on_vectors():
    import torch

    from compress.training.loop import TrainConfig, param_groups

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Linear(3, 3)
            self.classifier = torch.nn.Linear(3, 2)

    m = M()
    groups = param_groups(m, TrainConfig(lr=1e-4, head_lr=2e-3, weight_decay=0.01))
    by_id = {id(p): g for g in groups for p in g["params"]}
    assert by_id[id(m.classifier.weight)]["lr"] == 2e-3
    assert by_id[id(m.classifier.weight)]["weight_decay"] == 0.01
    assert by_id[id(m.classifier.bias)]["lr"] == 2e-3 and by_id[id(m.classifier.bias)]["weight_decay"] == 0
    assert "lr" not in by_id[id(m.encoder.weight)] and by_id[id(m.encoder.bias)]["weight_decay"] == 0
    assert sum(len(g["params"]) for g in groups) == 4
    # without head_lr every parameter takes the optimizer's lr
    assert all("lr" not in g for g in param_groups(m, TrainConfig(lr=1e-4)))


def test_multilabel_head_bias_starts_at_the_label_prior():
    import math

    import torch

    from compress.tasks.base import TextDataset
    from compress.training.classifier import init_bias_to_prior

    ds = TextDataset(["a", "b", "c", "d"], [[0], [0, 1], [0], [2]], ("x", "y", "z"), multilabel=True)
    head = torch.nn.Linear(4, 3)
    init_bias_to_prior(head, ds)
    # label counts 3, 1, 1 of 4 documents; p = (count + 0.5) / 5
    want = [math.log(p / (1 - p)) for p in (3.5 / 5, 1.5 / 5, 1.5 / 5)]
    assert head.bias.tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert", "electra", "albert", "deberta-v2",
                                  "modernbert"])
def test_head_lr_and_label_prior_reach_every_architectures_head(arch):
    """The head is every parameter not under the encoder's prefix (``roberta.``, ``model.``...):
    RoBERTa's classifier.dense + out_proj, DistilBERT's pre_classifier, ModernBERT's head; the
    multi-label prior goes into the Linear that makes the logits."""
    from transformers import AutoModelForSequenceClassification

    from compress.tasks.base import TextDataset
    from compress.training.classifier import classifier_output_layer, init_bias_to_prior, label_prior_logits
    from compress.training.loop import TrainConfig, param_groups
    from tests.tiny_encoders import build

    cfg = build(arch)[0]
    cfg.num_labels = 3
    model = AutoModelForSequenceClassification.from_config(cfg)
    prefix = model.base_model_prefix + "."
    head_names = {n for n, _ in model.named_parameters() if not n.startswith(prefix)}
    assert head_names and {n.split(".")[0] for n in head_names} <= {"classifier", "pre_classifier", "head",
                                                                    "pooler"}
    groups = param_groups(model, TrainConfig(lr=1e-4, head_lr=2e-3))
    lr_of = {id(p): g.get("lr") for g in groups for p in g["params"]}
    assert {n for n, p in model.named_parameters() if lr_of[id(p)] == 2e-3} == head_names

    ds = TextDataset(texts=["a", "b", "c", "d"], labels=[[0], [0, 1], [], [0]], label_names=("x", "y", "z"),
                     multilabel=True)
    out = classifier_output_layer(model)
    assert out.out_features == 3
    init_bias_to_prior(out, ds)
    torch.testing.assert_close(out.bias.detach(), label_prior_logits(ds))
