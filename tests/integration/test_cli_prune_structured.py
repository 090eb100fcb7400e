"""``compress prune --structured`` through the real CLI on tiny encoders other than BERT."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

FAST = ("--batch-size", "8", "--max-length", "32")


@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_structured_prune_of_a_non_bert_encoder_saves_a_folder_that_reloads(arch, tiny_encoder, tmp_path):
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_encoder(arch)), "--structured", "heads,ffn", "--sparsity", "0.5",
                "--max-steps", "2", *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())["structured"]
    assert s["architecture"] == ("bert" if arch == "roberta" else arch)
    assert sum(s["layer_heads"]) == sum(s["layer_heads_before"]) // 2
    assert sum(s["layer_ffn"]) == sum(s["layer_ffn_before"]) // 2
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == f"compress_{arch}" and config["layer_heads"] == s["layer_heads"]
    assert (out / "model" / "modeling_pruned.py").is_file() and "AutoModel" in config["auto_map"]

    from compress.pruning.integrity import load_saved_model

    model = load_saved_model(out / "model")
    assert type(model).__name__.startswith("Compress") and model.config.layer_heads == s["layer_heads"]


def test_a_sparsity_that_would_empty_a_layer_is_one_line_and_writes_nothing(tiny_encoder, tmp_path):
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_encoder("roberta")), "--structured", "heads",
                "--sparsity", "0.9", "--max-steps", "2", *FAST, "--out", str(out))
    assert r.returncode == 2  # a sparsity the head counts cannot honour is bad input
    error = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "would leave layer" in error[0] and "use a lower --sparsity" in error[0]
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))
