"""The report of a family of structured models aimed at several speedups: one row per model with
its dev scores (fp32, int8), predicted and measured speedups, and the fastest model within the
accuracy budget; a table in Markdown and a plot of dev score against measured speedup.

Pure functions over plain dicts (the family recipe, ``compress.recipes.speed_family``, gathers
them): ``family_rows``, ``fastest_within``, ``format_family_table``, ``plot_family``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def bench_ms(rows: Sequence[Mapping[str, Any]], label: str, batch: int, seq_len: int) -> float | None:
    """Median milliseconds of ``label`` at ``batch`` x ``seq_len`` in a ``compress bench`` result."""
    for row in rows:
        if row["model"] == label and row["batch"] == batch and row["seq_len"] == seq_len:
            return float(row["median_ms"])
    return None


def family_rows(members: Sequence[Mapping[str, Any]], bench: Sequence[Mapping[str, Any]],
                shapes: Sequence[tuple[int, int]], eager: str = "dense-eager-fp32",
                dense_int8: str = "dense-int8") -> list[dict[str, Any]]:
    """One row per model (``members``: label, score_fp32, score_int8, predicted_speedup and the
    sizes), with the measured speedup at each shape against the dense int8 export and against the
    dense model in PyTorch eager fp32 (``bench``: the rows of one ``compress bench`` run)."""
    out = []
    for m in members:
        row = dict(m)
        for batch, seq in shapes:
            ms = bench_ms(bench, m["label"], batch, seq)
            for ref, key in ((dense_int8, "vs_dense_int8"), (eager, "vs_eager_fp32")):
                ref_ms = bench_ms(bench, ref, batch, seq)
                row[f"{key}_{batch}x{seq}"] = None if ms is None or ref_ms is None else ref_ms / ms
            row[f"ms_{batch}x{seq}"] = ms
        out.append(row)
    return out


def fastest_within(rows: Sequence[Mapping[str, Any]], dense_score: float, max_drop: float,
                   speed_key: str, score_key: str = "score_int8") -> dict[str, Any] | None:
    """The row of greatest ``speed_key`` whose shipped score (``score_key``: ``score_int8``, the
    task metric, or ``macro_f1_int8``) is at most ``max_drop`` points (scores in [0, 1], points =
    100 x) below ``dense_score`` (the dense model's value of the same metric); None if none is."""
    ok = [r for r in rows if r.get(speed_key) is not None and r.get(score_key) is not None
          and 100 * (dense_score - r[score_key]) <= max_drop + 1e-9]
    return max(ok, key=lambda r: r[speed_key], default=None)


def _cell(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def format_family_table(rows: Sequence[Mapping[str, Any]], shapes: Sequence[tuple[int, int]],
                        dense_score: float, metric: str, shipped: str = "int8") -> str:
    """A Markdown table: target, sizes, scores and their drops, predicted and measured speedups;
    ``shipped`` names the shipped form in the headers (the rows' ``*_int8`` values)."""
    head = ["model", "target", "heads kept", "FFN kept", "blocks removed (attn/FFN)", f"{metric} one-shot",
            f"{metric} fp32", f"{metric} {shipped}", f"drop {shipped} (points)", f"macro-F1 {shipped}",
            "predicted", "seconds"]
    for b, n in shapes:
        head += [f"vs dense {shipped} {b}x{n}", f"vs eager fp32 {b}x{n}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        drop = None if r.get("score_int8") is None else 100 * (dense_score - r["score_int8"])
        cells = [r["label"], _cell(r.get("target"), "g") + ("x" if r.get("target") else ""),
                 _cell(r.get("heads_kept"), "d"), _cell(r.get("ffn_kept"), "d"),
                 f"{r.get('attention_blocks_removed', '')}/{r.get('ffn_blocks_removed', '')}",
                 _cell(r.get("score_before_recovery"), ".4f"), _cell(r.get("score_fp32"), ".4f"),
                 _cell(r.get("score_int8"), ".4f"), _cell(drop, "+.2f"), _cell(r.get("macro_f1_int8"), ".4f"),
                 _cell(r.get("predicted_speedup"), ".2f") + ("x" if r.get("predicted_speedup") else ""),
                 _cell(r.get("seconds"), ".0f")]
        for b, n in shapes:
            cells += [_cell(r.get(f"vs_dense_int8_{b}x{n}"), ".2f") + "x",
                      _cell(r.get(f"vs_eager_fp32_{b}x{n}"), ".2f") + "x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_family(rows: Sequence[Mapping[str, Any]], speed_key: str, dense_score: float, max_drop: float,
                path: str | Path, metric: str) -> Path:
    """Dev score (int8) against measured speedup, the dense score and the budget as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    pts = [(r[speed_key], 100 * r["score_int8"], r["label"]) for r in rows
           if r.get(speed_key) is not None and r.get("score_int8") is not None]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    for x, y, label in pts:
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(100 * dense_score, color="grey", linestyle="--", label="dense (fp32)")
    ax.axhline(100 * dense_score - max_drop, color="red", linestyle=":", label=f"budget (-{max_drop:g})")
    ax.set_xlabel(f"measured speedup ({speed_key.replace('_', ' ')})")
    ax.set_ylabel(f"dev {metric} (int8), %")
    ax.legend(loc="lower left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
