"""``compress verify`` on every kind of folder compress writes: a pruned run (masks), a dense
model, a structured-pruned model (no masks: its weight shapes against its config), a distilled
student; one line of result, one line of error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.cli.main import main


@pytest.fixture(scope="module")
def structured_folder(tiny_bert, tmp_path_factory):
    """A classifier of the tiny BERT with half its heads and FFN neurons removed, saved by
    ``compress.save_model`` (no masks: the removed units are gone, not zero)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import compress
    from compress.pruning.structured import prune_structured

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    report = prune_structured(model, 0.5, ("heads", "ffn"))
    assert report["heads_removed"] > 0 and report["ffn_removed"] > 0
    folder = tmp_path_factory.mktemp("structured") / "model"
    compress.save_model(model, AutoTokenizer.from_pretrained(tiny_bert), folder)
    assert not (folder / "masks.safetensors").exists()
    return folder


def _one_line(capsys) -> tuple[str, str]:
    out, err = capsys.readouterr()
    return out.strip(), err.strip()


def test_a_structured_model_verifies_against_its_config(structured_folder, capsys):
    assert main(["verify", str(structured_folder)]) == 0
    out, _ = _one_line(capsys)
    cfg = json.loads((structured_folder / "config.json").read_text())
    assert len(out.splitlines()) == 1 and out.startswith("ok: every weight finite, no masks "
                                                         "(structured-pruned model)")
    assert f"heads per layer {cfg['layer_heads']}" in out and f"{cfg['layer_intermediate']}" in out


def test_a_structured_model_whose_config_disagrees_with_its_weights_fails(structured_folder, tmp_path,
                                                                          capsys):
    bad = tmp_path / "bad"
    shutil.copytree(structured_folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["layer_intermediate"][1] += 3
    (bad / "config.json").write_text(json.dumps(cfg))
    assert main(["verify", str(bad)]) == 1
    _, err = _one_line(capsys)
    assert len(err.splitlines()) == 1, err
    assert "encoder.layer.1.intermediate.dense." in err and "config and the weights disagree" in err


def test_a_structured_model_with_a_nan_fails_on_the_nan(structured_folder, tmp_path, capsys):
    bad = tmp_path / "nan"
    shutil.copytree(structured_folder, bad)
    w = load_file(str(bad / "model.safetensors"))
    name = next(k for k in w if k.endswith("layer.0.output.dense.weight"))
    w[name][0, 0] = float("nan")
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
    assert main(["verify", str(bad)]) == 1
    _, err = _one_line(capsys)
    assert f"{name}: 1 NaN, 0 inf" in err and len(err.splitlines()) == 1


def test_a_dense_model_passes_and_missing_recorded_masks_fail(tiny_bert, tmp_path, capsys):
    dense = tmp_path / "dense"
    shutil.copytree(tiny_bert, dense)
    assert main(["verify", str(dense)]) == 0
    out, _ = _one_line(capsys)
    assert out.startswith("ok: every weight finite, no masks (dense model) in ")
    assert len(out.splitlines()) == 1
    # a pruned folder whose masks file went missing in a copy is not taken for a dense one
    (dense / "compress.json").write_text(json.dumps({"pruning": {"masks_file": "masks.safetensors"}}))
    assert main(["verify", str(dense)]) == 1
    _, err = _one_line(capsys)
    assert "records masks" in err and "no masks.safetensors" in err and len(err.splitlines()) == 1


def test_a_distilled_student_is_checked_for_finite_weights(tmp_path, capsys):
    run = tmp_path / "distill"
    (run / "student").mkdir(parents=True)
    (run / "student" / "student.json").write_text(json.dumps({"student": "logreg"}))
    weights = {"linear.weight": torch.randn(2, 8), "linear.bias": torch.zeros(2)}
    save_file(weights, str(run / "student" / "model.safetensors"))
    assert main(["verify", str(run)]) == 0
    out, _ = _one_line(capsys)
    assert out.startswith("ok: every weight of the distilled student is finite")
    weights["linear.bias"][1] = float("inf")
    save_file(weights, str(run / "student" / "model.safetensors"))
    assert main(["verify", str(run)]) == 1
    _, err = _one_line(capsys)
    assert "linear.bias: 0 NaN, 1 inf" in err
