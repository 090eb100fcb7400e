"""The model card (README.md) of a folder saved by the real CLI: YAML metadata a hub reads, the
dev metric of the run, the sparsity table, FLOPs and the command with its config."""

from __future__ import annotations

import json

import yaml

from tests.conftest import run_cli


def test_pruned_run_card_has_base_model_dev_metric_sparsity_and_command(tiny_bert, tmp_path):
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_bert), "--sparsity", "0.4", "--max-steps", "6",
                "--batch-size", "8", "--max-length", "32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = (out / "model" / "README.md").read_text()
    header, body = text.removeprefix("---\n").split("\n---\n", 1)
    meta = yaml.safe_load(header)
    assert meta["base_model"] == str(tiny_bert)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert {"compress", "pruned", "bert"} <= set(meta["tags"])
    summary = json.loads((out / "summary.json").read_text())
    result = meta["model-index"][0]["results"][0]
    assert result["dataset"] == {"name": "sample", "type": "sample", "split": "dev"}
    first = result["metrics"][0]
    assert first["type"] == summary["metric"] == "accuracy"
    assert first["value"] == round(summary["eval"]["accuracy"], 6)
    assert "global: 40.0%" in body and "sequence length 32" in body and "effective" in body
    assert f"compress prune --model {tiny_bert} --sparsity 0.4" in body
    assert (out / "config.yaml").read_text().strip() in body  # the resolved config, verbatim
