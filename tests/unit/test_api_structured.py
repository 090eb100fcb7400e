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
@pytest.mark.parametrize("method", ["obs", "fisher"])
def test_a_flops_target_is_met_and_the_saved_folder_reloads(model_type, method, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compress.models.loading import load_pretrained, packaged_model_path

    model = tiny_model(model_type)
    report = compress.prune_structured_model(model, _labelled(), flops_reduction=0.3, seq_len=12,
                                             method=method)
    assert report["flops_reduction"] >= 0.3
    assert report["method"].startswith("structured OBS" if method == "obs" else "fisher")
    assert sum(report["layer_heads"]) < 8 or sum(report["layer_ffn"]) < 2 * 37
    assert type(model).__name__.startswith("Compress")
    tok = AutoTokenizer.from_pretrained(packaged_model_path("minilm"))
    compress.save_model(model, tok, tmp_path / "m")
    again = load_pretrained(AutoModelForSequenceClassification, str(tmp_path / "m")).eval()
    with torch.no_grad():
        assert torch.allclose(again(**batch(5)).logits, model.eval()(**batch(5)).logits, atol=1e-6)
    assert compress.verify_masks(tmp_path / "m")["pruned"] == 0  # no masks: the units are gone, not zeroed


def smallest_table():
    """A hand-made latency table of the tiny models (2 layers, 4 heads, FFN 37; no block can go):
    what the speedup search reads, without timing anything."""
    from dataclasses import replace

    from tests.unit.test_latency_table import hand_table

    return replace(hand_table("smallest"), ffn_width=37, widths=(1, 8, 37))


@pytest.mark.parametrize("method", ["obs", "fisher"])
@pytest.mark.parametrize("model_type", ["ernie", "mpnet"])
def test_a_speedup_target_is_met_by_the_latency_table(model_type, method, monkeypatch):
    import compress.measure.latency_table as latency

    table = smallest_table()
    monkeypatch.setattr(latency, "latency_table", lambda *a, **k: table)
    model = tiny_model(model_type)
    report = compress.prune_structured_model(model, [batch(1), batch(2)], speedup=1.5, seq_len=16,
                                             latency_runtime="torch", latency_batch=2, method=method)
    assert report["predicted_speedup"] >= 1.5 and report["latency_shape"] == "2x16"
    assert table.predicted_speedup(report["layer_heads"], report["layer_ffn"]) >= 1.5
    assert min(report["layer_heads"]) >= 1  # a discovered type keeps a head in every layer


def test_the_timed_models_of_mpnet_cut_its_position_bias_to_their_heads():
    """The 1-layer models a latency table times keep their first heads; MPNet's bias, computed for
    every head of the config, is cut to them (built and run here, not timed)."""
    from compress.measure.latency_table import encoder_config, pruned_classifier, pruned_config

    config = pruned_config(encoder_config(tiny_model("mpnet")), [2], [10], 128, "eager")
    assert config.layer_kept_heads == [[0, 1]]
    assert pruned_classifier(config)(**batch()).logits.shape == (4, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one target"),
    ({"flops_reduction": 0.3, "speedup": 2}, "exactly one target"),
    ({"flops_reduction": 1.0}, "below 1"),
    ({"flops_reduction": 0}, "flops_reduction"),
    ({"speedup": 0.5}, "speedup"),
    ({"speedup": 1.5, "targets": ("heads", "mlp")}, "mlp"),
    ({"speedup": 1.5, "method": "l2"}, "unknown method 'l2'"),
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


@pytest.mark.parametrize("method", ["obs", "fisher"])
def test_a_model_with_a_nan_weight_is_refused_before_any_change(method):
    model = tiny_model("bert")
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "intermediate" in n).view(-1)[0] = float("nan")
    before = {n: p.clone() for n, p in model.state_dict().items()}
    with pytest.raises(compress.ModelError, match="NaN"):
        compress.prune_structured_model(model, _labelled(), flops_reduction=0.3, method=method)
    assert all(torch.equal(before[n], p) or torch.isnan(p).any() for n, p in model.state_dict().items())
    assert type(model).__name__.startswith("Bert")
