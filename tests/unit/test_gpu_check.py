"""python -m benchmarks gpu-check, rehearsed on the CPU (--tiny): every step runs through the real CLI
and the result file holds the exports, the bench table and the skips; a spent budget is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.filterwarnings("ignore")


def _run(*args: str, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", "gpu-check", "--tiny", "--work", str(out),
                           "--out", str(out / "gpu_check.json"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_tiny_rehearsal_writes_exports_bench_table_and_skips(tmp_path):
    proc = _run(out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["finished"] and result["budget"].startswith("one tiny")
    record = result["results"]
    assert record["mode"] == "tiny" and record["failed_steps"] == [] and record["not_run"] == []
    assert [s["name"] for s in record["steps"]] == ["export tiny fp32", "export tiny fp16", "bench tiny",
                                                    "finetune tiny on the sample", "family tiny",
                                                    "bench tiny-2of4"]
    exports = record["exports"]["tiny"]
    assert exports["fp16"]["half"]["half_initializers"] > 0 and exports["fp32"]["fused_ops"]["Attention"] == 2
    table = record["bench"]["tiny"]["table"]
    assert {(r["model"], r["runtime"]) for r in table} == {
        ("tiny", "torch"), ("tiny", "torch-int8"), ("ort-fp32", "ort"), ("ort-fp16", "ort-fp16")}
    assert all(r["mean_ms"] > 0 and r["vs_baseline"] > 0 for r in table)
    assert [s["runtime"] for s in record["bench"]["tiny"]["skipped"]] == ["torch-fp16"]
    assert "torch" in record["environment"] and (tmp_path / "nvidia-smi.txt").is_file()
    sparse = record["bench"]["tiny-2of4"]  # the 2:4 copy: dense eager times; torch-sparse needs a GPU
    assert {(r["model"], r["runtime"]) for r in sparse["table"]} == {("tiny-2of4", "torch")}
    assert [s["runtime"] for s in sparse["skipped"]] == ["torch-sparse"]
    # the speed family: each target met by the table it measured, both members exported and benched
    family = record["family"]["tiny"]
    assert family["latency_runtime"] == "ort-fp32" and family["latency_shape"] == "2x16"
    rows = family["rows"]
    assert [r["target"] for r in rows] == [1.5, 2.0]
    assert all(r["predicted_speedup"] >= r["target"] - 1e-6 and r["vs_dense_int8_2x16"] > 0 for r in rows)
    assert {p.name for p in (tmp_path / "family" / "tiny").iterdir()} == {"family.md", "family.json",
                                                                         "latency_table.json"}
    assert "gpu check: 6 steps, failed: none" in proc.stdout
    assert not list(tmp_path.rglob("*.onnx")) and not list(tmp_path.rglob("*.safetensors"))  # kept small


def test_a_spent_budget_is_recorded_not_silent(tmp_path):
    proc = _run("--budget-s", "0", out=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())["results"]
    assert record["not_run"] == ["export tiny fp32", "export tiny fp16", "bench tiny",
                                 "finetune tiny on the sample", "bench tiny-2of4"]
    assert all(s["not_run"].startswith("out of time") for s in record["steps"])
