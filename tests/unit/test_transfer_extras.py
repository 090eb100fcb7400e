"""Teacher-only transfer examples for a recovery: what is added, how the loss reads them, and the
refusals of the flags that add them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compress.api.prune_stages import PruneConfig
from compress.core.errors import UsageError
from compress.distill.teacher_kd import TeacherLogitsLoss, teacher_logits_collate, teacher_training
from compress.distill.transfer import HAS_LABEL, teacher_only, transfer_extras
from compress.tasks.base import TextDataset

LABELS = ("neg", "pos")


@pytest.fixture(scope="module")
def classifier(tiny_bert):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.tiny_encoders import perturb_defaults

    torch.manual_seed(0)
    model = perturb_defaults(AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2))
    return model.eval(), AutoTokenizer.from_pretrained(tiny_bert)


def _ds(texts, labels):
    return TextDataset(list(texts), list(labels), LABELS)


def test_unlabeled_texts_keep_their_text_and_lose_their_gold_label():
    extras = transfer_extras(_ds(["a b", "c d"], [1, 1]), _ds(["e f", "g h", "i j"], [1, 0, 1]))
    assert extras.texts.texts == ["e f", "g h", "i j"]
    assert extras.texts.labels == [0, 0, 0]  # placeholders: the gold labels are never read
    assert extras.summary() == {"unlabeled": 3, "augmented": 0}
    assert transfer_extras(_ds(["a"], [1]), None) is None
    multi = teacher_only(TextDataset(["x"], [[0, 1]], LABELS, multilabel=True))
    assert multi.labels == [[]]


def test_the_task_term_reads_labelled_examples_only_and_the_kd_term_all(classifier):
    model = classifier[0]
    torch.manual_seed(0)
    ids = torch.randint(5, 90, (4, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor([1, 0, 0, 0]),
             "teacher_logits": torch.randn(4, 2), HAS_LABEL: torch.tensor([True, True, False, False])}
    loss, extra = TeacherLogitsLoss(False, kd_lambda=2.0, temperature=1.0)(model, batch)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits
    task = F.cross_entropy(logits[:2], batch["labels"][:2])  # the two labelled rows only
    kd = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(batch["teacher_logits"], -1),
                  reduction="batchmean", log_target=True)
    assert extra["task_loss"] == pytest.approx(float(task), rel=1e-5)
    assert float(loss) == pytest.approx(float(task + 2.0 * kd), rel=1e-5)


def test_collate_marks_teacher_only_rows(classifier):
    from compress.training.loop import make_collate

    collate = teacher_logits_collate(make_collate(classifier[1]))
    rows = [{"input_ids": [2, 7, 3], "labels": 1, "teacher_logits": [0.1, 0.2]},
            {"input_ids": [2, 8, 9, 3], "labels": 0, "teacher_logits": [0.3, 0.4], HAS_LABEL: False}]
    batch = collate(rows)
    assert batch[HAS_LABEL].tolist() == [True, False]
    assert batch["input_ids"].shape == (2, 4)
    assert HAS_LABEL not in collate(rows[:1])  # all labelled: the loss reads every row


def test_teacher_training_labels_the_extras_with_the_teacher(classifier, tmp_path):
    from types import SimpleNamespace

    from compress.distill.teacher import teacher_predict
    from compress.training.loop import encode

    teacher, tiny_tokenizer = classifier
    train = _ds(["good film", "bad film"], [1, 0])
    extras = transfer_extras(train, _ds(["fine acting", "dull plot", "long"], [1, 0, 1]))
    cfg = SimpleNamespace(kd_hidden=0.0, kd_layers=0.0, max_length=16, eval_batch_size=8, temperature=1.0,
                          lambda_for=lambda multilabel: 1.0)
    feats = encode(tiny_tokenizer, train, 16)
    run = SimpleNamespace(path=tmp_path)
    out = teacher_training(cfg, teacher, None, tiny_tokenizer, train, feats, False, run, extras)
    feats = out["feats"]
    assert len(feats) == 5 and [f.get(HAS_LABEL, True) for f in feats] == [True, True, False, False, False]
    expected = teacher_predict(teacher, tiny_tokenizer, ["fine acting", "dull plot", "long"], None, 16, 8)
    got = torch.tensor([f["teacher_logits"] for f in feats[2:]])
    assert torch.allclose(got, torch.as_tensor(expected, dtype=torch.float32), atol=1e-5)
    with pytest.raises(UsageError, match="need a teacher"):
        teacher_training(cfg, None, None, tiny_tokenizer, train, [], False, None, extras)


@pytest.mark.parametrize("flags, message", [
    ({"recovery_unlabeled": 10, "recovery_steps": 5, "train_limit": 20}, "post-training.*--teacher"),
    ({"recovery_augment": 1, "teacher": "self"}, "--recovery-steps N"),
    ({"recovery_unlabeled": 10, "recovery_steps": 5, "teacher": "self"}, "set --train-limit"),
    ({"recovery_augment": -1}, "--recovery-augment must be in"),
])
def test_teacher_only_examples_need_a_distilling_recovery(flags, message):
    with pytest.raises(UsageError, match=message):
        PruneConfig(stage="post-training", **flags)


@pytest.mark.parametrize("flags, named", [
    ({"kd_lambda": 2.0}, "--kd-lambda"),
    ({"kd_hidden": 1.0, "teacher": "self", "recovery_steps": 3}, "--kd-hidden"),
    ({"temperature": 2.0}, "--temperature"),
])
def test_logit_kd_flags_of_an_embedding_prune_name_the_real_fix(flags, named):
    with pytest.raises(UsageError, match=f"{named}: an embedding model has no logits.*drop {named}"):
        PruneConfig(stage="post-training", task="embedding", **flags)
    if "teacher" not in flags:  # a classification task asks for the teacher instead
        with pytest.raises(UsageError, match="applies with --teacher only"):
            PruneConfig(stage="post-training", task="sst2", **flags)
