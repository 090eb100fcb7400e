"""Removing whole column groups of one linear map with the optimal second-order update of the rest
(the structured optimal brain surgeon of ZipLM, Kurtic, Frantar & Alistarh 2023), pure tensor code.

For ``y = W x`` with calibration inputs ``X`` (tokens x in) and ``H = X^T X``, setting the columns
``G`` of ``W`` to zero and moving the others by

    delta = -W[:, G] (H^-1[G, G])^-1 H^-1[G, :]

is the least-squares optimal way to make up for them: the output error ``|(W - W') X^T|^2`` rises by
``tr(W[:, G] (H^-1[G, G])^-1 W[:, G]^T)``, the group's score. One group goes at a time, each time the
group of least score under the current weights and the current inverse; ``H^-1`` then loses the
group by the Schur complement ``H^-1 - H^-1[:, G] (H^-1[G, G])^-1 H^-1[G, :]``, so every later
score and update is the optimal one for the groups already gone. A group is one attention head's
``head_size`` input columns of the attention output projection, or one FFN neuron's input column of
the FFN output projection.

``H`` is damped as SparseGPT's reference code does (``percdamp`` times its mean diagonal; input
features that never fire get a unit diagonal) so the inverse exists. The recorded error is the
undamped one, ``tr(D H D^T)`` with ``D = W - W'``: the damped error the scores add up to, less the
damping's share ``sum_j damp_j |D[:, j]|^2``, so it equals the output error measured on the
calibration inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compress.core.errors import UsageError


@dataclass(frozen=True)
class RemovalPath:
    """``order``: the groups in the order they were removed; ``errors[r]``: the output squared error
    (summed over the calibration tokens and output features) once the first ``r`` of them are gone,
    ``errors[0] = 0``."""

    order: tuple[int, ...]
    errors: tuple[float, ...]

    def kept(self, groups: int) -> list[int]:
        """The groups still there, sorted."""
        gone = set(self.order)
        return [g for g in range(groups) if g not in gone]


def _damping(gram: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the damped Gram matrix, what was added to its diagonal) in float64."""
    h = gram.detach().to(torch.float64).clone()
    diag = torch.diagonal(h)
    added = torch.zeros_like(diag)
    added[diag == 0] = 1.0  # a feature that never fires: a unit diagonal, as SparseGPT does
    added += percdamp * float((diag + added).mean())
    diag += added
    return h, added


def _group_scores(w: torch.Tensor, hinv: torch.Tensor, size: int, alive: torch.Tensor) -> torch.Tensor:
    """``[groups]``: ``tr(W_G (H^-1_GG)^-1 W_G^T)`` of each group still ``alive`` (inf for the rest)."""
    out, cols = w.shape
    groups = cols // size
    scores = torch.full((groups,), float("inf"), dtype=w.dtype)
    idx = alive.nonzero().squeeze(1)
    if size == 1:
        d = torch.diagonal(hinv)[idx]
        scores[idx] = (w[:, idx] ** 2).sum(0) / d
        return scores
    blocks = hinv.view(groups, size, groups, size)[idx, :, idx, :]  # [alive, size, size]
    wg = w.view(out, groups, size)[:, idx, :]  # [out, alive, size]
    sol = torch.linalg.solve(blocks, wg.permute(1, 2, 0))  # [alive, size, out]
    scores[idx] = torch.einsum("ask,kas->a", sol, wg)
    return scores


@torch.no_grad()
def remove_groups(weight: torch.Tensor, gram: torch.Tensor, group_size: int = 1, remove: int | None = None,
                  percdamp: float = 0.01) -> tuple[torch.Tensor, RemovalPath]:
    """Remove ``remove`` column groups (all of them when None) of ``weight`` ``[out, in]`` one at a
    time, each the one of least score, updating the other columns optimally; ``gram`` ``[in, in]``
    is ``X^T X`` of its calibration inputs. Returns the new weight (the removed columns exactly
    zero, the dtype of ``weight``) and the ``RemovalPath``. ``remove=0`` returns ``weight`` itself,
    untouched."""
    out, cols = weight.shape
    if group_size < 1 or cols % group_size:
        raise UsageError(f"{cols} input columns do not split into groups of {group_size}")
    groups = cols // group_size
    remove = groups if remove is None else int(remove)
    if not 0 <= remove <= groups:
        raise UsageError(f"cannot remove {remove} of {groups} column groups")
    if tuple(gram.shape) != (cols, cols):
        raise UsageError(f"the Gram matrix is {tuple(gram.shape)}; the weight has {cols} input columns")
    if remove == 0:
        return weight, RemovalPath((), (0.0,))
    h, added = _damping(gram, percdamp)
    hinv = torch.cholesky_inverse(torch.linalg.cholesky(h))
    w0 = weight.detach().to(torch.float64)
    if group_size == 1:
        w, order, errors = _remove_columns(w0, hinv, added, remove)
    else:
        w, order, errors = _remove_blocks(w0, hinv, added, group_size, remove)
    return w.to(weight.dtype), RemovalPath(tuple(order), tuple(errors))


def _remove_blocks(w0: torch.Tensor, hinv: torch.Tensor, added: torch.Tensor, size: int, remove: int):
    """The general sweep: groups of ``size`` columns (a head's), one at a time."""
    groups = w0.shape[1] // size
    w = w0.clone()
    alive = torch.ones(groups, dtype=torch.bool)
    order, errors, damped = [], [0.0], 0.0
    for _ in range(remove):
        scores = _group_scores(w, hinv, size, alive)
        g = int(torch.argmin(scores))
        cols_g = slice(g * size, (g + 1) * size)
        rows = torch.linalg.inv(hinv[cols_g, cols_g]) @ hinv[cols_g, :]  # [size, in]
        w -= w[:, cols_g] @ rows
        w[:, cols_g] = 0.0
        hinv -= hinv[:, cols_g] @ rows
        hinv[cols_g, :] = 0.0
        hinv[:, cols_g] = 0.0
        alive[g] = False
        damped += float(scores[g])
        order.append(g)
        errors.append(max(0.0, damped - float((((w - w0) ** 2).sum(0) * added).sum())))
    return w, order, errors


def _remove_columns(w0: torch.Tensor, hinv: torch.Tensor, added: torch.Tensor, remove: int):
    """The sweep for single columns (FFN neurons), the same arithmetic as ``_remove_blocks`` at
    ``size`` 1 on a working copy that drops the removed columns (and the inverse's rows and columns)
    every few removals, so each step costs the columns still there, not all of them."""
    cols = w0.shape[1]
    idx = torch.arange(cols)  # the original column of each working column
    w, ref, damp = w0.clone(), w0.clone(), added.clone()  # ref: the original weights, removed ones zero
    gone = torch.zeros(cols, dtype=torch.bool)  # working columns removed since the last compaction
    order, errors, damped, removed_penalty = [], [0.0], 0.0, 0.0
    inf = torch.tensor(float("inf"), dtype=w.dtype)
    for _ in range(remove):
        d = torch.diagonal(hinv)
        scores = torch.where(gone, inf, (w * w).sum(0) / d)
        q = int(torch.argmin(scores))
        row = hinv[q] / d[q]
        w.addr_(w[:, q].clone(), row, alpha=-1.0)
        hinv.addr_(hinv[:, q].clone(), row, alpha=-1.0)
        w[:, q] = 0.0
        removed_penalty += float(damp[q] * (ref[:, q] ** 2).sum())
        ref[:, q] = 0.0
        gone[q] = True
        order.append(int(idx[q]))
        damped += float(scores[q])
        if int(gone.sum()) * 8 >= len(gone) or len(order) == remove:
            keep = ~gone
            w, ref, damp, idx = w[:, keep], ref[:, keep], damp[keep], idx[keep]
            hinv = hinv[keep][:, keep]
            gone = torch.zeros(len(idx), dtype=torch.bool)
        penalty = removed_penalty + float((((w - ref) ** 2).sum(0) * damp).sum())
        errors.append(max(0.0, damped - penalty))
    full = torch.zeros_like(w0)
    full[:, idx[~gone]] = w[:, ~gone]
    return full, order, errors


def output_error(weight: torch.Tensor, new_weight: torch.Tensor, gram: torch.Tensor) -> float:
    """``|(W - W') X^T|^2`` from ``H = X^T X``: ``tr(D H D^T)``, ``D = W - W'``."""
    d = (weight.double() - new_weight.double())
    return float(torch.einsum("oi,ij,oj->", d, gram.double(), d))
