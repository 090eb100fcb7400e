"""Run folders: complete or absent, kept for resume only when a checkpoint exists, metrics rewound."""

from __future__ import annotations

import json

import pytest
import torch

from compress.core.errors import DataError, UsageError
from compress.core.runs import RunDir, records_upto
from compress.training.loop import save_checkpoint


def _checkpoint(run: RunDir, step: int) -> None:
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_checkpoint(run.checkpoint_dir, m, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                    [], step)


def test_success_renames_and_nothing_exists_before_enter(tmp_path):
    run = RunDir("x", out=tmp_path / "r")
    assert not list(tmp_path.iterdir())
    with run:
        assert run.path.name == ".tmp-r"
        run.write_summary({"ok": 1})
    assert run.path == (tmp_path / "r").resolve()
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == {"ok": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@pytest.mark.parametrize("exc", [DataError("bad row"), KeyboardInterrupt(), OSError(28, "No space"),
                                 RuntimeError("boom")])
def test_failure_before_a_checkpoint_leaves_nothing(tmp_path, exc):
    with pytest.raises(type(exc)), RunDir("x", out=tmp_path / "r") as run:
        run.write_config({"a": 1})
        raise exc
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError(28, "No space"), RuntimeError("CUDA OOM")])
def test_failure_after_a_checkpoint_keeps_it_for_resume(tmp_path, exc):
    with pytest.raises(type(exc)), RunDir("x", out=tmp_path / "r") as run:
        _checkpoint(run, 4)
        raise exc
    assert (tmp_path / ".tmp-r" / "checkpoint" / "step-00000004" / "state.pt").is_file()
    assert not (tmp_path / "r").exists()
    with pytest.raises(UsageError, match="pass --resume"):
        RunDir("x", out=tmp_path / "r")


def test_resume_rewinds_metrics_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "r") as run:
        for s in range(1, 6):
            run.log_metrics({"step": s, "loss": s / 10})
        _checkpoint(run, 5)
        for s in range(6, 8):
            run.log_metrics({"step": s, "loss": s / 10})
        with open(run.path / "metrics.jsonl", "a") as fh:
            fh.write('{"step": 8, "lo')  # killed mid-write
        raise KeyboardInterrupt
    with RunDir("x", out=tmp_path / "r", resume=True) as run:
        steps = [json.loads(x)["step"] for x in (run.path / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3, 4, 5]
        assert run.resumed


def test_records_upto(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"note": "header"}\n{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 2, "eval": 1}\n')
    assert records_upto(p, 2) == ['{"note": "header"}\n', '{"step": 1}\n', '{"step": 2}\n']
    assert records_upto(p, 0) == ['{"note": "header"}\n']
    p.write_text('{"step": 1}\n{"step": 2}')  # last line without newline: cut short
    assert records_upto(p, 9) == ['{"step": 1}\n']


def test_resume_refuses_different_options_and_records_the_resume(tmp_path):
    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "r") as run:
        run.write_config({"lr": 0.1, "seed": 1, "resume": False})
        run.write_env(1)
        _checkpoint(run, 2)
        raise KeyboardInterrupt
    with pytest.raises(UsageError, match=r"lr: 0.1 -> 0.2"), \
            RunDir("x", out=tmp_path / "r", resume=True) as run:
        run.write_config({"lr": 0.2, "seed": 1, "resume": True})
    assert (tmp_path / ".tmp-r" / "checkpoint" / "step-00000002").is_dir()  # still there
    with RunDir("x", out=tmp_path / "r", resume=True) as run:
        run.write_config({"lr": 0.1, "seed": 1, "resume": True})
        run.write_env(1)
    env = json.loads((tmp_path / "r" / "env.json").read_text())
    assert env["seed"] == 1 and len(env["resumes"]) == 1


def test_resume_of_a_run_that_never_started_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(UsageError, match="no interrupted run to resume at .*drop --resume"):
        RunDir("x", out=tmp_path / "r", resume=True)
    (tmp_path / "done").mkdir()
    with pytest.raises(UsageError, match="is a finished run: there is nothing to resume"):
        RunDir("x", out=tmp_path / "done", resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done"]


@pytest.mark.parametrize("out, needle", [("file.txt", "is an existing file"),
                                         ("file.txt/sub", "is a file, so no folder"),
                                         ("a\x00b", "NUL byte"), ("", "--out is empty")])
def test_bad_out_paths(tmp_path, monkeypatch, out, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("keep me")
    with pytest.raises(UsageError, match=needle):
        RunDir("x", out=out)
    assert (tmp_path / "file.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_existing_run_is_never_overwritten_and_resume_needs_out(tmp_path, monkeypatch):
    (tmp_path / "r").mkdir()
    with pytest.raises(UsageError, match="already exists"):
        RunDir("x", out=tmp_path / "r")
    with pytest.raises(UsageError, match="--resume needs --out"):
        RunDir("x", resume=True)


def test_run_names_cannot_escape_the_artifacts_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_ARTIFACTS", str(tmp_path / "art"))
    with RunDir("cmd", name="../../evil/x") as run:
        pass
    assert run.path.parent == tmp_path / "art" / "cmd"
    assert run.path.name.endswith("-evil-x") and not (tmp_path / "evil").exists()


def test_another_loops_checkpoint_is_kept_on_ctrl_c_but_not_on_bad_input(tmp_path):
    """Distillation keeps its own ``checkpoint/student.pt`` and epoch records; RunDir respects them."""
    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "a") as run:
        run.log_metrics({"epoch": 1, "loss": 0.5})
        run.checkpoint_dir.mkdir()
        (run.checkpoint_dir / "student.pt").write_bytes(b"state")
        raise KeyboardInterrupt
    assert (tmp_path / ".tmp-a" / "checkpoint" / "student.pt").is_file()
    with RunDir("x", out=tmp_path / "a", resume=True) as run:  # no step checkpoints: records untouched
        assert (run.path / "metrics.jsonl").read_text() == '{"epoch": 1, "loss": 0.5}\n'
    with pytest.raises(UsageError), RunDir("x", out=tmp_path / "b") as run:
        run.checkpoint_dir.mkdir()
        raise UsageError("embed_dim differs")
    assert not (tmp_path / ".tmp-b").exists()


def test_a_failed_resume_never_removes_the_interrupted_run(tmp_path):
    (tmp_path / ".tmp-r").mkdir()
    (tmp_path / ".tmp-r" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(DataError), RunDir("x", out=tmp_path / "r", resume=True):
        raise DataError("still bad")
    assert (tmp_path / ".tmp-r").is_dir()


def test_resume_survives_damaged_config_and_env_files(tmp_path):
    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "r") as run:
        _checkpoint(run, 2)
        raise KeyboardInterrupt
    (tmp_path / ".tmp-r" / "config.yaml").write_bytes(b"lr: [0.1\n\xff")  # torn / not UTF-8
    (tmp_path / ".tmp-r" / "env.json").write_text('{"seed": 1')
    with RunDir("x", out=tmp_path / "r", resume=True) as run:
        run.write_config({"lr": 0.1})
        run.write_env(1)
    assert (tmp_path / "r" / "config.yaml").read_text() == "lr: 0.1\n"
    assert json.loads((tmp_path / "r" / "env.json").read_text())["seed"] == 1


def _phase_checkpoint(run: RunDir, phase: str, step: int) -> None:
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    save_checkpoint(run.phase_checkpoint_dir(phase), m, opt,
                    torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), [], step)


def _steps(run: RunDir) -> list[tuple]:
    recs = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    return [(r.get("phase"), r["step"], "eval" in r) for r in recs]


def test_resume_keeps_finished_phases_and_rewinds_the_unfinished_one(tmp_path):
    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "r") as run:
        assert run.phase_results("dense") is None  # a fresh run has finished nothing
        for s in (1, 2, 3):
            run.log_metrics({"step": s, "loss": 0.1})
        _phase_checkpoint(run, "dense", 3)
        run.finish_phase("dense", {"steps": 3, "eval": {"score": 0.25}},
                         [{"phase": "dense", "step": 3, "eval": {"score": 0.25}}])
        for s in (1, 2, 3):
            run.log_metrics({"phase": "recovery", "step": s, "loss": 0.2})
        _phase_checkpoint(run, "recovery", 2)
        raise KeyboardInterrupt
    with RunDir("x", out=tmp_path / "r", resume=True) as run:
        assert run.phase_results("dense") == {"steps": 3, "eval": {"score": 0.25}}
        assert run.phase_results("recovery") is None
        # dense's records (its step 3 is not cut by recovery's checkpoint at 2), recovery's up to 2
        assert _steps(run) == [(None, 1, False), (None, 2, False), (None, 3, False), ("dense", 3, True),
                               ("recovery", 1, False), ("recovery", 2, False)]


def test_a_kill_between_finishing_a_phase_and_logging_its_records_logs_them_once(tmp_path):
    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "r") as run:
        run.log_metrics({"step": 1, "loss": 0.1})
        run.finish_phase("dense", {"steps": 1}, [{"phase": "dense", "step": 1, "eval": 1.0}])
        (run.path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.1}\n{"phase": "de')  # torn
        raise KeyboardInterrupt
    with RunDir("x", out=tmp_path / "r", resume=True) as run:
        assert _steps(run) == [(None, 1, False), ("dense", 1, True)]
        assert run.phase_results("dense") == {"steps": 1}


def test_a_finished_phase_keeps_a_run_stopped_by_bad_input_for_resume(tmp_path):
    with pytest.raises(DataError), RunDir("x", out=tmp_path / "r") as run:
        run.finish_phase("before", {"loss": 2.0})
        raise DataError("the next phase found bad data")
    assert (tmp_path / ".tmp-r" / "checkpoint" / "before" / "done.json").is_file()


def _other_live_pid():
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_run_being_written_by_a_live_process_is_never_opened_twice(tmp_path):
    from compress.core.runs import OWNER_FILE

    with RunDir("x", out=tmp_path / "r") as run:
        assert (run.path / OWNER_FILE).read_text().strip() == str(__import__("os").getpid())
        other = _other_live_pid()
        try:  # the same folder, recorded as owned by another live process
            (run.path / OWNER_FILE).write_text(f"{other.pid}\n")
            for resume in (False, True):
                with pytest.raises(UsageError) as e:
                    RunDir("x", out=tmp_path / "r", resume=resume)
                msg = str(e.value)
                assert f"running process (PID {other.pid})" in msg and "pass --resume" not in msg
        finally:
            other.kill()
            other.wait()
        _checkpoint(run, 2)
    assert not (tmp_path / "r" / OWNER_FILE).exists()  # the finished folder carries no lock


def test_the_lock_of_a_dead_process_lets_resume_continue(tmp_path):
    from compress.core.runs import OWNER_FILE

    with pytest.raises(KeyboardInterrupt), RunDir("x", out=tmp_path / "r") as run:
        _checkpoint(run, 2)
        raise KeyboardInterrupt
    dead = _other_live_pid()
    dead.kill()
    dead.wait()
    (tmp_path / ".tmp-r" / OWNER_FILE).write_text(f"{dead.pid}\n")  # left by a SIGKILLed run
    with pytest.raises(UsageError, match="pass --resume"):
        RunDir("x", out=tmp_path / "r")
    with RunDir("x", out=tmp_path / "r", resume=True) as run:
        assert run.resumed
    assert (tmp_path / "r").is_dir()
