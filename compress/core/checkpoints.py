"""Resumable checkpoints of the training loop: model, optimizer, scheduler, the RNG states of
every rank (dropout), hook states (masks), the step and the running loss.

Each checkpoint is written to a temporary folder, fsynced, hashed (SHA-256) and renamed, and the
last ``CHECKPOINT_KEEP`` are kept, so a kill or a full disk during a save leaves the previous
checkpoint intact, and a checkpoint corrupted later is detected by its hash and skipped in favour
of the one before. ``compress.training.loop`` saves them; ``compress.core.runs`` finds them to resume.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from compress.core.distributed import is_distributed
from compress.core.errors import CompressError, IntegrityError

log_ = logging.getLogger(__name__)

CHECKPOINT_KEEP = 2  # the newest checkpoint and the one before it (the fallback if the newest is corrupt)
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def _rng_state() -> dict:
    key, pos, has_gauss, cached = np.random.get_state()[1:]
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        # numpy's state as tensors and numbers, which weights_only loading accepts
        "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": random.getstate(),
    }


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    n = s["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached"]))
    version, internal, gauss = s["python"]
    random.setstate((version, tuple(internal), gauss))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename itself is still atomic
    finally:
        os.close(fd)


def checkpoint_dirs(folder: Path) -> list[Path]:
    """Complete checkpoint folders (``step-NNNNNNNN`` with state and hash), oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for d in folder.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / "state.pt").is_file() and (d / "state.sha256").is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def checkpoint_step(path: Path) -> int:
    return int(_STEP_DIR.match(path.name).group(1))


def verify_checkpoint(path: Path) -> bool:
    """True when ``state.pt`` still has the SHA-256 recorded when it was written."""
    try:
        expected = (path / "state.sha256").read_text(encoding="utf-8").strip()
        return _sha256(path / "state.pt") == expected
    except OSError:
        return False


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint under ``folder`` whose hash verifies; None when there is none.

    A corrupt newest checkpoint is skipped in favour of the previous one, with one warning naming
    both; if every checkpoint is corrupt, IntegrityError says so (its one line, no warning before
    it) rather than silently restarting from step 0.
    """
    dirs = checkpoint_dirs(folder)
    corrupt = []
    for d in reversed(dirs):
        if verify_checkpoint(d):
            if corrupt:
                log_.warning("checkpoint %s does not match its SHA-256; resuming from %s instead",
                             ", ".join(c.name for c in corrupt), d.name)
            return d
        corrupt.append(d)
    if dirs:
        raise IntegrityError(f"every checkpoint under {folder} is corrupt ({', '.join(d.name for d in dirs)}"
                             f" fail their SHA-256); remove {folder} to restart from step 0")
    return None


def save_checkpoint(folder: Path, model, optimizer, scheduler, hooks, step: int,
                    loop: dict | None = None, keep: int = CHECKPOINT_KEEP,
                    extra_modules: list[torch.nn.Module] = ()) -> Path | None:
    """Save the training state of ``step`` as ``folder/step-NNNNNNNN``; returns it (None off rank 0).

    Call on every rank in multi-process runs: the RNG states of all ranks are gathered, rank 0
    writes. The state goes to a temporary folder, is fsynced and hashed, and the folder is renamed,
    so an interruption at any point leaves the previous checkpoint intact. Older checkpoints beyond
    ``keep`` are removed after the new one is in place. ``loop`` holds extra loop state (plain values).
    The ``state_dict`` of each of ``extra_modules`` (``train``'s) is saved under ``extra_modules``;
    without them the checkpoint has no such entry.
    """
    rng = _rng_state()
    if is_distributed():
        gathered: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, rng)
        if torch.distributed.get_rank() != 0:
            return None
    else:
        gathered = [rng]
    state = {
        "step": step,
        "loop": dict(loop or {}),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": gathered,
        "hooks": [h.state_dict() for h in hooks],
    }
    if extra_modules:
        state["extra_modules"] = [m.state_dict() for m in extra_modules]
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step:08d}"
    tmp = folder / f".step-{step:08d}.tmp"
    for stale in folder.glob(".step-*.tmp"):  # left by a save that was killed
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.mkdir()
        with open(tmp / "state.pt", "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        (tmp / "state.sha256").write_text(_sha256(tmp / "state.pt") + "\n", encoding="utf-8")
        if final.exists():  # a corrupt checkpoint of this step, skipped when resuming
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoint_dirs(folder)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, hooks,
                    extra_modules: list[torch.nn.Module] = ()) -> dict:
    """Restore a checkpoint folder written by ``save_checkpoint`` (or the newest valid one when
    ``path`` is the folder holding them); returns the loop state, ``{'step', 'running', ...}``."""
    if not _STEP_DIR.match(path.name):
        found = latest_checkpoint(path)
        if found is None:
            raise CompressError(f"no checkpoint under {path} to resume from")
        path = found
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - an unreadable checkpoint is reported as one line
        raise IntegrityError(f"checkpoint {path} cannot be read ({type(exc).__name__}); remove it to "
                             "resume from the previous one") from None
    extra_states = state.get("extra_modules", [])
    if len(extra_states) != len(extra_modules):
        raise CompressError(f"checkpoint {path} holds the state of {len(extra_states)} extra module(s) "
                            f"but this run trains {len(extra_modules)}; resume with the same command "
                            "and options")
    try:
        model.load_state_dict(state["model"])
        for m, ms in zip(extra_modules, extra_states):
            m.load_state_dict(ms)
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CompressError(f"checkpoint {path} does not fit this model/optimizer ({first}); resume "
                            "with the same model and options as the interrupted run") from None
    scheduler.load_state_dict(state["scheduler"])
    rngs = state["rng"]
    rank = torch.distributed.get_rank() if is_distributed() else 0
    world = torch.distributed.get_world_size() if is_distributed() else 1
    if len(rngs) != world:
        log_.warning("checkpoint was written by %d process(es), resuming with %d: dropout will not "
                     "replay exactly", len(rngs), world)
    _set_rng_state(rngs[rank] if rank < len(rngs) else rngs[0])
    hook_states = state["hooks"]
    if len(hook_states) != len(hooks):
        raise CompressError(f"checkpoint {path} holds the state of {len(hook_states)} hook(s) but this "
                            f"run has {len(hooks)}; resume with the same command and options")
    for h, hs in zip(hooks, hook_states):
        h.load_state_dict(hs)
    return {"step": int(state["step"]), "running": 0.0, **state["loop"]}
