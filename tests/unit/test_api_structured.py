"""``compress.prune_structured_model``: Fisher-structured pruning from the Python API on a tiny BERT
(role table) and a tiny ERNIE (roles found by discovery), to a FLOPs target and to a speedup of a
latency table; the folder ``save_model`` writes reloads to the same outputs; bad arguments are one
UsageError line with the model unchanged."""

from __future__ import annotations

import pytest
import torch

import compress
from tests.unit.test_role_discovery import batch, tiny_model


def _labelled(n: int = 2) -> list[dict[str, torch.Tensor]]:
    return [dict(batch(i), labels=torch.tensor([0, 1, 0, 1])) for i in range(1, n + 1)]


@pytest.mark.parametrize("model_type", ["bert", "ernie"])
def test_a_flops_target_is_met_and_the_saved_folder_reloads(model_type, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compress.models.loading import load_pretrained, packaged_model_path

    model = tiny_model(model_type)
    report = compress.prune_structured_model(model, _labelled(), flops_reduction=0.3, seq_len=12)
    assert report["flops_reduction"] >= 0.3
    assert sum(report["layer_heads"]) < 8 or sum(report["layer_ffn"]) < 2 * 37
    assert type(model).__name__.startswith("Compress")
    tok = AutoTokenizer.from_pretrained(packaged_model_path("minilm"))
    compress.save_model(model, tok, tmp_path / "m")
    again = load_pretrained(AutoModelForSequenceClassification, str(tmp_path / "m")).eval()
    with torch.no_grad():
        assert torch.allclose(again(**batch(5)).logits, model.eval()(**batch(5)).logits, atol=1e-6)
    assert compress.verify_masks(tmp_path / "m")["pruned"] == 0  # no masks: the units are gone, not zeroed


@pytest.mark.parametrize("model_type", ["ernie", "mpnet"])  # MPNet: its timed 1-layer models cut
def test_a_speedup_target_uses_the_latency_table_of_this_machine(model_type, tmp_path, monkeypatch):
    from compress.measure.latency_table import latency_table

    monkeypatch.setenv("COMPRESS_CACHE_DIR", str(tmp_path / "cache"))  # the position bias per layer too
    model = tiny_model(model_type)
    table = latency_table(model, "torch", 2, 16)  # measured once, then read from the cache
    # the target: half way to what the table predicts for the smallest model it allows (one head and
    # one neuron per layer), so that timing noise cannot make it unreachable
    most = table.predicted_speedup([1, 1], [1, 1])
    assert most > 1, most
    target = 1 + (most - 1) / 2
    report = compress.prune_structured_model(model, [batch(1), batch(2)], speedup=target, seq_len=16,
                                             latency_runtime="torch", latency_batch=2)
    assert report["predicted_speedup"] >= target and report["latency_shape"] == "2x16"
    assert table.predicted_speedup(report["layer_heads"], report["layer_ffn"]) >= target
    assert min(report["layer_heads"]) >= 1  # a discovered type keeps a head in every layer


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one target"),
    ({"flops_reduction": 0.3, "speedup": 2}, "exactly one target"),
    ({"flops_reduction": 1.0}, "below 1"),
    ({"flops_reduction": 0}, "flops_reduction"),
    ({"speedup": 0.5}, "speedup"),
    ({"speedup": 1.5, "targets": ("heads", "mlp")}, "mlp"),
])
def test_bad_targets_are_refused_with_the_model_unchanged(kwargs, message):
    model = tiny_model("bert")
    before = {n: p.clone() for n, p in model.state_dict().items()}
    with pytest.raises(compress.UsageError, match=message):
        compress.prune_structured_model(model, _labelled(), **kwargs)
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


def test_mixed_labelled_and_unlabelled_batches_are_refused():
    with pytest.raises(compress.UsageError, match="every calibration batch carries 'labels' or none"):
        compress.prune_structured_model(tiny_model("bert"), [*_labelled(1), batch(2)], flops_reduction=0.3)
