"""Cross-rank agreement checks for multi-process training (accelerate/DDP); no-ops on one process."""

from __future__ import annotations

import hashlib

import torch

from compress.errors import IntegrityError


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
        raise IntegrityError(f"{what} differs across ranks: {values}")
    return [str(v) for v in values]
