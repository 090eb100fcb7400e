"""Teacher logits are computed once per (teacher, texts) and reused: counted forward calls."""

from __future__ import annotations

import json

import numpy as np
import pytest

from compress.core.errors import UsageError
from compress.distill.teacher import cached_logits, read_cache, teacher_fingerprint, transfer_key
from compress.recipes import distill as workflow


def test_cached_logits_computes_once_per_key(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(3, 2)

    path = tmp_path / "t.safetensors"
    k1 = transfer_key("fp", ["a", "b", "c"], None, 64)
    a, where_a = cached_logits(path, k1, compute)
    b, where_b = cached_logits(path, k1, compute)
    assert (where_a, where_b) == ("computed", "cache") and len(calls) == 1
    assert np.array_equal(a, b)
    assert read_cache(path)[0] == k1
    # any change of teacher, text, pair or length gives another key, so a recomputation
    abc = ["a", "b", "c"]
    keys = {k1, transfer_key("fp2", abc, None, 64), transfer_key("fp", ["a", "b", "d"], None, 64),
            transfer_key("fp", abc, ["x", "y", "z"], 64), transfer_key("fp", abc, None, 32),
            transfer_key("fp", ["ab", "", "c"], None, 64)}
    assert len(keys) == 6
    cached_logits(path, transfer_key("fp", ["a", "b", "d"], None, 64), compute)
    assert len(calls) == 2


def test_cache_source_reused_or_refused(tmp_path):
    src = tmp_path / "src.safetensors"
    key = transfer_key("fp", ["a"], None, 64)
    cached_logits(src, key, lambda: np.ones((1, 2), np.float32))

    def fail():
        raise AssertionError("the teacher must not run when the source cache matches")

    out, where = cached_logits(tmp_path / "run.safetensors", key, fail, source=src)
    assert where == "source" and out.tolist() == [[1.0, 1.0]]
    other = transfer_key("fp", ["b"], None, 64)
    with pytest.raises(UsageError, match="key mismatch"):
        cached_logits(tmp_path / "run2.safetensors", other, fail, source=src)
    out, where = cached_logits(tmp_path / "run3.safetensors", other,
                               lambda: np.zeros((1, 2), np.float32), source=src, strict_source=False)
    assert where == "computed"


@pytest.fixture(scope="module")
def tiny_teacher(tiny_bert, tmp_path_factory):
    """A tiny BERT fine-tuned by compress on the sample task (2 steps): a valid teacher folder."""
    from compress.api.finetuning import FinetuneConfig
    from compress.recipes.finetune import run_finetune

    out = tmp_path_factory.mktemp("teacher") / "run"
    return run_finetune(FinetuneConfig(model=str(tiny_bert), max_steps=2, batch_size=8, max_length=32,
                                       out=str(out)))


def test_distill_reuses_teacher_logits_across_runs(tiny_teacher, tmp_path, monkeypatch):
    calls = {"n": 0, "texts": 0}
    real = workflow.teacher_predict

    def counting(model, tokenizer, texts, *args, **kwargs):
        calls["n"] += 1
        calls["texts"] += len(texts)
        return real(model, tokenizer, texts, *args, **kwargs)

    from tests.conftest import skip_without_tagger_data

    skip_without_tagger_data()
    monkeypatch.setattr(workflow, "teacher_predict", counting)
    base = dict(student="kimcnn", teacher=str(tiny_teacher), epochs=1, max_length=32, augment=1,
                student_options=("num_filters=4",))
    first = workflow.run_distill(workflow.DistillConfig(**base, out=str(tmp_path / "a")))
    assert calls["n"] == 2  # eval split + transfer set (256 originals + 256 augmented)
    n_train = json.loads((first / "summary.json").read_text())["train_examples"]
    assert calls["texts"] == 64 + 2 * n_train
    second = workflow.run_distill(workflow.DistillConfig(**base, out=str(tmp_path / "b"),
                                                         teacher_cache=str(first)))
    assert calls["n"] == 2  # nothing recomputed
    summary = json.loads((second / "summary.json").read_text())
    assert summary["teacher_logits"] == {"transfer": "source", "eval": "source"}
    a = read_cache(first / "teacher_logits" / "transfer.safetensors")
    b = read_cache(second / "teacher_logits" / "transfer.safetensors")
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    # the same student and seed on the same cached targets train to the same result
    s1 = json.loads((first / "summary.json").read_text())["student_eval"]
    assert summary["student_eval"]["accuracy"] == s1["accuracy"]
    # another student seed with the first run's data seed: same transfer set, teacher not run
    third = workflow.run_distill(workflow.DistillConfig(**base, out=str(tmp_path / "c"), seed=7, data_seed=42,
                                                        teacher_cache=str(first)))
    assert calls["n"] == 2
    assert read_cache(third / "teacher_logits" / "transfer.safetensors")[0] == a[0]
    # without it, seed 7 augments differently, so the first run's cache does not match
    with pytest.raises(UsageError, match="key mismatch"):
        workflow.run_distill(workflow.DistillConfig(**base, out=str(tmp_path / "d"), seed=7,
                                                    teacher_cache=str(first)))
    assert not (tmp_path / "d").exists()


def test_interrupted_run_resumes_without_rerunning_the_teacher(tiny_teacher, tmp_path, monkeypatch):
    calls = {"n": 0}
    real_predict, real_train = workflow.teacher_predict, workflow.train_student

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real_predict(*args, **kwargs)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(workflow, "teacher_predict", counting)
    monkeypatch.setattr(workflow, "train_student", interrupted)
    cfg = dict(student="logreg", teacher=str(tiny_teacher), epochs=1, max_length=32,
               out=str(tmp_path / "run"))
    with pytest.raises(KeyboardInterrupt):
        workflow.run_distill(workflow.DistillConfig(**cfg))
    kept = tmp_path / ".tmp-run"
    assert (kept / "teacher_logits" / "transfer.safetensors").is_file() and calls["n"] == 2
    monkeypatch.setattr(workflow, "train_student", real_train)
    done = workflow.run_distill(workflow.DistillConfig(**cfg, resume=True))
    assert calls["n"] == 2  # the cached logits were read, the teacher did not run again
    assert json.loads((done / "summary.json").read_text())["teacher_logits"] == {
        "transfer": "cache", "eval": "cache"}
    assert not kept.exists()


def test_fingerprint_covers_weights_labels_and_tokenizer_not_other_files(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "compress.json").write_text('{"label_names": ["neg", "pos"]}')
    (tmp_path / "vocab.txt").write_text("[PAD]\nfilm\n")
    base = teacher_fingerprint(tmp_path)
    (tmp_path / "README.md").write_text("notes")  # not read by the model or its tokenizer
    assert teacher_fingerprint(tmp_path) == base
    for name, text in [("vocab.txt", "[PAD]\nmovie\n"), ("compress.json", '{"label_names": ["a", "b"]}'),
                       ("tokenizer_config.json", '{"do_lower_case": false}')]:
        before = teacher_fingerprint(tmp_path)
        (tmp_path / name).write_text(text)
        assert teacher_fingerprint(tmp_path) != before, name
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UsageError, match="no \\*.safetensors weights"):
        teacher_fingerprint(tmp_path)
