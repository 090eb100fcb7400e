"""Structured search against a latency target: how many heads and FFN neurons each layer keeps so
that the predicted time of the pruned encoder in the runtime it ships in stays within the target,
at the least estimated loss. Whole attention blocks, whole FFN blocks and whole layers (both
blocks) may go where the architecture can remove them.

Why not FLOPs: a runtime pays per block, not per multiply-add. A block of 6 FFN neurons still
costs a dispatch, a LayerNorm and a residual add, and int8 GEMMs run at different speeds by
width; ``compress.measure.latency_table`` measures these costs on the machine, and this search
spends the time budget where the table says it goes (after ZipLM, Kurtic, Frantar & Alistarh 2023,
whose search is also a dynamic programme over per-layer options with measured latencies).

Per block b (layer l's attention or FFN) and kept count k:

- time: ``attn_ms(k)`` / ``ffn_ms(k)`` from the latency table (0 for an empty block);
- loss: the block-Fisher estimate of removing the n - k least important units (Kwon et al.'s
  mask rearrangement estimate, ``sum_i (g_i . z)^2`` over examples i, ``z`` the removed units'
  indicator, ``g_i`` the per-example gradient with respect to the unit masks), computed for every
  k at once with prefix sums over the importance ranking.

The search picks one option per block minimising the summed loss with the summed time within the
budget: a knapsack solved exactly by dynamic programming over time quantised into ``resolution``
steps, each option's time rounded up (so the predicted time of the result never exceeds the
budget). ``brute_force`` enumerates every combination, for tests on small cases.

No model here: per-example gradients and cost functions in, per-layer kept counts out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from compress.core.errors import UsageError


@dataclass(frozen=True)
class BlockOptions:
    """The choices for one block: kept counts, their predicted milliseconds and estimated losses."""

    kind: str  # "attention" or "ffn"
    layer: int
    counts: tuple[int, ...]
    ms: tuple[float, ...]
    loss: tuple[float, ...]


def keep_order(importance: torch.Tensor) -> torch.Tensor:
    """Unit indices, most important first (ties: lower index first): a block keeping k units keeps
    the first k, one removing r units removes the last r."""
    return torch.argsort(-importance.double(), stable=True)


def removal_losses(grads: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
    """``[n + 1]``: entry r = ``sum_i (g_i . z_r)^2``, the block-Fisher loss estimate of removing the
    r least important units (the last r of ``keep_order``). ``grads``: ``[examples, n]`` per-example
    gradients of the loss with respect to the block's unit masks."""
    order = keep_order(importance).flip(0)
    partial_sums = torch.cumsum(grads.double()[:, order], dim=1)  # [examples, n]
    losses = partial_sums.pow(2).sum(0)
    return torch.cat([torch.zeros(1, dtype=torch.float64), losses])


def width_counts(full: int, step: int, allow_empty: bool) -> list[int]:
    """The FFN widths the search may choose: multiples of ``step`` below ``full``, ``full`` itself,
    and 0 (an empty block) when ``allow_empty``."""
    counts = set(range(step, full, step)) | {full}
    if allow_empty:
        counts.add(0)
    elif step > 1:
        counts.add(1)
    return sorted(c for c in counts if 0 <= c <= full)


def default_ffn_step(full: int) -> int:
    """About 64 width options per block, in multiples of 8 where the block is wide enough."""
    step = max(1, round(full / 64))
    return max(8, step - step % 8) if step >= 8 else step


def block_options(kind: str, layer: int, grads: torch.Tensor, importance: torch.Tensor,
                  counts: Sequence[int], cost_ms: Callable[[int], float]) -> BlockOptions:
    n = grads.shape[1]
    losses = removal_losses(grads, importance)
    ms = tuple(0.0 if k == 0 else float(cost_ms(k)) for k in counts)
    return BlockOptions(kind, layer, tuple(counts), ms, tuple(float(losses[n - k]) for k in counts))


def block_budget_ms(table, dense_ms: float, speedup: float, n_layers: int) -> float:
    """The milliseconds the attention and FFN blocks of an ``n_layers`` model may take so that ``table``
    predicts ``dense_ms / speedup``: the target time over the table's ``dense_scale`` (every
    prediction is multiplied by it; 1 for a table without one), less what no choice of the search
    changes (the embeddings and head, each layer's LayerNorms)."""
    fixed_ms = table.base_ms + n_layers * table.layer_fixed_ms
    return dense_ms / speedup / getattr(table, "dense_scale", 1.0) - fixed_ms


def search_latency(blocks: Sequence[BlockOptions], budget_ms: float, resolution: int = 2000
                   ) -> tuple[list[int], float, float]:
    """The option of each block (index into its ``counts``) of least summed loss whose summed
    milliseconds, each rounded up to ``budget_ms / resolution``, fit ``budget_ms``; returns
    (choices, predicted ms, estimated loss). UsageError when not even the cheapest options fit."""
    if budget_ms <= 0:
        raise UsageError(f"the time left for the encoder blocks is {budget_ms:.3g} ms; the latency target "
                         "is below what the embeddings, the task head and the layers' fixed costs take: "
                         "ask for a smaller --speedup")
    quantum = budget_ms / resolution
    best = np.full(resolution + 1, np.inf)
    best[0] = 0.0
    picks = []
    for block in blocks:
        steps = [math.ceil(ms / quantum - 1e-9) for ms in block.ms]
        new = np.full(resolution + 1, np.inf)
        pick = np.full(resolution + 1, -1, dtype=np.int64)
        for j, (s, loss) in enumerate(zip(steps, block.loss)):
            if s > resolution:
                continue
            cand = np.full(resolution + 1, np.inf)
            cand[s:] = best[:resolution + 1 - s] + loss
            better = cand < new
            new[better], pick[better] = cand[better], j
        best = new
        picks.append(pick)
    end = int(np.argmin(best))
    if not np.isfinite(best[end]):
        cheapest = sum(min(b.ms) for b in blocks)
        raise UsageError(f"no structure fits {budget_ms:.3g} ms for the encoder blocks (the smallest this "
                         f"architecture allows takes {cheapest:.3g} ms); ask for a smaller --speedup")
    choices, at = [], end
    for block, pick in zip(reversed(blocks), reversed(picks)):
        j = int(pick[at])
        choices.append(j)
        at -= math.ceil(block.ms[j] / quantum - 1e-9)
    choices.reverse()
    ms = sum(b.ms[j] for b, j in zip(blocks, choices))
    return choices, ms, float(best[end])


def brute_force(blocks: Sequence[BlockOptions], budget_ms: float) -> tuple[list[int], float]:
    """Every combination; the least summed loss within ``budget_ms`` (exact milliseconds)."""
    best: tuple[float, list[int]] | None = None
    for combo in itertools.product(*(range(len(b.counts)) for b in blocks)):
        ms = sum(b.ms[j] for b, j in zip(blocks, combo))
        loss = sum(b.loss[j] for b, j in zip(blocks, combo))
        if ms <= budget_ms + 1e-9 and (best is None or loss < best[0]):
            best = (loss, list(combo))
    if best is None:
        raise UsageError("no combination fits the budget")
    return best[1], best[0]


def top_units(importance: torch.Tensor, k: int) -> list[int]:
    """The ``k`` most important units' indices (the first k of ``keep_order``), sorted."""
    return sorted(keep_order(importance)[:k].tolist())
