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
