"""`compress prune --teacher`: distillation-aware pruning through the real CLI (in process) on a tiny
random BERT and the bundled sample."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from compress.cli.main import main
from tests.conftest import write_tiny_reuters, write_tiny_squad

FAST = ["--batch-size", "16", "--max-length", "32", "--log-every", "1", "--seed", "5"]


@pytest.fixture(scope="module")
def teacher(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("t") / "teacher"
    assert main(["finetune", "--model", str(tiny_bert), "--max-steps", "6", "--lr", "1e-3", *FAST,
                 "--out", str(out)]) == 0
    return out


def _weights(run):
    return load_file(str(run / "model" / "model.safetensors"))


def _assert_zeros_are_the_masks(run):
    w, masks = _weights(run), load_file(str(run / "model" / "masks.safetensors"))
    for name, m in masks.items():
        assert torch.equal(w["bert." + name] == 0, ~m.bool()), name


def test_lambda_zero_is_plain_pruning_bit_for_bit(tiny_bert, teacher, tmp_path):
    args = ["prune", "--model", str(tiny_bert), "--sparsity", "0.5", "--max-steps", "6", *FAST]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--teacher", str(teacher), "--kd-lambda", "0", "--out", str(tmp_path / "kd0")]) == 0
    plain, kd0 = _weights(tmp_path / "plain"), _weights(tmp_path / "kd0")
    assert plain.keys() == kd0.keys()
    for k in plain:
        assert torch.equal(plain[k], kd0[k]), k


def test_kd_changes_training_keeps_masks_and_reports_the_teacher(tiny_bert, teacher, tmp_path, capsys):
    before = _weights(teacher)
    out = tmp_path / "kd"
    assert main(["prune", "--model", str(tiny_bert), "--sparsity", "0.5", "--max-steps", "6", *FAST,
                 "--teacher", str(teacher), "--temperature", "2", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if "loss" in r]
    assert len(losses) == 6 and all(r["kd_loss"] > 0 for r in losses)
    for r in losses:  # the logged loss is task + lambda * KD, lambda 4 by default
        assert r["loss"] == pytest.approx(r["task_loss"] + 4.0 * r["kd_loss"], rel=1e-5)
    summary = json.loads((out / "summary.json").read_text())
    d = summary["distillation"]
    assert d["teacher"] == str(teacher) and d["kd_lambda"] == 4.0 and d["temperature"] == 2.0
    assert 0.0 <= d["agreement_with_teacher"] <= 1.0 and "score" in d["teacher_eval"]
    assert (out / "teacher_logits" / "train.safetensors").is_file()
    assert main(["verify", str(out)]) == 0
    _assert_zeros_are_the_masks(out)
    after = _weights(teacher)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the teacher is never updated


def test_teacher_self_after_finetune_is_the_unchanged_dense_model(tiny_bert, tmp_path):
    out = tmp_path / "self"
    assert main(["prune", "--model", str(tiny_bert), "--stage", "after-finetune", "--schedule", "oneshot",
                 "--sparsity", "0.6", "--max-steps", "4", "--recovery-steps", "4", "--lr", "1e-3", *FAST,
                 "--teacher", "self", "--kd-hidden", "1.0", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    # the teacher is the dense phase's model: scored after recovery, it still scores what it did then
    assert summary["distillation"]["teacher_eval"]["accuracy"] == summary["eval_dense"]["accuracy"]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("hidden_mse" in r for r in records if r.get("phase") == "recovery")


def test_post_training_recovery_with_layer_wise_distillation(teacher, tmp_path):
    """--kd-layers after a structured one-shot prune: each recovery step's loss is task + lambda * KD
    + W * the layer-wise MSE, and the summary records W beside --kd-hidden."""
    out = tmp_path / "layers"
    assert main(["prune", "--stage", "post-training", "--model", str(teacher), "--structured", "heads,ffn",
                 "--sparsity", "0.5", "--recovery-steps", "3", "--calibration-samples", "16", *FAST,
                 "--teacher", "self", "--kd-layers", "1.5", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") == "recovery" and "loss" in r]
    assert len(steps) == 3 and all(r["layer_mse"] > 0 and "hidden_mse" not in r for r in steps)
    for r in steps:
        want = r["task_loss"] + 4.0 * r["kd_loss"] + 1.5 * r["layer_mse"]
        assert r["loss"] == pytest.approx(want, rel=1e-5)
    d = json.loads((out / "summary.json").read_text())["distillation"]
    assert d["kd_layers"] == 1.5 and d["kd_hidden"] == 0.0


def test_structured_pruning_with_a_teacher(tiny_bert, teacher, tmp_path):
    out = tmp_path / "structured"
    assert main(["prune", "--model", str(tiny_bert), "--structured", "heads,ffn", "--sparsity", "0.5",
                 "--max-steps", "4", *FAST, "--teacher", str(teacher), "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["distillation"]["kd_lambda"] == 4.0


def test_multilabel_pruning_with_a_teacher(tiny_bert, tmp_path):
    """Reuters (multi-label): lambda 1 by default as in distill, the logged loss is task + KD, the
    masks hold and the teacher is unchanged (the Bernoulli KL itself is checked in the unit tests)."""
    data = write_tiny_reuters(tmp_path / "data")
    task = ["--task", "reuters", "--data-dir", str(data), *FAST]
    dense = tmp_path / "dense"
    assert main(["finetune", "--model", str(tiny_bert), *task, "--max-steps", "3", "--lr", "1e-3",
                 "--out", str(dense)]) == 0
    before = _weights(dense)
    out = tmp_path / "kd"
    assert main(["prune", "--model", str(dense), *task, "--sparsity", "0.5", "--max-steps", "4",
                 "--teacher", "self", "--out", str(out)]) == 0
    d = json.loads((out / "summary.json").read_text())["distillation"]
    assert d["kd_lambda"] == 1.0 and "micro_f1" in d["teacher_eval"]
    assert 0.0 <= d["agreement_with_teacher"] <= 1.0
    losses = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses) == 4 and all(r["kd_loss"] >= 0 for r in losses)
    for r in losses:
        assert r["loss"] == pytest.approx(r["task_loss"] + 1.0 * r["kd_loss"], rel=1e-5)
    _assert_zeros_are_the_masks(out)
    after = _weights(dense)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_teacher_with_other_labels_or_another_tokenizer_is_refused(tiny_bert, teacher, tiny_encoder,
                                                                      tmp_path, capsys):
    # the same texts as another task (labels 0/1 renamed): another label set
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("text,label\ngood film,pos\nbad film,neg\n")
    (data / "dev.csv").write_text("text,label\nfine film,pos\n")
    runs = tmp_path / "runs"
    code = main(["prune", "--model", str(tiny_bert), "--task", "csv", "--data-dir", str(data),
                 "--max-steps", "2", *FAST, "--teacher", str(teacher), "--out", str(runs / "a")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "labels" in err[-1] and len(err) == 1
    # a RoBERTa teacher (byte-level BPE) for a WordPiece student
    other = tmp_path / "roberta-teacher"
    assert main(["finetune", "--model", str(tiny_encoder("roberta")), "--max-steps", "2", *FAST,
                 "--out", str(other)]) == 0
    capsys.readouterr()
    code = main(["prune", "--model", str(tiny_bert), "--max-steps", "2", *FAST, "--teacher", str(other),
                 "--out", str(runs / "b")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "another tokenizer" in err[-1] and len(err) == 1  # a model, as labels are
    assert not runs.exists() or not any(runs.iterdir())


def test_teacher_options_that_do_not_apply_are_refused(tiny_bert, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["prune", "--model", str(tiny_bert), "--kd-lambda", "2", "--out", str(runs / "a")]) == 2
    assert "--kd-lambda applies with --teacher only" in capsys.readouterr().err
    write_tiny_squad(tmp_path)
    assert main(["prune", "--model", str(tiny_bert), "--task", "reqa", "--data-dir", str(tmp_path),
                 "--teacher", "self", "--out", str(runs / "b")]) == 2
    assert "does not support it yet" in capsys.readouterr().err
    # squad distils span logits from a model fine-tuned on squad: a plain encoder is refused
    assert main(["prune", "--model", str(tiny_bert), "--task", "squad", "--data-dir", str(tmp_path),
                 "--split-by-article", "2/1", "--teacher", "self", "--out", str(runs / "q")]) == 1
    assert "not fine-tuned on squad" in capsys.readouterr().err
    assert main(["prune", "--model", str(tiny_bert), "--task", "squad", "--data-dir", str(tmp_path),
                 "--split-by-article", "2/1", "--teacher", "self", "--objective", "pfa",
                 "--out", str(runs / "p")]) == 2
    assert "with --objective plain" in capsys.readouterr().err
    assert main(["prune", "--model", str(tiny_bert), "--stage", "pretrain", "--teacher", "self",
                 "--out", str(runs / "c")]) == 2
    assert not runs.exists() or not any(runs.iterdir())


def test_squad_pruning_distils_start_and_end_logits(tiny_bert, tmp_path, capsys):
    """A squad run with --teacher: the span model is the teacher, the summary reports it, the
    masks hold, and the teacher's files are untouched."""
    write_tiny_squad(tmp_path)
    qa = ["--task", "squad", "--data-dir", str(tmp_path), "--split-by-article", "2/1", "--max-length", "48",
          "--doc-stride", "16", "--batch-size", "4", "--seed", "5"]
    teacher = tmp_path / "squad-teacher"
    assert main(["finetune", "--model", str(tiny_bert), *qa, "--max-steps", "3", "--out", str(teacher)]) == 0
    before = _weights(teacher)
    run = tmp_path / "pruned"
    assert main(["prune", "--model", str(teacher), *qa, "--sparsity", "0.5", "--max-steps", "4",
                 "--log-every", "1", "--teacher", "self", "--kd-lambda", "2", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    d = summary["distillation"]
    assert d["teacher"] == "self" and d["kd_lambda"] == 2.0 and d["temperature"] == 1.0
    assert set(d["teacher_eval"]) >= {"exact_match", "f1"} and 0.0 <= d["agreement_with_teacher"] <= 1.0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    kd_terms = [m["kd_loss"] for m in logged if "kd_loss" in m]
    assert len(kd_terms) == 4 and all(v >= 0 for v in kd_terms)
    assert main(["verify", str(run)]) == 0
    after = _weights(teacher)
    assert all(torch.equal(before[k], after[k]) for k in before)
