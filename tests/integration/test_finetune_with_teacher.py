"""`compress finetune --teacher`: a pruned model recovers by distilling from its dense original, through
the real CLI (in process) on a tiny random BERT and the bundled sample."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from compress.cli.main import main
from tests.conftest import write_tiny_squad

FAST = ["--batch-size", "16", "--max-length", "32", "--log-every", "1", "--seed", "5"]


@pytest.fixture(scope="module")
def dense_and_pruned(tiny_bert, tmp_path_factory):
    """A fine-tuned dense model (the teacher) and a 50%-pruned copy of it (the student)."""
    base = tmp_path_factory.mktemp("ft-kd")
    dense, pruned = base / "dense", base / "pruned"
    assert main(["finetune", "--model", str(tiny_bert), "--max-steps", "6", "--lr", "1e-3", *FAST,
                 "--out", str(dense)]) == 0
    assert main(["prune", "--model", str(dense), "--stage", "after-finetune", "--schedule", "oneshot",
                 "--sparsity", "0.5", "--recovery-steps", "1", *FAST, "--out", str(pruned)]) == 0
    return dense, pruned


def _weights(run):
    return load_file(str(run / "model" / "model.safetensors"))


def test_a_pruned_model_recovers_with_kd_and_keeps_its_masks(dense_and_pruned, tmp_path):
    dense, pruned = dense_and_pruned
    before = _weights(dense)
    out = tmp_path / "recovered"
    assert main(["finetune", "--model", str(pruned), "--teacher", str(dense), "--kd-lambda", "2",
                 "--max-steps", "5", *FAST, "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if "loss" in r]
    assert len(losses) == 5 and all(r["kd_loss"] > 0 for r in losses)
    for r in losses:  # the logged loss is task + lambda * KD
        assert r["loss"] == pytest.approx(r["task_loss"] + 2.0 * r["kd_loss"], rel=1e-5)
    d = json.loads((out / "summary.json").read_text())["distillation"]
    assert d["teacher"] == str(dense) and d["kd_lambda"] == 2.0
    assert 0.0 <= d["agreement_with_teacher"] <= 1.0
    # the teacher's own dev score is the one its fine-tuning run reported
    assert d["teacher_eval"]["score"] == json.loads((dense / "summary.json").read_text())["eval"]["score"]
    # the pruned positions are still zero after training with KD
    w, masks = _weights(out), load_file(str(out / "model" / "masks.safetensors"))
    assert masks and masks.keys() == load_file(str(pruned / "model" / "masks.safetensors")).keys()
    for name, m in masks.items():
        assert torch.equal(w["bert." + name] == 0, ~m.bool()), name
    assert main(["verify", str(out)]) == 0
    after = _weights(dense)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the teacher is never updated


def test_finetune_with_lambda_zero_is_plain_finetuning_bit_for_bit(dense_and_pruned, tmp_path):
    dense, pruned = dense_and_pruned
    args = ["finetune", "--model", str(pruned), "--max-steps", "4", *FAST]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--teacher", str(dense), "--kd-lambda", "0", "--out", str(tmp_path / "kd0")]) == 0
    plain, kd0 = _weights(tmp_path / "plain"), _weights(tmp_path / "kd0")
    assert plain.keys() == kd0.keys()
    for k in plain:
        assert torch.equal(plain[k], kd0[k]), k


def test_finetune_on_squad_distils_span_logits(tiny_bert, tmp_path):
    write_tiny_squad(tmp_path)
    qa = ["--task", "squad", "--data-dir", str(tmp_path), "--split-by-article", "2/1", "--max-length", "48",
          "--doc-stride", "16", "--batch-size", "4", "--seed", "5"]
    teacher = tmp_path / "squad-teacher"
    assert main(["finetune", "--model", str(tiny_bert), *qa, "--max-steps", "3", "--out", str(teacher)]) == 0
    out = tmp_path / "student"
    assert main(["finetune", "--model", str(tiny_bert), *qa, "--max-steps", "3", "--log-every", "1",
                 "--teacher", str(teacher), "--out", str(out)]) == 0
    d = json.loads((out / "summary.json").read_text())["distillation"]
    assert d["teacher"] == str(teacher) and set(d["teacher_eval"]) >= {"exact_match", "f1"}
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([m for m in logged if "kd_loss" in m]) == 3


def test_finetune_teacher_refusals_are_one_line_and_write_nothing(dense_and_pruned, tiny_bert, tmp_path,
                                                                   capsys):
    dense, _ = dense_and_pruned
    runs = tmp_path / "runs"
    assert main(["finetune", "--model", str(tiny_bert), "--temperature", "2", "--out", str(runs / "a")]) == 2
    assert "--temperature applies with --teacher only" in capsys.readouterr().err
    # 'self' must be fine-tuned on the task: a bare encoder has no head to distil from
    assert main(["finetune", "--model", str(tiny_bert), "--teacher", "self", "--max-steps", "1",
                 "--out", str(runs / "b")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tiny_bert) in err[0]
    write_tiny_squad(tmp_path)
    assert main(["finetune", "--model", str(tiny_bert), "--task", "reqa", "--data-dir", str(tmp_path),
                 "--teacher", str(dense), "--out", str(runs / "c")]) == 2
    assert "'reqa' is a retrieval task, which does not support it yet" in capsys.readouterr().err
    assert not runs.exists() or not any(runs.iterdir())
