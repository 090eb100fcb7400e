"""A real ``compress prune`` whose loss turns NaN mid-run (injected into the model's forward pass):
one line naming the step and the learning rate, exit 1, no model saved; the run folder stays only
when it holds a checkpoint of the steps before, and ``--resume`` finishes it from there."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

ARGS = ("prune", "--sparsity", "0.5", "--schedule", "gradual", "--stage", "finetune", "--max-steps", "12",
        "--batch-size", "8", "--max-length", "32", "--log-every", "1", "--seed", "7", "--lr", "1e-3")


@pytest.fixture
def nan_at_step_7(monkeypatch):
    from transformers import BertForSequenceClassification

    real, steps = BertForSequenceClassification.forward, []

    @functools.wraps(real)
    def forward(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.training and out.loss is not None:
            steps.append(1)
            if len(steps) == 7:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(BertForSequenceClassification, "forward", forward)
    return monkeypatch


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def test_diverged_prune_saves_nothing_keeps_its_checkpoint_and_resumes(tiny_bert, tmp_path, nan_at_step_7):
    out, tmp = tmp_path / "run", tmp_path / ".tmp-run"
    args = [*ARGS, "--model", str(tiny_bert), "--out", str(out), "--checkpoint-every", "4"]
    r = run_cli(*args)
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "training diverged: the loss is nan at step 7" in line
    assert "--lr 0.001" in line
    assert not out.exists() and tmp.is_dir()  # not completed, kept for --resume
    assert sorted(p.name for p in (tmp / "checkpoint").glob("step-*")) == ["step-00000004"]
    assert not (tmp / "model").exists() and not (tmp / "masks.safetensors").exists()

    nan_at_step_7.undo()  # the cause removed, the run continues from its last good step
    r = run_cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert not tmp.exists() and (out / "model" / "model.safetensors").is_file()
    assert _steps(out) == list(range(1, 13))  # the steps after the checkpoint, once
    assert json.loads((out / "summary.json").read_text())["steps"] == 12


def test_diverged_prune_without_checkpoints_leaves_no_folder(tiny_bert, tmp_path, nan_at_step_7):
    out = tmp_path / "run"
    r = run_cli(*ARGS, "--model", str(tiny_bert), "--out", str(out))
    assert r.returncode == 1 and "at step 7" in r.stderr, r.stderr
    assert not out.exists() and not (tmp_path / ".tmp-run").exists()
