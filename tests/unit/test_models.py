"""Model resolution: packaged default, model folders, run folders, hub names (offline here)."""

from __future__ import annotations

import json

import pytest

from compress.errors import ModelError
from compress.models import load_classifier, packaged_model_path, resolve_model


def test_minilm_is_the_packaged_model():
    path = resolve_model("minilm")
    assert path == str(packaged_model_path("minilm"))
    cfg = json.loads((packaged_model_path("minilm") / "config.json").read_text())
    assert cfg["hidden_size"] == 384 and cfg["num_hidden_layers"] == 6


def test_model_folder_and_run_folder(tiny_bert, tmp_path):
    assert resolve_model(str(tiny_bert)) == str(tiny_bert)
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    assert resolve_model(str(run)) == str(run / "model")


def test_missing_local_path_and_bad_folder(tmp_path):
    with pytest.raises(ModelError, match="model folder not found"):
        resolve_model("./no/such/model")
    with pytest.raises(ModelError, match="neither a model folder"):
        resolve_model(str(tmp_path))


def test_hub_name_is_passed_through_and_fails_offline_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"
    with pytest.raises(ModelError, match="could not load model 'google-bert/bert-base-uncased'") as e:
        load_classifier("google-bert/bert-base-uncased", ("a", "b"))
    assert "\n" not in str(e.value)


def test_fresh_head_and_strict_labels(tiny_bert):
    model, tok, meta = load_classifier(str(tiny_bert), ("neg", "pos", "mixed"))
    assert model.config.num_labels == 3 and model.config.id2label[2] == "mixed"
    assert meta == {}
    with pytest.raises(ModelError, match="not fine-tuned by compress"):
        load_classifier(str(tiny_bert), ("neg", "pos"), strict_labels=True)


def test_a_head_trained_for_other_labels_is_not_carried_over(tiny_bert, tmp_path):
    # SST-2 (negative/positive) and RTE (entailment/not_entailment) both have 2 labels: the
    # head's shape matches, so only the saved label names tell that it belongs to another task.
    import torch

    from compress.models import save_model

    model, tok, _ = load_classifier(str(tiny_bert), ("negative", "positive"))
    with torch.no_grad():
        model.classifier.weight.fill_(7.0)
        model.classifier.bias.fill_(7.0)
        encoder_w = model.bert.encoder.layer[0].attention.self.query.weight.clone()
    save_model(model, tok, tmp_path / "sst2", {"label_names": ["negative", "positive"]})
    same, _, _ = load_classifier(str(tmp_path / "sst2"), ("negative", "positive"))
    assert (same.classifier.weight == 7).all() and (same.classifier.bias == 7).all()  # same task: kept
    other, _, _ = load_classifier(str(tmp_path / "sst2"), ("entailment", "not_entailment"))
    w = other.classifier.weight
    assert not (w == 7).any() and (other.classifier.bias == 0).all()
    assert 0 < w.std().item() < 0.1  # N(0, initializer_range = 0.02)
    assert torch.equal(other.bert.encoder.layer[0].attention.self.query.weight, encoder_w)  # encoder kept
