"""`compress prune --speedup` through the real CLI on a tiny fine-tuned BERT: one target (a run
folder whose structure the latency table predicts at the target, verify passing), a family of two
(one run folder each, exports, one bench run, the report), and the one-line refusals."""

from __future__ import annotations

import json

import pytest

from compress.cli.main import main
from compress.measure.latency_table import LatencyTable

FAST = ("--batch-size", "8", "--max-length", "32", "--calibration-samples", "16")
SPEED = ("--stage", "post-training", "--structured", "heads,ffn", "--criterion", "fisher",
         "--latency-shape", "4x32")


@pytest.fixture(scope="module")
def finetuned(tiny_encoder, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "run"
    assert main(["finetune", "--model", str(tiny_encoder("bert")), "--max-steps", "2", *FAST[:4],
                 "--out", str(out)]) == 0
    return out


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # one table for the module's tests, measured once (tiny model, 4 x 32), in a folder of the test's own
    monkeypatch.setenv("COMPRESS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "latency-cache"))


def test_one_target_meets_its_predicted_speedup_and_verifies(finetuned, tmp_path, capsys):
    out = tmp_path / "p2"
    assert main(["prune", "--model", str(finetuned), *SPEED, "--speedup", "2", *FAST, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "heads kept per layer" in printed and "predicted speedup in ort-int8 at 4x32" in printed
    result = json.loads((out / "summary.json").read_text())["structured"]
    table = LatencyTable.from_dict(json.loads((out / "latency_table.json").read_text()))
    cfg = json.loads((out / "model" / "config.json").read_text())
    # the saved structure is what the table predicts at the target
    assert table.predicted_speedup(cfg["layer_heads"], cfg["layer_intermediate"]) >= 2.0
    assert result["predicted_speedup"] == pytest.approx(
        table.predicted_speedup(cfg["layer_heads"], cfg["layer_intermediate"]))
    assert main(["verify", str(out)]) == 0
    assert main(["eval", "--model", str(out), "--max-length", "32"]) == 0


def test_auto_latency_shape_aims_at_the_calibration_lengths(finetuned, tmp_path, capsys):
    out = tmp_path / "auto"
    args = [a for a in SPEED if a not in ("--latency-shape", "4x32")]
    assert main(["prune", "--model", str(finetuned), *args, "--latency-shape", "auto", "--speedup", "1.5",
                 *FAST, "--out", str(out)]) == 0
    result = json.loads((out / "summary.json").read_text())["structured"]
    table = json.loads((out / "latency_table.json").read_text())
    batch, tokens = (int(x) for x in result["latency_shape"].split("x"))
    assert (batch, tokens) == (table["batch"], table["seq_len"]) and batch == 32
    assert tokens % 8 == 0 and 8 <= tokens <= 32 and result["latency_shape_from"].startswith("auto")
    assert "predicted speedup in ort-int8 at " + result["latency_shape"] in capsys.readouterr().out


def test_auto_latency_shape_is_the_rounded_up_quantile_of_the_attention_masks():
    import torch

    from compress.api.prune_stages import latency_shape_of
    from compress.core.errors import UsageError

    def batch(lengths):
        return {"attention_mask": torch.tensor([[1] * n + [0] * (40 - n) for n in lengths])}

    # ten lengths 1..10 and 30: the 90% quantile of [1..10, 30] is 10 (index 9 of 11 sorted), -> 16
    assert latency_shape_of("auto", [batch(range(1, 11)), batch([30])]) == (32, 16)
    # twenty lengths of 20 and one of 40: the quantile is 20 -> 24
    assert latency_shape_of("auto", [batch([20] * 20 + [40])]) == (32, 24)
    assert latency_shape_of("8x64", None) == (8, 64)
    with pytest.raises(UsageError, match="auto"):
        latency_shape_of("auto", [])


def test_a_family_builds_exports_benches_and_names_the_fastest(finetuned, tmp_path, capsys):
    out = tmp_path / "family"
    assert main(["prune", "--model", str(finetuned), *SPEED, "--speedup", "1.5,2.5", "--max-drop", "100",
                 *FAST, "--recovery-steps", "1", "--teacher", "self", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    family = json.loads((out / "family.json").read_text())
    assert [r["label"] for r in family["rows"]] == ["1.5x", "2.5x"]
    for row, target in zip(family["rows"], (1.5, 2.5)):
        assert (out / f"speedup-{target:g}x" / "model" / "config.json").is_file()
        assert (out / f"speedup-{target:g}x" / "model-ort-int8.onnx").is_file()
        assert row["predicted_speedup"] >= target
        assert row["vs_dense_int8_4x32"] > 0 and row["vs_eager_fp32_1x32"] > 0
        assert 0 <= row["score_int8"] <= 1
    bench = json.loads((out / "bench" / "bench.json").read_text())
    assert {r["model"] for r in bench["rows"]} == {"dense-eager-fp32", "dense-ort-int8", "1.5x", "2.5x"}
    # with a budget of 100 points every model qualifies: the fastest at the table's shape is named
    fastest = max(family["rows"], key=lambda r: r["vs_dense_int8_4x32"])
    assert family["fastest_within_budget"] == fastest["label"]
    assert "fastest within 100 point(s) of dense" in printed and (out / "family.png").stat().st_size > 0
    assert main(["verify", str(out / "speedup-2.5x")]) == 0


def test_a_gradual_obs_family_starts_each_member_from_the_previous_one(finetuned, tmp_path, capsys):
    out = tmp_path / "gradual"
    obs = [a if a != "fisher" else "obs" for a in SPEED]
    assert main(["prune", "--model", str(finetuned), *obs, "--speedup", "1.5,2.5", "--max-drop", "100",
                 "--max-drop-metric", "macro_f1", *FAST, "--recovery-steps", "1", "--teacher", "self",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "member 2.5x: pruning speedup-1.5x" in printed
    family = json.loads((out / "family.json").read_text())
    assert family["family_mode"] == "gradual" and family["criterion"] == "obs"
    first, second = (json.loads((out / f"speedup-{t}x" / "summary.json").read_text()) for t in ("1.5", "2.5"))
    # the second member starts from the first after its recovery: the model it scores before pruning is
    # the first member as saved, with the same dev metrics to the last digit
    assert second["eval_dense"] == first["eval"]
    assert family["rows"][1]["started_from"] == "speedup-1.5x"
    # its target is still relative to the dense model, whose teacher it distils from
    assert second["structured"]["dense_predicted_ms"] == first["structured"]["dense_predicted_ms"]
    assert second["structured"]["predicted_speedup"] >= 2.5
    h1, h2 = first["structured"]["layer_heads"], second["structured"]["layer_heads"]
    assert all(b <= a for a, b in zip(h1, h2))
    assert second["structured"]["method"].startswith("structured OBS")
    for row in family["rows"]:
        assert 0 <= row["macro_f1_int8"] <= 1 and row["macro_f1_fp32"] is not None
    assert family["max_drop_metric"] == "macro_f1" and family["fastest_within_budget"] is not None
    assert "macro-F1" in (out / "family.md").read_text()
    assert main(["verify", str(out / "speedup-2.5x")]) == 0


def test_a_torch_family_names_its_fastest_model_and_labels_its_columns(finetuned, tmp_path, monkeypatch):
    # a hand-made table of the tiny model's sizes: a tiny model's eager timings are mostly fixed costs,
    # and the search reads the table alone (the bench still times the real models)
    import compress.measure.latency_table as latency
    from tests.unit.test_latency_table import hand_table

    monkeypatch.setattr(latency, "latency_table", lambda *a, **k: hand_table())
    out = tmp_path / "torch-family"
    args = [a if a != "fisher" else "obs" for a in SPEED]
    assert main(["prune", "--model", str(finetuned), *args, "--speedup", "1.5,2.5", "--max-drop", "100",
                 "--latency-runtime", "torch", "--family-mode", "independent", *FAST, "--out", str(out)]) == 0
    family = json.loads((out / "family.json").read_text())
    for row in family["rows"]:
        summary = json.loads((out / row["run"] / "summary.json").read_text())
        assert row["score_int8"] == summary["eval"]["score"]  # shipped as scored: the folder itself
    assert family["fastest_within_budget"] in ("1.5x", "2.5x")
    md = (out / "family.md").read_text()
    assert "accuracy torch fp32" in md and " int8" not in md


def test_a_family_on_a_masked_model_is_refused_before_any_work(finetuned, tmp_path, capsys, monkeypatch):
    pruned = tmp_path / "masked"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned), "--criterion", "magnitude",
                 "--sparsity", "0.5", *FAST, "--out", str(pruned)]) == 0
    capsys.readouterr()
    import compress.measure.latency_table as latency

    monkeypatch.setattr(latency, "latency_table", lambda *a, **k: pytest.fail("timed before refusing"))
    code = main(["prune", "--model", str(pruned), *SPEED, "--speedup", "1.5,2", *FAST,
                 "--out", str(tmp_path / "fam")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "would not keep the zeros" in err[0]
    assert not (tmp_path / "fam").exists()


def test_the_default_latency_shape_follows_max_length(finetuned, tmp_path):
    out = tmp_path / "task-shape"
    args = [a for a in SPEED if a not in ("--latency-shape", "4x32")]
    assert main(["prune", "--model", str(finetuned), *args, "--speedup", "1.5", "--batch-size", "8",
                 "--max-length", "24", "--calibration-samples", "16", "--out", str(out)]) == 0
    result = json.loads((out / "summary.json").read_text())["structured"]
    assert result["latency_shape"] == "32x24" and result["latency_shape_from"].startswith("task")
    assert json.loads((out / "latency_table.json").read_text())["seq_len"] == 24


@pytest.mark.parametrize("args, words", [
    (["--stage", "post-training", "--speedup", "2"], "--speedup set the target of --criterion obs or fisher"),
    ([*SPEED, "--speedup", "2", "--family-mode", "independent"], "--family-mode applies to a --speedup"),
    ([*SPEED, "--speedup", "2,2.0000001"], "share one name"),
    ([*SPEED[:-1], "4x100000", "--speedup", "2"], "longer than"),
    ([*SPEED[:-1], "4x100000", "--speedup", "2,3"], "longer than"),
    ([*SPEED[:-1], "\uff13\uff12x32", "--speedup", "2"], "--latency-shape"),
    ([*SPEED, "--speedup", "2", "--max-drop-metric", "macro_f1"], "--max-drop-metric applies"),
    ([*SPEED, "--speedup", "2", "--flops-reduction", "0.3"], "two targets"),
    ([*SPEED, "--speedup", "0.5"], "speedup"),
    ([*SPEED, "--speedup", "3,2"], "increasing order"),
    ([*SPEED, "--speedup", "2", "--latency-shape", "32by128"], "--latency-shape"),
    ([*SPEED, "--speedup", "2", "--latency-runtime", "tensorrt"], "tensorrt"),
    ([*SPEED, "--speedup", "2", "--max-drop", "0.5"], "--max-drop"),
    ([*SPEED[:-2], "--flops-reduction", "0.3", "--latency-shape", "8x64"], "applies with --speedup only"),
])
def test_bad_speed_targets_are_one_line_exit_2_nothing_written(args, words, finetuned, tmp_path, capsys):
    out = tmp_path / "runs"
    code = main(["prune", "--model", str(finetuned), *args, *FAST, "--out", str(out / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not out.exists() or not any(out.iterdir())
