"""What every report kind shares: reading run files, CSV and markdown tables, PNG plots whose
axis labels are also written into the file (so the tests can read them back)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

SPARSITY_AXIS = "sparsity (% of prunable weights set to zero)"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _save_fig(fig, path: Path) -> None:
    """Save as PNG; the axis labels also go into the file's text chunks (``x-axis``, ``y-axis``)
    so a reader (and the tests) can check every plot says what its axes measure."""
    from matplotlib.ticker import MaxNLocator

    path.parent.mkdir(parents=True, exist_ok=True)
    ax = fig.axes[0]
    if "layer" in ax.get_xlabel():
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"x-axis": ax.get_xlabel(), "y-axis": ax.get_ylabel(),
                                         "Title": ax.get_title()})
    _plt().close(fig)


def _latency_ms(bench: dict | None, label: str | None = None) -> float | None:
    """Median latency (ms) of the smallest batch in a ``compress bench`` result, for ``label``
    (default: the first model), preferring the torch runtime."""
    rows = [r for r in (bench or {}).get("rows", []) if label is None or r.get("model") == label]
    if not rows:
        return None
    label = label or rows[0].get("model")
    rows = [r for r in rows if r.get("model") == label]
    rows.sort(key=lambda r: (r.get("batch", 0), r.get("runtime") != "torch", r.get("seq_len", 0)))
    v = rows[0].get("median_ms")
    return float(v) if isinstance(v, (int, float)) else None
