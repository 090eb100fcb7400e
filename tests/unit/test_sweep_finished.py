"""A sweep cell is finished when its run folder holds ``summary.json``, and only then: a folder
without one (a cell that exited 0 without writing it, or one whose summary was lost) is run again,
after what it left is removed, on the local backend and on the Ray backend.

The Ray backend is stood in for at the function level (``make_backend`` returns a backend that runs
each cell to completion in-process and reports it as ``RayBackend.wait`` does: name, exit code,
seconds, host), so no Ray cluster starts and nothing listens beyond this process; the counting of
finished cells is the sweep's own (``compress.recipes.sweep``) for both backends."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import compress.recipes.sweep as sweep_recipe
from compress.core.errors import CompressError
from compress.core.sweep_backends import Ended, runner_prefix
from compress.recipes.sweep import SweepConfig, build_plan, clean_unfinished, is_finished, run_sweep

PRETRAIN, FINETUNE = "pt-magnitude-s30", "ft-sst2-magnitude-s30-lr5e-05"  # FINETUNE needs PRETRAIN

# A cell as RunDir writes one (.tmp-<name>, renamed when complete). CELL_NO_SUMMARY=<name>: that cell
# renames its folder without a summary.json and still exits 0.
CELL = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    argv = sys.argv[1:]
    out = Path(argv[argv.index("--out") + 1])
    with open(out.parent / "starts.txt", "a") as fh:
        fh.write(out.name + "\\n")
    tmp = out.parent / (".tmp-" + out.name)
    tmp.mkdir()
    (tmp / "config.yaml").write_text("x")
    if os.environ.get("CELL_NO_SUMMARY") != out.name:
        (tmp / "summary.json").write_text(json.dumps({"eval": {"score": 0.5}, "metric": "accuracy"}))
    os.replace(tmp, out)
""")


class _RayLikeBackend:
    """What ``RayBackend`` hands the sweep, without Ray: each cell runs to its end when started,
    and ``wait`` reports it as an ``Ended`` with its exit code and a host."""

    name = "ray"

    def __init__(self, runner: str | None):
        self.runner, self.ended = runner, []

    def prepare(self, sweep_dir: Path) -> None:
        pass

    def describe(self) -> str:
        return "Ray stand-in: 1 node(s)"

    def has_room(self) -> bool:
        return True

    def start(self, name: str, argv: tuple[str, ...], log_path: Path) -> dict:
        t0 = time.time()
        with open(log_path, "ab") as fh:
            rc = subprocess.run([*runner_prefix(self.runner), *argv], stdout=fh,
                                stderr=subprocess.STDOUT).returncode
        self.ended.append(Ended(name, rc, round(time.time() - t0, 1), "127.0.0.1"))
        return {"status": "submitted"}

    def wait(self, timeout: float) -> list[Ended]:
        ended, self.ended = self.ended, []
        return ended

    def stop(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture(params=["local", "ray"])
def backend(request, monkeypatch) -> str:
    if request.param == "ray":
        monkeypatch.setattr(sweep_recipe, "import_ray", lambda: None)  # the input check: Ray not needed
        monkeypatch.setattr(sweep_recipe, "make_backend",
                            lambda backend, jobs, runner, *rest: _RayLikeBackend(runner))
    return request.param


def _cfg(tmp_path: Path, backend: str) -> SweepConfig:
    script = tmp_path / "cell.py"
    script.write_text(CELL)
    return SweepConfig(sparsities=("0.3",), tasks=("sst2",), variants=("magnitude",),
                       pretrain_corpus=(str(tmp_path),), out=str(tmp_path / "sw"),
                       runner=f"{sys.executable} {script}", backend=backend)


def _starts(sweep: Path) -> list[str]:
    path = sweep / "starts.txt"
    return path.read_text().split() if path.is_file() else []


def _state(sweep: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((sweep / "sweep.json").read_text())["cells"]}


def test_only_a_folder_with_summary_json_is_finished_and_clean_up_keeps_only_that(tmp_path):
    assert not is_finished(tmp_path, "a")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.yaml").write_text("x")
    (tmp_path / ".tmp-a").mkdir()
    assert not is_finished(tmp_path, "a")  # a folder alone is not a finished cell
    clean_unfinished(tmp_path, "a")
    assert not (tmp_path / "a").exists() and not (tmp_path / ".tmp-a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{}")
    assert is_finished(tmp_path, "b")
    clean_unfinished(tmp_path, "b")
    assert (tmp_path / "b" / "summary.json").is_file()  # a finished cell is kept


def test_exit_0_without_summary_json_is_a_failed_cell_and_the_rerun_redoes_it(tmp_path, backend, monkeypatch):
    cfg = _cfg(tmp_path, backend)
    sweep = Path(cfg.out)
    assert [c.name for c in build_plan(cfg, sweep)] == [PRETRAIN, FINETUNE]
    monkeypatch.setenv("CELL_NO_SUMMARY", PRETRAIN)
    with pytest.raises(CompressError, match="2 of 2 cells did not finish"):
        run_sweep(cfg, log=lambda *_: None)
    state = _state(sweep)
    assert state[PRETRAIN]["status"] == "failed" and state[PRETRAIN]["returncode"] == 0
    assert state[PRETRAIN]["reason"] == "exit code 0 but no summary.json"
    assert state[FINETUNE]["status"] == "blocked" and _starts(sweep) == [PRETRAIN]
    assert (sweep / PRETRAIN).is_dir() and not is_finished(sweep, PRETRAIN)

    monkeypatch.delenv("CELL_NO_SUMMARY")
    (sweep / PRETRAIN / "left-behind").write_text("x")
    run_sweep(cfg, log=lambda *_: None)
    assert _starts(sweep) == [PRETRAIN, PRETRAIN, FINETUNE]
    assert {s["status"] for s in _state(sweep).values()} == {"finished"}
    assert not (sweep / PRETRAIN / "left-behind").exists()  # the unfinished folder was removed first


def test_a_finished_cell_that_lost_its_summary_json_is_run_again(tmp_path, backend):
    cfg = _cfg(tmp_path, backend)
    sweep = Path(cfg.out)
    run_sweep(cfg, log=lambda *_: None)
    assert _starts(sweep) == [PRETRAIN, FINETUNE]
    (sweep / FINETUNE / "summary.json").unlink()  # the folder stays, with its config.yaml
    lines = []
    run_sweep(cfg, log=lines.append)
    assert "2 cells, 1 finished already, 1 to run" in lines[0]
    assert ("Ray stand-in" in lines[0]) == (backend == "ray")
    assert _starts(sweep) == [PRETRAIN, FINETUNE, FINETUNE]
    state = _state(sweep)
    assert state[PRETRAIN]["skipped"] and not state[FINETUNE]["skipped"]
    assert state[FINETUNE]["status"] == "finished" and is_finished(sweep, FINETUNE)
