"""The fine-tuning loop: AdamW, linear warm-up/decay, accelerate for devices and DDP.

Pruning and distillation plug in through ``TrainHook`` (mask after each optimizer step, replace the
loss) instead of subclassing the loop. The batch order of epoch ``e`` is a permutation seeded by
``seed + e``, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from compress.config import check_range
from compress.tasks.base import TextDataset


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 5e-5
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 32
    eval_batch_size: int = 128
    max_length: int = 128
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    log_every: int = 50
    checkpoint_every: int = 0

    def __post_init__(self):
        check_range("lr", self.lr, 0, None, lo_open=True)
        check_range("epochs", self.epochs, 0, None, lo_open=True)
        if self.max_steps is not None:
            check_range("max_steps", self.max_steps, 1)
        check_range("batch_size", self.batch_size, 1)
        check_range("max_length", self.max_length, 8, 512)
        check_range("warmup_ratio", self.warmup_ratio, 0, 1)
        check_range("weight_decay", self.weight_decay, 0)


class TrainHook:
    """Extension points of the loop; every method is optional."""

    def on_train_begin(self, model, total_steps: int) -> None:
        pass

    def compute_loss(self, model, batch: dict, outputs) -> torch.Tensor | None:
        """Return a loss to replace the model's own, or None to keep it."""
        return None

    def on_step_end(self, model, step: int) -> None:
        """Called after every optimizer step (masks are re-applied here)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def train(model, tokenizer, feats: list[dict], cfg: TrainConfig, hooks: list[TrainHook] = (),
          log: Callable[[dict], None] | None = None, checkpoint_dir: Path | None = None,
          resume: bool = False) -> dict:
    """Train ``model`` in place on tokenized ``feats``; returns {'steps', 'final_loss'}."""
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    set_seed(cfg.seed)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    collate = make_collate(tokenizer)
    world = accelerator.num_processes
    per_epoch = max(1, math.ceil(len(feats) / (cfg.batch_size * world)))
    total = cfg.max_steps or max(1, math.ceil(per_epoch * cfg.epochs))

    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total), total)
    model, optimizer = accelerator.prepare(model, optimizer)
    for h in hooks:
        h.on_train_begin(accelerator.unwrap_model(model), total)

    step = 0
    if resume and checkpoint_dir is not None and (checkpoint_dir / "state.pt").is_file():
        step = load_checkpoint(checkpoint_dir, accelerator.unwrap_model(model), optimizer, scheduler,
                               hooks)

    model.train()
    bar = tqdm(total=total, initial=step, desc="train", disable=not accelerator.is_main_process
               or os.environ.get("COMPRESS_NO_PROGRESS") == "1", leave=False)
    running, last = 0.0, float("nan")
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        order = epoch_order(len(feats), cfg.seed, epoch)
        shard = order[accelerator.process_index::world]
        for b in range(offset, per_epoch):
            if step >= total:
                break
            idx = shard[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            if not idx:
                break
            batch = {k: v.to(accelerator.device) for k, v in collate([feats[i] for i in idx]).items()}
            outputs = model(**batch)
            loss = None
            for h in hooks:
                loss = h.compute_loss(model, batch, outputs) if loss is None else loss
            loss = outputs.loss if loss is None else loss
            accelerator.backward(loss)
            if cfg.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            for h in hooks:
                h.on_step_end(accelerator.unwrap_model(model), step)
            last = float(loss.detach())
            running += last
            bar.update(1)
            if log and step % cfg.log_every == 0:
                log({"step": step, "loss": running / cfg.log_every, "lr": scheduler.get_last_lr()[0]})
                running = 0.0
            if checkpoint_dir is not None and cfg.checkpoint_every and step % cfg.checkpoint_every == 0 \
                    and accelerator.is_main_process:
                save_checkpoint(checkpoint_dir, accelerator.unwrap_model(model), optimizer, scheduler,
                                hooks, step)
    bar.close()
    accelerator.wait_for_everyone()
    return {"steps": step, "final_loss": last}


def save_checkpoint(folder: Path, model, optimizer, scheduler, hooks, step: int) -> None:
    """Model, optimizer, scheduler, RNG, hook state and step, written to a temporary file and
    renamed: an interrupted save leaves the previous checkpoint intact."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng_torch": torch.get_rng_state(),
        "rng_numpy": np.random.get_state()[1].tolist(),
        "rng_python": random.getstate()[1],
        "hooks": [h.state_dict() for h in hooks],
    }
    tmp = folder / "state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / "state.pt")


def load_checkpoint(folder: Path, model, optimizer, scheduler, hooks) -> int:
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng_torch"])
    np.random.set_state(("MT19937", np.array(state["rng_numpy"], dtype=np.uint32), 624, 0, 0.0))
    random.setstate((3, tuple(state["rng_python"]), None))
    for h, hs in zip(hooks, state["hooks"]):
        h.load_state_dict(hs)
    return int(state["step"])
