"""Masks from scores: pure functions, deterministic on every process.

A mask is a bool tensor shaped like its weight, True = kept, False = pruned (stored as zero).
The ``k`` lowest scores are pruned, ``k = round(sparsity * numel)``; ties are broken by flat index
(lower index pruned first), and in global scope by the sorted parameter name, then the index, so
every rank of a multi-process run computes the same mask from the same weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from compress.core.config import check_range, check_sparsity
from compress.core.errors import UsageError


def n_pruned(numel: int, sparsity: float) -> int:
    """How many entries a tensor of ``numel`` elements loses at ``sparsity`` (nearest integer)."""
    return min(numel, int(round(sparsity * numel)))


def keep_mask_flat(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Bool keep-mask over a 1-D ``scores``: False for the ``k`` lowest, ties by lower index first.

    Uses a k-th value threshold rather than a full sort (several times faster on the 11.7M word
    embeddings): entries below the threshold are pruned, then the first (by index) of those equal to it.
    """
    flat = scores.reshape(-1)
    if k <= 0:
        return torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
    if k >= flat.numel():
        return torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    f = flat.float()
    thresh = torch.kthvalue(f, k).values
    keep = f > thresh
    n_not_above = f.numel() - int(torch.count_nonzero(keep))  # entries below or equal to the threshold
    if n_not_above > k:  # only part of the tied entries goes: keep the later ones
        ties = torch.nonzero(f == thresh, as_tuple=False).reshape(-1)
        n_below = n_not_above - ties.numel()
        keep[ties[k - n_below:]] = True
    return keep


def mask_from_scores(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Local (per-matrix) mask: prune the ``round(sparsity * numel)`` lowest-scoring entries."""
    check_sparsity(sparsity)
    return keep_mask_flat(scores, n_pruned(scores.numel(), sparsity)).reshape(scores.shape)


def local_masks(scores: dict[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """One threshold per matrix (the paper's default): each matrix reaches ``sparsity`` on its own."""
    return {name: mask_from_scores(scores[name], sparsity) for name in sorted(scores)}


def global_masks(scores: dict[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """One threshold over all matrices: ``sparsity`` overall, matrices differ.

    Scores are concatenated in sorted-name order, so ties between matrices break by name, then index.
    """
    check_sparsity(sparsity)
    names = sorted(scores)
    if not names:
        return {}
    device = scores[names[0]].device
    flat = torch.cat([scores[n].reshape(-1).float().to(device) for n in names])
    keep = keep_mask_flat(flat, n_pruned(flat.numel(), sparsity))
    out, start = {}, 0
    for n in names:
        size = scores[n].numel()
        out[n] = keep[start:start + size].reshape(scores[n].shape).to(scores[n].device)
        start += size
    return out


# scope name -> function(scores by name, sparsity) -> keep-masks by name
SCOPES: dict[str, Callable[[dict[str, torch.Tensor], float], dict[str, torch.Tensor]]] = {
    "local": local_masks,
    "global": global_masks,
}


def get_scope(name: str):
    if name not in SCOPES:
        raise UsageError(f"unknown scope '{name}'; choose one of: {', '.join(SCOPES)}")
    return SCOPES[name]


# ------------------------------------------------------------------------ N:M semi-structured


@dataclass(frozen=True)
class NMPattern:
    """N:M semi-structured sparsity: at least ``n`` zeros in every group of ``m`` consecutive
    weights along a matrix's last dimension. An ``nn.Linear`` weight is ``[out, in]``, so the groups
    run along its input dimension, the layout of PyTorch's semi-structured sparse kernels
    (``torch.sparse.to_sparse_semi_structured``, 2:4); a word-embedding matrix ``[vocab, hidden]``
    is grouped along its hidden dimension, the input dimension of the masked-LM decoder tied to it.

    ``n`` counts the zeros: 2:4 keeps 2 of every 4 weights (NVIDIA's 2:4), 1:4 keeps 3 of 4.
    """

    n: int
    m: int

    def __post_init__(self):
        if not (isinstance(self.n, int) and isinstance(self.m, int) and 0 < self.n < self.m):
            raise UsageError(f"--pattern {self.n}:{self.m}: N:M needs integers 0 < N < M (N zeros in "
                             "every group of M weights), e.g. 2:4")

    @classmethod
    def parse(cls, text: str) -> NMPattern:
        """'2:4' -> NMPattern(2, 4); UsageError naming the text otherwise."""
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(text))
        if m is None:
            raise UsageError(f"--pattern '{text}': expected N:M with integers 0 < N < M (N zeros in "
                             "every group of M weights), e.g. 2:4")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.n}:{self.m}"

    @property
    def sparsity(self) -> float:
        """The fraction of zeros once every group is pruned: N/M."""
        return self.n / self.m

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of ``shape`` splits into whole groups along its last dimension."""
        return len(shape) >= 2 and shape[-1] % self.m == 0

    def group_fraction(self, sparsity: float) -> float:
        """The fraction of groups pruned at a schedule's ``sparsity`` (N/M at the end: all of them)."""
        return min(1.0, sparsity / self.sparsity)

    def masks(self, scores: dict[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
        """A scope (``SCOPES``' signature): ``nm_mask`` of every matrix at the group fraction that
        ``sparsity`` stands for."""
        check_range("sparsity", sparsity, 0, self.sparsity + 1e-9)
        frac = self.group_fraction(sparsity)
        return {name: nm_mask(scores[name], self.n, self.m, frac) for name in sorted(scores)}


def nm_mask(scores: torch.Tensor, n: int, m: int, group_fraction: float = 1.0) -> torch.Tensor:
    """Keep-mask with the ``n`` lowest scores of each pruned group of ``m`` along the last dimension
    set False.

    ``scores``: ``[..., in]`` with ``in`` a multiple of ``m``; group g of the flattened rows holds
    entries ``g*m .. g*m + m - 1`` of the flat tensor. ``round(group_fraction * n_groups)`` groups
    are pruned: those whose ``n`` lowest scores sum lowest (a group holding an already pruned entry,
    scored -inf, goes first, so masks stay nested as the fraction grows). Ties break by lower index:
    within a group, and between groups.
    """
    if scores.ndim < 2 or scores.shape[-1] % m:
        raise UsageError(f"a {n}:{m} pattern needs a matrix whose last dimension is a multiple of "
                         f"{m}; got shape {tuple(scores.shape)}")
    check_range("group_fraction", group_fraction, 0, 1)
    groups = scores.reshape(-1, m).float()
    # a stable ascending sort keeps the lower index first among equal scores
    lowest, order = torch.sort(groups, dim=1, stable=True)
    lowest, order = lowest[:, :n], order[:, :n]
    pruned_groups = ~keep_mask_flat(lowest.sum(dim=1), n_pruned(groups.shape[0], group_fraction))
    drop = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, order, True)
    drop &= pruned_groups[:, None]
    return (~drop).reshape(scores.shape)


def broken_groups(weight: torch.Tensor, n: int, m: int) -> tuple[int, tuple[int, int, int] | None]:
    """How many groups of ``m`` along the last dimension of ``weight`` hold fewer than ``n`` zeros,
    and the first as (row, group in the row, its zeros), rows flattened over the leading dimensions;
    (0, None) when the pattern holds. ``weight``'s last dimension must be a multiple of ``m``."""
    zeros = (weight.detach().reshape(-1, m) == 0).sum(dim=1)
    bad = torch.nonzero(zeros < n, as_tuple=False).reshape(-1)
    if bad.numel() == 0:
        return 0, None
    per_row = weight.shape[-1] // m
    first = int(bad[0])
    return int(bad.numel()), (first // per_row, first % per_row, int(zeros[first]))
