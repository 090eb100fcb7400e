"""A run folder is complete or absent: Ctrl-C and a failing save, injected into the real CLI
(``compress.cli.main.main`` in process) at chosen points."""

from __future__ import annotations

import errno
import json

import pytest

import compress.models.loading
from compress.cli.main import main
from compress.core.runs import RunDir
from tests.integration.test_resume import tiny_classifier  # noqa: F401 - fixture

ARGS = ["--max-steps", "6", "--batch-size", "8", "--max-length", "24", "--log-every", "1", "--seed", "3"]


def _interrupt_at(monkeypatch, step: int, exc: BaseException) -> None:
    real = RunDir.log_metrics

    def log(self, record):
        real(self, record)
        if record.get("step") == step and "loss" in record:
            raise exc

    monkeypatch.setattr(RunDir, "log_metrics", log)


def _steps(run):
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_ctrl_c_before_any_checkpoint_leaves_nothing(tiny_classifier, tmp_path, monkeypatch, capsys):  # noqa: F811
    _interrupt_at(monkeypatch, 2, KeyboardInterrupt())
    code = main(["finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(tmp_path / "r")])
    assert code == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_after_a_checkpoint_keeps_it_and_resume_completes(tiny_classifier, tmp_path,  # noqa: F811
                                                                  monkeypatch, capsys):
    base = ["finetune", "--model", str(tiny_classifier), *ARGS, "--checkpoint-every", "2",
            "--out", str(tmp_path / "r")]
    _interrupt_at(monkeypatch, 3, KeyboardInterrupt())
    assert main(base) == 130
    assert "--resume" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-r"]
    assert (tmp_path / ".tmp-r" / "checkpoint" / "step-00000002").is_dir()
    monkeypatch.undo()
    assert main([*base, "--resume"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert _steps(tmp_path / "r") == [1, 2, 3, 4, 5, 6, 6]  # 6 twice: the last loss and the eval record
    assert not (tmp_path / "r" / "checkpoint").exists()


def _failing_save(monkeypatch):
    real = compress.models.loading.save_model  # what the training workflows save through (save_run_model)

    def save_then_disk_full(model, tokenizer, folder, meta):
        real(model, tokenizer, folder, meta)
        (folder / "model.safetensors").write_bytes(b"\0" * 10)  # a torn file
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "model.safetensors"))

    monkeypatch.setattr(compress.models.loading, "save_model", save_then_disk_full)


def test_disk_full_while_saving_the_model_leaves_no_run_folder(tiny_classifier, tmp_path,  # noqa: F811
                                                               monkeypatch, capsys):
    _failing_save(monkeypatch)
    code = main(["finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(tmp_path / "r")])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("compress finetune: error: [Errno 28] No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_after_checkpoints_keeps_them_and_no_final_folder(tiny_classifier, tmp_path,  # noqa: F811
                                                                    monkeypatch):
    base = ["finetune", "--model", str(tiny_classifier), *ARGS, "--checkpoint-every", "2",
            "--out", str(tmp_path / "r")]
    _failing_save(monkeypatch)
    assert main(base) == 1
    assert not (tmp_path / "r").exists()
    assert (tmp_path / ".tmp-r" / "checkpoint" / "step-00000004").is_dir()
    monkeypatch.undo()
    assert main([*base, "--resume"]) == 0  # resumes from step 4, not from scratch
    assert _steps(tmp_path / "r") == [1, 2, 3, 4, 5, 6, 6]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 6
    assert len(json.loads((tmp_path / "r" / "env.json").read_text())["resumes"]) == 1


@pytest.mark.parametrize("exc", [RuntimeError("simulated crash")])
def test_a_crash_before_the_first_checkpoint_propagates_and_leaves_nothing(tiny_classifier, tmp_path,  # noqa: F811
                                                                           monkeypatch, exc):
    _interrupt_at(monkeypatch, 1, exc)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["finetune", "--model", str(tiny_classifier), *ARGS, "--out", str(tmp_path / "r")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_model_file_is_one_line_and_leaves_nothing(tiny_classifier, tmp_path, capsys, damage):  # noqa: F811
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_classifier, model)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"\x00garbage" * 100)
    code = main(["finetune", "--model", str(model), *ARGS, "--out", str(tmp_path / "r")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"compress finetune: error: {weights}"), err
    assert "copy the folder again" in err[0]
    assert not (tmp_path / "r").exists() and not (tmp_path / ".tmp-r").exists()


def test_sigterm_is_handled_as_ctrl_c_and_the_run_resumes(tiny_classifier, tmp_path, monkeypatch,  # noqa: F811
                                                          capsys):
    import os
    import signal

    from compress.core.runs import OWNER_FILE

    base = ["finetune", "--model", str(tiny_classifier), *ARGS, "--checkpoint-every", "2",
            "--out", str(tmp_path / "r")]
    real = RunDir.log_metrics

    def log(self, record):
        real(self, record)
        if record.get("step") == 3 and "loss" in record:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(RunDir, "log_metrics", log)
    before = signal.getsignal(signal.SIGTERM)
    assert main(base) == 143
    assert signal.getsignal(signal.SIGTERM) is before  # restored for the caller
    err = capsys.readouterr().err
    assert "terminated (SIGTERM)" in err and "--resume" in err
    assert (tmp_path / ".tmp-r" / "checkpoint" / "step-00000002").is_dir()
    assert not (tmp_path / ".tmp-r" / OWNER_FILE).exists()
    monkeypatch.undo()
    assert main([*base, "--resume"]) == 0
    assert _steps(tmp_path / "r") == [1, 2, 3, 4, 5, 6, 6]


def test_sigterm_inside_a_save_that_rewraps_it_is_still_one_line_and_143(tiny_classifier, tmp_path,  # noqa: F811
                                                                          monkeypatch, capsys):
    """torch.save's zip writer catches an interrupt mid-write and raises its own RuntimeError from
    it: the CLI still reports the SIGTERM in one line, exit 143, and leaves no finished run."""
    import os
    import signal
    import time

    import torch

    real = torch.save

    def save(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    code = main(["finetune", "--model", str(tiny_classifier), *ARGS, "--checkpoint-every", "2",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 143, err
    assert len(err) == 1 and "terminated (SIGTERM)" in err[0], err
    assert not (tmp_path / "r").exists()
