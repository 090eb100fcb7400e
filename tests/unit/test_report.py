"""compress.report on hand-built sweep, pipeline and run folders: report.md, valid PNGs with
labelled axes, CSVs whose numbers match the hand-written inputs."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from compress.core.errors import DataError
from compress.report import write_report
from tests.conftest import run_cli


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def _model_copy(src: Path, dst: Path, edit=None) -> None:
    """A copy of the tiny BERT folder, its weights changed by ``edit(state_dict)``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if edit:
        state = load_file(str(dst / "model.safetensors"))
        edit(state)
        save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"),
                  metadata={"format": "pt"})


def _zero_half(state) -> None:
    # half the encoder weights zeroed, the rest scaled up: a random tiny BERT is dominated by its
    # residual path, so zeros alone barely move its features
    for k, v in state.items():
        if ".layer." in k and k.endswith(".weight") and v.dim() == 2:
            thr = v.abs().flatten().kthvalue(v.numel() // 2).values
            v[v.abs() <= thr] = 0
            v.mul_(-50)


def _nudge(state) -> None:
    g = torch.Generator().manual_seed(0)
    for v in state.values():
        if v.is_floating_point():
            v.add_(1e-3 * torch.randn(v.shape, generator=g))


@pytest.fixture
def sweep_folder(tmp_path, tiny_bert) -> Path:
    root = tmp_path / "sweep"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i} of held out text about pruning models" for i in range(40)))
    cells = [
        {"name": "pt-dense", "kind": "pretrain", "sparsity": 0.0, "criterion": "none", "deps": []},
        {"name": "pt-magnitude-s50", "kind": "pretrain", "sparsity": 0.5, "criterion": "magnitude",
         "deps": []},
    ]
    _write(root / "pt-dense" / "summary.json", {"mlm_loss": {"pruned_after": 2.0}})
    _write(root / "pt-magnitude-s50" / "summary.json", {"mlm_loss": {"pruned_after": 2.5}})
    _model_copy(tiny_bert, root / "pt-dense" / "model")
    _model_copy(tiny_bert, root / "pt-magnitude-s50" / "model", _zero_half)
    heads = {"0": {"min": 0.4, "mean": 0.5, "max": 0.6}, "1": {"min": 0.5, "mean": 0.5, "max": 0.5}}
    _write(root / "pt-magnitude-s50" / "sparsity.json", {"heads": heads})
    # downstream: (cell, variants, sparsity, lr, score, pretrain)
    ds = [("ft-sst2-dense-lr1e-05", ["magnitude", "random"], 0.0, 1e-5, 0.90, "pt-dense"),
          ("ft-sst2-dense-lr2e-05", ["magnitude", "random"], 0.0, 2e-5, 0.88, "pt-dense"),
          ("ft-sst2-magnitude-s50-lr1e-05", ["magnitude"], 0.5, 1e-5, 0.80, "pt-magnitude-s50"),
          ("ft-sst2-magnitude-s50-lr2e-05", ["magnitude"], 0.5, 2e-5, 0.84, "pt-magnitude-s50"),
          ("ft-sst2-random-s50-lr1e-05", ["random"], 0.5, 1e-5, 0.60, None)]
    for name, variants, s, lr, score, pre in ds:
        cells.append({"name": name, "kind": "downstream", "task": "sst2", "sparsity": s, "lr": lr,
                      "variants": variants, "deps": [pre] if pre else []})
        _write(root / name / "summary.json", {"eval": {"score": score}, "metric": "accuracy"})
    _model_copy(tiny_bert, root / "ft-sst2-dense-lr1e-05" / "model", _nudge)
    cells.append({"name": "ft-sst2-random-s80-lr1e-05", "kind": "downstream", "task": "sst2",
                  "sparsity": 0.8, "lr": 1e-5, "variants": ["random"], "deps": []})  # unfinished
    _write(root / "sweep.json", {"config": {"pretrain_corpus": [str(corpus)], "model": str(tiny_bert)},
                                 "cells": cells})
    return root


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _check_pngs(root: Path, md: str) -> list[str]:
    pngs = re.findall(r"!\[[^\]]*\]\((report/[^)]+\.png)\)", md)
    assert pngs
    for rel in pngs:
        with Image.open(root / rel) as im:
            im.verify()
        with Image.open(root / rel) as im:
            assert im.format == "PNG" and im.size[0] > 200
            x, y = im.text.get("x-axis", ""), im.text.get("y-axis", "")
        assert x and y, rel
        # every axis names its unit: a percentage, millions, nats, a count of layers/steps, ...
        for label in (x, y):
            assert re.search(r"\(|layer|step", label), f"{rel}: axis '{label}' has no unit"
    return pngs


def test_sweep_report_tables_plots_and_csvs(sweep_folder):
    out = write_report(sweep_folder)
    md = out.read_text()
    assert out == sweep_folder / "report.md"
    assert "7 of 8 cells finished" in md and "incomplete" in md
    pngs = _check_pngs(sweep_folder, md)
    assert "report/metric_vs_sparsity_sst2.png" in pngs
    assert "report/pretrain_loss_vs_sparsity.png" in pngs
    rows = {(r["variant"], r["sparsity_pct"]): r for r in _read_csv(sweep_folder / "report" /
                                                                     "metric_vs_sparsity.csv")}
    # best over the learning-rate grid: 0.90 at 1e-5 for dense, 0.84 at 2e-5 for magnitude 50%
    assert float(rows[("magnitude", "0.0")]["score"]) == pytest.approx(0.90)
    assert float(rows[("magnitude", "0.0")]["best_lr"]) == pytest.approx(1e-5)
    assert float(rows[("magnitude", "50.0")]["score"]) == pytest.approx(0.84)
    assert rows[("magnitude", "50.0")]["n_lrs"] == "2"
    assert float(rows[("random", "50.0")]["score"]) == pytest.approx(0.60)
    assert "| 50 | 84 | 60 |" in md
    loss = _read_csv(sweep_folder / "report" / "pretrain_loss_vs_sparsity.csv")
    assert [(r["sparsity_pct"], float(r["heldout_mlm_loss"])) for r in loss] == [("0.0", 2.0), ("50.0", 2.5)]
    # Figure 2 left: points (2.0, 0.90) and (2.5, 0.84) -> slope -0.12
    fit = _read_csv(sweep_folder / "report" / "metric_vs_pretrain_loss_fit.csv")[0]
    assert float(fit["slope"]) == pytest.approx(-0.12)
    assert fit["n"] == "2"  # the dense cell is a row of both variants but one point of the fit
    # Figure 2 right: features of the half-zeroed model differ from the dense one past the embeddings
    feats = _read_csv(sweep_folder / "report" / "feature_similarity.csv")
    assert float(feats[0]["cosine"]) == pytest.approx(1.0)  # layer 0 = embeddings, untouched
    assert float(feats[-1]["cosine"]) < 0.999
    heads = _read_csv(sweep_folder / "report" / "head_sparsity.csv")
    got = [(r["layer"], float(r["min"]), float(r["max"])) for r in heads]
    assert got == [("0", 0.4, 0.6), ("1", 0.5, 0.5)]
    # Table 2: the dense cell moved a little from pt-dense, so some ranks changed, not most
    move = _read_csv(sweep_folder / "report" / "sort_order_movement.csv")[0]
    assert 0 < float(move["mean_rank_shift_fraction"]) < 0.5
    pareto = _read_csv(sweep_folder / "report" / "pareto.csv")
    assert [r["cell"] for r in pareto] == ["ft-sst2-dense-lr1e-05"]  # the only cell with a model


def test_run_folder_report(tmp_path):
    run = tmp_path / "run"
    _write(run / "summary.json", {"task": "sst2", "eval": {"score": 0.75, "n": 8}, "steps": 4})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.7}, {"step": 2, "eval": {"score": 0.75}}]) + "\n")
    _write(run / "sparsity.json", {
        "layers": {"0": {"sparsity": 0.5}, "1": {"sparsity": 0.25}},
        "heads": {"0": {"min": 0.4, "mean": 0.5, "max": 0.6}, "1": {"min": 0.2, "mean": 0.25, "max": 0.3}},
        **{g: {"numel": 100, "zeros": 40, "sparsity": 0.4} for g in ("embeddings", "encoder", "global")}})
    md = write_report(run).read_text()
    assert "| eval.score | 0.75 |" in md
    assert set(_check_pngs(run, md)) == {"report/training_loss.png", "report/head_sparsity.png"}
    loss = _read_csv(run / "report" / "training_loss.csv")
    assert [float(r["loss"]) for r in loss] == [0.9, 0.7]
    layers = _read_csv(run / "report" / "layer_sparsity.csv")
    assert [float(r["sparsity_pct"]) for r in layers] == [50.0, 25.0]
    assert (run / "report" / "summary.csv").is_file()


def test_pipeline_folder_report(tmp_path):
    root = tmp_path / "docbert"
    models = {}
    for label, params, flops, score, hidden in [("teacher", 22_000_000, 2e9, 0.9, None),
                                                ("bilstm-kd", 1_000_000, 1e7, 0.85, None),
                                                ("bilstm-kd-h64", 500_000, 5e6, 0.80, 64),
                                                ("bilstm-kd-h256", 2_000_000, 2e7, 0.86, 256)]:
        key = "student_eval" if label != "teacher" else "eval"
        _write(root / label / "summary.json", {key: {"score": score}})
        _write(root / "measure" / f"{label}.json",
               {"params": {"total": params}, "flops": {"dense_flops": flops}})
        models[label] = {"run": str(root / label), "measure": str(root / "measure" / f"{label}.json"),
                         "hidden": hidden}
    _write(root / "bench" / "bench.json", {"rows": [
        {"model": "teacher", "runtime": "ort", "batch": 1, "seq_len": 128, "median_ms": 20.0},
        {"model": "teacher", "runtime": "ort", "batch": 32, "seq_len": 128, "median_ms": 300.0},
        {"model": "bilstm-kd", "runtime": "ort", "batch": 1, "seq_len": 128, "median_ms": 2.0}]})
    _write(root / "pipeline.json", {"pipeline": "docbert", "models": models})
    md = write_report(root).read_text()
    _check_pngs(root, md)
    rows = {r["model"]: r for r in _read_csv(root / "report" / "models.csv")}
    assert float(rows["bilstm-kd"]["speedup"]) == pytest.approx(10.0)  # 20 ms / 2 ms at batch 1
    assert float(rows["bilstm-kd"]["params_ratio"]) == pytest.approx(1 / 22)
    bench = _read_csv(root / "report" / "bench.csv")
    assert [(r["model"], r["batch"], float(r["median_ms"])) for r in bench] == [
        ("teacher", "1", 20.0), ("teacher", "32", 300.0), ("bilstm-kd", "1", 2.0)]
    curve = _read_csv(root / "report" / "lstm_hidden_curve.csv")
    assert [(r["hidden_size"], float(r["score"])) for r in curve] == [("64", 0.8), ("256", 0.86)]


def test_report_errors(tmp_path):
    with pytest.raises(DataError, match="not a folder"):
        write_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no sweep.json, pipeline.json or summary.json"):
        write_report(tmp_path / "empty")
    res = run_cli("report", str(tmp_path / "empty"))
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "empty" / "report.md").exists()
    res = run_cli("report")
    assert res.returncode == 2 and "pass the sweep or run folder" in res.stderr


def test_feature_texts_are_the_pretraining_cells_held_out_lines(tmp_path):
    """The report scores features on the lines the masked-LM stage held out, not on others."""
    from compress.pruning.mlm import read_corpus, split_heldout
    from compress.report.sweep import _heldout_texts

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"sentence number {i} about pruning models" for i in range(100)))
    (tmp_path / "pt-dense").mkdir()
    (tmp_path / "pt-dense" / "config.yaml").write_text("heldout_fraction: 0.1\n")
    state = {"config": {"pretrain_corpus": [str(corpus)]}}
    texts = _heldout_texts(tmp_path, state, "pt-dense", 50)
    _, held = split_heldout(read_corpus([str(corpus)]), 0.1)
    assert texts == held and len(texts) == 10 and texts[0] == "sentence number 90 about pruning models"
    assert _heldout_texts(tmp_path, state, "pt-dense", 3) == held[-3:]
    assert _heldout_texts(tmp_path, {"config": {}}, "pt-dense", 3) == []
