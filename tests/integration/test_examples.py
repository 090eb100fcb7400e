"""The scripts in examples/ run as a user runs them (a subprocess, on a tiny random BERT), and what
they save is read by the real ``compress verify``, ``measure`` and ``export``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.conftest import ROOT, run_cli

EXAMPLES = ("trainer_prune.py", "plain_loop_prune_kd.py", "trainer_distill.py", "oneshot_sparsegpt.py")
FAST = ("--max-steps", "6", "--batch-size", "8", "--max-length", "32", "--lr", "1e-3")


def run_example(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    header, body = text.removeprefix("---\n").split("\n---\n", 1)
    return yaml.safe_load(header), body


def zeros_match_masks(folder: Path) -> None:
    """Independently of ``compress verify``: the stored zeros are exactly the masked-out entries."""
    weights = load_file(str(folder / "model.safetensors"))
    masks = load_file(str(folder / "masks.safetensors"))
    for name, mask in masks.items():
        w = weights.get(name, weights.get("bert." + name))
        assert w is not None, name
        assert ((w == 0) == ~mask.bool()).all(), name


@pytest.mark.parametrize("name", EXAMPLES)
def test_help(name):
    r = run_example(name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "--out" in r.stdout and "--sparsity" in r.stdout


@pytest.fixture(scope="module")
def trainer_pruned(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("ex") / "trainer-prune"
    r = run_example("trainer_prune.py", "--model", str(tiny_bert), "--sparsity", "0.5", *FAST,
                    "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r.stdout


def test_trainer_callback_prunes_and_saves_what_the_commands_read(trainer_pruned, tiny_bert, tmp_path):
    out, stdout = trainer_pruned
    for folder in (out, out / "checkpoint-6"):
        r = run_cli("verify", str(folder))
        assert r.returncode == 0, r.stderr
        assert "in 13 masked tensors are zero (50.00%)" in r.stdout
        zeros_match_masks(folder)
        report = json.loads((folder / "sparsity.json").read_text())
        assert report["global"]["sparsity"] == pytest.approx(0.5, abs=1e-4)
    # the gradual schedule ran over the first half (steps 0..3) and the Trainer logged its sparsity
    history = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    logged = [h["sparsity"] for h in history if "sparsity" in h]
    assert logged and logged[-1] == pytest.approx(0.5, abs=1e-4)
    meta = json.loads((out / "compress.json").read_text())
    assert [h["step"] for h in meta["pruning"]["history"]] == [0, 1, 2, 3]
    assert meta["label_names"] == ["negative", "positive"]
    header, body = card(out)
    assert header["base_model"] == str(tiny_bert) and "pruned" in header["tags"]
    accuracy = float(re.search(r"dev accuracy ([0-9.]+)", stdout).group(1))
    metric = header["model-index"][0]["results"][0]["metrics"][0]
    assert metric["type"] == "accuracy" and metric["value"] == pytest.approx(accuracy, abs=1e-3)
    assert "global: 50.0%" in body and "trainer_prune.py" in body and "learning_rate: 0.001" in body
    r = run_cli("measure", str(out), "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    assert "global: 50.0%" in r.stdout and "effective" in r.stdout
    r = run_cli("export", str(out), "--to", str(tmp_path / "m.onnx"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m.json").read_text())["parity_fp32"]["max_abs_diff"]["logits"] <= 1e-4


def test_trainer_prune_reads_a_task_through_compress_loaders(tiny_bert, tmp_path):
    """--task/--data-dir/--train-limit: a GLUE-format SST-2 folder, read by compress's own loader,
    cut to its first 24 training sentences (3 steps of 8), evaluated on its dev file."""
    words = ["good", "fine", "great", "bad", "awful", "poor"]
    for split, n in (("train", 40), ("dev", 12)):
        rows = [f"a {words[i % 6]} film {i}\t{int(i % 6 < 3)}" for i in range(n)]
        (tmp_path / "sst2").mkdir(exist_ok=True)
        (tmp_path / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    r = run_example("trainer_prune.py", "--model", str(tiny_bert), "--task", "sst2", "--data-dir",
                    str(tmp_path), "--train-limit", "24", "--batch-size", "8", "--max-length", "32",
                    "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"sparsity 40\.0% .*; dev accuracy [0-9.]+ on 12 sst2 examples", r.stdout), r.stdout
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-3"]  # one epoch of 24 / 8
    meta = json.loads((out / "compress.json").read_text())
    assert meta["label_names"] == ["negative", "positive"] and meta["dataset"] == "sst2"
    bad = run_example("trainer_prune.py", "--task", "nope", "--out", str(tmp_path / "x"))
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown task 'nope'; known tasks:")


def test_plain_loop_prunes_and_distils_to_the_requested_sparsity(trainer_pruned, tiny_bert, tmp_path):
    teacher, _ = trainer_pruned
    out = tmp_path / "kd"
    r = run_example("plain_loop_prune_kd.py", "--teacher", str(teacher), "--student", str(tiny_bert),
                    "--sparsity", "0.6", *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"step 6/6: loss [0-9.]+ \(task [0-9.]+, kd [0-9.]+\), sparsity 60\.0%", r.stdout)
    v = run_cli("verify", str(out))
    assert v.returncode == 0, v.stderr
    assert "(60.00%)" in v.stdout
    zeros_match_masks(out)
    masks = load_file(str(out / "masks.safetensors"))
    for name, m in masks.items():  # local scope: every matrix on its own at 60%
        assert int((~m.bool()).sum()) == round(0.6 * m.numel()), name
    header, _ = card(out)
    assert {"pruned", "distilled"} <= set(header["tags"]) and header["base_model"] == str(tiny_bert)


def test_trainer_distillation_with_pruning(trainer_pruned, tiny_bert, tmp_path):
    teacher, _ = trainer_pruned
    out = tmp_path / "distilled"
    r = run_example("trainer_distill.py", "--teacher", str(teacher), "--student", str(tiny_bert),
                    "--sparsity", "0.3", *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    v = run_cli("verify", str(out))
    assert v.returncode == 0 and "(30.00%)" in v.stdout, v.stderr
    header, _ = card(out)
    assert {"pruned", "distilled"} <= set(header["tags"])
    meta = json.loads((out / "compress.json").read_text())
    assert meta["distillation"]["teacher"] == str(teacher) and meta["distillation"]["kd_lambda"] == 4.0


def test_oneshot_sparsegpt_prunes_from_training_sentences_and_saves_what_verify_reads(tiny_bert, tmp_path):
    out = tmp_path / "sgpt"
    r = run_example("oneshot_sparsegpt.py", "--model", str(tiny_bert), "--sparsity", "0.5",
                    "--finetune-steps", "4", "--calibration-samples", "32", "--max-length", "32",
                    "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"sparsegpt: sparsity (\d+\.\d)% of (\d+) matrices; dev accuracy ([0-9.]+) dense "
                  r"-> ([0-9.]+) pruned", r.stdout)
    assert m and float(m.group(1)) == pytest.approx(50.0, abs=0.1), r.stdout
    zeros_match_masks(out)
    assert run_cli("verify", str(out)).returncode == 0
    r = run_example("oneshot_sparsegpt.py", "--model", str(tiny_bert), "--pattern", "2:4", "--criterion",
                    "wanda", "--finetune-steps", "0", "--calibration-samples", "16", "--max-length", "32",
                    "--out", str(tmp_path / "wanda24"))
    assert r.returncode == 0, r.stderr[-3000:]
    weights = load_file(str(tmp_path / "wanda24" / "model.safetensors"))
    layer = [w for k, w in weights.items() if ".encoder.layer." in k and w.ndim == 2]
    assert layer and all(((w.reshape(-1, 4) == 0).sum(dim=1) >= 2).all() for w in layer)
