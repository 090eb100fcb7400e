"""Analyses behind the tables and figures of Gordon et al. 2020 and Adhikari et al. 2020 (DocBERT).

Pure functions on numbers, tensors and lists of result rows; nothing here reads run folders
(``compress.report`` does that) or trains anything. Every function has a known-answer test in
tests/unit/test_analysis.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

# ---------------------------------------------------------------------------------------------
# sweep results


def pretrain_loss_by_sparsity(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Held-out MLM loss per criterion, sorted by sparsity.

    ``rows``: ``{"criterion", "sparsity", "loss"}``. A ``criterion`` of ``"none"`` (the dense
    model) is added to every criterion's curve as its sparsity-0 point.
    """
    rows = list(rows)
    dense = [r for r in rows if r["criterion"] == "none"]
    out: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["criterion"] != "none":
            out.setdefault(r["criterion"], []).append((float(r["sparsity"]), float(r["loss"])))
    if not out and dense:
        out["none"] = []
    for crit in out:
        out[crit] += [(float(d["sparsity"]), float(d["loss"])) for d in dense]
        out[crit].sort()
    return out


def best_metric(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, float], dict[str, Any]]:
    """The best dev score over the learning-rate grid, per (task, variant, sparsity).

    ``rows``: ``{"task", "variant", "sparsity", "lr", "score"}``; returns
    ``{(task, variant, sparsity): {"score", "lr", "n_lrs"}}``. Ties go to the smaller rate.
    """
    best: dict[tuple[str, str, float], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: float(r["lr"])):
        key = (r["task"], r["variant"], float(r["sparsity"]))
        score = float(r["score"])
        cur = best.get(key)
        if cur is None:
            best[key] = {"score": score, "lr": float(r["lr"]), "n_lrs": 1}
        else:
            cur["n_lrs"] += 1
            if score > cur["score"]:
                cur.update(score=score, lr=float(r["lr"]))
    return best


# ---------------------------------------------------------------------------------------------
# masks and weights (Figure 3, Table 2, Figure 4)


def mask_difference(mask_a: torch.Tensor, mask_b: torch.Tensor) -> dict[str, float]:
    """How two keep-masks (1 = kept, 0 = pruned) of one matrix differ (Figure 3).

    ``differ``: fraction of positions where they disagree; ``only_a`` / ``only_b``: fraction
    pruned by one mask and kept by the other; ``pruned_overlap``: |pruned_a & pruned_b| /
    |pruned_a | pruned_b| (1 when both prune the same weights, 1 also when neither prunes any).
    """
    if mask_a.shape != mask_b.shape:
        raise ValueError(f"mask shapes differ: {tuple(mask_a.shape)} vs {tuple(mask_b.shape)}")
    a = mask_a.bool().flatten()
    b = mask_b.bool().flatten()
    n = a.numel()
    pa, pb = ~a, ~b
    union = int((pa | pb).sum())
    return {
        "differ": float((a != b).sum()) / n,
        "only_a": float((pa & b).sum()) / n,
        "only_b": float((a & pb).sum()) / n,
        "pruned_overlap": float((pa & pb).sum()) / union if union else 1.0,
        "numel": n,
    }


def mask_difference_all(masks_a: Mapping[str, torch.Tensor], masks_b: Mapping[str, torch.Tensor]
                        ) -> dict[str, Any]:
    """``mask_difference`` per shared parameter and over all of them (weighted by size)."""
    shared = [k for k in masks_a if k in masks_b]
    per = {k: mask_difference(masks_a[k], masks_b[k]) for k in shared}
    total = sum(d["numel"] for d in per.values())
    overall = {"differ": sum(d["differ"] * d["numel"] for d in per.values()) / total if total else 0.0,
               "numel": total}
    return {"per_matrix": per, "overall": overall, "only_in_a": sorted(set(masks_a) - set(masks_b)),
            "only_in_b": sorted(set(masks_b) - set(masks_a))}


def magnitude_ranks(w: torch.Tensor) -> torch.Tensor:
    """Position of each weight in the ascending sort of |w| (0 = smallest), as a flat tensor.
    Ties are broken by position (stable sort), so equal magnitudes get distinct ranks."""
    flat = w.detach().flatten().abs().double()
    order = torch.sort(flat, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(flat.numel())
    return ranks


def sort_order_movement(before: torch.Tensor, after: torch.Tensor, sparsity: float | None = None
                        ) -> dict[str, float]:
    """How far weights move in the magnitude sort order during fine-tuning (Table 2, Figure 4 right).

    ``mean_shift``: mean |rank_after - rank_before| / n (0 = same order; a full reversal of n
    weights gives about 1/2); ``max_shift``: the largest |rank change| / n. With ``sparsity``,
    ``crossed``: fraction of the weights pruned at that sparsity before fine-tuning that would
    no longer be pruned after it (magnitude pruning picks different weights).
    """
    if before.shape != after.shape:
        raise ValueError(f"shapes differ: {tuple(before.shape)} vs {tuple(after.shape)}")
    n = before.numel()
    rb, ra = magnitude_ranks(before), magnitude_ranks(after)
    shift = (ra - rb).abs().double()
    out = {"mean_shift": float(shift.mean()) / n, "max_shift": float(shift.max()) / n, "numel": n}
    if sparsity is not None:
        k = int(round(sparsity * n))
        if k == 0:
            out["crossed"] = 0.0
        else:
            pruned_before = rb < k
            pruned_after = ra < k
            out["crossed"] = float((pruned_before & ~pruned_after).sum()) / k
    return out


def per_head_sparsity(weight: torch.Tensor, num_heads: int, head_dim_axis: int) -> list[float]:
    """Fraction of exact zeros in each head's slice of an attention matrix.

    Q/K/V weights ``[hidden_out, hidden_in]`` split heads along rows (``head_dim_axis=0``); the
    attention output projection splits them along columns (``head_dim_axis=1``).
    """
    size = weight.shape[head_dim_axis]
    if size % num_heads:
        raise ValueError(f"axis {head_dim_axis} of size {size} does not split into {num_heads} heads")
    chunks = torch.chunk(weight.detach(), num_heads, dim=head_dim_axis)
    return [float((c == 0).sum()) / c.numel() for c in chunks]


_HEAD_MATRICES = {"attention.self.query.weight": 0, "attention.self.key.weight": 0,
                  "attention.self.value.weight": 0, "attention.output.dense.weight": 1}


def head_sparsity_by_layer(state: Mapping[str, torch.Tensor], num_heads: int) -> dict[int, dict[str, Any]]:
    """Per layer: each head's sparsity over its slices of Q, K, V and the output projection
    (equal-sized slices, so the mean of the four fractions), and their min/mean/max.

    ``state``: a BERT state dict (names ``...layer.<i>.attention.self.query.weight`` etc.).
    """
    import re

    per_layer: dict[int, list[list[float]]] = {}
    for name, w in state.items():
        m = re.search(r"layer\.(\d+)\.(attention\.(?:self\.(?:query|key|value)|output\.dense)"
                      r"\.weight)$", name)
        if m:
            per_layer.setdefault(int(m.group(1)), []).append(
                per_head_sparsity(w, num_heads, _HEAD_MATRICES[m.group(2)]))
    out = {}
    for layer, lists in sorted(per_layer.items()):
        heads = [sum(vals) / len(vals) for vals in zip(*lists)]
        out[layer] = {"per_head": heads, **min_mean_max(heads)}
    return out


def min_mean_max(values: Sequence[float]) -> dict[str, float]:
    """``{"min", "mean", "max"}`` of a non-empty list (Figure 4 left draws these per layer)."""
    if not values:
        raise ValueError("min_mean_max of an empty list")
    return {"min": float(min(values)), "mean": float(sum(values) / len(values)), "max": float(max(values))}


# ---------------------------------------------------------------------------------------------
# features (Figure 2 right) and fits (Figure 2 left)


def layerwise_cosine(hidden_a: Sequence[torch.Tensor], hidden_b: Sequence[torch.Tensor],
                     attention_mask: torch.Tensor | None = None) -> list[float]:
    """Mean cosine similarity of two models' token features, per layer.

    ``hidden_a[l]``, ``hidden_b[l]``: ``[batch, seq, hidden]`` (Hugging Face ``hidden_states``,
    embeddings first). Padding positions (``attention_mask == 0``) are left out of the mean.
    """
    if len(hidden_a) != len(hidden_b):
        raise ValueError(f"the models have {len(hidden_a)} and {len(hidden_b)} layers of features")
    out = []
    for ha, hb in zip(hidden_a, hidden_b):
        if ha.shape != hb.shape:
            raise ValueError(f"feature shapes differ: {tuple(ha.shape)} vs {tuple(hb.shape)}")
        cos = torch.nn.functional.cosine_similarity(ha.double(), hb.double(), dim=-1, eps=1e-12)
        if attention_mask is not None:
            keep = attention_mask.bool()
            out.append(float(cos[keep].mean()))
        else:
            out.append(float(cos.mean()))
    return out


@torch.no_grad()
def feature_similarity(model_a, model_b, tokenizer, texts: Sequence[str], max_length: int = 128,
                       batch_size: int = 16) -> list[float]:
    """``layerwise_cosine`` of two Hugging Face encoders on held-out ``texts`` (token-weighted mean
    over batches); both models see the same tokens."""
    sums: list[float] | None = None
    total = 0
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        ha = model_a(**enc, output_hidden_states=True).hidden_states
        hb = model_b(**enc, output_hidden_states=True).hidden_states
        n = int(enc["attention_mask"].sum())
        layer = layerwise_cosine(ha, hb, enc["attention_mask"])
        sums = [v * n for v in layer] if sums is None else [s + v * n for s, v in zip(sums, layer)]
        total += n
    if sums is None:
        raise ValueError("feature_similarity needs at least one text")
    return [s / total for s in sums]


def linear_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Least-squares line ``y = slope * x + intercept`` and its R^2 (Figure 2 left: downstream
    metric against pre-training loss). Needs two distinct x values."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
    n = len(x)
    if n < 2:
        raise ValueError("a line needs at least two points")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        raise ValueError("all x values are equal; a line cannot be fitted")
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_res = sum((b - (slope * a + intercept)) ** 2 for a, b in zip(x, y))
    ss_tot = sum((b - my) ** 2 for b in y)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {"slope": slope, "intercept": intercept, "r2": r2, "n": n}


# ---------------------------------------------------------------------------------------------
# distillation (DocBERT Tables 2-3, Figure 1) and trade-offs


def distillation_table(rows: Iterable[Mapping[str, Any]], reference: str | None = None
                       ) -> list[dict[str, Any]]:
    """Rows ``{"model", "params", "flops", "latency_ms", "score"}`` sorted by parameters (largest
    first), with ``params_ratio`` and ``speedup`` against ``reference`` (a model name; default:
    the row with the most parameters, i.e. the teacher). Missing numbers stay ``None``."""
    rows = [dict(r) for r in rows]
    if not rows:
        return []
    rows.sort(key=lambda r: -(r.get("params") or 0))
    ref = next((r for r in rows if r["model"] == reference), rows[0]) if reference else rows[0]
    for r in rows:
        p, rp = r.get("params"), ref.get("params")
        lat, rlat = r.get("latency_ms"), ref.get("latency_ms")
        r["params_ratio"] = p / rp if p and rp else None
        r["speedup"] = rlat / lat if lat and rlat else None
    return rows


def paired_comparison(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[str, Any]:
    """Scores of two variants keyed by seed, compared seed by seed (``a`` minus ``b``).

    The seeds both have: their differences, mean and sample standard deviation of the
    differences, how many seeds ``a`` wins, loses and ties, and the two-sided paired t-test
    (scipy's ``ttest_rel``; ``t`` and ``p`` are None with fewer than two seeds, NaN when every
    difference is equal)."""
    seeds = [s for s in a if s in b]
    if not seeds:
        raise ValueError("the two variants share no seed")
    diffs = [float(a[s]) - float(b[s]) for s in seeds]
    t = p = None
    if len(diffs) > 1:
        from scipy.stats import ttest_rel

        res = ttest_rel([float(a[s]) for s in seeds], [float(b[s]) for s in seeds])
        t, p = float(res.statistic), float(res.pvalue)
    return {"seeds": seeds, "differences": diffs, "mean_difference": statistics.mean(diffs),
            "sd_difference": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
            "wins": sum(d > 0 for d in diffs), "losses": sum(d < 0 for d in diffs),
            "ties": sum(d == 0 for d in diffs), "t": t, "p": p}


def hidden_size_curve(rows: Iterable[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(LSTM hidden size, best score at that size) sorted by size (DocBERT Figure 1)."""
    best: dict[int, float] = {}
    for r in rows:
        h, s = int(r["hidden"]), float(r["score"])
        best[h] = max(best.get(h, -math.inf), s)
    return sorted(best.items())


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(cost, score)`` no other point beats: lower-or-equal cost and
    higher-or-equal score with one strictly better. Sorted by cost."""
    keep = []
    for i, (c, s) in enumerate(points):
        dominated = any((c2 <= c and s2 >= s) and (c2 < c or s2 > s)
                        for j, (c2, s2) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: (points[i][0], -points[i][1]))
