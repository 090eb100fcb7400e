"""The student training loop: Adam, shuffled batches with dynamic padding, KD loss, a checkpoint
after every epoch. Small on purpose: students are cheap and train well with plain Adam.

An example is a dict with ``input_ids`` (list of int), ``teacher`` (a logits row or None), and
``label`` (int, a multi-hot list, or None for augmented examples).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.config import check_choice, check_range
from compress.distill.losses import DEFAULT_TEMPERATURE, KD_LOSS_CHOICES, check_kd_values, distillation_loss
from compress.training.divergence import check_finite_loss, likely_cause

LR_SCHEDULES = ("constant", "linear")


def lr_factor(schedule: str, step: int, total: int) -> float:
    """Multiplier of the base learning rate before optimizer step ``step`` (0-based) of ``total``."""
    if schedule == "linear":
        return max(0.0, 1.0 - step / max(total, 1))
    return 1.0


@dataclass(frozen=True)
class StudentTrainConfig:
    lr: float = 1e-3
    epochs: int = 10
    batch_size: int = 64
    weight_decay: float = 0.0
    max_grad_norm: float = 5.0
    seed: int = 42
    temperature: float = DEFAULT_TEMPERATURE
    kd_lambda: float = 4.0
    kd_loss: str = "kl"  # or "mse" on logits
    multilabel: bool = False
    lr_schedule: str = "constant"  # or "linear": decay to 0 over all steps

    def __post_init__(self):
        check_range("lr", self.lr, 0, None, lo_open=True)
        check_range("epochs", self.epochs, 1)
        check_range("batch_size", self.batch_size, 1)
        check_kd_values(self.temperature, self.kd_lambda)
        check_choice("kd_loss", self.kd_loss, KD_LOSS_CHOICES)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)


def collate(rows: list[dict], pad_id: int, num_labels: int, multilabel: bool) -> dict[str, torch.Tensor]:
    """Pad to the longest row; teacher logits/labels of rows that lack them are zero and masked."""
    n, width = len(rows), max(len(r["input_ids"]) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, :len(r["input_ids"])] = 1
    out = {"input_ids": ids, "attention_mask": mask}
    has_teacher = all(r.get("teacher") is not None for r in rows)
    if has_teacher:
        out["teacher"] = torch.tensor(np.stack([r["teacher"] for r in rows]), dtype=torch.float32)
    label_mask = torch.tensor([r.get("label") is not None for r in rows])
    if multilabel:
        labels = torch.tensor([r["label"] if r.get("label") is not None else [0.0] * num_labels
                               for r in rows], dtype=torch.float32)
    else:
        labels = torch.tensor([r["label"] if r.get("label") is not None else 0 for r in rows])
    out["labels"], out["label_mask"] = labels, label_mask
    return out


@torch.no_grad()
def predict_student(model, sequences: list[list[int]], pad_id: int, batch_size: int = 256,
                    device: torch.device | str = "cpu") -> np.ndarray:
    """Logits (n, num_labels) in input order (length-sorted batches)."""
    model.eval()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out = None
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        b = collate([{"input_ids": sequences[i]} for i in idx], pad_id, 1, False)
        logits = model(b["input_ids"].to(device), b["attention_mask"].to(device)).float().cpu().numpy()
        if out is None:
            out = np.zeros((len(sequences), logits.shape[1]), dtype=np.float32)
        out[idx] = logits
    return out


def _state_copy(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def train_student(model, examples: list[dict], cfg: StudentTrainConfig, pad_id: int,
                  device: torch.device | str = "cpu", use_teacher: bool = True,
                  log: Callable[[dict], None] | None = None,
                  epoch_end: Callable[[int], dict] | None = None,
                  validate: Callable[[], float] | None = None,
                  checkpoint: Path | None = None) -> dict:
    """Train ``model`` in place. ``epoch_end(epoch)`` may return metrics that are logged.

    With ``validate`` (a score, higher is better, on examples held out of training) the model is
    scored after every epoch and ends with the weights of its best epoch (the earlier one on a tie);
    without it, with the last epoch's. With ``checkpoint`` set, state (the best epoch's weights
    included) is saved there after every epoch and a run resumes from it."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    model.to(device)
    opts, dense = _optimizers(model, cfg)
    state = _resume(checkpoint, model, opts)  # {} when there is nothing to resume
    start = int(state.get("epoch", 0))
    per_epoch = -(-len(examples) // cfg.batch_size)
    val_scores: list[float] = list(state.get("val_scores", []))
    best = state.get("best")
    # A resumed run counts the steps, seconds and loss of the epochs it did before the stop too.
    step = int(state.get("step", start * per_epoch))
    before = float(state.get("seconds", 0.0))
    last = float(state.get("final_loss", float("nan")))
    t0 = time.time()
    loop = _EpochLoop(model, examples, cfg, opts, dense, pad_id, device, use_teacher, per_epoch,
                      cause=(likely_cause(cfg.lr, cfg.temperature, cfg.kd_lambda) if use_teacher
                             else likely_cause(cfg.lr)))
    for epoch in range(start, cfg.epochs):
        sums, batches, step, factor = loop.run(epoch, step)
        last = sums["loss"] / max(batches, 1)
        record = {"epoch": epoch + 1, **{k: v / max(batches, 1) for k, v in sums.items()},
                  "lr": cfg.lr * factor,  # the last step's
                  "seconds": round(before + time.time() - t0, 1)}
        if validate is not None:
            val_scores.append(float(validate()))
            record["val_score"] = val_scores[-1]
            if val_scores[-1] > max(val_scores[:-1], default=float("-inf")):
                best = _state_copy(model)
        if epoch_end is not None:
            record["eval"] = epoch_end(epoch + 1)
        if log:
            log(record)
        # one line per epoch: not a progress bar, so COMPRESS_NO_PROGRESS leaves it on
        ev = record.get("eval", {}).get("score")
        print(f"  epoch {epoch + 1}/{cfg.epochs}: loss {last:.4f}"
              + (f", held-out {val_scores[-1]:.4f}" if validate is not None else "")
              + (f", dev {ev:.4f}" if ev is not None else "") + f" ({record['seconds']}s)", flush=True)
        if checkpoint is not None:
            _save_state(checkpoint, {"epoch": epoch + 1, "model": model.state_dict(),
                                     "optimizers": [o.state_dict() for o in opts],
                                     "rng_torch": torch.get_rng_state(), "val_scores": val_scores,
                                     "best": best, "step": step, "seconds": before + time.time() - t0,
                                     "final_loss": last})
    out = {"steps": step, "epochs": cfg.epochs, "final_loss": last, "seconds": before + time.time() - t0}
    if validate is not None:
        selected = val_scores.index(max(val_scores)) + 1
        model.load_state_dict(best)
        out.update(val_scores=val_scores, selected_epoch=selected)
    return out


def _optimizers(model, cfg: StudentTrainConfig) -> tuple[list[torch.optim.Optimizer], list]:
    """(optimizers, the dense parameters). Embedding tables with sparse gradients get SparseAdam
    (only the rows a batch uses are updated); everything else Adam. Gradient clipping applies to
    the dense parameters."""
    sparse = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse]
    dense = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in sparse)]
    opts = [torch.optim.Adam(dense, lr=cfg.lr, weight_decay=cfg.weight_decay)]
    if sparse:
        opts.append(torch.optim.SparseAdam(sparse, lr=cfg.lr))
    return opts, dense


def _resume(checkpoint: Path | None, model, opts) -> dict:
    """The saved state of an interrupted run, loaded into ``model``, ``opts`` and torch's RNG;
    {} when ``checkpoint`` is unset or not there."""
    if checkpoint is None or not checkpoint.is_file():
        return {}
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    for o, o_state in zip(opts, state["optimizers"]):
        o.load_state_dict(o_state)
    torch.set_rng_state(state["rng_torch"])
    return state


def _save_state(checkpoint: Path, state: dict) -> None:
    """Write ``state`` to ``checkpoint`` through a temporary file, so a stop never leaves half of one."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint.with_name(checkpoint.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(checkpoint)


@dataclass
class _EpochLoop:
    """One epoch of student training: seeded order, scheduled learning rate, loss, step."""

    model: Any
    examples: list[dict]
    cfg: StudentTrainConfig
    opts: list
    dense: list
    pad_id: int
    device: Any
    use_teacher: bool
    per_epoch: int
    cause: str

    def run(self, epoch: int, step: int) -> tuple[dict[str, float], int, int, float]:
        """(loss sums, batches, the step count after it, the last step's learning-rate factor)."""
        model, cfg, opts, examples = self.model, self.cfg, self.opts, self.examples
        model.train()
        g = torch.Generator().manual_seed(cfg.seed + epoch)
        order = torch.randperm(len(examples), generator=g).tolist()
        sums = {"loss": 0.0, "task": 0.0, "distill": 0.0}
        batches = 0
        for s in range(0, len(order), cfg.batch_size):
            factor = lr_factor(cfg.lr_schedule, epoch * self.per_epoch + s // cfg.batch_size,
                               self.per_epoch * cfg.epochs)
            for o in opts:
                for group in o.param_groups:
                    group["lr"] = cfg.lr * factor
            b = collate([examples[i] for i in order[s:s + cfg.batch_size]], self.pad_id,
                        model.config.num_labels, cfg.multilabel)
            b = {k: v.to(self.device) for k, v in b.items()}
            logits = model(b["input_ids"], b["attention_mask"])
            losses = distillation_loss(logits, b.get("teacher") if self.use_teacher else None, b["labels"],
                                       b["label_mask"], cfg.multilabel, cfg.temperature,
                                       cfg.kd_lambda if self.use_teacher else 0.0, cfg.kd_loss)
            # before backward: a non-finite loss would turn the weights to NaN (and the checkpoint)
            check_finite_loss(float(losses["loss"].detach()), step + 1, self.cause)
            for o in opts:
                o.zero_grad(set_to_none=True)
            losses["loss"].backward()
            if cfg.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.dense, cfg.max_grad_norm)
            for o in opts:
                o.step()
            step += 1
            batches += 1
            for k in sums:
                sums[k] += float(losses[k].detach())
        return sums, batches, step, factor
