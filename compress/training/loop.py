"""The fine-tuning loop: AdamW, linear warm-up/decay, accelerate for devices and DDP.

Pruning and distillation plug in through ``TrainHook`` (``compress.core.hooks``: mask after each
optimizer step, replace the loss) instead of subclassing the loop. The batch order of epoch ``e``
is a permutation seeded by ``seed + e``, so a resumed run sees exactly the batches an
uninterrupted one would.

Checkpoints (``compress.core.checkpoints``) hold everything the next step depends on; the loop saves one
every ``checkpoint_every`` steps and ``--resume`` restores the newest intact one.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from compress.core.checkpoints import (  # noqa: F401 - re-exported; the loop saves through these names
    CHECKPOINT_KEEP,
    checkpoint_dirs,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from compress.core.config import check_range, option
from compress.core.distributed import assert_tensors_same_across_ranks, is_distributed
from compress.core.errors import DataError, UsageError
from compress.core.hooks import TrainHook  # noqa: F401 - re-exported; hooks subclass it from here too
from compress.tasks.base import TextDataset
from compress.training.divergence import check_finite_loss, likely_cause
from compress.training.trackers import REPORT_TO, check_report_to

log_ = logging.getLogger(__name__)


def _tracker_names() -> tuple[str, ...]:
    return tuple(REPORT_TO)


@dataclass(frozen=True)
class TrainConfig:
    lr: float = option(5e-5, help="AdamW learning rate of the encoder")
    # A 90-way sigmoid head on a pre-trained encoder needs a larger one than the encoder (Reuters).
    head_lr: float | None = option(None, help="learning rate of the freshly initialised task head "
                                              "(classifier / qa_outputs); unset: --lr")
    epochs: float = option(1.0, help="passes over the training data (fractions allowed)")
    max_steps: int | None = option(None, help="optimizer steps; overrides --epochs")
    batch_size: int = option(32, help="examples per optimizer step")
    eval_batch_size: int = option(128, help="examples per batch when evaluating")
    max_length: int = option(128, help="tokens per example (longer inputs are truncated)")
    warmup_ratio: float = option(0.1, help="share of the steps over which the learning rate warms "
                                           "up linearly")
    weight_decay: float = option(0.01, help="AdamW weight decay (not on biases and LayerNorms)")
    max_grad_norm: float = option(1.0, help="clip the gradient norm to this (0 = no clipping)")
    seed: int = option(42, help="seed of the head initialisation, data order and dropout")
    log_every: int = option(50, help="log the mean loss every N steps to metrics.jsonl")
    checkpoint_every: int = option(0, help="save a resumable checkpoint every N steps (0 = never; "
                                           "needs --out)")
    # Hashing BERT-base's masks (85M entries) took 0.42 s on a shared 2-core CPU, so not every step
    # by default; the pruner also checks its masks at every pruning step. Skipped on one process.
    rank_check_every: int = option(10, help="multi-process runs: check every N steps that all ranks "
                                            "hold the same masks (a SHA-256 of every hook's tensors; "
                                            "0 = off)")
    report_to: str = option("none", choices=_tracker_names,
                            help="also send the logged loss, learning rate, sparsity (at each "
                                 "pruning step) and eval metrics to an experiment tracker, its "
                                 "files in <run>/trackers/ (mlflow: a SQLite store there unless "
                                 "MLFLOW_TRACKING_URI is set); needs its package installed")

    def __post_init__(self):
        check_range("lr", self.lr, 0, None, lo_open=True)
        if self.head_lr is not None:
            check_range("head_lr", self.head_lr, 0, None, lo_open=True)
        check_range("epochs", self.epochs, 0, 1e6, lo_open=True)
        if self.max_steps is not None:
            check_range("max_steps", self.max_steps, 1)
        check_range("batch_size", self.batch_size, 1)
        check_range("eval_batch_size", self.eval_batch_size, 1)
        check_range("max_length", self.max_length, 8, 512)
        check_range("warmup_ratio", self.warmup_ratio, 0, 1)
        check_range("weight_decay", self.weight_decay, 0)
        check_range("max_grad_norm", self.max_grad_norm, 0)
        check_range("seed", self.seed, 0, 2**32 - 1)  # numpy's seed range
        check_range("log_every", self.log_every, 1)
        check_range("checkpoint_every", self.checkpoint_every, 0)
        check_range("rank_check_every", self.rank_check_every, 0)
        check_report_to(self.report_to)


HEAD_PREFIXES = ("classifier.", "qa_outputs.")


def head_parameter_ids(model) -> set[int]:
    """ids of the task head's parameters. For a Hugging Face task model: every parameter outside its
    encoder (``model.base_model``), whatever the architecture names its head (BERT's ``classifier``,
    RoBERTa's and ELECTRA's ``classifier.dense``/``out_proj``, DistilBERT's ``pre_classifier``,
    ModernBERT's ``head``, ``qa_outputs``); for another module, the parameters under HEAD_PREFIXES."""
    base = getattr(model, "base_model", None)
    if isinstance(base, torch.nn.Module) and base is not model:
        encoder = {id(p) for p in base.parameters()}
        return {id(p) for p in model.parameters() if id(p) not in encoder}
    return {id(p) for name, p in model.named_parameters() if name.startswith(HEAD_PREFIXES)}


def param_groups(model, cfg: TrainConfig) -> list[dict]:
    """AdamW groups: no weight decay on biases and LayerNorms; the task head at ``cfg.head_lr``."""
    groups: dict[tuple[bool, bool], list] = {}
    heads = head_parameter_ids(model) if cfg.head_lr is not None else set()
    for p in model.parameters():
        if p.requires_grad:
            head = id(p) in heads
            groups.setdefault((p.ndim >= 2, head), []).append(p)
    return [{"params": ps, "weight_decay": cfg.weight_decay if decay else 0.0,
             **({"lr": cfg.head_lr} if head else {})}
            for (decay, head), ps in sorted(groups.items())]


class ProgressLines:
    """For a run whose output goes to a file, what a progress bar shows, one line on stdout per
    logging window (stderr stays for errors): the step, the window's mean loss, the time left at the
    pace since ``first_step``."""

    def __init__(self, total: int, first_step: int):
        self.total, self.first_step, self.started = total, first_step, time.perf_counter()

    def __call__(self, step: int, loss: float) -> None:
        done = step - self.first_step
        left = (time.perf_counter() - self.started) / done * (self.total - step) if done else 0.0
        minutes, seconds = divmod(int(left), 60)
        print(f"train step {step}/{self.total}: loss {loss:.4f}, about {minutes} min {seconds:02d} s left",
              flush=True)


def progress_wanted() -> bool:
    """The training bar shows on a terminal; COMPRESS_NO_PROGRESS=1 hides it and =0 forces it
    (``--verbose``). A log file (stderr not a terminal) would fill with carriage returns."""
    setting = os.environ.get("COMPRESS_NO_PROGRESS")
    if setting in ("0", "1"):
        return setting == "0"
    return sys.stderr.isatty()


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# An encoded example marked False under this key has no gold label (a teacher-only transfer example,
# ``compress.distill.transfer``): losses and class balancing skip it; absent means labelled.
HAS_LABEL = "has_label"


def is_labelled(example: dict) -> bool:
    return example.get(HAS_LABEL, True)


def encode(tokenizer, ds: TextDataset, max_length: int) -> list[dict]:
    """Tokenize once; labels become ints (single-label) or multi-hot float vectors (multi-label)."""
    enc = tokenizer(ds.texts, ds.pairs, truncation=True, max_length=max_length)
    feats = []
    n_labels = len(ds.label_names)
    for i in range(len(ds)):
        f = {k: enc[k][i] for k in enc.keys()}
        if ds.multilabel:
            y = [0.0] * n_labels
            for j in ds.labels[i]:
                y[j] = 1.0
            f["labels"] = y
        else:
            f["labels"] = ds.labels[i]
        feats.append(f)
    return feats


def make_collate(tokenizer) -> Callable[[list[dict]], dict]:
    def collate(rows: list[dict]) -> dict:
        labels = [r["labels"] for r in rows]
        batch = tokenizer.pad([{k: v for k, v in r.items() if k != "labels"} for r in rows],
                              return_tensors="pt")
        dtype = torch.float32 if isinstance(labels[0], list) else torch.long
        batch["labels"] = torch.tensor(labels, dtype=dtype)
        return dict(batch)
    return collate


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def steps_per_epoch(n: int, batch_size: int, world: int = 1) -> int:
    """Optimizer steps per epoch when ``world`` ranks each take ``batch_size`` examples per step."""
    return max(1, math.ceil(n / (batch_size * world)))


def rank_batches(order: list[int], batch_size: int, rank: int, world: int) -> list[list[int]]:
    """The batches of one rank for one epoch, as lists of example indices.

    The order is padded by wrapping around to a multiple of ``world`` (as torch's
    DistributedSampler does) and dealt round-robin, so every rank gets the same number of non-empty
    batches and no rank waits forever in an all-reduce the others never reach. With ``world == 1``
    this is plain consecutive batching of ``order``. Step ``b`` of ranks 0..world-1 together covers
    positions ``[b*batch_size*world, (b+1)*batch_size*world)`` of the padded order, i.e. the same
    examples a single process would use with ``batch_size * world``.
    """
    if world > 1 and len(order) % world:
        pad = world - len(order) % world
        order = order + (order * (pad // len(order) + 1))[:pad]
    shard = order[rank::world]
    return [shard[i:i + batch_size] for i in range(0, len(shard), batch_size)]


@torch.no_grad()
def predict(model, feats: list[dict], collate, batch_size: int, device=None) -> np.ndarray:
    """Logits for ``feats`` in order, shape (n, num_labels)."""
    model.eval()
    device = device or next(model.parameters()).device
    outs = []
    for i in range(0, len(feats), batch_size):
        batch = collate(feats[i:i + batch_size])
        batch.pop("labels")
        batch = {k: v.to(device) for k, v in batch.items()}
        outs.append(model(**batch).logits.float().cpu().numpy())
    return np.concatenate(outs, axis=0)


def hook_tensors(hooks) -> dict[str, torch.Tensor]:
    """Every tensor in the hooks' state dicts, by a dotted path (``0.masks.bert...``)."""
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)

    for i, h in enumerate(hooks):
        walk(str(i), h.state_dict())
    return out


def check_ranks_agree(hooks, step: int) -> None:
    """Raise IntegrityError when the hooks' tensors (masks) differ between ranks; no-op on one."""
    if not is_distributed():
        return
    tensors = hook_tensors(hooks)
    if tensors:
        assert_tensors_same_across_ranks(tensors, f"hook state (masks) after step {step}")


LossFn = Callable[[Any, dict], tuple[torch.Tensor, dict]]


def trainable_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of an extra module that ``train`` optimizes: its ``trainable_parameters()``
    when it has one (a loss plug-in that trains some layers with an optimizer of its own, such as
    PFA's W1 critic, leaves those out), else its parameters that require grad."""
    if hasattr(module, "trainable_parameters"):
        return list(module.trainable_parameters())
    return [p for p in module.parameters() if p.requires_grad]


def _decay_groups(params: list, cfg: TrainConfig) -> list[dict]:
    """AdamW groups of extra parameters, after the model's: decay on matrices only, at ``cfg.lr``."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": cfg.weight_decay},
                        {"params": no_decay, "weight_decay": 0.0}) if g["params"]]


def _kd_values(loss_fn) -> dict:
    """``temperature`` and ``kd_lambda`` of a distillation loss plug-in (``TeacherLogitsLoss``, or
    a bound method of ``SpanDistillation``), else nothing: what a diverged run blames."""
    owner = getattr(loss_fn, "__self__", loss_fn)
    values = {k: getattr(owner, k, None) for k in ("temperature", "kd_lambda")}
    return values if None not in values.values() else {}


def _check_one_loss_owner(hooks, loss_fn) -> None:
    """A ``loss_fn`` and a hook that replaces the loss would both own it: a programming error."""
    if loss_fn is None:
        return
    base = TrainHook.compute_loss
    replacing = [type(h).__name__ for h in hooks if getattr(type(h), "compute_loss", base) is not base]
    if replacing:
        raise ValueError(f"hook(s) {', '.join(replacing)} replace the loss, which loss_fn computes "
                         "in this run; pass one or the other")


def _extra_parameters(extra_modules: list[torch.nn.Module], world: int, device) -> list:
    """The trainable parameters of the modules trained beside the model, moved to ``device``;
    refused on more than one process (they are not wrapped for DDP)."""
    extra_params = [p for m in extra_modules for p in trainable_parameters(m)]
    if extra_params and world > 1:
        names = ", ".join(type(m).__name__ for m in extra_modules)
        raise UsageError(f"the layers of {names} are trained beside the model and are not averaged "
                         f"across the {world} processes; run on one process")
    for m in extra_modules:
        m.to(device)
    return extra_params


def _loop_start(checkpoint_dir: Path | None, raw, optimizer, scheduler, hooks, extra_modules
                ) -> tuple[int, float, dict, int | None]:
    """(step, running loss sum, running extras, resumed_from) to start the loop from: those of the
    newest valid checkpoint in ``checkpoint_dir`` (loaded into the model, optimizer, scheduler,
    hooks and extra modules), else a fresh start."""
    ckpt = latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is None:
        return 0, 0.0, {}, None
    loop = load_checkpoint(ckpt, raw, optimizer, scheduler, hooks, extra_modules)
    return loop["step"], loop["running"], dict(loop.get("running_extra", {})), loop["step"]


def _batch_loss(model, batch: dict, hooks, loss_fn) -> tuple[torch.Tensor, dict]:
    """(loss, the loss plug-in's extras): ``loss_fn``'s, else the first hook that computes one,
    else the model's own ``outputs.loss``."""
    if loss_fn is not None:
        return loss_fn(model, batch)
    outputs = model(**batch)
    loss = None
    for h in hooks:
        loss = h.compute_loss(model, batch, outputs) if loss is None else loss
    return (outputs.loss if loss is None else loss), {}


def _stop_if_not_finite(last: float, step: int, cause: str, accelerator, bar) -> None:
    """Raise (``check_finite_loss``) when this step's loss is not finite here or on another rank."""
    elsewhere = False
    if accelerator.num_processes > 1:  # all ranks stop together, or the others wait in the next all-reduce
        flag = torch.tensor(float(not math.isfinite(last)), device=accelerator.device)
        elsewhere = bool(accelerator.reduce(flag, "sum") > 0)
    if elsewhere or not math.isfinite(last):
        bar.close()
        check_finite_loss(last, step + 1, cause, elsewhere)


def _prepared(model, extra_params: list, cfg: TrainConfig, total: int, accelerator):
    """(model as prepared by accelerate, the unwrapped model, AdamW over the model's groups then
    the extra parameters', the linear warm-up/decay schedule over ``total`` steps)."""
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.AdamW(param_groups(model, cfg) + _decay_groups(extra_params, cfg), lr=cfg.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total), total)
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, accelerator.unwrap_model(model), optimizer, scheduler


def _checkpoint_due(cfg: TrainConfig, step: int, total: int, checkpoint_last: bool) -> bool:
    """Every ``cfg.checkpoint_every`` steps but the last (the caller saves the finished model);
    the last one only with ``checkpoint_last``."""
    return bool((cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total)
                or (checkpoint_last and step == total))


def _optimizer_step(loss, model, extra_params: list, optimizer, scheduler, accelerator, hooks, hooked,
                    max_grad_norm: float) -> None:
    """Backward (hooks see the gradients), clip the model's and the extra modules' gradients
    together, step the optimizer and the schedule."""
    accelerator.backward(loss)
    for h in hooks:
        h.on_after_backward(hooked)
    if max_grad_norm:
        clipped = [*model.parameters(), *extra_params] if extra_params else model.parameters()
        accelerator.clip_grad_norm_(clipped, max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _log_window(step: int, running: float, running_extra: dict, log_every: int, scheduler, accelerator,
                log: Callable[[dict], None] | None, progress: ProgressLines | None = None) -> None:
    """Log the window's mean loss (over all ranks) and the extras' window means, which add up to it;
    ``progress`` prints this rank's window mean as a line (a run without a terminal)."""
    if progress is not None:
        progress(step, running / log_every)
    mean = running / log_every
    if accelerator.num_processes > 1:  # every rank reaches this step together: the collective is safe
        mean = float(accelerator.reduce(torch.tensor(mean, device=accelerator.device), "mean"))
    if log:
        log({"step": step, "loss": mean, "lr": scheduler.get_last_lr()[0],
             **{k: v / log_every for k, v in running_extra.items()}})


def train(model, tokenizer, feats: list[dict], cfg: TrainConfig, hooks: list[TrainHook] = (),
          log: Callable[[dict], None] | None = None, checkpoint_dir: Path | None = None,
          resume: bool = False, checkpoint_last: bool = False, *,
          collate: Callable[[list], dict] | None = None, loss_fn: LossFn | None = None,
          extra_modules: list[torch.nn.Module] = (),
          hook_module: Callable[[Any], Any] | None = None) -> dict:
    """Train ``model`` in place on tokenized ``feats``; returns {'steps', 'final_loss', 'resumed_from'}.

    With ``checkpoint_dir`` and ``cfg.checkpoint_every`` a checkpoint is saved every that many
    steps (not at the last step: the caller saves the finished model). ``checkpoint_last`` saves
    the last step too, even without ``checkpoint_every``: for a phase of a multi-phase run whose
    end state the next phase starts from, which resuming then restores without a step. With
    ``resume`` the newest valid checkpoint there is loaded and training continues from its step;
    records passed to ``log`` are then only those after that step (the caller rewinds its log to
    the checkpoint, as ``RunDir`` does). ``log`` is called on the main process only; its ``loss``
    is the mean over the last ``log_every`` steps and over all ranks.

    Tasks whose batches or losses are not a classifier's plug in without a loop of their own:

    - ``collate(rows) -> batch``: a dict of tensors from a list of ``feats`` rows (default: the
      tokenizer pads the inputs and stacks ``labels``).
    - ``loss_fn(model, batch) -> (loss, extra)``: replaces the forward pass and ``outputs.loss``;
      ``model`` is the prepared one (DDP-wrapped on several processes) and ``extra`` (plain floats of
      the step) is added to the logged record. Hooks then must not replace the loss.
    - ``extra_modules``: modules trained beside the model (a loss plug-in's own layers). They are
      moved to the device and put in train mode, their ``trainable_parameters`` join the optimizer
      after the model's groups, their gradients are clipped with the model's, and their
      ``state_dict`` is checkpointed (a module keeps other state, an optimizer of its own, say,
      through ``get_extra_state``). They are not wrapped for DDP, so with trainable parameters they
      are refused on more than one process.
    - ``hook_module(model)``: what hooks are given (default: the unwrapped model), e.g. the
      Hugging Face encoder inside a wrapper, which is what pruning masks apply to.
    """
    from accelerate import Accelerator

    if not feats:
        raise DataError("no training examples to train on")
    _check_one_loss_owner(hooks, loss_fn)
    set_seed(cfg.seed)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    collate = collate or make_collate(tokenizer)
    world, rank = accelerator.num_processes, accelerator.process_index
    per_epoch = steps_per_epoch(len(feats), cfg.batch_size, world)
    total = cfg.max_steps or max(1, math.ceil(per_epoch * cfg.epochs))
    extra_modules = list(extra_modules)
    extra_params = _extra_parameters(extra_modules, world, accelerator.device)

    model, raw, optimizer, scheduler = _prepared(model, extra_params, cfg, total, accelerator)
    hooked = hook_module(raw) if hook_module else raw
    for h in hooks:
        h.on_train_begin(hooked, total)

    # running sums of the loss and of the loss plug-in's extras over the current log window
    step, running, running_extra, resumed_from = _loop_start(
        checkpoint_dir if resume else None, raw, optimizer, scheduler, hooks, extra_modules)

    model.train()
    for m in extra_modules:
        m.train()
    main = accelerator.is_main_process
    bar = tqdm(total=total, initial=step, desc="train", leave=False,
               disable=not main or not progress_wanted())
    last = float("nan")
    cause = likely_cause(cfg.lr, **_kd_values(loss_fn))
    lines = ProgressLines(total, step) if main and not progress_wanted() else None
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        batches = rank_batches(epoch_order(len(feats), cfg.seed, epoch), cfg.batch_size, rank, world)
        for idx in batches[offset:]:
            if step >= total:
                break
            batch = {k: v.to(accelerator.device) for k, v in collate([feats[i] for i in idx]).items()}
            loss, extra = _batch_loss(model, batch, hooks, loss_fn)
            # before backward: a non-finite loss would turn the gradients, then the weights, to NaN
            last = float(loss.detach())
            _stop_if_not_finite(last, step, cause, accelerator, bar)
            _optimizer_step(loss, model, extra_params, optimizer, scheduler, accelerator, hooks, hooked,
                            cfg.max_grad_norm)
            step += 1
            for h in hooks:
                h.on_step_end(hooked, step)
            if world > 1 and cfg.rank_check_every and step % cfg.rank_check_every == 0:
                check_ranks_agree(hooks, step)
            running += last
            for k, v in extra.items():
                running_extra[k] = running_extra.get(k, 0.0) + float(v)
            bar.update(1)
            if step % cfg.log_every == 0:
                _log_window(step, running, running_extra, cfg.log_every, scheduler, accelerator,
                            log if main else None, lines)
                running, running_extra = 0.0, {}
            if checkpoint_dir is not None and _checkpoint_due(cfg, step, total, checkpoint_last):
                save_checkpoint(checkpoint_dir, raw, optimizer, scheduler, hooks, step,
                                loop={"running": running, "running_extra": running_extra},
                                extra_modules=extra_modules)
    bar.close()
    accelerator.wait_for_everyone()
    return {"steps": step, "final_loss": last, "resumed_from": resumed_from}


# --------------------------------------------------------------------------------------------------
# Checkpoints


