"""Model resolution: packaged default, model folders, run folders, hub names (offline here)."""

from __future__ import annotations

import json

import pytest

from compress.core.errors import ModelError
from compress.models.loading import load_classifier, packaged_model_path, resolve_model


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


def test_a_hub_name_is_passed_through_when_the_hub_can_answer(monkeypatch):
    import compress.models.loading as models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_answers", lambda timeout: True)
    assert resolve_model("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cached model is used offline
    monkeypatch.setattr(models, "_in_hub_cache", lambda repo: True)
    assert resolve_model("google-bert/bert-base-uncased") == "google-bert/bert-base-uncased"


@pytest.mark.parametrize("offline, answers, why", [("1", True, "HF_HUB_OFFLINE is set"),
                                                   ("", False, "huggingface.co does not answer")])
def test_an_uncached_hub_name_without_a_hub_is_one_line_at_once(monkeypatch, offline, answers, why):
    import compress.models.loading as models

    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(models, "_hub_answers", lambda timeout: answers)
    with pytest.raises(ModelError) as e:
        load_classifier("google-bert/bert-base-uncased", ("a", "b"))
    msg = str(e.value)
    assert "'google-bert/bert-base-uncased' is neither a local folder nor a cached hub model" in msg
    assert why in msg and "\n" not in msg


def test_the_cli_checks_the_model_name_before_building_its_parser(monkeypatch, capsys):
    import compress.cli.main as cli

    def never(*a, **k):
        raise AssertionError("the full parser (every workflow import) was built first")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(cli, "build_parser", never)
    assert cli.main(["prune", "--sparsity", "0.4", "--model", "nosuchmodel"]) == 1
    assert cli.main(["distill", "--teacher=nosuchmodel"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("'nosuchmodel' is neither a local folder" in line for line in err)


def test_fresh_head_and_strict_labels(tiny_bert, capsys):
    model, tok, meta = load_classifier(str(tiny_bert), ("neg", "pos", "mixed"))
    assert model.config.num_labels == 3 and model.config.id2label[2] == "mixed"
    assert meta == {}
    # one line (on stdout) saying what the load report hidden by the CLI says at length
    said = [ln for ln in capsys.readouterr().out.splitlines() if "new task head" in ln]
    assert said == ["new task head: classifier, 3 labels (randomly initialised)"]
    with pytest.raises(ModelError, match="not fine-tuned by compress"):
        load_classifier(str(tiny_bert), ("neg", "pos"), strict_labels=True)


def test_a_head_trained_for_other_labels_is_not_carried_over(tiny_bert, tmp_path, capsys):
    # SST-2 (negative/positive) and RTE (entailment/not_entailment) both have 2 labels: the
    # head's shape matches, so only the saved label names tell that it belongs to another task.
    import torch

    from compress.models.loading import save_model

    model, tok, _ = load_classifier(str(tiny_bert), ("negative", "positive"))
    with torch.no_grad():
        model.classifier.weight.fill_(7.0)
        model.classifier.bias.fill_(7.0)
        encoder_w = model.bert.encoder.layer[0].attention.self.query.weight.clone()
    save_model(model, tok, tmp_path / "sst2", {"label_names": ["negative", "positive"]})
    capsys.readouterr()
    same, _, _ = load_classifier(str(tmp_path / "sst2"), ("negative", "positive"))
    assert (same.classifier.weight == 7).all() and (same.classifier.bias == 7).all()  # same task: kept
    assert "new task head" not in capsys.readouterr().out
    other, _, _ = load_classifier(str(tmp_path / "sst2"), ("entailment", "not_entailment"))
    assert "new task head: classifier, 2 labels" in capsys.readouterr().out
    w = other.classifier.weight
    assert not (w == 7).any() and (other.classifier.bias == 0).all()
    assert 0 < w.std().item() < 0.1  # N(0, initializer_range = 0.02)
    assert torch.equal(other.bert.encoder.layer[0].attention.self.query.weight, encoder_w)  # encoder kept


def test_one_loader_maps_every_loading_failure_to_one_line(tiny_bert, tmp_path):
    """``load_pretrained`` is the loader behind the classifier, span, encoder and export loaders."""
    import shutil

    from transformers import AutoModel, AutoModelForQuestionAnswering

    from compress.core.errors import ModelError
    from compress.models.loading import load_pretrained

    enc = load_pretrained(AutoModel, str(tiny_bert), what="an encoder")
    assert enc.config.hidden_size == 32
    qa = load_pretrained(AutoModelForQuestionAnswering, str(tiny_bert), what="a question-answering model")
    assert qa.qa_outputs.out_features == 2
    broken = tmp_path / "broken"
    shutil.copytree(tiny_bert, broken)
    (broken / "model.safetensors").unlink()  # a folder whose weights are missing
    with pytest.raises(ModelError) as err:
        load_pretrained(AutoModel, str(broken), what="an encoder")
    msg = str(err.value)
    assert "\n" not in msg and f"could not load '{broken}' as an encoder" in msg


def test_a_model_that_needs_its_own_code_is_refused_in_one_line_and_its_code_never_runs(tiny_bert, tmp_path):
    """A config whose auto_map names classes in the model's own files: transformers runs them only
    with trust_remote_code, which compress keeps off; the line says so (not "offline?")."""
    import shutil

    from transformers import AutoModel

    from compress.models.loading import load_pretrained, load_tokenizer

    folder = tmp_path / "own-code"
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="my_encoder", auto_map={"AutoConfig": "modeling_my.MyConfig",
                                                      "AutoModel": "modeling_my.MyModel"})
    (folder / "config.json").write_text(json.dumps(config))
    ran = tmp_path / "ran"
    (folder / "modeling_my.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    with pytest.raises(ModelError) as err:
        load_pretrained(AutoModel, str(folder), what="an encoder")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"model '{folder}' needs its own Python code to load")
    assert "trust_remote_code stays off" in msg and "offline" not in msg
    with pytest.raises(ModelError, match="needs its own Python code"):
        load_classifier(str(folder), ("neg", "pos"))
    load_tokenizer(str(folder))  # the tokenizer files are stock: no own code is asked for
    assert not ran.exists()
