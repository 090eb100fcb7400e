"""A saved model is complete or refused: a weight deleted from (or added to) a run's
``model.safetensors`` is named in one line by every command that loads it, dense and structured
folders alike, instead of being filled with random values."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from compress.cli.main import main

FAST = ("--batch-size", "8", "--max-length", "32")


@pytest.fixture(scope="module")
def runs(tiny_encoder, tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    dense = base / "dense"
    assert main(["finetune", "--model", str(tiny_encoder("bert")), "--max-steps", "2", *FAST,
                 "--out", str(dense)]) == 0
    structured = base / "structured"
    assert main(["prune", "--stage", "post-training", "--model", str(dense), "--structured", "heads,ffn",
                 "--flops-reduction", "0.3", "--calibration-samples", "16", *FAST,
                 "--out", str(structured)]) == 0
    return {"dense": dense, "structured": structured}


def _edit(run, tmp_path, change) -> str:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    path = copy / "model" / "model.safetensors"
    weights = load_file(str(path))
    change(weights)
    save_file(weights, str(path), metadata={"format": "pt"})
    return str(copy)


def _drop(weights):
    del weights["bert.encoder.layer.1.intermediate.dense.weight"]


def _add(weights):
    extra = weights["bert.encoder.layer.1.output.dense.weight"].clone()
    weights["bert.encoder.layer.9.output.dense.weight"] = extra


@pytest.mark.parametrize("kind", ["dense", "structured"])
@pytest.mark.parametrize("change, words", [
    (_drop, "lacks weights bert.encoder.layer.1.intermediate.dense.weight"),
    (_add, "holds unexpected weights bert.encoder.layer.9")])
def test_every_command_refuses_the_folder_in_one_line(kind, change, words, runs, tmp_path, capsys):
    folder = _edit(runs[kind], tmp_path, change)
    for args in (["verify", folder], ["eval", "--model", folder, "--max-length", "32"],
                 ["measure", folder], ["export", folder, "--to", str(tmp_path / "m.onnx")]):
        code = main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and words in err[0], (args[0], err)
    assert not (tmp_path / "m.onnx").exists()
