"""Student model selection: the held-out split and the best-epoch rule of ``train_student``."""

from __future__ import annotations

import pytest
import torch

from compress.core.errors import UsageError
from compress.distill.train import StudentTrainConfig, train_student
from compress.recipes.distill import hold_out
from compress.tasks.base import TextDataset
from students.registry import build_student, student_config


def _ds(n, pairs=False):
    return TextDataset([f"t{i}" for i in range(n)], [i % 2 for i in range(n)], ("a", "b"),
                       [f"p{i}" for i in range(n)] if pairs else None)


def test_hold_out_is_a_seeded_disjoint_split_that_keeps_order():
    ds = _ds(40, pairs=True)
    train, val = hold_out(ds, 0.25, seed=7)
    assert len(val) == 10 and len(train) == 30
    assert sorted(train.texts + val.texts, key=lambda t: int(t[1:])) == ds.texts
    assert not set(train.texts) & set(val.texts)
    for part in (train, val):  # original order, pairs and labels travel with their text
        idx = [int(t[1:]) for t in part.texts]
        assert idx == sorted(idx)
        assert part.pairs == [f"p{i}" for i in idx] and part.labels == [i % 2 for i in idx]
    assert hold_out(ds, 0.25, seed=7)[1].texts == val.texts  # same seed, same split
    assert hold_out(ds, 0.25, seed=8)[1].texts != val.texts
    assert hold_out(ds, 0.0, seed=7) == (ds, None)
    assert len(hold_out(_ds(3), 0.01, seed=0)[1]) == 1  # at least one example
    with pytest.raises(UsageError, match="--val-fraction 0.4 leaves no training examples"):
        hold_out(_ds(1), 0.4, seed=0)


def _student():
    cfg = student_config("kimcnn", {"num_labels": 2, "embed_dim": 4, "num_filters": 2})
    torch.manual_seed(0)
    return build_student("kimcnn", cfg, 20)


@pytest.mark.parametrize("scores, selected", [([0.5, 0.9, 0.7], 2), ([0.6, 0.6, 0.5], 1),
                                              ([0.1, 0.2, 0.3], 3)])
def test_best_epoch_weights_are_kept(scores, selected, tmp_path):
    examples = [{"input_ids": [1, 3 + i % 7, 4, 2], "label": i % 2, "teacher": None} for i in range(16)]
    model = _student()
    after_epoch, calls = [], iter(scores)

    def epoch_end(epoch):  # runs after validate; records the weights each epoch ended with
        after_epoch.append({k: v.clone() for k, v in model.state_dict().items()})
        return {}

    out = train_student(model, examples, StudentTrainConfig(lr=0.05, epochs=3, batch_size=4), 0,
                        use_teacher=False, epoch_end=epoch_end, validate=lambda: next(calls))
    assert out["val_scores"] == scores and out["selected_epoch"] == selected
    final = model.state_dict()
    for epoch, state in enumerate(after_epoch, start=1):
        same = all(torch.equal(final[k], state[k]) for k in final)
        assert same == (epoch == selected), epoch  # the weights differ from epoch to epoch


def test_best_epoch_survives_a_resume(tmp_path):
    """A run stopped after epoch 2 (of 3) and resumed still ends on epoch 1's weights."""
    examples = [{"input_ids": [1, 3 + i % 7, 4, 2], "label": i % 2, "teacher": None} for i in range(16)]
    ckpt = tmp_path / "student.pt"
    first = _student()
    states = []

    def record(epoch):
        states.append({k: v.clone() for k, v in first.state_dict().items()})
        return {}

    train_student(first, examples, StudentTrainConfig(lr=0.05, epochs=2, batch_size=4), 0,
                  use_teacher=False, validate=iter([0.9, 0.1]).__next__, checkpoint=ckpt,
                  epoch_end=record)
    resumed = _student()
    out = train_student(resumed, examples, StudentTrainConfig(lr=0.05, epochs=3, batch_size=4), 0,
                        use_teacher=False, validate=iter([0.2]).__next__, checkpoint=ckpt)
    assert out["val_scores"] == [0.9, 0.1, 0.2] and out["selected_epoch"] == 1
    assert all(torch.equal(resumed.state_dict()[k], states[0][k]) for k in states[0])


def test_lr_factor_by_hand():
    from compress.distill.train import lr_factor

    assert [lr_factor("linear", s, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert [lr_factor("constant", s, 4) for s in range(4)] == [1.0] * 4
    with pytest.raises(UsageError, match="unknown lr schedule 'cosine'; choose one of: constant, linear"):
        StudentTrainConfig(lr_schedule="cosine")


def test_linear_schedule_sets_each_steps_lr_and_resumes_identically(tmp_path):
    """10 examples, batch 4: 3 steps per epoch, 6 in all; the lr seen at each step decays
    1, 5/6, ..., 1/6 of the base, and a run resumed after epoch 1 ends with the same weights."""
    examples = [{"input_ids": [1, 3 + i % 7, 4, 2], "label": i % 2, "teacher": None} for i in range(10)]
    cfg = StudentTrainConfig(lr=0.06, epochs=2, batch_size=4, lr_schedule="linear")
    model, seen = _student(), []
    real_step = torch.optim.Adam.step

    def spy(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **k)

    torch.optim.Adam.step = spy
    try:
        train_student(model, examples, cfg, 0, use_teacher=False)
    finally:
        torch.optim.Adam.step = real_step
    assert seen == pytest.approx([0.06 * (6 - s) / 6 for s in range(6)])

    # epoch_end(2) runs before epoch 2's checkpoint is written: the file then holds epoch 1
    import shutil

    ckpt, after_one = tmp_path / "student.pt", tmp_path / "after_one.pt"
    full = _student()
    train_student(full, examples, cfg, 0, use_teacher=False, checkpoint=ckpt,
                  epoch_end=lambda e: shutil.copyfile(ckpt, after_one) and {} if e == 2 else {})
    resumed = _student()
    train_student(resumed, examples, cfg, 0, use_teacher=False, checkpoint=after_one)
    assert all(torch.equal(resumed.state_dict()[k], v) for k, v in full.state_dict().items())
    assert all(torch.equal(full.state_dict()[k], v) for k, v in model.state_dict().items())
