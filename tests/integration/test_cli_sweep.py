"""A real 2-cell sweep (``compress prune`` cells on the tiny BERT, real SST-2 rows), then its report;
a one-shot sweep (sparsegpt, wanda) pruning its shared dense cell; and ``compress run`` of the gordon
pipeline with overrides."""

from __future__ import annotations

import csv
import json

import pytest

from compress.core.errors import CompressError
from compress.recipes.sweep import SweepConfig, run_sweep
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

SMALL = ["--train-limit", "32", "--eval-limit", "32", "--max-steps", "2", "--batch-size", "16",
         "--max-length", "32"]


def test_two_cell_prune_sweep_then_report(tiny_bert, shared_data, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--sparsities", "0.3", "--tasks", "sst2", "--variants", "magnitude,random",
            "--model", str(tiny_bert), "--data-dir", str(shared_data), *SMALL, "--jobs", "2",
            "--out", str(out)]
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    state = json.loads((out / "sweep.json").read_text())
    assert [c["name"] for c in state["cells"]] == ["ft-sst2-magnitude-s30-lr5e-05",
                                                    "ft-sst2-random-s30-lr5e-05"]
    for cell in state["cells"]:
        assert cell["status"] == "finished" and cell["argv"][:3] == ["prune", "--stage", "finetune"]
        summary = json.loads((out / cell["name"] / "summary.json").read_text())
        assert summary["eval"]["n"] == 32
        # the cell really pruned what the grid asked for, with the criterion the variant names
        assert summary["sparsity"]["encoder"] == pytest.approx(0.3, abs=0.01)
        cfg = (out / cell["name"] / "config.yaml").read_text()
        assert f"criterion: {cell['variants'][0]}" in cfg
    # re-running the finished sweep runs nothing
    again = run_cli(*args)
    assert again.returncode == 0 and "2 finished already, 0 to run" in again.stdout
    rep = run_cli("report", str(out))
    assert rep.returncode == 0, rep.stderr
    md = (out / "report.md").read_text()
    assert "![sst2 dev accuracy vs sparsity](report/metric_vs_sparsity_sst2.png)" in md
    with open(out / "report" / "metric_vs_sparsity.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["variant"] for r in rows} == {"magnitude", "random"}
    scores = {r["variant"]: float(r["score"]) for r in rows}
    for cell in state["cells"]:
        s = json.loads((out / cell["name"] / "summary.json").read_text())["eval"]["score"]
        assert scores[cell["variants"][0]] == pytest.approx(s)


def test_one_shot_sweep_prunes_the_shared_dense_cell_then_report(tiny_bert, shared_data, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--sparsities", "0.3,0.5", "--tasks", "sst2", "--variants", "sparsegpt,wanda",
            "--calibration-samples", "16", "--model", str(tiny_bert), "--data-dir", str(shared_data),
            *SMALL, "--jobs", "2", "--out", str(out)]
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    state = json.loads((out / "sweep.json").read_text())
    dense = "ft-sst2-dense-lr5e-05"
    cells = {c["name"]: c for c in state["cells"]}
    assert list(cells) == [dense, "ft-sst2-sparsegpt-s30-lr5e-05", "ft-sst2-wanda-s30-lr5e-05",
                           "ft-sst2-sparsegpt-s50-lr5e-05", "ft-sst2-wanda-s50-lr5e-05"]
    # sparsity 0 is not in the grid: the dense cell runs as the model pruned, on no variant's curve
    assert cells[dense]["argv"][0] == "finetune" and cells[dense]["variants"] == []
    assert not cells[dense]["deps"]
    dense_score = json.loads((out / dense / "summary.json").read_text())["eval"]["score"]
    for name, cell in cells.items():
        assert cell["status"] == "finished"
        if name == dense:
            continue
        argv = cell["argv"]
        assert cell["deps"] == [dense] and argv[:3] == ["prune", "--stage", "post-training"]
        assert argv[argv.index("--model") + 1] == str(out / dense)
        assert argv[argv.index("--calibration-samples") + 1] == "16" and "--schedule" not in argv
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["criterion"] == cell["variants"][0] and summary["recovery_steps"] == 0
        assert summary["sparsity"]["encoder"] == pytest.approx(cell["sparsity"], abs=0.01)
        assert summary["eval"]["n"] == 32 and summary["eval"] == summary["eval_pruned_before_recovery"]
        # what it pruned is the dense cell: the same dev score before pruning
        assert summary["eval_dense"]["score"] == pytest.approx(dense_score)
        assert summary["calibration"]["calibration_tokens"] > 0 and summary["prune_seconds"] >= 0
    again = run_cli(*args)
    assert again.returncode == 0 and "5 finished already, 0 to run" in again.stdout
    rep = run_cli("report", str(out))
    assert rep.returncode == 0, rep.stderr
    md = (out / "report.md").read_text()
    assert "| sparsity % | sparsegpt | wanda |" in md and "## One-shot pruning" in md
    with open(out / "report" / "metric_vs_sparsity.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["variant"], float(r["sparsity_pct"])) for r in rows) == [
        ("sparsegpt", 30.0), ("sparsegpt", 50.0), ("wanda", 30.0), ("wanda", 50.0)]
    with open(out / "report" / "one_shot.csv", newline="") as fh:
        one_shot = {(r["variant"], float(r["sparsity_pct"])): r for r in csv.DictReader(fh)}
    assert len(one_shot) == 4
    for name, cell in cells.items():
        if name == dense:
            continue
        summary = json.loads((out / name / "summary.json").read_text())
        row = one_shot[(cell["variants"][0], 100 * cell["sparsity"])]
        assert float(row["prune_seconds"]) == pytest.approx(summary["prune_seconds"])
        assert float(row["dense_score"]) == pytest.approx(dense_score)
        assert float(row["score"]) == pytest.approx(summary["eval"]["score"])


def test_compress_run_gordon_ci_with_overrides(tiny_bert, shared_data, tmp_path):
    out = tmp_path / "g"
    res = run_cli("run", "pipelines/configs/gordon-ci.yaml", f"model={tiny_bert}", f"out={out}",
                  f"data_dir={shared_data}", f"pretrain.corpus=[{shared_data / 'wikitext2'}]",
                  "sweep.sparsities=[0.5]", "finetune.max_steps=1")
    assert res.returncode == 0, res.stderr
    state = json.loads((out / "sweep.json").read_text())
    assert [c["name"] for c in state["cells"]] == ["pt-magnitude-s50", "ft-sst2-magnitude-s50-lr0.0001"]
    pre = json.loads((out / "pt-magnitude-s50" / "summary.json").read_text())
    assert pre["sparsity"]["encoder"] == pytest.approx(0.5, abs=0.01) and pre["mlm_loss"]["pruned_after"] > 0
    ft = json.loads((out / "ft-sst2-magnitude-s50-lr0.0001" / "summary.json").read_text())
    assert ft["steps"] == 1
    assert "## Pre-training loss vs sparsity" in (out / "report.md").read_text()


@pytest.mark.parametrize("override, code, words", [
    ("sweep.nope=1", 2, "unknown option 'nope'"),
    ("sweep.variants=[magnitude,bogus]", 2, "unknown variant 'bogus'"),
    ("novalue", 2, "is not KEY=VALUE"),
])
def test_compress_run_bad_overrides(tmp_path, override, code, words):
    res = run_cli("run", "pipelines/configs/gordon-ci.yaml", f"out={tmp_path / 'x'}", override)
    assert res.returncode == code and words in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_compress_run_unknown_pipeline(tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("pipeline: gordn\n")
    res = run_cli("run", str(cfg))
    assert res.returncode == 2 and "unknown pipeline 'gordn'" in res.stderr and "gordon" in res.stderr


def test_the_teacher_of_a_kd_sweep_is_checked_once_before_any_cell(tiny_bert, tmp_path, monkeypatch):
    """A teacher fine-tuned on the sample (negative/positive) for a sweep over a csv task with
    other labels: refused in one line before the first cell, the teacher loaded once."""
    import compress.models.loading as models

    teacher = tmp_path / "teacher"
    res = run_cli("finetune", "--model", str(tiny_bert), "--max-steps", "1", "--batch-size", "8",
                  "--max-length", "16", "--out", str(teacher))
    assert res.returncode == 0, res.stderr
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("text,label\ngood film,pos\nbad film,neg\n")
    (data / "dev.csv").write_text("text,label\nfine film,pos\n")
    loads = []
    real = models.load_classifier
    monkeypatch.setattr(models, "load_classifier", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    sweep = tmp_path / "sw"
    cfg = SweepConfig(sparsities=("0.5",), tasks=("sample", "csv"), variants=("magnitude",),
                      lrs=(1e-4, 2e-4), model=str(tiny_bert), teacher=str(teacher), data_dir=str(data),
                      out=str(sweep))
    with pytest.raises(CompressError) as err:  # before the first cell
        run_sweep(cfg, log=lambda *_: None)
    assert str(err.value) == (f"teacher '{teacher}' predicts labels ['negative', 'positive'], the task "
                              "has ['neg', 'pos']; use a teacher fine-tuned on this task")
    assert loads == [str(teacher)]
    assert not sweep.exists()


def test_a_sweep_of_an_encoder_without_a_role_table(tmp_path):
    """A tiny ERNIE (roles found by discovery) through a one-shot sweep on the bundled sample and the
    report: every cell finishes and prunes the discovered matrices."""
    import transformers

    from tests.integration.test_cli_prune_any_encoder import DISCOVERED, _saved

    config_class, model_class = (getattr(transformers, n) for n in DISCOVERED["ernie"][:2])
    folder = _saved(tmp_path / "ernie", model_class(config_class(
        vocab_size=30527, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)))
    out = tmp_path / "sweep"
    res = run_cli("sweep", "--sparsities", "0.5", "--tasks", "sample", "--variants", "sparsegpt,wanda",
                  "--calibration-samples", "16", "--model", str(folder), *SMALL, "--out", str(out))
    assert res.returncode == 0, res.stderr
    cells = json.loads((out / "sweep.json").read_text())["cells"]
    assert len(cells) == 3 and all(c["status"] == "finished" for c in cells)
    for cell in cells[1:]:
        summary = json.loads((out / cell["name"] / "summary.json").read_text())
        assert summary["sparsity"]["encoder"] == pytest.approx(0.5, abs=0.01)
    assert run_cli("report", str(out)).returncode == 0
    assert "| sparsity % | sparsegpt | wanda |" in (out / "report.md").read_text()
