"""Experiment trackers (``--report-to tensorboard|mlflow|wandb``) through accelerate's trackers.

A run's records (those ``RunDir.log_metrics`` writes to ``metrics.jsonl``: loss and learning rate
every ``--log-every`` steps, the eval metrics) go to the tracker as scalars at their step, and the
sparsity after each pruning step with them. The tracker's files go inside the run folder,
``<run>/trackers/``, so they are renamed with it when the run completes:

- tensorboard: event files under ``trackers/compress-<command>/``;
- mlflow: a SQLite store ``trackers/mlflow.db`` (MLflow 3 refuses its ``./mlruns`` file store by
  default), unless ``MLFLOW_TRACKING_URI`` names another; the run is named after the run folder;
- wandb: its ``wandb/`` folder under ``trackers/`` (online or offline as wandb is set up).

A resumed run appends to the same tracker folder; the records after the checkpoint are logged again.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compress.core.errors import UsageError
from compress.core.hooks import TrainHook

# --report-to name -> the package it needs (None: no tracker)
REPORT_TO: dict[str, str | None] = {"none": None, "tensorboard": "tensorboard", "mlflow": "mlflow",
                                    "wandb": "wandb"}
TRACKER_DIR = "trackers"
MLFLOW_DB = "mlflow.db"
# keys of a record that say where it is, not what was measured
_POSITION_KEYS = ("step", "epoch", "phase")


def check_report_to(name: str) -> None:
    """UsageError for an unknown tracker or one whose package is not installed (before any training)."""
    if name not in REPORT_TO:
        raise UsageError(f"unknown --report-to '{name}'; choose one of: {', '.join(REPORT_TO)}")
    package = REPORT_TO[name]
    if package is not None and importlib.util.find_spec(package) is None:
        raise UsageError(f"--report-to {name} needs the {package} package, which is not installed: "
                         f"pip install {package} (or --report-to none)")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a logged record by tracker name: nested dicts joined with ``/``
    (``eval/accuracy``), a ``phase`` as prefix (``recovery/loss``); positions, text and None left out."""
    prefix = f"{record['phase']}/" if isinstance(record.get("phase"), str) else ""
    out: dict[str, float] = {}

    def walk(name: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{name}/{k}", v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)

    for key, value in record.items():
        if key not in _POSITION_KEYS:
            walk(prefix + key, value)
    return out


def _hparams(config: dict[str, Any]) -> dict[str, Any]:
    """The run's options as the values every tracker accepts (bool, int, float, str)."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in config.items()}


class RunTracker:
    """One tracker run beside one run folder, through ``accelerate.Accelerator(log_with=...)``.

    ``log_record`` takes the records of ``RunDir.log_metrics``; ``log`` takes scalars at a step;
    ``close`` ends the tracker run (``accelerator.end_training``) and must come before the run
    folder is renamed. Only the main process writes (accelerate's trackers are main-process only).
    """

    def __init__(self, report_to: str, folder: Path, project: str, run_name: str, config: dict[str, Any]):
        import torch
        from accelerate import Accelerator

        check_report_to(report_to)
        self.report_to, self.folder = report_to, Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._mlflow_uri_set = False
        self._watched: list[SparsityLogHook] = []
        init_kwargs: dict[str, dict] = {
            "mlflow": {"run_name": run_name, "logging_dir": str(self.folder / "mlflow-artifacts")},
            "wandb": {"name": run_name, "dir": str(self.folder)},
        }
        if report_to == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
            import mlflow

            mlflow.set_tracking_uri(f"sqlite:///{(self.folder / MLFLOW_DB).resolve()}")
            self._mlflow_uri_set = True
        # the device choice of the training loop's own Accelerator (compress.training.loop.train)
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(), log_with=report_to,
                                       project_dir=str(self.folder))
        self.accelerator.init_trackers(project, config=_hparams(config),
                                       init_kwargs={report_to: init_kwargs.get(report_to, {})})

    def log(self, values: dict[str, float], step: int | None) -> None:
        if values:
            self.accelerator.log(values, step=step)

    def log_record(self, record: dict[str, Any]) -> None:
        """A ``metrics.jsonl`` record at its ``step`` (distillation's per-epoch records: ``epoch``)."""
        step = record.get("step", record.get("epoch"))
        self.log(scalars(record), step if isinstance(step, int) else None)

    def watch(self, pruner) -> SparsityLogHook:
        """A hook that logs ``pruner``'s sparsity at each pruning step (and at ``close``)."""
        hook = SparsityLogHook(pruner, self)
        self._watched.append(hook)
        return hook

    def close(self) -> None:
        for hook in self._watched:  # a prune at finalize() comes after the last training step
            hook.flush()
        self.accelerator.end_training()
        if self._mlflow_uri_set:  # leave mlflow as it was found: the next run gets its own store
            import mlflow

            mlflow.set_tracking_uri(None)
            self._mlflow_uri_set = False


class SparsityLogHook(TrainHook):
    """After a pruning hook: logs the sparsity reached and the schedule's target at every pruning
    step of ``pruner`` to ``tracker`` (the masks fixed by ``finalize`` too, when the tracker closes)."""

    def __init__(self, pruner, tracker: RunTracker):
        self.pruner, self.tracker, self.logged = pruner, tracker, 0

    def flush(self) -> None:
        for h in self.pruner.history[self.logged:]:
            self.tracker.log({"sparsity": float(h["sparsity"]), "sparsity_target": float(h["target"])},
                             int(h["step"]))
        self.logged = len(self.pruner.history)

    def on_train_begin(self, model, total_steps: int) -> None:
        self.flush()

    def on_step_end(self, model, step: int) -> None:
        self.flush()


def start_tracking(run, report_to: str, config: dict[str, Any], command: str,
                   hooks: Sequence[TrainHook] = ()) -> list[TrainHook]:
    """Open the ``report_to`` tracker for ``run`` (a ``RunDir``: every record it logs goes to the
    tracker too, and it closes the tracker before its folder is renamed) and return ``hooks`` with a
    ``SparsityLogHook`` after each pruning hook among them. ``report_to`` "none": ``hooks`` as given.
    Every process of a multi-process launch calls it (the same hooks on every rank); only the main
    process writes."""
    hooks = list(hooks)
    if report_to == "none":
        return hooks
    tracker = RunTracker(report_to, run.path / TRACKER_DIR, f"compress-{command}", run.final.name, config)
    run.tracker = tracker
    out: list[TrainHook] = []
    for h in hooks:
        out.append(h)
        # a pruning hook carries its pruner, whose ``history`` grows by one record per pruning step
        if isinstance(getattr(getattr(h, "pruner", None), "history", None), list):
            out.append(tracker.watch(h.pruner))
    return out
