"""SparseGPT's layer-wise pruning with reconstruction (Frantar & Alistarh 2023), pure tensor code.

For one linear map ``y = W x`` and calibration inputs ``X`` (tokens x in), pruning weights of a row
``w`` changes the layer output by ``(w - w') X^T``; its squared error is ``(w - w') H (w - w')^T``
with ``H = X^T X`` (the input Gram matrix; the layer-wise Hessian up to a factor 2). The optimal
brain surgeon (OBS) removes weight ``q`` and moves the others by
``delta = -w_q / [H^-1]_qq * H^-1[q, :]``, which is optimal for that one weight. SparseGPT visits
the columns left to right, prunes the chosen weights of each column and spreads their error onto
the columns not yet visited only, using the rows of the upper Cholesky factor of ``H^-1`` (so one
inverse serves every row of ``W`` although the rows prune different columns). The mask is chosen
adaptively per block of ``blocksize`` columns by the OBS saliency ``w^2 / U_jj^2`` (``U`` the
Cholesky factor) of the current, already updated weights; with an N:M pattern, per group of M
columns. Each block loses the same fraction of its weights, as in the reference code
(``block_split="uniform"``); re-pruning a pruned matrix, its old zeros stay and count toward the
matrix's target, and each block loses the same fraction of its other weights.
``block_split="saliency"`` lets blocks differ, each losing as many as it holds of the matrix's
lowest-saliency weights before any update: it lowered the layer output error on
synthetic layers with a few large input features, but cost accuracy on a real model (SST-2 MiniLM,
50%, encoder matrices: 85.44 against 86.01 with the uniform rule, dense 86.24), so it is not the
default.

``H`` is damped by ``percdamp`` times its mean diagonal, as the reference code does; input features
that never fire (zero diagonal) get a unit diagonal so the inverse exists.
"""

from __future__ import annotations

import torch

from compress.pruning.masks import keep_mask_flat


def damped_inverse(gram: torch.Tensor, weight: torch.Tensor | None = None, percdamp: float = 0.01
                   ) -> torch.Tensor:
    """``(H + damp I)^-1`` in float64, ``H = gram`` with dead features given a unit diagonal."""
    h = gram.detach().to(torch.float64).clone()
    diag = torch.diagonal(h)
    dead = diag == 0
    diag[dead] = 1.0
    diag += percdamp * diag.mean()
    return torch.cholesky_inverse(torch.linalg.cholesky(h))


def _block_counts(saliency: torch.Tensor, total: int, blocksize: int, split: str = "saliency",
                  forced: torch.Tensor | None = None) -> list[int]:
    """Weights to prune in each block of columns, summing to ``total`` exactly (to the number of
    ``forced`` weights when there are more of those). ``"saliency"``: as many as the block holds of
    the ``total`` lowest-saliency weights of the whole matrix (``forced`` ones score -inf, so they
    come first); ``"uniform"``: every block its forced weights, plus the same fraction of its other
    weights (the reference code's choice: the same fraction of every block when none is forced).
    Forced zeros count toward the matrix's ``total``: a block holding more than its share of them
    does not push the matrix past it."""
    rows, cols = saliency.shape
    starts = list(range(0, cols, blocksize))
    if split == "uniform":
        ends = [min(a + blocksize, cols) for a in starts]
        held = ([int(forced[:, a:b].sum()) for a, b in zip(starts, ends)] if forced is not None
                else [0] * len(starts))
        free = total - sum(held)
        if free <= 0:
            return held
        room = [rows * (b - a) - f for a, b, f in zip(starts, ends, held)]
        out, before, capacity = [], 0, sum(room)
        for f, r in zip(held, room):
            out.append(f + round(free * (before + r) / capacity) - round(free * before / capacity))
            before += r
        return out
    pruned = ~keep_mask_flat(saliency, total).reshape(saliency.shape)
    return [int(pruned[:, a:a + blocksize].sum()) for a in starts]


@torch.no_grad()
def sparsegpt_prune(weight: torch.Tensor, gram: torch.Tensor, prune_count: int | None = None,
                    pattern: tuple[int, int] | None = None, forced: torch.Tensor | None = None,
                    blocksize: int = 128, percdamp: float = 0.01, block_split: str = "uniform"
                    ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Prune ``weight`` ``[out, in]`` given ``gram`` ``[in, in]``; returns ``(new weight, keep mask,
    estimated error)``.

    Unstructured: ``prune_count`` weights of the matrix go (each block of columns loses its share,
    ``_block_counts``). ``pattern`` ``(n, m)``: ``n`` zeros in every group of ``m`` consecutive
    columns of every row (``blocksize`` must then be a multiple of ``m``). ``forced`` (bool, True =
    must be pruned, e.g. the zeros of an already pruned model) is pruned first and always, and counts
    toward ``prune_count`` (the matrix ends at ``prune_count`` zeros unless more are forced). The error
    is ``sum (w - w')^2 / [H^-1]_jj^2 / 2`` over the pruned weights, the OBS estimate of the added
    squared output error. The new weight is exactly zero where the mask is False.
    """
    rows, cols = weight.shape
    if pattern is not None and blocksize % pattern[1]:
        blocksize = pattern[1] * max(1, blocksize // pattern[1])
    # the inverse and its factor in float64; the column sweep in the weight's precision (float32 for
    # a float32 model, as the reference code does: the sweep is most of the time)
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    u = torch.linalg.cholesky(damped_inverse(gram, weight, percdamp), upper=True).to(dtype)
    w = weight.detach().to(dtype).clone()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the sweep's operations are small: threads only add synchronisation
    try:
        return _sweep(w, u, weight.dtype, prune_count, pattern, forced, blocksize, block_split)
    finally:
        torch.set_num_threads(threads)


def _sweep(w: torch.Tensor, u: torch.Tensor, out_dtype: torch.dtype, prune_count: int | None,
           pattern: tuple[int, int] | None, forced: torch.Tensor | None, blocksize: int,
           block_split: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """SparseGPT's column sweep over ``w`` with ``u`` the upper Cholesky factor of ``H^-1``."""
    rows, cols = w.shape
    pruned = torch.zeros(rows, cols, dtype=torch.bool, device=w.device)
    forced = (torch.zeros_like(pruned) if forced is None else forced.to(w.device, torch.bool))
    counts = None
    if pattern is None:
        saliency = (w ** 2 / torch.diagonal(u).reshape(1, -1) ** 2).masked_fill(forced, float("-inf"))
        counts = _block_counts(saliency, prune_count or 0, blocksize, block_split, forced)
    error = 0.0
    for bi, i1 in enumerate(range(0, cols, blocksize)):
        i2 = min(i1 + blocksize, cols)
        w1, u1 = w[:, i1:i2].clone(), u[i1:i2, i1:i2]
        d1 = torch.diagonal(u1)
        err1 = torch.zeros_like(w1)
        if pattern is None:
            score = (w1 ** 2 / d1.reshape(1, -1) ** 2).masked_fill(forced[:, i1:i2], float("-inf"))
            pruned[:, i1:i2] = ~keep_mask_flat(score, counts[bi]).reshape(score.shape)
            pruned[:, i1:i2] |= forced[:, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if pattern is not None and i % pattern[1] == 0:
                n, m = pattern
                score = (w1[:, i:i + m] ** 2 / d1[i:i + m].reshape(1, -1) ** 2)
                score = score.masked_fill(forced[:, col:col + m], float("-inf"))
                # a stable sort keeps the lower index first among equal scores
                low = torch.sort(score, dim=1, stable=True).indices[:, :n]
                pruned[:, col:col + m].scatter_(1, low, True)
                pruned[:, col:col + m] |= forced[:, col:col + m]
            q = w1[:, i].masked_fill(pruned[:, col], 0.0)
            e = (w1[:, i] - q) / d1[i]
            error += float((e ** 2).sum()) / 2
            w1[:, i:] -= e.reshape(-1, 1) * u1[i, i:].reshape(1, -1)
            w1[:, i] = q
            err1[:, i] = e
        w[:, i1:i2] = w1
        w[:, i2:] -= err1 @ u[i1:i2, i2:]
    w.masked_fill_(pruned, 0.0)
    return w.to(out_dtype), ~pruned, error
