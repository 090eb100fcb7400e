"""Grid parsing and resume semantics of compress.recipes.sweep, with a fake cell runner (no training).

The fake runner is a small Python script given as ``--runner``: it reads ``--out`` from the cell's
arguments, counts its starts in ``<sweep>/counts/<cell>``, optionally sleeps (to be killed), and
writes the run folder the way ``RunDir`` does: ``.tmp-<name>`` first, renamed when complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from compress.core.errors import CompressError, UsageError
from compress.recipes.sweep import SweepConfig, build_plan, parse_sparsities, run_sweep
from tests.conftest import run_cli

FAKE = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    argv = sys.argv[1:]
    out = Path(argv[argv.index("--out") + 1])
    name = out.name
    counts = out.parent / "counts"
    counts.mkdir(exist_ok=True)
    with open(counts / name, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    tmp = out.parent / (".tmp-" + name)
    tmp.mkdir()
    t0 = time.time()
    (tmp / "started").write_text("x")
    if os.environ.get("FAKE_SLOW") and name.startswith(os.environ["FAKE_SLOW"]):
        time.sleep(float(os.environ.get("FAKE_SLEEP", "60")))
    if os.environ.get("FAKE_FAIL") == name:
        sys.exit(3)
    s = float(argv[argv.index("--sparsity") + 1]) if "--sparsity" in argv else 0.0
    summary = {"eval": {"score": 0.9 - s / 2}, "metric": "accuracy"}
    if "pretrain" in argv:
        summary = {"mlm_loss": {"pruned_after": 2.0 + s}}
    (tmp / "summary.json").write_text(json.dumps(summary))
    (tmp / "times").write_text(f"{t0} {time.time()}")
    os.replace(tmp, out)
""")


@pytest.fixture
def fake_runner(tmp_path) -> str:
    script = tmp_path / "fake_cell.py"
    script.write_text(FAKE)
    return f"{sys.executable} {script}"


def test_parse_sparsities_ranges_and_lists():
    assert parse_sparsities(("0:0.9:0.1",)) == tuple(round(0.1 * i, 6) for i in range(10))
    assert parse_sparsities(("0.4", "0", "0.2", "0.2")) == (0.0, 0.2, 0.4)
    assert parse_sparsities("0:0.4:0.2,0.9") == (0.0, 0.2, 0.4, 0.9)
    assert parse_sparsities(("0.1:0.35:0.1",)) == (0.1, 0.2, 0.3)  # STOP not on the grid


@pytest.mark.parametrize("bad, words", [
    (("1.0",), "outside [0, 1)"), (("abc",), "'abc' is not a number"),
    (("0:0.5",), "START:STOP:STEP"), (("0:0.5:0",), "positive STEP"),
    (("0.5:0.1:0.1",), "STOP < START"), ((),  "empty"), (("nan",), "finite"),
])
def test_parse_sparsities_errors_name_the_value(bad, words):
    with pytest.raises(UsageError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_sparsities(bad)


def test_config_rejects_unknown_variant_and_id_without_corpus():
    with pytest.raises(UsageError, match="unknown variant 'magnitud'.*magnitude, random"):
        SweepConfig(variants=("magnitud",))
    with pytest.raises(UsageError, match="--pretrain-corpus"):
        SweepConfig(variants=("information-deletion",))
    with pytest.raises(UsageError, match="--jobs"):
        SweepConfig(jobs=0)


def test_plan_shares_dense_cell_and_orders_dependencies(tmp_path):
    cfg = SweepConfig(sparsities=("0", "0.5"), tasks=("sst2", "rte"), variants=("magnitude", "random"),
                      lrs=(1e-5, 2e-5), pretrain_corpus=("corpus.txt",))
    plan = build_plan(cfg, tmp_path)
    names = [c.name for c in plan]
    assert len(names) == len(set(names))
    # pre-training: dense + 2 criteria at 50%; downstream: per task and lr, 1 dense + 2 variants
    assert sum(c.kind == "pretrain" for c in plan) == 3
    assert sum(c.kind == "downstream" for c in plan) == 2 * 2 * 3
    dense = next(c for c in plan if c.name == "ft-sst2-dense-lr1e-05")
    assert dense.info["variants"] == ["magnitude", "random"] and dense.deps == ("pt-dense",)
    rnd = next(c for c in plan if c.name == "ft-rte-random-s50-lr2e-05")
    assert rnd.deps == ("pt-random-s50",)
    assert "--model" in rnd.argv and str(tmp_path / "pt-random-s50") in rnd.argv
    pos = {n: i for i, n in enumerate(names)}
    assert all(pos[d] < pos[c.name] for c in plan for d in c.deps)
    # without a corpus, magnitude/random prune while fine-tuning and have no dependencies
    plain = build_plan(SweepConfig(sparsities=("0", "0.5"), tasks=("sst2",)), tmp_path)
    assert [c.argv[:3] for c in plain if "s50" in c.name] == [("prune", "--stage", "finetune")] * 2
    assert all(not c.deps for c in plain)


def test_teacher_adds_a_kd_twin_of_every_cell_pruned_on_the_task(tmp_path):
    cfg = SweepConfig(sparsities=("0", "0.6"), tasks=("sst2",), variants=("magnitude", "after-finetune"),
                      teacher="self")
    plan = {c.name: c for c in build_plan(cfg, tmp_path)}
    # self: only after-finetune cells have a dense phase to distil from
    assert sorted(plan) == ["ft-sst2-after-finetune+kd-s60-lr5e-05", "ft-sst2-after-finetune-s60-lr5e-05",
                            "ft-sst2-dense-lr5e-05", "ft-sst2-magnitude-s60-lr5e-05"]
    twin = plan["ft-sst2-after-finetune+kd-s60-lr5e-05"]
    base = plan["ft-sst2-after-finetune-s60-lr5e-05"]
    i = twin.argv.index("--teacher")
    assert twin.argv[i + 1] == "self" and "--teacher" not in base.argv
    assert [a for a in twin.argv if a not in ("--teacher", "self")][:-1] == list(base.argv)[:-1]
    assert twin.info["variants"] == ["after-finetune+kd"]
    # the twin's curve starts at the shared dense cell
    assert "after-finetune+kd" in plan["ft-sst2-dense-lr5e-05"].info["variants"]
    # a fine-tuned teacher run: every variant pruned on the task gets a twin, with the path resolved
    run = tmp_path / "teacher"
    run.mkdir()
    plan = build_plan(SweepConfig(sparsities=("0.6",), tasks=("sst2",), variants=("magnitude", "random"),
                                  teacher=str(run)), tmp_path)
    kd = [c for c in plan if c.name.endswith("+kd-s60-lr5e-05") or "+kd" in c.name]
    assert len(kd) == 2 and all(c.argv[c.argv.index("--teacher") + 1] == str(run.resolve()) for c in kd)


def test_teacher_self_without_an_after_finetune_variant_is_refused():
    with pytest.raises(UsageError, match="--teacher self adds KD twins to after-finetune variants"):
        SweepConfig(sparsities=("0.6",), variants=("magnitude",), teacher="self")


def test_one_shot_variants_prune_the_shared_dense_cell_of_their_rate(tmp_path):
    cfg = SweepConfig(sparsities=("0", "0.5"), tasks=("sst2",), lrs=(1e-5, 2e-5),
                      variants=("magnitude", "sparsegpt", "oneshot-magnitude"))
    plan = build_plan(cfg, tmp_path)
    cells = {c.name: c for c in plan}
    pos = {c.name: i for i, c in enumerate(plan)}
    for lr in ("1e-05", "2e-05"):
        dense = cells[f"ft-sst2-dense-lr{lr}"]
        # the curves of all three variants start at the shared dense point
        assert dense.info["variants"] == ["magnitude", "oneshot-magnitude", "sparsegpt"]
        for variant, criterion in (("sparsegpt", "sparsegpt"), ("oneshot-magnitude", "magnitude")):
            c = cells[f"ft-sst2-{variant}-s50-lr{lr}"]
            assert c.deps == (dense.name,) and pos[dense.name] < pos[c.name]
            assert c.argv[:3] == ("prune", "--stage", "post-training")
            assert c.argv[c.argv.index("--criterion") + 1] == criterion
            assert c.argv[c.argv.index("--model") + 1] == str(tmp_path / dense.name)
            assert c.argv[c.argv.index("--calibration-samples") + 1] == "512"
            assert c.argv[c.argv.index("--lr") + 1] == repr(float(lr))
            # the post-training stage prunes once: no schedule; and no training without a teacher
            assert "--schedule" not in c.argv and "--recovery-steps" not in c.argv
            assert c.info["variants"] == [variant]
    assert cells["ft-sst2-magnitude-s50-lr1e-05"].argv[:3] == ("prune", "--stage", "finetune")
    # after continued pre-training the dense cell fine-tunes pt-dense, which a one-shot criterion
    # (refused by the pre-training stage) must not name
    plan = build_plan(SweepConfig(sparsities=("0.5",), variants=("sparsegpt",), calibration_samples=64,
                                  pretrain_corpus=("corpus.txt",)), tmp_path)
    assert [c.name for c in plan] == ["pt-dense", "ft-sst2-dense-lr5e-05", "ft-sst2-sparsegpt-s50-lr5e-05"]
    pt, dense, one = plan
    assert pt.argv[pt.argv.index("--criterion") + 1] == "magnitude" and dense.deps == ("pt-dense",)
    assert dense.info["variants"] == [] and one.deps == (dense.name,)
    assert one.argv[one.argv.index("--calibration-samples") + 1] == "64"


def test_one_shot_kd_twin_recovers_distilling_from_the_dense_cell(tmp_path):
    cfg = SweepConfig(sparsities=("0.6",), variants=("wanda",), teacher="self", recovery_steps=40)
    plan = {c.name: c for c in build_plan(cfg, tmp_path)}
    assert sorted(plan) == ["ft-sst2-dense-lr5e-05", "ft-sst2-wanda+kd-s60-lr5e-05",
                            "ft-sst2-wanda-s60-lr5e-05"]
    base, twin = plan["ft-sst2-wanda-s60-lr5e-05"], plan["ft-sst2-wanda+kd-s60-lr5e-05"]
    assert list(twin.argv[:-2]) == [*base.argv[:-2], "--teacher", "self", "--recovery-steps", "40"]
    assert twin.deps == base.deps == ("ft-sst2-dense-lr5e-05",)
    assert twin.info["variants"] == ["wanda+kd"]


@pytest.mark.parametrize("kw, words", [
    (dict(calibration_samples=64), "--calibration-samples applies to the one-shot variants"),
    (dict(variants=("sparsegpt",), recovery_steps=10), "--recovery-steps sets the training of the "
                                                       "one-shot variants' \\+kd twins; add --teacher"),
    (dict(variants=("sparsegpt",), calibration_samples=0), "calibration"),
])
def test_one_shot_options_without_their_variants_are_refused(kw, words):
    with pytest.raises(UsageError, match=words):
        SweepConfig(**kw)


def test_close_sparsities_get_cells_of_their_own(tmp_path):
    plan = build_plan(SweepConfig(sparsities=("0.99991", "0.99994", "0.4"), tasks=("sst2",),
                                  variants=("magnitude",), lrs=(2e-5,)), tmp_path)
    pruned = {c.name: c.argv for c in plan if "-s" in c.name}
    assert sorted(pruned) == ["ft-sst2-magnitude-s40-lr2e-05", "ft-sst2-magnitude-s99.991-lr2e-05",
                              "ft-sst2-magnitude-s99.994-lr2e-05"]
    assert "0.99994" in pruned["ft-sst2-magnitude-s99.994-lr2e-05"]


def _counts(sweep: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().split()) for p in (sweep / "counts").iterdir()}


def _cfg(sweep: Path, runner: str, **kw) -> SweepConfig:
    base = dict(sparsities=("0", "0.3", "0.6"), tasks=("sst2",), variants=("magnitude", "random"),
                pretrain_corpus=(str(sweep.parent),), out=str(sweep), runner=runner)
    return SweepConfig(**{**base, **kw})


def test_sweep_runs_every_cell_once_and_rerun_skips_all(tmp_path, fake_runner):
    sweep = tmp_path / "sw"
    cfg = _cfg(sweep, fake_runner, jobs=2)
    run_sweep(cfg, log=lambda *_: None)
    plan = build_plan(cfg, sweep)
    assert set(_counts(sweep)) == {c.name for c in plan}
    assert set(_counts(sweep).values()) == {1}
    state = json.loads((sweep / "sweep.json").read_text())
    assert {c["status"] for c in state["cells"]} == {"finished"}
    mtimes = {c.name: (sweep / c.name / "summary.json").stat().st_mtime_ns for c in plan}
    run_sweep(cfg, log=lambda *_: None)
    assert set(_counts(sweep).values()) == {1}  # nothing ran again
    assert mtimes == {c.name: (sweep / c.name / "summary.json").stat().st_mtime_ns for c in plan}
    assert all(c["skipped"] for c in json.loads((sweep / "sweep.json").read_text())["cells"])


def test_jobs_run_independent_cells_at_the_same_time(tmp_path, fake_runner, monkeypatch):
    sweep = tmp_path / "sw"
    monkeypatch.setenv("FAKE_SLOW", "ft-sst2-")  # every fine-tuning cell takes 2 s
    monkeypatch.setenv("FAKE_SLEEP", "2")
    run_sweep(SweepConfig(sparsities=("0.3", "0.6"), tasks=("sst2",), variants=("magnitude",),
                          out=str(sweep), runner=fake_runner, jobs=2), log=lambda *_: None)
    spans = [tuple(map(float, (sweep / n / "times").read_text().split()))
             for n in ("ft-sst2-magnitude-s30-lr5e-05", "ft-sst2-magnitude-s60-lr5e-05")]
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1  # the two 2-second cells overlapped


def test_rerun_with_other_options_is_refused(tmp_path, fake_runner):
    sweep = tmp_path / "sw"
    run_sweep(_cfg(sweep, fake_runner, sparsities=("0",)), log=lambda *_: None)
    with pytest.raises(UsageError, match="other options.*sparsities"):
        run_sweep(_cfg(sweep, fake_runner, sparsities=("0", "0.5")), log=lambda *_: None)
    # jobs and runner may change between runs
    run_sweep(_cfg(sweep, fake_runner, sparsities=("0",), jobs=3), log=lambda *_: None)


def test_sweep_started_before_an_option_existed_resumes_with_its_default(tmp_path, fake_runner):
    sweep = tmp_path / "sw"
    cfg = _cfg(sweep, fake_runner, sparsities=("0",))
    run_sweep(cfg, log=lambda *_: None)
    state = json.loads((sweep / "sweep.json").read_text())
    for added in ("calibration_samples", "recovery_steps"):
        del state["config"][added]
    (sweep / "sweep.json").write_text(json.dumps(state))
    run_sweep(cfg, log=lambda *_: None)  # same options: resumes, nothing runs again
    assert set(_counts(sweep).values()) == {1}


def test_failed_cell_blocks_dependants_and_is_redone(tmp_path, fake_runner, monkeypatch):
    sweep = tmp_path / "sw"
    cfg = _cfg(sweep, fake_runner)
    monkeypatch.setenv("FAKE_FAIL", "pt-random-s30")
    with pytest.raises(CompressError, match="2 of .* cells did not finish.*pt-random-s30"):
        run_sweep(cfg, log=lambda *_: None)
    state = {c["name"]: c for c in json.loads((sweep / "sweep.json").read_text())["cells"]}
    assert state["pt-random-s30"]["status"] == "failed" and state["pt-random-s30"]["returncode"] == 3
    assert state["ft-sst2-random-s30-lr5e-05"]["status"] == "blocked"
    assert not (sweep / "counts" / "ft-sst2-random-s30-lr5e-05").exists()
    assert (sweep / ".tmp-pt-random-s30").is_dir()  # what the failed cell left behind
    monkeypatch.delenv("FAKE_FAIL")
    before = _counts(sweep)
    run_sweep(cfg, log=lambda *_: None)
    after = _counts(sweep)
    assert after["pt-random-s30"] == 2 and after["ft-sst2-random-s30-lr5e-05"] == 1
    assert all(after[n] == 1 for n in before if n != "pt-random-s30")
    assert not (sweep / ".tmp-pt-random-s30").exists()


def _wait_for(pred, timeout=60.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


@pytest.mark.parametrize("kill", ["cell", "sweep"])
def test_killed_mid_cell_then_rerun_redoes_only_that_cell(tmp_path, fake_runner, kill):
    """SIGKILL the running cell (or the whole sweep with its cells), then re-run the same command."""
    sweep = tmp_path / "sw"
    slow = "ft-sst2-magnitude-s60"
    args = ["sweep", "--sparsities", "0,0.3,0.6", "--tasks", "sst2", "--variants", "magnitude,random",
            "--pretrain-corpus", str(tmp_path), "--out", str(sweep), "--runner", fake_runner]
    env = {**os.environ, "FAKE_SLOW": slow, "FAKE_SLEEP": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "compress", *args], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tmp_cell = next(iter([sweep / f".tmp-{slow}-lr5e-05"]))
        _wait_for(lambda: (tmp_cell / "started").is_file())
        pid = int((sweep / "counts" / tmp_cell.name[len(".tmp-"):]).read_text().split()[0])
        finished_before = {p.name for p in sweep.iterdir() if (p / "summary.json").is_file()}
        if kill == "cell":
            os.kill(pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 1 and "did not finish" in err
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            assert (sweep / ".lock").is_file()  # a killed sweep cannot clean up
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert tmp_cell.is_dir() and not (sweep / tmp_cell.name[len(".tmp-"):]).exists()
    counts = _counts(sweep)
    mtimes = {n: (sweep / n / "summary.json").stat().st_mtime_ns for n in finished_before}
    res = run_cli(*args)  # FAKE_SLOW unset: the redone cell finishes
    assert res.returncode == 0, res.stderr
    after = _counts(sweep)
    name = tmp_cell.name[len(".tmp-"):]
    assert after[name] == counts[name] + 1
    for n in finished_before:  # finished cells were not redone
        assert after[n] == counts[n] == 1
        assert (sweep / n / "summary.json").stat().st_mtime_ns == mtimes[n]
    assert all(v == 1 for n, v in after.items() if n != name)
    assert not tmp_cell.exists() and (sweep / name / "summary.json").is_file()
    state = json.loads((sweep / "sweep.json").read_text())
    assert {c["status"] for c in state["cells"]} == {"finished"}
    assert not (sweep / ".lock").exists()


def test_cli_errors_are_one_line_and_leave_no_folder(tmp_path, fake_runner):
    out = tmp_path / "sw"
    res = run_cli("sweep", "--sparsities", "0,1.5", "--out", str(out))
    assert res.returncode == 2 and "1.5 is outside [0, 1)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = run_cli("sweep", "--tasks", "sst3", "--out", str(out), "--runner", fake_runner)
    assert res.returncode == 2 and "sst3" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = run_cli("sweep", "--variants", "magnitude", "--pretrain-corpus", str(tmp_path / "nope"),
                  "--out", str(out), "--runner", fake_runner)
    assert res.returncode == 1 and "does not exist" in res.stderr
    res = run_cli("sweep", "--data-dir", str(tmp_path / "nodata"), "--out", str(out))
    assert res.returncode == 1 and "not a folder" in res.stderr
    assert not out.exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    res = run_cli("sweep", "--out", str(tmp_path / "busy"), "--runner", fake_runner)
    assert res.returncode == 2 and "not a sweep folder" in res.stderr


def _sigint_as_in_a_terminal() -> None:
    """A job started in the background of a non-interactive shell (as CI may start the tests)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: Ctrl-C in a
    terminal never meets that state, so the sweep under test starts with the default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_sweep_and_rerun_finishes_it(tmp_path, fake_runner):
    """SIGINT to the process group (what Ctrl-C in a terminal sends): exit 130, the state records
    the interrupted cell, and the same command completes the sweep."""
    sweep = tmp_path / "sw"
    args = ["sweep", "--sparsities", "0,0.5", "--tasks", "sst2", "--variants", "magnitude",
            "--out", str(sweep), "--runner", fake_runner]
    env = {**os.environ, "FAKE_SLOW": "ft-sst2-magnitude-s50", "FAKE_SLEEP": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "compress", *args], env=env, start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (sweep / ".tmp-ft-sst2-magnitude-s50-lr5e-05" / "started").is_file())
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and "re-run the same command" in err
    state = {c["name"]: c for c in json.loads((sweep / "sweep.json").read_text())["cells"]}
    assert state["ft-sst2-magnitude-s50-lr5e-05"]["status"] == "interrupted"
    assert state["ft-sst2-dense-lr5e-05"]["status"] == "finished"
    assert not (sweep / ".lock").exists()
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert _counts(sweep) == {"ft-sst2-dense-lr5e-05": 1, "ft-sst2-magnitude-s50-lr5e-05": 2}


@pytest.mark.parametrize("kw, words", [
    ({"backend": "slurm"}, "unknown backend 'slurm'; choose one of: local, ray"),
    ({"address": "auto"}, "--address only applies to --backend ray; add --backend ray or drop it"),
    ({"gpus_per_cell": 1.0, "cpus_per_cell": 4.0},
     "--cpus-per-cell, --gpus-per-cell only apply to --backend ray"),
    ({"backend": "ray", "cpus_per_cell": 0.0}, "--cpus-per-cell must be in (0, inf], got 0.0"),
    ({"backend": "ray", "gpus_per_cell": -1.0}, "--gpus-per-cell must be in [0, inf], got -1.0"),
    ({"backend": "ray", "address": " "}, "--address is empty"),
])
def test_backend_options_are_checked(kw, words):
    with pytest.raises(UsageError) as err:
        SweepConfig(**kw)
    assert words in str(err.value)


def test_ray_backend_without_ray_names_the_install_command(tmp_path, fake_runner, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    sweep = tmp_path / "sw"
    with pytest.raises(UsageError, match=r"needs Ray, which is not installed; run: pip install "
                                         r"'compress\[ray\]'"):
        run_sweep(SweepConfig(sparsities=("0.3",), variants=("magnitude",), backend="ray", out=str(sweep),
                              runner=fake_runner), log=lambda *_: None)
    assert not sweep.exists()  # refused before anything was written


def test_backend_can_change_between_runs_of_one_sweep(tmp_path, fake_runner):
    """Where cells run does not change what they compute: resuming elsewhere is allowed."""
    from compress.recipes.sweep import _comparable

    a = SweepConfig(out=str(tmp_path), runner=fake_runner)
    b = SweepConfig(out=str(tmp_path), runner=fake_runner, backend="ray", address="auto", gpus_per_cell=1.0)
    from compress.core.config import to_dict

    assert _comparable(to_dict(a)) == _comparable(to_dict(b))


# ------------------------------------------------------------------ Ray: fail fast, never hang


def _closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening: bound by the OS, then released."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scheme, fix", [("", "ray start --head --port="),
                                         ("ray://", "--ray-client-server-port=")])
def test_a_dead_address_is_refused_in_one_line_within_seconds(scheme, fix, monkeypatch):
    from compress.core.sweep_backends import check_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = _closed_port()
    t0 = time.time()
    with pytest.raises(UsageError) as err:
        check_address(f"{scheme}127.0.0.1:{port}")
    assert time.time() - t0 < 5
    msg = str(err.value)
    assert msg.startswith(f"--address {scheme}127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port} "
                          "(connection refused")
    assert fix in msg and "\n" not in msg


@contextlib.contextmanager
def _listener(reply):
    """A TCP server on 127.0.0.1 whose every connection gets ``reply(conn)`` in a thread; yields its
    port. Its connections and the server itself are shut down when the block ends."""
    import socket
    import threading

    server, conns = socket.socket(), []
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conns.append(conn)
            reply(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept() above; close() alone would not
        server.close()
        thread.join(timeout=5)
        for conn in conns:
            conn.close()


def _http1(conn):
    conn.recv(64)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def _settings(flags: int):  # an (empty) SETTINGS frame: what a gRPC server sends first with flags 0
    def reply(conn):
        conn.recv(64)
        conn.sendall(bytes([0, 0, 0, 4, flags, 0, 0, 0, 0]))
    return reply


@pytest.mark.parametrize("reply, why", [
    (lambda conn: None, "something accepts connections there but is silent for 0.5 s"),
    (lambda conn: conn.shutdown(2), "something accepts connections there but closed them unanswered"),
    (_http1, "something there answered the HTTP/2 greeting with b'HTTP/1.1 '"),
    (_settings(1), "something there answered the HTTP/2 greeting with b'\\x00\\x00\\x00\\x04\\x01"),  # an ACK
])
def test_an_address_where_something_else_listens_is_refused_within_the_timeout(reply, why, monkeypatch):
    from compress.core.sweep_backends import check_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    with _listener(reply) as port:
        t0 = time.time()
        with pytest.raises(UsageError) as err:
            check_address(f"127.0.0.1:{port}", timeout=2, greeting_timeout=0.5)
        assert time.time() - t0 < 3
    msg = str(err.value)
    assert msg.startswith(f"--address 127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port} ({why}")
    assert "not Ray's gRPC port" in msg and "ray start --head" in msg and "\n" not in msg


def test_a_grpc_greeting_passes_and_tls_clusters_are_only_connected_to(monkeypatch):
    from compress.core.sweep_backends import check_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    with _listener(_settings(0)) as port:
        check_address(f"127.0.0.1:{port}")
        check_address(f"ray://127.0.0.1:{port}")
    with _listener(_http1) as port:  # with TLS the greeting would be a TLS handshake: not sent
        monkeypatch.setenv("RAY_USE_TLS", "1")
        check_address(f"127.0.0.1:{port}")


def test_ray_address_overrides_an_unset_address_as_it_does_for_ray_init(monkeypatch):
    from compress.core.sweep_backends import check_address

    port = _closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match=f"^RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers"):
        check_address(None)
    monkeypatch.delenv("RAY_ADDRESS")
    check_address(None)  # unset: Ray is started here, nothing to reach


def test_auto_without_a_cluster_or_with_a_stale_one_is_refused(monkeypatch):
    pytest.importorskip("ray")
    import ray._private.services as services

    from compress.core.sweep_backends import check_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def nothing(addr, temp_dir):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(services, "get_ray_address_from_environment", nothing)
    with pytest.raises(UsageError, match="^--address auto: no Ray cluster is running on this node; start "
                                         "one with 'ray start --head'"):
        check_address("auto")
    port = _closed_port()  # what a cluster that died without 'ray stop' leaves behind
    monkeypatch.setattr(services, "get_ray_address_from_environment", lambda a, t: f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match=f"^--address auto: no Ray cluster answers at 127.0.0.1:{port}"):
        check_address("auto")


@pytest.mark.parametrize("bad", ["http://head:6379", "head:port"])
def test_a_malformed_address_is_a_usage_error(bad):
    from compress.core.sweep_backends import check_address

    with pytest.raises(UsageError, match=f"--address {bad}"):
        check_address(bad)


def test_sweep_with_a_dead_address_exits_2_within_seconds_and_writes_nothing(tmp_path, fake_runner):
    """The real command in a fresh interpreter: refused before the parser's heavy imports."""
    out = tmp_path / "sw"
    port = _closed_port()
    t0 = time.time()
    res = run_cli("sweep", "--backend", "ray", "--address", f"127.0.0.1:{port}", "--sparsities", "0.3",
                  "--variants", "magnitude", "--out", str(out), "--runner", fake_runner, isolated=True,
                  env={"RAY_ADDRESS": ""})
    took = time.time() - t0
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"compress sweep: error: --address 127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port} "
        f"(connection refused: nothing listens there); start the cluster ('ray start --head --port={port}' "
        "on 127.0.0.1) or check the address"]
    assert took < 10, took
    assert not out.exists()


def test_a_dead_address_from_a_config_is_refused_before_anything_is_written(tmp_path, fake_runner,
                                                                            monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    out = tmp_path / "sw"
    cfg = SweepConfig(sparsities=("0.3",), variants=("magnitude",), backend="ray", out=str(out),
                      address=f"127.0.0.1:{_closed_port()}", runner=fake_runner)
    with pytest.raises(UsageError, match="no Ray cluster answers"):
        run_sweep(cfg, log=lambda *_: None)
    assert not out.exists()  # no sweep.json, no logs/


def _node(cpus, gpus=0.0, ip="10.0.0.1", alive=True):
    return {"Alive": alive, "NodeManagerAddress": ip, "Resources": {"CPU": cpus, "GPU": gpus}}


def test_a_cell_larger_than_every_node_is_refused_naming_the_largest():
    from compress.core.sweep_backends import check_cell_fits

    nodes = [_node(8, ip="10.0.0.1"), _node(4, 1, ip="10.0.0.2"), _node(64, 8, ip="10.0.0.9", alive=False)]
    check_cell_fits(nodes, 8, 0)
    check_cell_fits(nodes, 4, 1)
    with pytest.raises(UsageError) as err:
        check_cell_fits(nodes, 16, 0)
    assert str(err.value) == ("--cpus-per-cell 16 --gpus-per-cell 0 is more than any node of the Ray "
                              "cluster offers: the largest has 8 CPUs and 0 GPUs (10.0.0.1, 2 node(s)); "
                              "lower --cpus-per-cell/--gpus-per-cell or add a larger node")
    with pytest.raises(UsageError, match=r"--cpus-per-cell 1 --gpus-per-cell 2 is more .* the largest has "
                                         r"4 CPUs and 1 GPUs \(10.0.0.2"):
        check_cell_fits(nodes, 1, 2)
    # both fit somewhere, but not on one node
    with pytest.raises(UsageError, match="--cpus-per-cell 8 --gpus-per-cell 1 is more"):
        check_cell_fits(nodes, 8, 1)


def test_embedding_cells_score_and_prune_the_model_itself(tmp_path):
    cfg = SweepConfig(sparsities=("0", "0.5"), tasks=("embedding",), variants=("sparsegpt", "wanda"),
                      teacher="self", recovery_steps=40, split_by_article="38/10", data_dir=None)
    cells = {c.name: c for c in build_plan(cfg, tmp_path)}
    dense = cells.pop("ft-embedding-dense-lr5e-05")
    assert dense.argv[0] == "eval" and dense.argv[dense.argv.index("--model") + 1] == "minilm"
    assert dense.info["variants"] == ["sparsegpt", "sparsegpt+kd", "wanda", "wanda+kd"]
    assert sorted(cells) == ["ft-embedding-sparsegpt+kd-s50-lr5e-05", "ft-embedding-sparsegpt-s50-lr5e-05",
                             "ft-embedding-wanda+kd-s50-lr5e-05", "ft-embedding-wanda-s50-lr5e-05"]
    for name, c in cells.items():
        # no fine-tuned dense cell to wait for: the model is pruned as it is
        assert c.deps == () and c.argv[:3] == ("prune", "--stage", "post-training")
        assert c.argv[c.argv.index("--model") + 1] == "minilm"
        assert c.argv[c.argv.index("--split-by-article") + 1] == "38/10"
        assert ("--recovery-steps" in c.argv) == name.startswith(("ft-embedding-sparsegpt+kd",
                                                                  "ft-embedding-wanda+kd"))
        assert "--teacher" not in c.argv


@pytest.mark.parametrize("kw,words", [
    ({"variants": ("magnitude",)}, "use sparsegpt, wanda, oneshot-magnitude"),
    ({"variants": ("sparsegpt",), "teacher": "RUN"}, "use --teacher self"),
])
def test_embedding_sweeps_refuse_what_needs_labels(kw, words):
    with pytest.raises(UsageError, match=words):
        SweepConfig(tasks=("embedding",), **kw)
