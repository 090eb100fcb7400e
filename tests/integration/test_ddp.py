"""Two-process data-parallel training on CPU (gloo) through ``accelerate launch``.

accelerate 1.x runs ``--cpu`` scripts through its single-process launcher unless an MPI hostfile is
given, so two local CPU processes are started with its torchrun launcher (``--multi_gpu``) and
``ACCELERATE_USE_CPU=true``; ``train()`` then builds a gloo MULTI_CPU Accelerator. The worker
reports the world size it saw, so a launcher that silently starts one process fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_resume import tiny_classifier  # noqa: F401 - fixture

WORKER = Path(__file__).with_name("ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _launch(out: Path, *extra: str, procs: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "COMPRESS_NO_PROGRESS": "1", "PYTHONPATH": str(ROOT)}
    if procs == 1:
        cmd = [sys.executable, str(WORKER), str(out), *extra]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", str(procs), "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--main_process_port", "0", str(WORKER), str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)


@pytest.fixture(scope="module")
def two_and_one(tmp_path_factory):
    """The 2-process run (batch 4 per rank) and the 1-process reference (batch 8)."""
    base = tmp_path_factory.mktemp("ddp")
    r2 = _launch(base / "two")
    assert r2.returncode == 0, r2.stderr[-3000:]
    r1 = _launch(base / "one", "--batch-size", "8", procs=1)
    assert r1.returncode == 0, r1.stderr[-3000:]
    return base / "two", base / "one"


def test_two_ranks_agree_every_step_and_match_one_process(two_and_one):
    two, one = two_and_one
    a = json.loads((two / "result.json").read_text())
    b = json.loads((one / "result.json").read_text())
    assert a["world"] == 2 and b["world"] == 1
    assert a["steps"] == 6
    # the final parameters were gathered from both ranks and are bitwise equal
    assert len(a["param_checksums"]) == 2 and len(set(a["param_checksums"])) == 1
    # the masks changed during training (pruned 20% -> 50%), so the per-step check compared real updates
    assert len(set(a["mask_checksums"])) >= 3
    assert all(abs(s - 0.5) < 0.01 for s in a["sparsity"].values())
    # DDP averages the gradients: 2 ranks x batch 4 take the same steps as 1 process x batch 8
    # (rank_batches deals positions [8b, 8b+8) of the epoch order to step b either way)
    assert a["mask_checksums"] == b["mask_checksums"]
    la = [r["loss"] for r in a["losses"]]
    lb = [r["loss"] for r in b["losses"]]
    assert la == pytest.approx(lb, abs=1e-5)
    pa = torch.load(two / "params.pt", weights_only=True)
    pb = torch.load(one / "params.pt", weights_only=True)
    worst = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    assert worst < 1e-5, worst


def test_a_diverging_rank_is_caught_with_the_tensor_named(tmp_path):
    r = _launch(tmp_path / "div", "--diverge")
    assert r.returncode != 0
    msgs = [(tmp_path / "div" / f"error-rank{i}.txt").read_text() for i in (0, 1)]
    for m in msgs:
        assert "hook state (masks) after step 2 differs across ranks in 1 tensor(s)" in m, m
        assert "bert.encoder.layer.0.attention.self.query.weight" in m
        assert "\n" not in m
    assert not (tmp_path / "div" / "result.json").exists()


# -- the real CLI under a 2-process launch: one run folder, and SIGKILL + --resume replays exactly --

KILL_AFTER_STEP_5 = """
import os, signal, sys
from compress.core.runs import RunDir
real = RunDir.log_metrics

def log_then_die(self, record):
    real(self, record)
    if record.get("step") == 5 and "loss" in record:  # rank 0 logs; the launcher then ends rank 1
        os.kill(os.getpid(), signal.SIGKILL)

RunDir.log_metrics = log_then_die
from compress.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _launch_cli(script_or_module: list[str], args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COMPRESS_NO_PROGRESS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "docs" / "accelerate" / "ddp_cpu.yaml"), "--main_process_port", "0",
           *script_or_module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def test_cli_finetune_two_processes_sigkill_and_resume(tiny_classifier, tmp_path):  # noqa: F811
    args = ["finetune", "--model", str(tiny_classifier), "--max-steps", "8", "--batch-size", "4",
            "--max-length", "24", "--log-every", "1", "--checkpoint-every", "2", "--seed", "11"]
    r = _launch_cli(["-m", "compress"], [*args, "--out", str(tmp_path / "ref")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref"]  # no rank scratch folder left

    script = tmp_path / "kill_after_5.py"
    script.write_text(KILL_AFTER_STEP_5)
    out = tmp_path / "run"
    r = _launch_cli([str(script)], [*args, "--out", str(out)])
    assert r.returncode != 0 and not out.exists()
    assert (tmp_path / ".tmp-run" / "checkpoint" / "step-00000004").is_dir()
    r = _launch_cli(["-m", "compress"], [*args, "--out", str(out), "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]

    def records(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    # dropout is on: equal losses after the resume point need every rank's RNG restored
    assert records(out) == records(tmp_path / "ref")
    assert [x["step"] for x in records(out)] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kill_after_5.py", "ref", "run"]


def test_cli_prune_with_teacher_on_two_processes(tiny_classifier, tmp_path):  # noqa: F811
    """Distillation-aware pruning under DDP: the teacher's logits are computed once per run and are
    the ones a single process computes, the ranks' masks agree at every step (checked each step),
    and rank 0 alone writes the run, which verifies."""
    from safetensors.torch import load_file

    args = ["prune", "--model", str(tiny_classifier), "--teacher", "self", "--sparsity", "0.5",
            "--max-steps", "6", "--max-length", "24", "--log-every", "1", "--seed", "11",
            "--train-limit", "64", "--eval-limit", "32", "--rank-check-every", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COMPRESS_NO_PROGRESS": "1", "PYTHONPATH": str(ROOT)}
    one = subprocess.run([sys.executable, "-m", "compress", *args, "--batch-size", "8",
                          "--out", str(tmp_path / "one")], capture_output=True, text=True, env=env,
                         timeout=300, cwd=ROOT)
    assert one.returncode == 0, one.stderr[-3000:]
    r = _launch_cli(["-m", "compress"], [*args, "--batch-size", "4", "--out", str(tmp_path / "two")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]  # no rank scratch left
    assert r.stdout.count("sst2") + r.stdout.count("sample") == 1  # one rank reports the run

    cache = "teacher_logits/train.safetensors"
    a, b = load_file(str(tmp_path / "two" / cache)), load_file(str(tmp_path / "one" / cache))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logged = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    kd = [x["kd_loss"] for x in logged if "kd_loss" in x]
    assert len(kd) == 6 and all(v >= 0 and v == v for v in kd)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["distillation"]["teacher"] == "self"
    assert summary["sparsity"]["encoder"] == pytest.approx(0.5, abs=0.01)
    check = subprocess.run([sys.executable, "-m", "compress", "verify", str(tmp_path / "two")],
                           capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert check.returncode == 0, check.stderr


def test_cli_squad_prune_with_teacher_on_two_processes(tiny_bert, tmp_path):
    """Distillation-aware pruning on squad under DDP: KD on the start/end logits each step (the
    teacher runs on every rank's batch), masks checked across ranks each step, rank 0 alone writes
    the run, and its EM/F1 (scored over every eval window) are the ones a one-process
    ``compress eval`` of the saved model gives."""
    from safetensors.torch import load_file

    from tests.conftest import run_cli, write_tiny_squad

    (tmp_path / "data").mkdir()
    data = write_tiny_squad(tmp_path / "data", n_articles=5)
    qa = ["--task", "squad", "--data-dir", str(data), "--split-by-article", "4/1", "--max-length", "48",
          "--doc-stride", "16"]
    teacher = tmp_path / "teacher"
    r = run_cli("finetune", "--model", str(tiny_bert), *qa, "--seed", "7", "--max-steps", "3",
                "--batch-size", "8", "--out", str(teacher))
    assert r.returncode == 0, r.stderr
    before = load_file(str(teacher / "model" / "model.safetensors"))

    out = tmp_path / "two"
    prune = ["prune", "--model", str(teacher), *qa, "--seed", "7", "--teacher", "self", "--sparsity", "0.5",
             "--max-steps", "4", "--batch-size", "4", "--log-every", "1", "--rank-check-every", "1"]
    r = _launch_cli(["-m", "compress"], [*prune, "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "teacher", "two"]  # no rank scratch
    assert r.stdout.count("squad: EM =") == 1  # one rank reports the run

    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    kd = [x["kd_loss"] for x in logged if "kd_loss" in x]
    assert len(kd) == 4 and all(v >= 0 and v == v for v in kd)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["distillation"]["teacher"] == "self"
    assert set(summary["distillation"]["teacher_eval"]) >= {"exact_match", "f1"}
    sp = json.loads((out / "sparsity.json").read_text())
    assert all(abs(m["sparsity"] - 0.5) <= 0.005 for m in sp["matrices"].values())

    again = run_cli("eval", "--model", str(out / "model"), *qa, "--out", str(tmp_path / "ev"))
    assert again.returncode == 0, again.stderr
    ev = json.loads((tmp_path / "ev" / "summary.json").read_text())["eval"]
    assert ev["windows"] == summary["eval"]["windows"]
    assert (ev["exact_match"], ev["f1"]) == (summary["eval"]["exact_match"], summary["eval"]["f1"])
    assert run_cli("verify", str(out)).returncode == 0
    after = load_file(str(teacher / "model" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)  # the teacher is never updated


def test_cli_finetune_of_a_pruned_model_with_a_teacher_on_two_processes(tiny_classifier, tmp_path):  # noqa: F811
    """A pruned model recovering from a teacher under DDP: the kept masks are checked across ranks
    each step, and rank 0 alone writes the model, the masks and the summary (another rank cannot
    read back a model folder that ``save_pretrained`` wrote on rank 0 only)."""
    from safetensors.torch import load_file

    from tests.conftest import run_cli

    pruned = tmp_path / "pruned"
    r = run_cli("prune", "--model", str(tiny_classifier), "--stage", "after-finetune",
                "--schedule", "oneshot", "--sparsity", "0.5", "--max-steps", "2", "--recovery-steps", "1",
                "--max-length", "24", "--out", str(pruned))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "two"
    args = ["finetune", "--model", str(pruned), "--teacher", str(tiny_classifier), "--max-steps", "4",
            "--batch-size", "4", "--max-length", "24", "--log-every", "1", "--rank-check-every", "1",
            "--seed", "3", "--out", str(out)]
    r = _launch_cli(["-m", "compress"], args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pruned", "two"]  # no rank scratch left
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["distillation"]["teacher"] == str(tiny_classifier)
    w = load_file(str(out / "model" / "model.safetensors"))
    masks = load_file(str(out / "model" / "masks.safetensors"))
    assert masks.keys() == load_file(str(pruned / "model" / "masks.safetensors")).keys()
    for name, m in masks.items():
        assert torch.equal(w["bert." + name] == 0, ~m.bool()), name
    assert run_cli("verify", str(out)).returncode == 0
