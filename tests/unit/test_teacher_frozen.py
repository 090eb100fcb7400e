"""A teacher teaches with dropout off and learns nothing, on every path that runs one: ``prune
--teacher`` / ``finetune --teacher`` (``load_teacher``), the per-step teacher of ``--kd-hidden``
and of extractive QA, the ``transformers.Trainer`` integration (``DistillationTrainer``), and the
Python API's ``compress.kd_loss``, whose teacher logits must carry no gradient back.

Each teacher here is handed over in train mode with dropout 0.5, so one left in train mode gives
two different answers to the same batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import compress

LABELS = ("negative", "positive")


def _classifier(seed: int, dropout: float = 0.5, num_labels: int = 2):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                     num_labels=num_labels)
    return BertForSequenceClassification(cfg)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 60, (4, 9), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([0, 1, 1, 0])}


def _teaches_in_eval_mode(teacher: torch.nn.Module) -> None:
    training = [n or "(the model)" for n, m in teacher.named_modules() if m.training]
    assert not training, f"teacher modules left in train mode (dropout on): {training[:5]}"
    assert all(not p.requires_grad for p in teacher.parameters())
    inputs = {k: v for k, v in _batch().items() if k != "labels"}
    with torch.no_grad():
        assert torch.equal(teacher(**inputs).logits, teacher(**inputs).logits)  # no dropout noise


def test_load_teacher_self_is_an_eval_mode_copy_of_the_dense_model_in_training():
    from compress.distill.teacher_kd import load_teacher

    dense = _classifier(0).train()  # prune after-finetune: the dense phase's model, still training
    teacher, folder = load_teacher(SimpleNamespace(teacher="self", model="unused"), LABELS, None, False,
                                   dense=dense)
    assert folder is None and teacher is not dense
    _teaches_in_eval_mode(teacher)
    assert dense.training and all(p.requires_grad for p in dense.parameters())  # the student is untouched


def test_load_teacher_from_a_folder_is_in_eval_mode_whatever_the_loader_hands_back(monkeypatch):
    import compress.models.loading
    from compress.distill import teacher_kd

    loaded = _classifier(1).train()
    monkeypatch.setattr(compress.models.loading, "load_classifier",
                        lambda spec, labels, **kw: (loaded, None, {"label_names": list(labels)}))
    monkeypatch.setattr(compress.models.loading, "resolve_model", lambda spec: f"/models/{spec}")
    monkeypatch.setattr(teacher_kd, "check_teacher_fits", lambda *a, **kw: None)
    teacher, folder = teacher_kd.load_teacher(SimpleNamespace(teacher="big", model="small"), LABELS, None,
                                              False)
    assert teacher is loaded and folder == "/models/big"
    _teaches_in_eval_mode(teacher)


def test_per_step_teachers_of_the_kd_losses_run_in_eval_mode():
    from compress.distill.teacher_kd import SpanDistillation, TeacherLogitsLoss

    teacher = _classifier(2).train()
    fn = TeacherLogitsLoss(False, 1.0, 2.0, hidden_weight=1.0, teacher=teacher)
    student = _classifier(3, dropout=0.0)
    assert float(fn(student, _batch())[0]) == float(fn(student, _batch())[0])
    _teaches_in_eval_mode(teacher)

    teacher = _classifier(4).train()
    SpanDistillation(teacher, 1.0, 2.0)
    _teaches_in_eval_mode(teacher)


def test_distillation_trainer_teaches_in_eval_mode(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, disable_tqdm=True)
    student = _classifier(5, dropout=0.0).eval()
    trainer = compress.DistillationTrainer(model=student, teacher=_classifier(6).train(), args=args)
    _teaches_in_eval_mode(trainer.teacher)
    first, second = (trainer.compute_loss(student, _batch()) for _ in range(2))
    assert torch.equal(first, second)


@pytest.mark.parametrize("kind, multilabel", [("kl", False), ("kl", True), ("mse", False)])
def test_kd_loss_sends_no_gradient_into_the_teacher(kind, multilabel):
    teacher = _classifier(7, dropout=0.0).eval()
    batch = _batch()
    labels = batch.pop("labels")
    labels = torch.nn.functional.one_hot(labels, 2).float() if multilabel else labels
    teacher_logits = teacher(**batch).logits  # computed with gradients on, as a careless loop would
    student_logits = torch.randn(4, 2, requires_grad=True)
    out = compress.kd_loss(student_logits, teacher_logits, labels, kind=kind, multilabel=multilabel)
    out["loss"].backward()
    assert student_logits.grad is not None and student_logits.grad.abs().sum() > 0
    got = [n for n, p in teacher.named_parameters() if p.grad is not None]
    assert not got, f"kd_loss sent gradients into the teacher: {got[:3]}"
