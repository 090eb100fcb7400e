"""compress.PruningCallback inside a real transformers.Trainer on a tiny BERT: the schedule, the
masks held through AdamW's weight decay, sparsity in the logs, checkpoints that compress verify
reads, and a resumed run that keeps the checkpoint's zeros."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from safetensors.torch import load_file

import compress
from tests.tiny_encoders import build


@pytest.fixture(scope="module")
def parts():
    config, tokenizer = build("bert")
    ids = torch.randint(100, 1000, (16, 10), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": ids[i], "attention_mask": torch.ones(10, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(16)]
    return config, tokenizer, data


def _model(config):
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(config.__class__(**{**config.to_dict(), "num_labels": 2}))


def _trainer(model, data, tokenizer, out, max_steps, callbacks):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=max_steps,
                             learning_rate=1e-2, weight_decay=0.1, save_strategy="steps", save_steps=2,
                             logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                   callbacks=callbacks)


def _zeros(folder):
    w = load_file(str(folder / "model.safetensors"))
    return {n: w["bert." + n] == 0 for n in load_file(str(folder / "masks.safetensors"))}


def test_callback_prunes_on_schedule_logs_and_resumes(parts, tmp_path):
    config, tokenizer, data = parts
    out = tmp_path / "out"
    cb = compress.PruningCallback(0.5, prune_steps=2, prune_every=1)  # the model comes from the Trainer
    with pytest.raises(compress.UsageError, match=r"call trainer\.train\(\) first"):
        cb.save(tmp_path / "x")
    _trainer(_model(config), data, tokenizer, out, 4, [cb]).train()
    assert [h["step"] for h in cb.pruner.history][:3] == [0, 1, 2]
    assert cb.pruner.history[1]["sparsity"] == pytest.approx(0.5 * (1 - 0.5 ** 3), abs=1e-3)  # cubic
    for step in (2, 4):
        r = compress.verify_masks(out / f"checkpoint-{step}")
        assert r["sparsity"] == pytest.approx(0.5, abs=1e-4)
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    logged = {h["step"]: h["sparsity"] for h in state["log_history"] if "sparsity" in h}
    assert logged[1] == pytest.approx(cb.pruner.history[1]["sparsity"]) and logged[4] == pytest.approx(0.5)
    assert (out / "masks.safetensors").is_file() and (out / "README.md").is_file()  # at train end

    # resume from step 2 on a fresh model and callback: the checkpoint's zeros stay zero
    before = _zeros(out / "checkpoint-2")
    cb2 = compress.PruningCallback(0.5, prune_steps=2, prune_every=1)
    resumed = tmp_path / "resumed"
    trainer = _trainer(_model(config), data, tokenizer, resumed, 6, [cb2])
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    after = _zeros(resumed / "checkpoint-6")
    assert compress.verify_masks(resumed / "checkpoint-6")["sparsity"] == pytest.approx(0.5, abs=1e-4)
    for name, zero in before.items():
        assert torch.equal(after[name], zero), name  # the same weights: nothing regrew, nothing new


def test_callback_stops_a_diverged_run_before_saving_its_step(parts, tmp_path, monkeypatch):
    from compress.core.errors import TrainingDivergedError

    config, tokenizer, data = parts
    model, calls = _model(config), []
    real = type(model).forward

    @functools.wraps(real)  # the same signature: the Trainer keeps the columns it names
    def forward(self, *args, **kwargs):  # the loss of the third training step is NaN
        out = real(self, *args, **kwargs)
        calls.append(self.training)  # not the forward passes of the callback's reload check
        if calls.count(True) == 3 and self.training:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(type(model), "forward", forward)
    out = tmp_path / "out"
    cb = compress.PruningCallback(0.5, model=model, prune_steps=2, prune_every=1)
    with pytest.raises(TrainingDivergedError, match=r"NaN/inf values after step 3 .*learning_rate=0.01"):
        _trainer(model, data, tokenizer, out, 4, [cb]).train()
    assert (out / "checkpoint-2").is_dir()  # the last good step's checkpoint (save_steps=2)
    assert not (out / "checkpoint-4").exists() and not (out / "model.safetensors").exists()
