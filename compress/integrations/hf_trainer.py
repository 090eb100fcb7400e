"""``transformers.Trainer`` integration: a pruning callback and a distillation trainer.

``PruningCallback`` runs the same ``ScheduledPruner`` as ``compress prune`` inside your own
``Trainer``: it builds the schedule from the Trainer's step count at ``on_train_begin``, zeroes the
gradients of pruned weights during ``backward`` (so they count in neither the clipped norm nor
AdamW's moments), re-applies the masks after every optimizer step (weight decay would move them),
adds ``sparsity`` to the logs, and writes ``masks.safetensors``, ``sparsity.json``,
``compress.json`` and a ``README.md`` model card into every checkpoint and, at the end of
training, into ``output_dir`` (``trainer.save_model()`` then writes the weights beside them), so
``compress verify``, ``measure`` and ``export`` read those folders.

``DistillationTrainer`` replaces the loss only: task loss + lambda * KD loss against a teacher run
on the same batch (``compress.api.functions.kd_loss``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from compress.distill.losses import DEFAULT_TEMPERATURE
from compress.pruning.schedules import DEFAULT_POWER


class PruningCallback(TrainerCallback):
    """Prune on the gradual (or one-shot) schedule inside a ``transformers.Trainer``.

    ``sparsity``: the final fraction of zeros in the pruned matrices. The schedule options are those
    of ``compress.make_pruner`` (``prune_steps`` defaults to the first half of training, in ten
    increments). ``model``: the model the Trainer trains; when given, its prunable matrices are
    checked here, else at ``on_train_begin``. ``base_model`` (a hub id) and ``dataset`` (a name)
    are recorded in ``compress.json`` and the model card.

    ``sparsity`` (after the last pruning step) joins every log record: in ``trainer_state.json``'s
    ``log_history`` and for the callbacks after this one (the printer). The Trainer's ``report_to``
    integrations run before user callbacks and do not see it.

    After training, ``callback.masks`` holds the final masks and ``callback.pruner`` the pruner.
    A resumed run (``trainer.train(resume_from_checkpoint=...)``) keeps the zeros of the loaded
    weights as initial masks, and the schedule goes on from the restored step.
    """

    def __init__(self, sparsity: float, *, model: torch.nn.Module | None = None, schedule: str = "gradual",
                 prune_steps: int | None = None, prune_every: int | None = None, start_step: int = 0,
                 initial_sparsity: float = 0.0, power: float = DEFAULT_POWER, criterion: str = "magnitude",
                 scope: str = "local", include: Sequence[str] = (), exclude: Sequence[str] = (),
                 seed: int = 0, base_model: str | None = None, dataset: str | None = None):
        from compress.core.config import check_sparsity

        check_sparsity(sparsity)
        self.sparsity = sparsity
        self.options = dict(schedule=schedule, prune_steps=prune_steps, prune_every=prune_every,
                            start_step=start_step, initial_sparsity=initial_sparsity, power=power,
                            criterion=criterion, scope=scope, include=tuple(include),
                            exclude=tuple(exclude), seed=seed)
        self.base_model, self.dataset = base_model, dataset
        self.model = model
        self._args = self._state = None  # the Trainer's, kept for the model card
        self.pruner = None
        self.masks: dict[str, torch.Tensor] | None = None
        self._handles: list = []
        if model is not None:
            from compress.api.functions import prunable_targets

            prunable_targets(model, include, exclude)  # a model with nothing to prune fails here

    # ------------------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from compress.api.functions import make_pruner, prunable_targets

        model = self.model if self.model is not None else model
        if model is None:
            from compress.core.errors import UsageError

            raise UsageError("PruningCallback got no model; pass PruningCallback(..., model=model)")
        self.model, self._args, self._state = model, args, state
        initial = None
        if state.global_step > 0:  # resumed: the checkpoint's zeros stay pruned
            initial = {n: p.detach() != 0 for n, p in
                       prunable_targets(model, self.options["include"], self.options["exclude"]).items()}
        self.pruner = make_pruner(model, self.sparsity, total_steps=state.max_steps,
                                  initial_masks=initial, **self.options)
        self.pruner.initialize()
        self._handles = self.pruner.register_grad_masks()
        if state.global_step > 0:
            self.pruner.step(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self._check_finite(args, state.global_step)
        self.pruner.step(state.global_step)

    def _check_finite(self, args, step: int) -> None:
        """Stop training (TrainingDivergedError) once a pruned matrix holds NaN or inf: the
        Trainer hides a non-finite loss from its logs (``logging_nan_inf_filter``), but the step it
        came from has already spread it into the weights. Checked before the pruner ranks them and
        before the Trainer saves the step, so no checkpoint of it is written."""
        from compress.core.errors import TrainingDivergedError

        params = self.pruner.params
        total = torch.stack([p.detach().float().sum() for p in params.values()]).sum()
        if bool(torch.isfinite(total)):
            return
        found = next(((n, int((~torch.isfinite(p.detach())).sum())) for n, p in params.items()
                      if not bool(torch.isfinite(p.detach()).all())), None)
        if found is None:  # finite weights whose sum overflowed
            return
        raise TrainingDivergedError(
            f"training diverged: {found[0]} holds {found[1]} NaN/inf values after step {step} (a "
            f"non-finite loss); training stopped before saving it. Likely cause: the learning rate "
            f"(learning_rate={args.learning_rate:g}); lower it")

    def on_log(self, args, state, control, logs=None, **kwargs):
        s = self.current_sparsity()
        if logs is not None and s is not None:
            logs["sparsity"] = s
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1]["sparsity"] = s

    def on_save(self, args, state, control, model=None, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir() and args.process_index == 0:
            self.save(folder, state=state)

    def on_train_end(self, args, state, control, **kwargs):
        for h in self._handles:
            h.remove()
        self._handles = []
        self.masks = self.pruner.finalize()
        if args.process_index == 0:  # the weights come with trainer.save_model(), after this
            self.save(Path(args.output_dir), state=state, reload_check=False)

    # ------------------------------------------------------------------------------ outputs
    def current_sparsity(self) -> float | None:
        """The fraction of pruned entries over all pruned matrices after the last pruning step."""
        if self.pruner is None or not self.pruner.history:
            return None
        return float(self.pruner.history[-1]["sparsity"])

    def meta(self) -> dict[str, Any]:
        """``compress.json`` of a saved folder: labels, base model and the pruning record."""
        from compress.api.functions import model_meta
        from compress.pruning.integrity import MASKS_FILE

        sch = self.pruner.schedule
        opts = self.options
        pruning = {"stage": "finetune", "sparsity": self.sparsity, "criterion": opts["criterion"],
                   "scope": opts["scope"], "schedule": opts["schedule"], "seed": opts["seed"],
                   "masks_file": MASKS_FILE, "targets": list(self.pruner.params),
                   "schedule_params": {k: getattr(sch, k) for k in sch.__dataclass_fields__},
                   "history": self.pruner.history, "writer": "compress.PruningCallback"}
        extra = {"dataset": self.dataset} if self.dataset else {}
        return model_meta(self.model, self.base_model, pruning=pruning, **extra)

    def save(self, folder: str | Path, state=None, metrics: dict[str, float] | None = None,
             reload_check: bool = True) -> dict:
        """Write masks, ``sparsity.json``, ``compress.json`` and the model card into ``folder`` (a
        saved model folder, or the one ``trainer.save_model`` will fill); returns the sparsity report.
        The masks are checked on the live model and, with ``reload_check`` where ``folder`` holds a
        saved model, on that model reloaded from disk. ``metrics`` default to the last evaluation in
        the Trainer's log history (``state``)."""
        from compress.api.functions import write_pruning_files
        from compress.report.modelcard import write_model_card

        if self.pruner is None:
            from compress.core.errors import UsageError

            raise UsageError("PruningCallback.save() before training: call trainer.train() first")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        masks = {n: m.detach().cpu() for n, m in self.pruner.masks.items()}
        meta_file = folder / "compress.json"  # first: it says how the reload check loads the model
        old = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
        meta = {**old, **self.meta()}
        meta_file.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
        report = write_pruning_files(folder, self.model, masks, reload_check=reload_check)
        state = state if state is not None else self._state
        if metrics is None and state is not None:
            metrics = last_eval_metrics(state.log_history)
        write_model_card(folder, self.model, meta=meta, metrics=metrics, sparsity=report,
                         config=_training_config(self, state, self._args))
        return report


def last_eval_metrics(log_history: list[dict]) -> dict[str, float] | None:
    """The last ``eval_*`` record of a Trainer's log history, without the ``eval_`` prefix."""
    for rec in reversed(log_history or []):
        if any(k.startswith("eval_") for k in rec):
            return {k[len("eval_"):]: v for k, v in rec.items() if k.startswith("eval_")}
    return None


# TrainingArguments worth a line in the model card
CARD_TRAINING_ARGS = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                      "gradient_accumulation_steps", "weight_decay", "warmup_steps", "lr_scheduler_type",
                      "max_grad_norm", "seed")


def _training_config(callback: PruningCallback, state, args) -> dict[str, Any]:
    """The pruning options and the Trainer's main settings, for the card."""
    cfg: dict[str, Any] = {"pruning": {"sparsity": callback.sparsity,
                                       **{k: list(v) if isinstance(v, tuple) else v
                                          for k, v in callback.options.items()}}}
    if args is not None:
        cfg["training_arguments"] = {k: _plain(getattr(args, k)) for k in CARD_TRAINING_ARGS
                                     if hasattr(args, k)}
    if state is not None:
        cfg["trainer_state"] = {"max_steps": state.max_steps, "global_step": state.global_step}
    return cfg


def _plain(value: Any) -> Any:
    """A YAML-safe value: enums (``SchedulerType``, a ``str`` subclass) become their value."""
    if hasattr(value, "value") and isinstance(value.value, (int, float, str)):
        return value.value
    return value if type(value) in (int, float, str, bool, type(None)) else str(value)


class DistillationTrainer(Trainer):
    """A ``Trainer`` whose loss is ``task + kd_lambda * KD(teacher || student)``
    (``compress.api.functions.kd_loss``); everything else is the ``Trainer``'s.

    The teacher (any model returning ``logits`` of the student's label count; checked here) runs in
    eval mode without gradients on the same batch, which means the same tokenizer; it is moved to
    the student's device. ``kd_lambda`` defaults to 4 (single-label) and 1 (multi-label, read from
    the student's ``config.problem_type``). ``temperature`` scales both logits (the KL is multiplied
    by T^2). ``kind="mse"`` matches raw logits instead (Tang et al. 2019).
    """

    def __init__(self, *args, teacher: torch.nn.Module, temperature: float = DEFAULT_TEMPERATURE,
                 kd_lambda: float | None = None, kind: str = "kl", **kwargs):
        super().__init__(*args, **kwargs)
        from compress.core.errors import UsageError

        t_labels = getattr(getattr(teacher, "config", None), "num_labels", None)
        s_labels = getattr(getattr(self.model, "config", None), "num_labels", None)
        if t_labels is not None and s_labels is not None and t_labels != s_labels:
            raise UsageError(f"the student predicts {s_labels} labels and the teacher {t_labels}; build "
                             f"the student with the teacher's label set (num_labels={t_labels}, the same "
                             "id2label)")
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.temperature, self.kd_lambda, self.kind = temperature, kd_lambda, kind
        # kd_loss is a batch mean and takes no num_items_in_batch: the Trainer must divide it by the
        # gradient-accumulation steps itself, as it does for models without loss kwargs
        self.model_accepts_loss_kwargs = False
        self._teacher_inputs = set(inspect.signature(teacher.forward).parameters)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from compress.api.functions import kd_loss

        labels = inputs.get("labels")
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        device = outputs.logits.device
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        with torch.no_grad():
            t_out = self.teacher(**{k: v for k, v in inputs.items()
                                    if k != "labels" and k in self._teacher_inputs})
        multilabel = getattr(model.config, "problem_type", None) == "multi_label_classification"
        parts = kd_loss(outputs.logits, t_out.logits, labels, temperature=self.temperature,
                        kd_lambda=self.kd_lambda, kind=self.kind, multilabel=multilabel)
        from compress.distill.losses import default_kd_lambda
        from compress.training.divergence import check_finite_loss

        # before backward: a non-finite loss would turn the student's weights to NaN
        lam = self.kd_lambda if self.kd_lambda is not None else default_kd_lambda(multilabel)
        check_finite_loss(float(parts["loss"].detach()), self.state.global_step + 1,
                          f"the KD values temperature={self.temperature:g} and kd_lambda={lam:g} "
                          f"(learning_rate={self.args.learning_rate:g}); lower kd_lambda or the "
                          "learning rate")
        return (parts["loss"], outputs) if return_outputs else parts["loss"]
