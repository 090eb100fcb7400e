"""Kill a real ``compress prune`` with SIGKILL, resume it, and compare with an uninterrupted run.

Stage finetune is killed from outside once its first checkpoint is on disk (as the finetune test in
``test_resume.py`` does). Stage after-finetune is killed from inside at a chosen step of its second
phase (recovery), so the kill always lands there; the resumed run must not train the finished dense
phase again. Either way the metrics, the masks and the weights must equal an uninterrupted run's
bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, kill_at_first_checkpoint, run_cli

BASE = ("prune", "--sparsity", "0.5", "--schedule", "gradual", "--batch-size", "8", "--max-length", "32",
        "--log-every", "1", "--checkpoint-every", "4", "--seed", "7", "--lr", "1e-3")
FINETUNE = ("--stage", "finetune", "--max-steps", "24")
AFTER = ("--stage", "after-finetune", "--max-steps", "12", "--recovery-steps", "12")


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_same_as_reference(run: Path, ref: Path) -> None:
    assert _records(run) == _records(ref)  # every loss, lr and eval record, once, bit for bit
    s, w = json.loads((run / "summary.json").read_text()), json.loads((ref / "summary.json").read_text())
    for key in ("eval", "eval_dense", "steps", "dense_steps", "recovery_steps", "prune_history", "sparsity"):
        assert s.get(key) == w.get(key), key
    for f in ("masks.safetensors", "model/model.safetensors"):
        a, b = load_file(run / f), load_file(ref / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    assert not (run / "checkpoint").exists()  # removed once the run is complete
    assert len(json.loads((run / "env.json").read_text())["resumes"]) == 1


def _reference(tiny_bert: Path, stage: tuple[str, ...], out: Path) -> Path:
    r = run_cli(*BASE, *stage, "--model", str(tiny_bert), "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_sigkill_mid_gradual_pruning_then_resume_equals_uninterrupted(tiny_bert, tmp_path):
    ref = _reference(tiny_bert, FINETUNE, tmp_path / "ref")
    out, tmp = tmp_path / "run", tmp_path / ".tmp-run"
    args = [*BASE, *FINETUNE, "--model", str(tiny_bert), "--out", str(out)]
    kill_at_first_checkpoint(args, tmp)
    assert tmp.is_dir() and not out.exists()
    r = run_cli(*args)  # without --resume the interrupted run is not silently overwritten
    assert r.returncode == 2 and "pass --resume" in r.stderr
    r = run_cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert not tmp.exists()
    _assert_same_as_reference(out, ref)
    history = json.loads((out / "summary.json").read_text())["prune_history"]
    assert [h["step"] for h in history] == list(range(13))  # the ramp of the first half, each step once


KILL_OR_FORBID = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import compress.training.loop as training
    real_save = training.save_checkpoint

    def save(folder, model, optimizer, scheduler, hooks, step, **kwargs):
        phase = Path(folder).name
        if phase == os.environ.get("FORBID_PHASE"):
            sys.stderr.write(f"phase {phase} trained again (checkpoint of step {step})\\n")
            os._exit(3)
        if f"{phase}:{step}" == os.environ.get("KILL_AT"):  # steps up to here are logged, not saved
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(folder, model, optimizer, scheduler, hooks, step, **kwargs)

    training.save_checkpoint = save
    from compress.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_after_finetune_killed_in_recovery_resumes_there_without_redoing_dense(tiny_bert, tmp_path):
    ref = _reference(tiny_bert, AFTER, tmp_path / "ref")
    out, tmp = tmp_path / "run", tmp_path / ".tmp-run"
    args = [*BASE, *AFTER, "--model", str(tiny_bert), "--out", str(out)]

    def run(*extra: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", KILL_OR_FORBID, *args, *extra], capture_output=True,
                              text=True, cwd=ROOT, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **env})

    r = run(KILL_AT="recovery:8")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    ck = tmp / "checkpoint"
    assert (ck / "dense" / "done.json").is_file() and (ck / "dense" / "step-00000012").is_dir()
    assert sorted(p.name for p in (ck / "recovery").iterdir()) == ["step-00000004"]
    last = _records(tmp)[-1]
    assert (last["phase"], last["step"]) == ("recovery", 8)  # 5-8 logged after the checkpoint
    r = run("--resume", FORBID_PHASE="dense")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not tmp.exists()
    _assert_same_as_reference(out, ref)
    recs = _records(out)
    assert [x["step"] for x in recs if x.get("phase") == "recovery" and "loss" in x] == list(range(1, 13))
