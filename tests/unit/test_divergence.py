"""The finite-loss guard: the first NaN or infinite loss of a training loop stops it with
TrainingDivergedError naming the step and the likely cause, before the loss reaches the weights."""

from __future__ import annotations

import pytest
import torch

import compress.distill.train as distill_train
import compress.training.loop as T
from compress.core.errors import TrainingDivergedError
from compress.tasks import TASKS, DataOptions
from compress.training.loop import TrainConfig, TrainHook, checkpoint_dirs, train

CFG = dict(lr=1e-3, max_steps=6, batch_size=8, max_length=24, log_every=1, warmup_ratio=0.0, seed=5)


def _model():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=2))


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from compress.models.loading import packaged_model_path

    return AutoTokenizer.from_pretrained(packaged_model_path("minilm"))


@pytest.fixture(scope="module")
def feats(tok):
    return T.encode(tok, TASKS["sample"].load(DataOptions(), "train").subset(40), 24)


class PoisonAt(TrainHook):
    """Replaces the loss of step ``at`` (1-based) with ``value``; records the weights before it."""

    def __init__(self, at: int, value: float):
        self.at, self.value, self.calls, self.before = at, value, 0, None

    def compute_loss(self, model, batch, outputs):
        self.calls += 1
        if self.calls == self.at:
            self.before = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return outputs.loss * self.value
        return None


@pytest.mark.parametrize("value, shown", [(float("nan"), "nan"), (float("inf"), "inf")])
def test_train_stops_at_the_first_non_finite_loss_naming_step_and_lr(tok, feats, tmp_path, value, shown):
    model, hook, logs = _model(), PoisonAt(4, value), []
    cfg = TrainConfig(**CFG, checkpoint_every=2)
    with pytest.raises(TrainingDivergedError) as err:
        train(model, tok, feats, cfg, [hook], log=logs.append, checkpoint_dir=tmp_path / "c")
    msg = str(err.value)
    assert "\n" not in msg and f"the loss is {shown} at step 4" in msg and "--lr 0.001" in msg
    assert "--temperature" not in msg
    assert [r["step"] for r in logs] == [1, 2, 3]  # nothing logged for the diverged step
    # the diverged step never reached the weights, and no checkpoint was written after it
    after = model.state_dict()
    assert all(torch.equal(after[k], hook.before[k]) for k in after)
    assert [p.name for p in checkpoint_dirs(tmp_path / "c")] == ["step-00000002"]

    # resuming from the last good checkpoint (the poison gone) finishes the run
    out = train(_model(), tok, feats, cfg, [PoisonAt(0, value)], checkpoint_dir=tmp_path / "c", resume=True)
    assert out["resumed_from"] == 2 and out["steps"] == 6


class KDLoss:
    """A loss plug-in with a teacher's KD values, as TeacherLogitsLoss has; NaN at its 2nd call."""

    temperature, kd_lambda = 3.0, 250.0

    def __init__(self):
        self.calls = 0

    def __call__(self, model, batch):
        self.calls += 1
        loss = model(**batch).loss
        return (loss * float("nan") if self.calls == 2 else loss), {}


def test_train_with_a_kd_loss_blames_temperature_and_kd_lambda(tok, feats):
    with pytest.raises(TrainingDivergedError, match=r"step 2; .*--temperature 3 and --kd-lambda 250"):
        train(_model(), tok, feats, TrainConfig(**CFG), loss_fn=KDLoss())


def _student():
    from students.registry import build_student, student_config

    torch.manual_seed(0)
    return build_student("kimcnn", student_config("kimcnn", {"num_labels": 2, "embed_dim": 4,
                                                              "num_filters": 2}), 20)


@pytest.mark.parametrize("use_teacher, cause", [(True, "--temperature 2 and --kd-lambda 4"),
                                                (False, "the learning rate --lr 0.05")])
def test_student_loop_stops_at_the_first_non_finite_loss(monkeypatch, tmp_path, use_teacher, cause):
    real, calls = distill_train.distillation_loss, []

    def poisoned(*args, **kwargs):
        parts = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 6:  # the second batch of epoch 2 (4 batches an epoch)
            parts["loss"] = parts["loss"] * float("nan")
        return parts

    monkeypatch.setattr(distill_train, "distillation_loss", poisoned)
    examples = [{"input_ids": [1, 3 + i % 7, 4, 2], "label": i % 2, "teacher": [0.5, -0.5]}
                for i in range(16)]
    model, ckpt = _student(), tmp_path / "student.pt"
    cfg = distill_train.StudentTrainConfig(lr=0.05, epochs=3, batch_size=4, temperature=2.0, kd_lambda=4.0)
    with pytest.raises(TrainingDivergedError, match=f"step 6; .*{cause}"):
        distill_train.train_student(model, examples, cfg, 0, use_teacher=use_teacher, checkpoint=ckpt)
    assert torch.load(ckpt, weights_only=True)["epoch"] == 1  # the good epoch's checkpoint stays
    assert all(torch.isfinite(v).all() for v in model.state_dict().values() if v.is_floating_point())
