"""Kill a real ``compress finetune`` with SIGKILL, resume it, and compare with an uninterrupted run.

The model is a tiny BERT that already has a 2-label head for the sample task, so loading it draws no
random numbers and every run starts from the same weights (the loop seeds itself; see the report on
seeding the head of a freshly loaded encoder).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, kill_at_first_checkpoint, run_cli, write_tiny_squad

ARGS = ("--max-steps", "16", "--batch-size", "8", "--max-length", "32", "--log-every", "1",
        "--checkpoint-every", "4", "--seed", "7", "--lr", "1e-3")


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from compress.models.loading import packaged_model_path

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_cls")
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, num_labels=2)  # dropout 0.1 on: its RNG must replay
    BertForSequenceClassification(cfg).save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(packaged_model_path("minilm")).save_pretrained(folder)
    (folder / "compress.json").write_text(json.dumps(
        {"task": "sample", "label_names": ["negative", "positive"], "multilabel": False}))
    return folder


@pytest.fixture(scope="module")
def reference(tiny_classifier, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    r = run_cli("finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_same_as_reference(run: Path, ref: Path) -> None:
    got, want = _records(run), _records(ref)
    steps = [r["step"] for r in got if "loss" in r]
    assert steps == list(range(1, 17)), steps  # no step lost, none duplicated
    assert got == want  # every logged loss and lr, and the eval record, bit for bit
    s, w = json.loads((run / "summary.json").read_text()), json.loads((ref / "summary.json").read_text())
    assert s["eval"] == w["eval"] and s["steps"] == w["steps"] == 16
    a = load_file(run / "model" / "model.safetensors")
    b = load_file(ref / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (run / "checkpoint").exists()  # removed once the run is complete
    assert len(json.loads((run / "env.json").read_text())["resumes"]) == 1


def test_sigkill_mid_training_then_resume_equals_uninterrupted(tiny_classifier, reference, tmp_path):
    out = tmp_path / "run"
    tmp = tmp_path / ".tmp-run"
    kill_at_first_checkpoint(["finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(out)], tmp)
    assert tmp.is_dir() and not out.exists()
    # without --resume the interrupted run is not silently overwritten
    r = run_cli("finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(out))
    assert r.returncode == 2 and "pass --resume" in r.stderr
    r = run_cli("finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    assert not tmp.exists()
    _assert_same_as_reference(out, reference)


KILL_DURING_THIRD_SAVE = textwrap.dedent("""
    import io, os, signal, sys
    import torch
    real_save, calls = torch.save, []

    def save_then_die(obj, f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the checkpoint of step 12: write half of it, then die
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save_then_die
    from compress.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_sigkill_during_checkpoint_save_keeps_previous_and_drops_later_metrics(
        tiny_classifier, reference, tmp_path):
    out = tmp_path / "run"
    tmp = tmp_path / ".tmp-run"
    base = ["finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", KILL_DURING_THIRD_SAVE, *base], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    ck = tmp / "checkpoint"
    assert sorted(p.name for p in ck.iterdir()) == [".step-00000012.tmp", "step-00000004", "step-00000008"]
    half = (ck / ".step-00000012.tmp" / "state.pt").stat().st_size
    full = (ck / "step-00000008" / "state.pt").stat().st_size
    assert 0 < half < full  # the interrupted write really was cut short
    assert [x["step"] for x in _records(tmp)][-1] == 12  # steps 9-12 were logged before the kill
    r = run_cli(*base, "--resume")
    assert r.returncode == 0, r.stderr
    _assert_same_as_reference(out, reference)  # 9-12 were dropped and logged again, once


def test_resume_refuses_changed_options_and_keeps_the_run(tiny_classifier, reference, tmp_path):
    from compress.training.loop import save_checkpoint

    out = tmp_path / "run"
    tmp = tmp_path / ".tmp-run"
    tmp.mkdir()  # an interrupted run: the reference's options and a checkpoint
    cfg = (reference / "config.yaml").read_text().replace(str(reference), str(out))
    (tmp / "config.yaml").write_text(cfg)
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_checkpoint(tmp / "checkpoint", m, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1), [], 8)
    r = run_cli("finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(out), "--resume",
                "--lr", "0.5")
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert errors == ["compress finetune: error: --resume with options that differ from the interrupted "
                      "run (lr: 0.001 -> 0.5); resume with the same options"], r.stderr
    assert "Traceback" not in r.stderr
    assert (tmp / "checkpoint" / "step-00000008").is_dir() and not out.exists()  # nothing lost
    r = run_cli("finetune", "--model", str(tiny_classifier), "--resume")
    assert r.returncode == 2 and "--resume needs --out" in r.stderr


def test_same_seed_same_metrics_from_an_encoder_without_head(tiny_bert, tmp_path):
    runs = []
    for name in ("a", "b"):
        r = run_cli("finetune", "--model", str(tiny_bert), "--max-steps", "3", "--batch-size", "8",
                    "--max-length", "24", "--log-every", "1", "--seed", "5", "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        runs.append(_records(tmp_path / name))
    assert runs[0] == runs[1]


# squad fine-tuning with PFA and a W1 critic: the objective's perturbation MLP is trained by the loop
# (an extra module), its critic by an optimizer of its own (checkpointed in the objective's state),
# and the gradient penalty draws from the global RNG. Pruning on squad rides on the same workflow
# with the pruning hook. 8 training windows at batch 2 make the 8 steps cross an epoch.
SQUAD_ARGS = ("--task", "squad", "--split-by-article", "4/2", "--max-steps", "8", "--batch-size", "2",
              "--max-length", "48", "--log-every", "1", "--checkpoint-every", "3", "--seed", "7",
              "--lr", "1e-3")
SQUAD_RUNS = {"finetune-pfa-w1": ("finetune", "--objective", "pfa", "--pfa-alignment", "w1"),
              "prune": ("prune", "--sparsity", "0.4")}


@pytest.mark.parametrize("kind", list(SQUAD_RUNS))
def test_squad_sigkill_then_resume_equals_uninterrupted(tiny_bert, tmp_path, kind):
    data = write_tiny_squad(tmp_path, n_articles=6)
    command, *extra = SQUAD_RUNS[kind]
    base = [command, "--model", str(tiny_bert), "--data-dir", str(data), *SQUAD_ARGS, *extra]
    ref = tmp_path / "ref"
    r = run_cli(*base, "--out", str(ref))
    assert r.returncode == 0, r.stderr
    out, tmp = tmp_path / "run", tmp_path / ".tmp-run"
    kill_at_first_checkpoint([*base, "--out", str(out)], tmp)
    assert [x["step"] for x in _records(tmp)] == [1, 2, 3] and not out.exists()
    r = run_cli(*base, "--out", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    got, want = _records(out), _records(ref)
    assert [x["step"] for x in got if "loss" in x] == list(range(1, 9))
    if kind == "finetune-pfa-w1":
        assert {"loss_original", "loss_perturbed", "alignment"} <= set(got[0])
    assert got == want  # losses, the objective's terms, lr and the eval record, bit for bit
    s, w = json.loads((out / "summary.json").read_text()), json.loads((ref / "summary.json").read_text())
    assert s["eval"] == w["eval"] and s["steps"] == w["steps"] == 8
    assert (out / "predictions.json").read_text() == (ref / "predictions.json").read_text()
    for f in ("model/model.safetensors", *(("masks.safetensors",) if command == "prune" else ())):
        a, b = load_file(out / f), load_file(ref / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    assert not (out / "checkpoint").exists() and not (ref / "checkpoint").exists()
    assert len(json.loads((out / "env.json").read_text())["resumes"]) == 1
