"""Achieved sparsity of a model: per matrix, per layer, per attention head, embeddings vs encoder.

Counts exact zeros in the weights (what is stored, not what a mask intends). The matrices counted are
the mask's when ``masks`` is given, else the default pruning targets (Q, K, V, attention output,
FFN in/out of every layer, word embeddings).

Per-head sparsity (Gordon et al. 2020, Fig. 4 left): head h of a layer owns rows
``h*d:(h+1)*d`` of the Q, K and V weights (``nn.Linear`` weights are ``[out, in]``) and the same
columns of the attention-output weight, with d = hidden / heads. A head's sparsity is the zeros over
those four slices together; per-matrix head sparsities are reported as well.
"""

from __future__ import annotations

import re

import torch

from compress.pruning.targets import DEFAULT_TARGETS, named_weights

LAYER_RE = re.compile(r"(?:^|\.)layer\.(\d+)\.")
KINDS = (  # (kind, suffix after encoder.layer.N.)
    ("query", "attention.self.query.weight"),
    ("key", "attention.self.key.weight"),
    ("value", "attention.self.value.weight"),
    ("attn_out", "attention.output.dense.weight"),
    ("ffn_in", "intermediate.dense.weight"),
    ("ffn_out", "output.dense.weight"),
)
HEAD_KINDS = ("query", "key", "value", "attn_out")


def _kind(name: str) -> str | None:
    for kind, suffix in KINDS:
        if name.endswith("." + suffix) and (kind != "ffn_out" or ".attention." not in name):
            return kind
    return None


def _counts(zeros: int, numel: int) -> dict:
    return {"numel": numel, "zeros": zeros, "sparsity": zeros / numel if numel else 0.0}


def _stats(values: list[float]) -> dict:
    if not values:
        return {"min": None, "mean": None, "max": None}
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


@torch.no_grad()
def sparsity_report(model: torch.nn.Module, masks: dict[str, torch.Tensor] | None = None) -> dict:
    """Sparsity report as a JSON-ready dict (fractions in [0, 1]); see the module docstring."""
    params = named_weights(model)
    if masks is not None:
        names = sorted(n for n in masks if n in params)
    else:
        names = sorted(n for n in params if any(re.search(d, n) for d in DEFAULT_TARGETS))
    config = getattr(model, "config", None)
    n_heads = getattr(config, "num_attention_heads", None)
    # head size from the config; the head count per layer from the matrix, since structured pruning
    # leaves layers with different numbers of heads
    head_dim = config.hidden_size // n_heads if n_heads else None

    matrices, layers = {}, {}
    groups = {"embeddings": [0, 0], "encoder": [0, 0], "other": [0, 0], "global": [0, 0]}
    head_zero: dict[int, dict[str, list[int]]] = {}
    head_size: dict[int, dict[str, int]] = {}
    for name in names:
        w = params[name].detach()
        zeros, numel = w.numel() - int(torch.count_nonzero(w)), w.numel()
        m = LAYER_RE.search(name)
        layer = int(m.group(1)) if m and name.startswith("encoder.") else None
        kind = _kind(name) if layer is not None else None
        matrices[name] = {"shape": list(w.shape), "layer": layer, "kind": kind, **_counts(zeros, numel)}
        group = "embeddings" if name.startswith("embeddings.") else \
            "encoder" if name.startswith("encoder.") else "other"
        for g in (group, "global"):
            groups[g][0] += zeros
            groups[g][1] += numel
        if layer is not None:
            lz = layers.setdefault(layer, [0, 0])
            lz[0] += zeros
            lz[1] += numel
        if kind in HEAD_KINDS and head_dim and w.ndim == 2:
            zero = (w == 0)
            # Q/K/V: a head's rows (output features); attention output: its columns (input features).
            per = zero.reshape(-1, head_dim, w.shape[1]) if kind != "attn_out" \
                else zero.reshape(w.shape[0], -1, head_dim).transpose(0, 1)
            head_zero.setdefault(layer, {})[kind] = per.reshape(per.shape[0], -1).sum(1).tolist()
            head_size.setdefault(layer, {})[kind] = per[0].numel()

    heads = {}
    all_heads: list[float] = []
    for layer in sorted(head_zero):
        kinds = head_zero[layer]
        per_kind = {k: [z / head_size[layer][k] for z in kinds[k]] for k in kinds}
        n_layer_heads = len(next(iter(kinds.values())))
        total_zero = [sum(kinds[k][h] for k in kinds) for h in range(n_layer_heads)]
        total_size = sum(head_size[layer][k] for k in kinds)
        per_head = [z / total_size for z in total_zero]
        all_heads.extend(per_head)
        heads[str(layer)] = {"per_head": per_head, **_stats(per_head),
                             "by_matrix": {k: {"per_head": v, **_stats(v)} for k, v in per_kind.items()}}

    return {
        "num_heads": n_heads,
        "matrices": matrices,
        "layers": {str(k): _counts(*v) for k, v in sorted(layers.items())},
        "heads": heads,
        "heads_overall": _stats(all_heads),
        **{g: _counts(*v) for g, v in groups.items()},
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_sparsity_table(report: dict) -> str:
    """A plain-text table: one row per layer (six matrices, total, head min/mean/max), then others."""
    kinds = [k for k, _ in KINDS]
    by_layer: dict[str, dict[str, float]] = {}
    others = []
    for name, m in report["matrices"].items():
        if m["layer"] is not None and m["kind"]:
            by_layer.setdefault(str(m["layer"]), {})[m["kind"]] = m["sparsity"]
        else:
            others.append((name, m))
    head = f"{'layer':>5} " + " ".join(f"{k:>8}" for k in kinds) + f" {'layer':>7}  heads min/mean/max"
    lines = ["sparsity (fraction of weights that are exactly zero)", head]
    for layer in sorted(by_layer, key=int):
        row = by_layer[layer]
        h = report["heads"].get(layer)
        hs = f"{_pct(h['min'])} / {_pct(h['mean'])} / {_pct(h['max'])}" if h else "-"
        lines.append(f"{layer:>5} " + " ".join(f"{_pct(row.get(k)):>8}" for k in kinds)
                     + f" {_pct(report['layers'][layer]['sparsity']):>7}  {hs}")
    for name, m in others:
        lines.append(f"{name}: {_pct(m['sparsity'])} of {m['numel']:,}")
    for g in ("embeddings", "encoder", "other", "global"):
        if report[g]["numel"]:
            lines.append(f"{g:>10}: {_pct(report[g]['sparsity'])} ({report[g]['zeros']:,} of "
                         f"{report[g]['numel']:,} weights)")
    return "\n".join(lines)
