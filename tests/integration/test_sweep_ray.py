"""``compress sweep --backend ray`` on a real local Ray cluster (``ray.init(num_cpus=2)``, bound to
127.0.0.1 only): the same cells and metrics as the local backend, a failing cell reported while the
others finish, a killed or signalled driver resumed by re-running the command, the shared-storage
check, and cells larger than the cluster refused up front."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from compress.core.errors import CompressError, DataError, UsageError
from compress.recipes.sweep import SweepConfig, build_plan, run_sweep
from tests.conftest import SHARED_DATA, run_cli
from tests.unit.test_sweep import FAKE, _sigint_as_in_a_terminal

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'compress[ray]')")

TINY = dict(sparsities=("0.6",), tasks=("sample",), variants=("magnitude", "random"),
            train_limit=32, eval_limit=32, max_steps=2, batch_size=16, max_length=32)


@pytest.fixture(scope="module")
def ray_cluster():
    """A real Ray instance on this machine, shared by the module's tests; its GCS address lets a
    second driver (a ``compress sweep`` subprocess) join it as a user's would join a cluster.

    Bound to 127.0.0.1 only, never the machine's network address: Ray replaces a loopback address
    by the address it sees the network from (even ``_node_ip_address="127.0.0.1"``) unless its
    cluster mode is off, so ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set here, where the drivers
    started by the tests inherit it, and in the constant Ray read at import."""
    import ray._private.ray_constants as ray_constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        mp.delenv("RAY_ADDRESS", raising=False)
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _node_ip_address="127.0.0.1")
        try:
            address = ray.get_runtime_context().gcs_address
            assert address.startswith("127.0.0.1:"), address
            assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
            yield address
        finally:
            ray.shutdown()


def test_the_real_gcs_answers_the_grpc_greeting(ray_cluster, monkeypatch):
    """``check_address`` against Ray itself: a running cluster's GCS answers the HTTP/2 greeting
    with its SETTINGS frame (the refusals are tested on stand-in listeners in test_sweep.py)."""
    from compress.core.sweep_backends import check_address

    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    check_address(ray_cluster)


def _state(sweep):
    return {c["name"]: c for c in json.loads((sweep / "sweep.json").read_text())["cells"]}


def test_ray_cells_compute_what_local_cells_compute(tiny_bert, ray_cluster, tmp_path):
    """A 2-cell sweep of a tiny model (real ``compress prune`` cells) on both backends."""
    local, remote = tmp_path / "local", tmp_path / "ray"
    run_sweep(SweepConfig(**TINY, model=str(tiny_bert), jobs=2, out=str(local)), log=lambda *_: None)
    cfg = SweepConfig(**TINY, model=str(tiny_bert), backend="ray", out=str(remote))
    lines = []
    run_sweep(cfg, log=lines.append)
    assert "2 cells, 0 finished already, 2 to run (Ray: 1 node(s), 2 CPUs" in lines[0]
    state = json.loads((remote / "sweep.json").read_text())
    assert state["backend"] == "ray" and {c["status"] for c in state["cells"]} == {"finished"}
    plan = build_plan(cfg, remote)
    assert len(plan) == 2
    for c in plan:
        a = json.loads((local / c.name / "summary.json").read_text())
        b = json.loads((remote / c.name / "summary.json").read_text())
        assert b["eval"] == pytest.approx(a["eval"]), c.name
        assert b["sparsity"] == pytest.approx(a["sparsity"]), c.name
        assert b["steps"] == a["steps"] == 2
        assert (remote / "logs" / f"{c.name}.log").is_file()


def test_a_failing_ray_cell_is_reported_and_the_others_finish(ray_cluster, tmp_path):
    script = tmp_path / "fake_cell.py"
    script.write_text(FAKE)
    sweep = tmp_path / "sw"
    failing = "ft-sst2-random-s60-lr5e-05"
    cfg = SweepConfig(sparsities=("0.3", "0.6"), tasks=("sst2",), variants=("magnitude", "random"),
                      backend="ray", out=str(sweep),
                      runner=f"env FAKE_FAIL={failing} {sys.executable} {script}")
    lines = []
    with pytest.raises(CompressError, match=f"1 of 4 cells did not finish \\({failing}\\)"):
        run_sweep(cfg, log=lines.append)
    state = _state(sweep)
    assert state[failing]["status"] == "failed" and state[failing]["returncode"] == 3
    assert state[failing]["log"] == str(sweep / "logs" / f"{failing}.log")
    assert any(ln.strip().startswith(f"FAILED {failing} (exit code 3; see ") for ln in lines)
    others = [n for n in state if n != failing]
    assert len(others) == 3 and all(state[n]["status"] == "finished" for n in others)
    assert all((sweep / n / "summary.json").is_file() for n in others)
    mtimes = {n: (sweep / n / "summary.json").stat().st_mtime_ns for n in others}

    lines = []
    run_sweep(replace(cfg, runner=f"{sys.executable} {script}"), log=lines.append)  # the cause fixed
    assert "4 cells, 3 finished already, 1 to run" in lines[0]
    assert [ln.split()[1] for ln in lines if ln.strip().startswith("start")] == [failing]
    assert mtimes == {n: (sweep / n / "summary.json").stat().st_mtime_ns for n in others}
    counts = {p.name: len(p.read_text().split()) for p in (sweep / "counts").iterdir()}
    assert counts == {**{n: 1 for n in others}, failing: 2}
    assert "log_tail" not in _state(sweep)[failing] and _state(sweep)[failing]["status"] == "finished"


SLOW = "ft-sst2-magnitude-s60-lr5e-05"  # the cell the fake runner keeps busy for 300 s


def _start_driver_with_a_slow_cell(ray_cluster, tmp_path, sparsities: str, variants: str, **popen):
    """A ``compress sweep`` driver joined to the cluster, in its own process group, whose cells run
    the fake cell script (``SLOW`` sleeps); returns (process, command, script, sweep folder)."""
    script = tmp_path / "fake_cell.py"
    script.write_text(FAKE)
    sweep = tmp_path / "sw"
    base = ["sweep", "--sparsities", sparsities, "--tasks", "sst2", "--variants", variants,
            "--backend", "ray", "--address", ray_cluster, "--out", str(sweep)]
    runner = f"env FAKE_SLOW={SLOW} FAKE_SLEEP=300 {sys.executable} {script}"
    proc = subprocess.Popen([sys.executable, "-m", "compress", *base, "--runner", runner],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)
    return proc, base, script, sweep


def _dies_within(pid: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline and _alive(pid):
        time.sleep(0.2)
    return not _alive(pid)


def test_killed_ray_driver_rerun_finishes_only_the_missing_cells(ray_cluster, tmp_path):
    proc, base, script, sweep = _start_driver_with_a_slow_cell(ray_cluster, tmp_path, "0.3,0.6",
                                                               "magnitude,random")
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            done = list(sweep.glob("*/summary.json"))
            if (sweep / f".tmp-{SLOW}" / "started").is_file() and len(done) == 3:
                break
            time.sleep(0.2)
        else:
            proc.kill()
            raise AssertionError(f"the sweep did not reach its slow cell: {proc.communicate()}")
        cell_pid = int((sweep / "counts" / SLOW).read_text().split()[0])
        os.killpg(proc.pid, signal.SIGKILL)  # the driver dies without cleaning up
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Ray stops the dead driver's tasks, and the cell dies with its task
    assert _dies_within(cell_pid, 60), "the killed driver's cell is still running"
    finished = {n: (sweep / n / "summary.json").stat().st_mtime_ns for n in _state(sweep)
                if (sweep / n / "summary.json").is_file()}
    assert len(finished) == 3 and SLOW not in finished

    res = run_cli(*base, "--runner", f"{sys.executable} {script}")
    assert res.returncode == 0, res.stderr
    assert "4 cells, 3 finished already, 1 to run" in res.stdout
    counts = {p.name: len(p.read_text().split()) for p in (sweep / "counts").iterdir()}
    assert counts == {**{n: 1 for n in finished}, SLOW: 2}
    assert finished == {n: (sweep / n / "summary.json").stat().st_mtime_ns for n in finished}
    assert {c["status"] for c in _state(sweep).values()} == {"finished"}
    assert not (sweep / f".tmp-{SLOW}").exists() and not (sweep / ".lock").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def test_a_sweep_folder_the_nodes_cannot_see_is_refused(ray_cluster, tmp_path, monkeypatch):
    import compress.core.sweep_backends as backends

    monkeypatch.setattr(backends, "write_token", lambda path, token: None)  # the token never lands
    script = tmp_path / "fake_cell.py"
    script.write_text(FAKE)
    sweep = tmp_path / "sw"
    with pytest.raises(DataError, match="cannot see the sweep folder .*storage every node mounts"):
        run_sweep(SweepConfig(sparsities=("0.3",), tasks=("sst2",), variants=("magnitude",),
                              backend="ray", out=str(sweep), runner=f"{sys.executable} {script}"),
                  log=lambda *_: None)
    assert not (sweep / "counts").exists()  # no cell ran
    assert not list(sweep.glob(".storage-check-*"))


@pytest.mark.integration
def test_gordon_ci_pipeline_on_ray(ray_cluster, tiny_bert, shared_data, tmp_path):
    """On the module's Ray instance (127.0.0.1 only), which the pipeline's sweep uses as it is."""
    out = tmp_path / "g"
    res = run_cli("run", "pipelines/configs/gordon-ci.yaml", "sweep.backend=ray", f"model={tiny_bert}",
                  f"out={out}", f"data_dir={SHARED_DATA}", f"pretrain.corpus=[{SHARED_DATA / 'wikitext2'}]",
                  "sweep.sparsities=[0.5]", "finetune.max_steps=1")
    assert res.returncode == 0, res.stderr
    state = json.loads((out / "sweep.json").read_text())
    assert state["backend"] == "ray" and {c["status"] for c in state["cells"]} == {"finished"}
    assert [c["name"] for c in state["cells"]] == ["pt-magnitude-s50", "ft-sst2-magnitude-s50-lr0.0001"]
    assert all(c["host"] for c in state["cells"])
    assert "## Pre-training loss vs sparsity" in (out / "report.md").read_text()


@pytest.mark.parametrize("kw, request_words", [
    ({"cpus_per_cell": 3.0}, "--cpus-per-cell 3 --gpus-per-cell 0"),
    ({"gpus_per_cell": 1.0}, "--cpus-per-cell 1 --gpus-per-cell 1"),
])
def test_a_cell_larger_than_every_node_is_refused_before_anything_is_written(ray_cluster, tmp_path, kw,
                                                                              request_words):
    script = tmp_path / "fake_cell.py"
    script.write_text(FAKE)
    sweep = tmp_path / "sw"
    cfg = SweepConfig(sparsities=("0.3",), tasks=("sst2",), variants=("magnitude",), backend="ray",
                      out=str(sweep), runner=f"{sys.executable} {script}", **kw)
    with pytest.raises(UsageError) as err:
        run_sweep(cfg, log=lambda *_: None)
    assert str(err.value).startswith(f"{request_words} is more than any node of the Ray cluster offers: "
                                     "the largest has 2 CPUs and 0 GPUs (127.0.0.1, 1 node(s))")
    assert not sweep.exists()  # Ray would have queued the cell for ever


@pytest.mark.parametrize("sig, code, what", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_a_signalled_ray_driver_stops_within_seconds_and_the_rerun_resumes(ray_cluster, tmp_path, sig,
                                                                           code, what):
    """SIGTERM or SIGINT to a driver joined to the cluster while a cell runs: it cancels the cell,
    records it as interrupted, removes its lock and exits with the usual line, within seconds (Ray's
    own SIGTERM handler, installed by ray.init, would exit without any of that); the driver's
    terminal shows nothing of Ray's, which went to logs/ray.log; the same command then resumes."""
    proc, base, script, sweep = _start_driver_with_a_slow_cell(ray_cluster, tmp_path, "0.6", "magnitude",
                                                               preexec_fn=_sigint_as_in_a_terminal)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (sweep / f".tmp-{SLOW}" / "started").is_file():
            time.sleep(0.2)
        assert (sweep / f".tmp-{SLOW}" / "started").is_file(), "the slow cell never started"
        cell_pid = int((sweep / "counts" / SLOW).read_text().split()[0])
        t0 = time.time()
        proc.send_signal(sig)  # the driver only, as `kill` or a scheduler sends it
        out, err = proc.communicate(timeout=30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err
    assert took < 15, took
    assert err.splitlines() == [f"compress sweep: {what}; re-run the same command (same --out) to resume: "
                                "finished cells are kept, the interrupted ones are redone"]
    assert "Token authentication" not in out + err and "GCS" not in out + err
    assert (sweep / "logs" / "ray.log").is_file()
    assert _state(sweep)[SLOW]["status"] == "interrupted"
    assert not (sweep / ".lock").exists()
    assert _dies_within(cell_pid, 60), "the cell outlived its cancelled task"

    res = run_cli(*base, "--runner", f"{sys.executable} {script}")
    assert res.returncode == 0, res.stderr
    assert "1 cells, 0 finished already, 1 to run" in res.stdout
    assert {c["status"] for c in _state(sweep).values()} == {"finished"}

