"""python -m benchmarks squad-oneshot, rehearsed on the CPU: a tiny BERT fine-tuned for two steps on a
tiny SQuAD file, then pruned once by two criteria through the real CLI; each row of the JSON holds
its run's EM/F1 and the sparsity it reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, write_tiny_squad

pytestmark = pytest.mark.filterwarnings("ignore")


def test_rehearsal_fine_tunes_then_prunes_once_per_criterion(tiny_bert, tmp_path):
    data = tmp_path / "data"
    (data / "squad_v1.1").mkdir(parents=True)
    write_tiny_squad(data / "squad_v1.1", n_articles=3)
    out = tmp_path / "oneshot_squad.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "squad-oneshot", "--finetune-from",
                           str(tiny_bert), "--data-dir", str(data), "--work", str(tmp_path / "w"),
                           "--out", str(out), "--split-by-article", "2/1", "--max-length", "48",
                           "--finetune-flags", "--max-steps 2", "--only", "magnitude-50,sparsegpt-2of4"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())["results"]
    dense = result["dense_summary"]
    assert dense["task"] == "squad" and dense["eval"]["n"] == 2  # the one held-out article's two questions
    rows = result["rows"]
    assert [r["name"] for r in rows] == ["magnitude-50", "sparsegpt-2of4"]  # RUNS' order, not the grid's
    for r in rows:
        assert r["rc"] == 0 and r["recovery_steps"] == 0 and r["final"] == r["oneshot"]
        assert r["dense"] == pytest.approx(dense["eval"]["score"])
        assert r["sparsity"]["encoder"] == pytest.approx(0.5, abs=1e-3) and r["sparsity"]["embeddings"] == 0
        assert {"exact_match", "f1"} <= set(r["metrics"]["eval"])
        assert "--split-by-article 2/1" in r["cmd"] and "--exclude role:word_embeddings" in r["cmd"]
