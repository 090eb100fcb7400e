"""Achieved sparsity of a model: per matrix, per role, per layer, per attention head, embeddings vs
encoder.

Counts exact zeros in the weights (what is stored, not what a mask intends). The matrices counted are
the mask's when ``masks`` is given, else the architecture's default pruning targets (every role
matrix of its role table, ``compress.models.architectures``, and the word embeddings).

Per-head sparsity (Gordon et al. 2020, Fig. 4 left): head h of a layer owns rows
``h*d:(h+1)*d`` of the Q, K and V weights (``nn.Linear`` weights are ``[out, in]``; in a fused QKV,
those rows of each of its three blocks) and the same columns of the attention-output weight, with
d the head size. A head's sparsity is the zeros over those slices together; per-matrix head
sparsities are reported as well. ALBERT's shared layer appears once (it is one set of weights).
"""

from __future__ import annotations

import re

import torch

from compress.models.architectures import ROLES, find_layout, head_layout, head_slices
from compress.pruning.masks import NMPattern, broken_groups
from compress.pruning.targets import WORD_EMBEDDINGS, named_weights, weight_roles

# N:M patterns looked for in the weights, first match reported: 2:4 is the one with fast kernels
# (PyTorch's semi-structured sparse matmuls on CUDA capability >= 8.0)
DETECTED_PATTERNS = (NMPattern(2, 4),)

LAYER_RE = re.compile(r"(?:^|\.)layer\.(\d+)\.")
HEAD_KINDS = ("query", "key", "value", "qkv", "pos_query", "pos_key", "attn_out")


def _counts(zeros: int, numel: int) -> dict:
    return {"numel": numel, "zeros": zeros, "sparsity": zeros / numel if numel else 0.0}


def _stats(values: list[float]) -> dict:
    if not values:
        return {"min": None, "mean": None, "max": None}
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


def _head_zeros(w: torch.Tensor, kind: str, head_dim: int,
                qkv_order: str = "blocks") -> tuple[list[int], int]:
    """Zeros of each head's slices of ``w`` (a ``kind`` matrix), and the size of one head's slices."""
    zero = w == 0
    per_head, size = [], 0
    for slices in head_slices(kind, tuple(w.shape), head_dim, qkv_order):
        parts = [zero[a:b] if dim == 0 else zero[:, a:b] for dim, a, b in slices]
        per_head.append(int(sum(int(p.sum()) for p in parts)))
        size = sum(p.numel() for p in parts)
    return per_head, size


@torch.no_grad()
def nm_pattern_report(weights: dict[str, torch.Tensor], encoder: set[str],
                      patterns: tuple[NMPattern, ...] = DETECTED_PATTERNS) -> dict | None:
    """The first of ``patterns`` that the stored zeros of some of ``weights`` (name -> matrix) hold:
    at least N zeros in every group of M along the last (input) dimension. Returns ``{"pattern":
    "2:4", "matrices": [names holding it], "other": [names that do not], "encoder": whether every
    name in ``encoder`` (the encoder layers' matrices) holds it}``, or None when no matrix does."""
    for pattern in patterns:
        holding = [n for n in sorted(weights) if pattern.fits(tuple(weights[n].shape))
                   and broken_groups(weights[n], pattern.n, pattern.m)[0] == 0]
        if holding:
            enc = [n for n in sorted(encoder) if n in weights]
            return {"pattern": str(pattern), "matrices": holding,
                    "other": [n for n in sorted(weights) if n not in holding],
                    "encoder": bool(enc) and set(enc) <= set(holding)}
    return None


@torch.no_grad()
def sparsity_report(model: torch.nn.Module, masks: dict[str, torch.Tensor] | None = None,
                    pattern: str | None = None) -> dict:
    """Sparsity report as a JSON-ready dict (fractions in [0, 1]); see the module docstring.

    ``pattern`` (an N:M the model was pruned with) is looked for in the weights before 2:4; the
    report's ``pattern`` is ``nm_pattern_report``'s answer."""
    from compress.core.arguments import check_module
    from compress.core.errors import UsageError

    check_module("model", model)
    if masks is not None and not isinstance(masks, dict):
        raise UsageError(f"masks must be a dict of name -> bool tensor or None, got {type(masks).__name__}")
    params = named_weights(model)
    layout = find_layout(model)
    roles = weight_roles(model, layout) if layout is not None else {}
    if masks is not None:
        names = sorted(n for n in masks if n in params)
    else:
        names = sorted(roles)
    config = getattr(model, "config", None)
    n_heads, head_dim = head_layout(model) if layout is not None else (None, None)

    matrices, layers, by_role = {}, {}, {}
    groups = {"embeddings": [0, 0], "encoder": [0, 0], "other": [0, 0], "global": [0, 0]}
    head_zero: dict[int, dict[str, list[int]]] = {}
    head_size: dict[int, dict[str, int]] = {}
    for name in names:
        w = params[name].detach()
        zeros, numel = w.numel() - int(torch.count_nonzero(w)), w.numel()
        layer, kind = roles.get(name, (None, None))
        if layer is None and kind is None and name.startswith("encoder."):
            m = LAYER_RE.search(name)  # a model outside the role table: the layer from the name
            layer = int(m.group(1)) if m else None
        matrices[name] = {"shape": list(w.shape), "layer": layer, "kind": kind, **_counts(zeros, numel)}
        group = "embeddings" if kind == WORD_EMBEDDINGS or name.startswith("embeddings.") else \
            "encoder" if layer is not None else "other"
        for g in (group, "global"):
            groups[g][0] += zeros
            groups[g][1] += numel
        if kind is not None:
            rz = by_role.setdefault(kind, [0, 0])
            rz[0] += zeros
            rz[1] += numel
        if layer is not None:
            lz = layers.setdefault(layer, [0, 0])
            lz[0] += zeros
            lz[1] += numel
        if kind in HEAD_KINDS and head_dim and w.ndim == 2:
            head_zero.setdefault(layer, {})[kind], head_size.setdefault(layer, {})[kind] = \
                _head_zeros(w, kind, head_dim, layout.extra.get("qkv_order", "blocks"))

    heads = {}
    all_heads: list[float] = []
    for layer in sorted(head_zero):
        # the heads of the query/key/value rows; an output projection may read more than the heads'
        # context (ConvBERT's convolution output follows it): those columns are no head's
        n_layer_heads = min(len(v) for v in head_zero[layer].values())
        kinds = {k: v[:n_layer_heads] for k, v in head_zero[layer].items()}
        per_kind = {k: [z / head_size[layer][k] for z in kinds[k]] for k in kinds}
        total_zero = [sum(kinds[k][h] for k in kinds) for h in range(n_layer_heads)]
        total_size = sum(head_size[layer][k] for k in kinds)
        per_head = [z / total_size for z in total_zero]
        all_heads.extend(per_head)
        heads[str(layer)] = {"per_head": per_head, **_stats(per_head),
                             "by_matrix": {k: {"per_head": v, **_stats(v)} for k, v in per_kind.items()}}

    looked_for = (NMPattern.parse(pattern),) if pattern else ()
    found = nm_pattern_report({n: params[n].detach() for n in names},
                              {n for n in names if matrices[n]["layer"] is not None},
                              tuple(dict.fromkeys(looked_for + DETECTED_PATTERNS)))
    extra = {}
    if layout is not None:
        extra["architecture"] = layout.name
        if layout.shared_layers:
            depth = getattr(config, "num_hidden_layers", None)
            extra["shared_layers"] = (f"{layout.notes}: {len(layers)} shared layer(s) run "
                                      f"{depth} times; each is counted once here")
    return {
        "num_heads": n_heads,
        "matrices": matrices,
        "layers": {str(k): _counts(*v) for k, v in sorted(layers.items())},
        "heads": heads,
        "heads_overall": _stats(all_heads),
        "roles": {k: _counts(*v) for k, v in sorted(by_role.items(), key=lambda kv: _role_order(kv[0]))},
        **extra,
        **{g: _counts(*v) for g, v in groups.items()},
        "pattern": found,
    }


def _role_order(role: str) -> int:
    return ROLES.index(role) if role in ROLES else len(ROLES)


def _natural_key(name: str) -> list:
    """``encoder.layer.10`` after ``encoder.layer.9``: digit runs compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_sparsity_table(report: dict) -> str:
    """A plain-text table: one row per layer (its role matrices, total, head min/mean/max), then the
    other matrices, then embeddings / encoder / global."""
    kinds = sorted({m["kind"] for m in report["matrices"].values() if m["layer"] is not None and m["kind"]},
                   key=_role_order)
    by_layer: dict[str, dict[str, float]] = {}
    others = []
    for name, m in report["matrices"].items():
        if m["layer"] is not None and m["kind"]:
            by_layer.setdefault(str(m["layer"]), {})[m["kind"]] = m["sparsity"]
        else:
            others.append((name, m))
    head = f"{'layer':>5} " + " ".join(f"{k:>8}" for k in kinds) + f" {'all':>7}  heads min/mean/max"
    lines = ["sparsity (fraction of weights that are exactly zero)"] + ([head] if by_layer else [])
    others.sort(key=lambda item: _natural_key(item[0]))
    for layer in sorted(by_layer, key=int):
        row = by_layer[layer]
        h = report["heads"].get(layer)
        hs = f"{_pct(h['min'])} / {_pct(h['mean'])} / {_pct(h['max'])}" if h else "-"
        lines.append(f"{layer:>5} " + " ".join(f"{_pct(row.get(k)):>8}" for k in kinds)
                     + f" {_pct(report['layers'][layer]['sparsity']):>7}  {hs}")
    for name, m in others:
        lines.append(f"{name}: {_pct(m['sparsity'])} of {m['numel']:,}")
    if report.get("shared_layers"):
        lines.append(report["shared_layers"])
    found = report.get("pattern")
    if found:
        n, m = found["pattern"].split(":")
        where = (f"all {len(found['matrices'])} matrices" if not found["other"] else
                 f"{len(found['matrices'])} of {len(found['matrices']) + len(found['other'])} matrices")
        lines.append(f"{found['pattern']} pattern: every group of {m} weights along the input dimension "
                     f"holds >= {n} zeros in {where}")
    for g in ("embeddings", "encoder", "other", "global"):
        if report[g]["numel"]:
            lines.append(f"{g:>10}: {_pct(report[g]['sparsity'])} ({report[g]['zeros']:,} of "
                         f"{report[g]['numel']:,} weights)")
    return "\n".join(lines)
