"""``--report-to``: a real ``compress prune`` on a tiny BERT writes TensorBoard event files and an
MLflow store inside its run folder, and the scalars read back are those of the run (the sparsity at
every pruning step of its history, the loss, the learning rate, the eval metric); a tracker whose
package is missing is refused before anything runs."""

from __future__ import annotations

import importlib.util
import json

import pytest

from compress.cli.main import main
from compress.training.trackers import scalars

# 8 steps, the gradual schedule over the first half: pruning at steps 0..4
ARGS = ("--sparsity", "0.4", "--max-steps", "8", "--batch-size", "8", "--max-length", "32",
        "--log-every", "2")


def prune(tiny_bert, out, report_to: str) -> dict:
    assert main(["prune", "--model", str(tiny_bert), *ARGS, "--report-to", report_to, "--out", str(out)]) == 0
    assert not list(out.parent.glob(".tmp-*"))  # renamed, tracker files and all
    return json.loads((out / "summary.json").read_text())


def check_sparsity(points: list[tuple[int, float]], summary: dict) -> None:
    history = summary["prune_history"]
    assert [s for s, _ in points] == [h["step"] for h in history] == [0, 1, 2, 3, 4]
    values = [v for _, v in points]
    assert values == pytest.approx([h["sparsity"] for h in history])
    assert values == sorted(values) and values[-1] == pytest.approx(0.4, abs=1e-4) and values[1] > 0


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_holds_the_sparsity_at_each_pruning_step(tiny_bert, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    summary = prune(tiny_bert, out, "tensorboard")
    logdir = out / "trackers" / "compress-prune"  # the hyperparameters are in a folder below it
    assert list(logdir.glob("events.out.tfevents.*")), list((out / "trackers").rglob("*"))
    acc = EventAccumulator(str(logdir)).Reload()
    tags = acc.Tags()["scalars"]
    check_sparsity([(e.step, e.value) for e in acc.Scalars("sparsity")], summary)
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [2, 4, 6, 8] and all(e.value > 0 for e in loss)
    assert "lr" in tags and "sparsity_target" in tags
    (acc_eval,) = acc.Scalars("eval/accuracy")
    assert acc_eval.step == 8 and acc_eval.value == pytest.approx(summary["eval"]["accuracy"])


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow not installed")
def test_mlflow_store_in_the_run_folder(tiny_bert, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "ml"
    summary = prune(tiny_bert, out, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'trackers' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("compress-prune").experiment_id])
    assert run.info.run_name == out.name and run.data.params["sparsity"] == "0.4"
    history = client.get_metric_history(run.info.run_id, "sparsity")
    check_sparsity(sorted((m.step, m.value) for m in history), summary)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [2, 4, 6, 8]
    assert run.data.metrics["eval/accuracy"] == pytest.approx(summary["eval"]["accuracy"])
    import mlflow

    assert "trackers" not in mlflow.get_tracking_uri()  # the process's mlflow is left as it was


@pytest.mark.parametrize("command", ["prune", "finetune", "distill"])
def test_a_tracker_that_is_not_installed_is_refused_before_any_work(command, tmp_path, capsys):
    missing = next((n for n in ("wandb", "mlflow", "tensorboard") if importlib.util.find_spec(n) is None),
                   None)
    if missing is None:
        pytest.skip("every tracker package is installed here")
    out = tmp_path / "run"
    assert main([command, "--report-to", missing, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"compress {command}: error: --report-to {missing} needs the {missing} package, which is not "
        f"installed: pip install {missing} (or --report-to none)"]
    assert not out.exists() and not list(tmp_path.iterdir())


def test_scalars_of_logged_records():
    assert scalars({"step": 4, "loss": 0.5, "lr": 1e-5}) == {"loss": 0.5, "lr": 1e-5}
    assert scalars({"phase": "recovery", "step": 9, "eval": {"accuracy": 0.75, "n": 64}}) == {
        "recovery/eval/accuracy": 0.75, "recovery/eval/n": 64.0}
    # text, None, booleans and non-finite numbers are not scalars
    assert scalars({"epoch": 1, "mlm_loss": {"dense_after": None, "head": "mlm", "before": 2.0},
                    "flag": True, "loss": float("nan")}) == {"mlm_loss/before": 2.0}
