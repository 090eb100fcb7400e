"""Cross-rank agreement checks for multi-process training (accelerate/DDP); no-ops on one process."""

from __future__ import annotations

import hashlib

import torch

from compress.core.errors import IntegrityError


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, shapes and bytes, in sorted name order: equal on every rank iff equal."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def assert_same_across_ranks(value: str, what: str) -> list[str]:
    """Gather ``value`` from every rank and raise IntegrityError if any differs; returns the values."""
    if not is_distributed():
        return [value]
    values: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(values, value)
    if len(set(values)) != 1:
        shown = ", ".join(f"rank {r}: {str(v)[:12]}" for r, v in enumerate(values))
        raise IntegrityError(f"{what} differs across ranks ({shown}); every rank must compute the same "
                             "masks (same seed, same data order) or take rank 0's by broadcast")
    return [str(v) for v in values]


def assert_tensors_same_across_ranks(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Like ``assert_same_across_ranks`` on ``tensor_checksum(tensors)``, but a failure names the
    tensors that differ and on which ranks (one more gather, only on failure: every rank sees the
    same gathered values, so all take that branch together)."""
    try:
        assert_same_across_ranks(tensor_checksum(tensors), what)
    except IntegrityError:
        mine = {n: tensor_checksum({n: t}) for n, t in tensors.items()}
        every: list[dict | None] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, mine)
        bad = [n for n in sorted(mine) if len({str(d.get(n)) for d in every if d is not None}) > 1]
        names = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise IntegrityError(f"{what} differs across ranks in {len(bad)} tensor(s): {names}; every rank "
                             "must compute the same masks (same seed, same data order)") from None
