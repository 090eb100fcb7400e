"""The real CLI on a tiny random BERT: finetune, eval, and bad input."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


def _runs(root):
    return sorted(p for p in root.rglob("summary.json"))


def test_finetune_then_eval_reproduces_metric(tiny_bert, tmp_path):
    out = tmp_path / "run"
    r = run_cli("finetune", "--model", str(tiny_bert), "--max-steps", "4", "--batch-size", "8",
                "--max-length", "32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    for f in ("config.yaml", "env.json", "metrics.jsonl", "model/model.safetensors",
              "model/tokenizer.json", "model/compress.json"):
        assert (out / f).exists(), f
    assert summary["steps"] == 4
    r2 = run_cli("eval", "--model", str(out), "--out", str(tmp_path / "ev"))
    assert r2.returncode == 0, r2.stderr
    again = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert again["eval"]["accuracy"] == summary["eval"]["accuracy"]


def test_config_file_and_flag_precedence(tiny_bert, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {tiny_bert}\nmax_steps: 3\nbatch_size: 4\nmax_length: 16\nlr: 0.001\n")
    out = tmp_path / "run"
    r = run_cli("finetune", "--config", str(cfg), "--max-steps", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    import yaml
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["max_steps"] == 2  # flag wins over file
    assert resolved["lr"] == 0.001  # file wins over default
    assert resolved["warmup_ratio"] == 0.1  # default


@pytest.mark.parametrize("args, code, needle", [
    (["--task", "nope"], 2, "unknown task 'nope'"),
    (["--lr", "abc"], 2, "--lr"),
    (["--model", "./does/not/exist"], 1, "model folder not found"),
    (["--task", "sst2", "--data-dir", "/nonexistent-dir"], 1, "data directory not found"),
    (["--epochs", "-1"], 2, "--epochs"),
    (["--config", "/nonexistent.yaml"], 2, "config file not found"),
])
def test_bad_input_one_line_no_run_folder(tiny_bert, tmp_path, args, code, needle):
    out = tmp_path / "run"
    r = run_cli("finetune", "--model", str(tiny_bert), *args, "--out", str(out),
                env={"COMPRESS_ARTIFACTS": str(tmp_path / "a")})
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert any(needle in ln for ln in lines), r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_bad_data_files(tiny_bert, tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "train.csv").write_text("text,label\ngood,1\nbad,0\n")
    (d / "dev.csv").write_text("text,label\nfine,7\n")
    base = ["finetune", "--task", "csv", "--model", str(tiny_bert), "--data-dir", str(d),
            "--out", str(tmp_path / "run")]
    r = run_cli(*base)
    assert r.returncode == 1 and "label '7' is not in the label set" in r.stderr
    r = run_cli(*base, "--label-column", "stars")
    assert r.returncode == 1 and "no column 'stars'" in r.stderr
    (d / "train.csv").write_text("")
    r = run_cli(*base)
    assert r.returncode == 1 and "is empty" in r.stderr
    (d / "train.csv").unlink()
    r = run_cli(*base)
    assert r.returncode == 1 and "no train file" in r.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_whose_output_goes_to_a_file_prints_its_progress(tiny_bert, tmp_path):
    """No terminal, no progress bar: every --log-every steps one line on stdout with the step, the
    window's mean loss and the time left, as the run goes (stderr stays for errors)."""
    out = tmp_path / "run"
    r = run_cli("finetune", "--model", str(tiny_bert), "--max-steps", "4", "--log-every", "2",
                "--batch-size", "8", "--max-length", "32", "--out", str(out), isolated=True)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("train step")]
    assert not any(line.startswith("train step") for line in r.stderr.splitlines())
    assert [line.split(":")[0] for line in lines] == ["train step 2/4", "train step 4/4"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in logged if "loss" in row and "step" in row]
    assert [f"loss {x:.4f}" for x in losses[:2]] == [line.split(": ")[1].split(",")[0] for line in lines]
    assert lines[-1].endswith("about 0 min 00 s left")
