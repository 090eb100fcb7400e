"""``write_report(run_or_sweep_dir)``: report.md with PNG plots and CSV tables.

A sweep folder (``sweep.json``) gets the paper's views: dev metric against sparsity per variant
(best over the learning-rate grid), held-out pre-training loss against sparsity, the downstream
metric against pre-training loss with its linear fit (Gordon et al. Figure 2 left), layer-wise
feature similarity of pruned and dense pre-trained models (Figure 2 right), mask difference
between pre-training and downstream pruning (Figure 3), movement in the magnitude sort order
during fine-tuning (Table 2), per-head sparsity (Figure 4 left) and the Pareto front of metric
against non-zero weights and effective FLOPs. A pipeline folder (``pipeline.json``: docbert,
export-bench) gets the distillation table (params / FLOPs / latency / metric) and the BiLSTM
hidden-size curve. A single run folder gets its summary, sparsity tables, training-loss curve and
per-head sparsity.

Everything is read from run-folder files; the numbers come from ``compress.analysis``. Plots and
CSVs go to ``<dir>/report/``, report.md to ``<dir>/report.md`` (rewritten on every call).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from compress import analysis as A
from compress.errors import DataError
from compress.runs import write_text_atomic

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


def write_report(path: str | Path) -> Path:
    """Write ``report.md`` (+ ``report/*.png``, ``report/*.csv``) for a sweep or run folder."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"{root} is not a folder; pass a sweep folder (with sweep.json) or a run "
                        "folder (with summary.json)")
    if (root / "sweep.json").is_file():
        text = _sweep_report(root)
    elif (root / "pipeline.json").is_file():
        text = _pipeline_report(root)
    elif (root / "summary.json").is_file():
        text = _run_report(root)
    else:
        raise DataError(f"{root} has no sweep.json, pipeline.json or summary.json; pass a finished "
                        "sweep, pipeline or run folder (an interrupted run is a .tmp-* folder with no "
                        "summary.json)")
    out = root / "report.md"
    write_text_atomic(out, text)
    return out


# ---------------------------------------------------------------------------------------------
# sweep


def _percent(x: float) -> float:
    return round(100 * x, 4)


def collect_sweep(root: Path) -> dict[str, Any]:
    """Rows of finished cells: ``downstream`` (task, variant, sparsity, lr, score, metric, cell,
    pretrain) and ``pretrain`` (criterion, sparsity, loss, cell)."""
    state = _read_json(root / "sweep.json")
    if state is None:
        raise DataError(f"{root / 'sweep.json'} cannot be read; re-run the sweep to rewrite it")
    down, pre = [], []
    n_finished = 0
    for cell in state.get("cells", []):
        summary = _read_json(root / cell["name"] / "summary.json")
        if summary is None:
            continue
        n_finished += 1
        if cell["kind"] == "pretrain":
            loss = (summary.get("mlm_loss") or {}).get("pruned_after")
            if loss is not None:
                pre.append({"criterion": cell["criterion"], "sparsity": cell["sparsity"], "loss": loss,
                            "cell": cell["name"]})
            continue
        score = (summary.get("eval") or {}).get("score")
        if score is None:
            continue
        for variant in cell.get("variants", []):
            down.append({"task": cell["task"], "variant": variant, "sparsity": cell["sparsity"],
                         "lr": cell["lr"], "score": score, "metric": summary.get("metric", "score"),
                         "cell": cell["name"], "pretrain": (cell.get("deps") or [None])[0]})
    return {"state": state, "downstream": down, "pretrain": pre, "n_finished": n_finished,
            "n_cells": len(state.get("cells", []))}


def _sweep_report(root: Path) -> str:
    data = collect_sweep(root)
    state = data["state"]
    out_dir = root / "report"
    md = [f"# Sweep report: {root.name}", "",
          f"{data['n_finished']} of {data['n_cells']} cells finished. Options: "
          + ", ".join(f"`{k}={v}`" for k, v in state.get("config", {}).items()
                      if k not in ("runner",) and v not in (None, [], ())), ""]
    if data["n_finished"] < data["n_cells"]:
        md += ["**The sweep is incomplete**: re-run the same `compress sweep` command to finish it; "
               "the tables below hold the finished cells only.", ""]
    md += _section_metric_vs_sparsity(data, out_dir)
    md += _section_pretrain_loss(data, out_dir)
    md += _section_fit(data, out_dir)
    md += _section_features(root, data, out_dir)
    md += _section_mask_difference(root, data, out_dir)
    md += _section_movement(root, data, out_dir)
    md += _section_heads(root, data, out_dir)
    md += _section_pareto(root, data, out_dir)
    return "\n".join(md) + "\n"


def _section_metric_vs_sparsity(data, out_dir: Path) -> list[str]:
    md = ["## Dev metric vs sparsity", ""]
    best = A.best_metric(data["downstream"])
    if not best:
        return md + ["No fine-tuning cell has finished yet.", ""]
    metric = {r["task"]: r["metric"] for r in data["downstream"]}
    csv_rows = [[t, v, _percent(s), metric[t], b["score"], b["lr"], b["n_lrs"]]
                for (t, v, s), b in sorted(best.items())]
    _write_csv(out_dir / "metric_vs_sparsity.csv",
               ["task", "variant", "sparsity_pct", "metric", "score", "best_lr", "n_lrs"], csv_rows)
    md += ["Best dev score over the learning-rate grid (x100); CSV: "
           "[report/metric_vs_sparsity.csv](report/metric_vs_sparsity.csv).", ""]
    plt = _plt()
    for task in sorted({t for t, _, _ in best}):
        variants = sorted({v for t, v, _ in best if t == task})
        sparsities = sorted({s for t, _, s in best if t == task})
        rows = []
        for s in sparsities:
            rows.append([_percent(s)] + [round(100 * best[(task, v, s)]["score"], 2)
                                         if (task, v, s) in best else None for v in variants])
        md += [f"### {task} ({metric[task]})", "",
               _md_table(["sparsity %"] + variants, rows), ""]
        fig, ax = plt.subplots(figsize=(6, 4))
        for v in variants:
            pts = sorted((s, best[(task, v, s)]["score"]) for t, vv, s in best if t == task and vv == v)
            # a +kd twin (distillation-aware pruning) dashed, in its base variant's colour
            base = v[:-len("+kd")] if v.endswith("+kd") else v
            color = f"C{sorted({x[:-3] if x.endswith('+kd') else x for x in variants}).index(base) % 10}"
            ax.plot([_percent(s) for s, _ in pts], [100 * y for _, y in pts], marker="o", label=v,
                    color=color, linestyle="--" if v.endswith("+kd") else "-")
        ax.set_xlabel(SPARSITY_AXIS)
        ax.set_ylabel(f"dev {metric[task]} (%)")
        ax.set_title(f"{task}: dev {metric[task]} vs sparsity")
        ax.grid(alpha=0.3)
        ax.legend()
        png = f"metric_vs_sparsity_{task}.png"
        _save_fig(fig, out_dir / png)
        md += [f"![{task} dev {metric[task]} vs sparsity](report/{png})", ""]
    return md


def _section_pretrain_loss(data, out_dir: Path) -> list[str]:
    if not data["pretrain"]:
        return []
    curves = A.pretrain_loss_by_sparsity(data["pretrain"])
    rows = [[c, _percent(s), loss] for c, pts in curves.items() for s, loss in pts]
    _write_csv(out_dir / "pretrain_loss_vs_sparsity.csv", ["criterion", "sparsity_pct", "heldout_mlm_loss"],
               rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for c, pts in curves.items():
        ax.plot([_percent(s) for s, _ in pts], [v for _, v in pts], marker="o", label=c)
    ax.set_xlabel(SPARSITY_AXIS)
    ax.set_ylabel("held-out MLM loss (nats per masked token)")
    ax.set_title("pre-training loss vs sparsity")
    ax.grid(alpha=0.3)
    ax.legend()
    _save_fig(fig, out_dir / "pretrain_loss_vs_sparsity.png")
    return ["## Pre-training loss vs sparsity", "",
            "Held-out masked-LM loss after continued pre-training with pruning (the sparsity-0 point "
            "is the dense model trained the same way). CSV: "
            "[report/pretrain_loss_vs_sparsity.csv](report/pretrain_loss_vs_sparsity.csv).", "",
            _md_table(["criterion", "sparsity %", "held-out MLM loss"], rows), "",
            "![pre-training loss vs sparsity](report/pretrain_loss_vs_sparsity.png)", ""]


def _section_fit(data, out_dir: Path) -> list[str]:
    loss_of = {p["cell"]: p["loss"] for p in data["pretrain"]}
    best = A.best_metric(data["downstream"])
    # keyed by cell: the shared dense cell is a row of each variant but one point of the fit
    by_cell: dict[str, dict[str, tuple[float, float, str]]] = {}
    for r in data["downstream"]:
        if r["pretrain"] in loss_of and r["variant"] in ("magnitude", "random"):
            b = best[(r["task"], r["variant"], r["sparsity"])]
            if b["lr"] == r["lr"]:
                by_cell.setdefault(r["task"], {}).setdefault(
                    r["cell"], (loss_of[r["pretrain"]], b["score"], r["variant"]))
    points = {t: sorted(p.values()) for t, p in by_cell.items()}
    if not any(len({x for x, _, _ in p}) >= 2 for p in points.values()):
        return []
    md = ["## Downstream metric vs pre-training loss (Gordon et al. Figure 2 left)", ""]
    rows, plt = [], _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for task, pts in sorted(points.items()):
        if len({x for x, _, _ in pts}) < 2:
            continue
        fit = A.linear_fit([x for x, _, _ in pts], [y for _, y, _ in pts])
        rows.append([task, fit["slope"], fit["intercept"], fit["r2"], fit["n"]])
        ax.scatter([x for x, _, _ in pts], [100 * y for _, y, _ in pts], label=f"{task} (R²={fit['r2']:.2f})")
        xs = [min(x for x, _, _ in pts), max(x for x, _, _ in pts)]
        ax.plot(xs, [100 * (fit["slope"] * x + fit["intercept"]) for x in xs], linestyle="--")
    ax.set_xlabel("held-out MLM loss after pre-training (nats per masked token)")
    ax.set_ylabel("best dev metric (%)")
    ax.set_title("downstream metric vs pre-training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    _save_fig(fig, out_dir / "metric_vs_pretrain_loss.png")
    _write_csv(out_dir / "metric_vs_pretrain_loss_fit.csv", ["task", "slope", "intercept", "r2", "n"], rows)
    return md + ["Least-squares line of the best dev score (fraction) against held-out MLM loss, "
                 "over the magnitude and random cells.", "",
                 _md_table(["task", "slope", "intercept", "R²", "points"], rows), "",
                 "![metric vs pre-training loss](report/metric_vs_pretrain_loss.png)", ""]


def _heldout_texts(state: dict, n: int) -> list[str]:
    """The last ``n`` non-empty lines of the pre-training corpus (the held-out end of it)."""
    files: list[Path] = []
    for c in state.get("config", {}).get("pretrain_corpus") or []:
        p = Path(c)
        if p.is_dir():
            files += sorted(q for q in p.iterdir() if q.suffix in (".txt", ".raw", ".tokens"))
        elif p.is_file():
            files.append(p)
    if not files:
        return []
    lines = [ln.strip() for ln in files[-1].read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = [ln for ln in lines if len(ln.split()) >= 5 and not ln.startswith("=")]
    return lines[-n:]


def _section_features(root: Path, data, out_dir: Path, n_texts: int = 32) -> list[str]:
    dense = next((p for p in data["pretrain"] if p["criterion"] == "none"), None)
    pruned = [p for p in data["pretrain"] if p["criterion"] != "none"]
    texts = _heldout_texts(data["state"], n_texts)
    if dense is None or not pruned or not texts:
        return []
    import torch
    from transformers import AutoModel, AutoTokenizer

    def load(cell):
        from compress.models import register_model_types

        register_model_types()
        return AutoModel.from_pretrained(root / cell / "model", use_safetensors=True).eval()

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(root / dense["cell"] / "model")
    ref = load(dense["cell"])
    sims = {}
    for p in sorted(pruned, key=lambda p: (p["criterion"], p["sparsity"])):
        sims[(p["criterion"], p["sparsity"])] = A.feature_similarity(ref, load(p["cell"]), tok, texts)
    rows = [[c, _percent(s), layer, v] for (c, s), vals in sims.items() for layer, v in enumerate(vals)]
    _write_csv(out_dir / "feature_similarity.csv", ["criterion", "sparsity_pct", "layer", "cosine"], rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for (c, s), vals in sims.items():
        ax.plot(range(len(vals)), vals, marker=".", label=f"{c} {_percent(s):g}%")
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("mean cosine similarity to dense features (unitless)")
    ax.set_title("features of pruned vs dense pre-trained model")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save_fig(fig, out_dir / "feature_similarity.png")
    last = [[c, _percent(s), vals[-1]] for (c, s), vals in sims.items()]
    return ["## Feature similarity to the dense model (Gordon et al. Figure 2 right)", "",
            f"Token features of each pruned pre-trained model vs the dense one on {len(texts)} held-out "
            "lines of the pre-training corpus; CSV: "
            "[report/feature_similarity.csv](report/feature_similarity.csv).",
            "", _md_table(["criterion", "sparsity %", "last-layer cosine"], last), "",
            "![feature similarity](report/feature_similarity.png)", ""]


def _load_masks(path: Path) -> dict | None:
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return {_strip(k): v for k, v in load_file(str(path)).items()}


def _strip(name: str) -> str:
    """Parameter names without the task model's wrapper prefix (``bert.``), so an encoder's and a
    classifier's names match."""
    return name[len("bert."):] if name.startswith("bert.") else name


def _section_mask_difference(root: Path, data, out_dir: Path) -> list[str]:
    pre = {(p["criterion"], p["sparsity"]): p["cell"] for p in data["pretrain"]}
    rows = []
    for r in data["downstream"]:
        if r["variant"] != "after-finetune" or r["sparsity"] == 0:
            continue
        pc = pre.get(("magnitude", r["sparsity"]))
        if pc is None:
            continue
        ma = _load_masks(root / pc / "masks.safetensors")
        mb = _load_masks(root / r["cell"] / "masks.safetensors")
        if ma is None or mb is None:
            continue
        d = A.mask_difference_all(ma, mb)
        rows.append([r["task"], _percent(r["sparsity"]), r["lr"], d["overall"]["differ"]])
    if not rows:
        return []
    _write_csv(out_dir / "mask_difference.csv", ["task", "sparsity_pct", "lr", "fraction_differ"], rows)
    return ["## Pre-training vs downstream pruning masks (Gordon et al. Figure 3)", "",
            "Fraction of weights whose keep/prune decision differs between magnitude pruning during "
            "pre-training and pruning after fine-tuning at the same sparsity.", "",
            _md_table(["task", "sparsity %", "lr", "fraction differing"], rows), ""]


def _encoder_weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    f = model_dir / "model.safetensors"
    if not f.is_file():
        return {}
    return {_strip(k): v for k, v in load_file(str(f)).items()
            if ".layer." in k and k.endswith(".weight") and v.dim() == 2}


def _section_movement(root: Path, data, out_dir: Path) -> list[str]:
    """Sort-order movement of the dense model's encoder weights during fine-tuning (Table 2)."""
    rows = []
    seen = set()
    for r in data["downstream"]:
        if r["sparsity"] != 0 or r["cell"] in seen:
            continue
        seen.add(r["cell"])
        start = root / r["pretrain"] / "model" if r["pretrain"] else None
        if start is None:
            from compress.models import resolve_model

            try:
                start = Path(resolve_model(data["state"]["config"]["model"]))
            except Exception:  # noqa: BLE001 - a missing start model only drops this table
                continue
        before, after = _encoder_weights(start), _encoder_weights(root / r["cell"] / "model")
        shared = [k for k in before if k in after and before[k].shape == after[k].shape]
        if not shared:
            continue
        moves = [A.sort_order_movement(before[k], after[k], sparsity=0.6) for k in shared]
        total = sum(m["numel"] for m in moves)
        rows.append([r["task"], r["lr"], len(shared),
                     sum(m["mean_shift"] * m["numel"] for m in moves) / total,
                     sum(m["crossed"] * m["numel"] for m in moves) / total])
    if not rows:
        return []
    _write_csv(out_dir / "sort_order_movement.csv",
               ["task", "lr", "matrices", "mean_rank_shift_fraction", "crossed_at_60pct"], rows)
    return ["## Movement in the magnitude sort order during fine-tuning (Gordon et al. Table 2)", "",
            "Dense model, pre-trained -> fine-tuned encoder matrices: mean |rank change| as a fraction "
            "of the matrix size, and the fraction of the weights a 60% magnitude mask would prune "
            "before fine-tuning that it would keep after.", "",
            _md_table(["task", "lr", "matrices", "mean rank shift", "crossed @60%"], rows), ""]


def _section_heads(root: Path, data, out_dir: Path) -> list[str]:
    rows = []
    for p in sorted(data["pretrain"], key=lambda p: (p["criterion"], p["sparsity"])):
        sp = _read_json(root / p["cell"] / "sparsity.json")
        if not sp or "heads" not in sp:
            continue
        for layer, h in sorted(sp["heads"].items(), key=lambda kv: int(kv[0])):
            rows.append([p["criterion"], _percent(p["sparsity"]), int(layer), h["min"], h["mean"], h["max"]])
    if not rows:
        return []
    _write_csv(out_dir / "head_sparsity.csv",
               ["criterion", "sparsity_pct", "layer", "min", "mean", "max"], rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for crit, s in sorted({(r[0], r[1]) for r in rows}):
        sel = [r for r in rows if r[0] == crit and r[1] == s]
        ax.errorbar([r[2] for r in sel], [100 * r[4] for r in sel],
                    yerr=[[100 * (r[4] - r[3]) for r in sel], [100 * (r[5] - r[4]) for r in sel]],
                    marker="o", capsize=3, label=f"{crit} {s:g}%")
    ax.set_xlabel("encoder layer")
    ax.set_ylabel("attention-head sparsity (% zeros; bar = min-max)")
    ax.set_title("per-head sparsity after pre-training pruning")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save_fig(fig, out_dir / "head_sparsity.png")
    return ["## Per-head sparsity (Gordon et al. Figure 4 left)", "",
            "Min / mean / max over the heads of each layer; CSV: "
            "[report/head_sparsity.csv](report/head_sparsity.csv).", "",
            "![per-head sparsity](report/head_sparsity.png)", ""]


def _nonzero_params(model_dir: Path) -> int | None:
    from safetensors.torch import load_file

    f = model_dir / "model.safetensors"
    if not f.is_file():
        return None
    return int(sum(int((t != 0).sum()) for t in load_file(str(f)).values()))


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


def _effective_flops(measure: dict | None) -> float | None:
    v = ((measure or {}).get("flops") or {}).get("effective_flops")
    return float(v) if isinstance(v, (int, float)) else None


def _front_plot(ms: list[dict], key: str, scale: float, xlabel: str, title: str, path: Path) -> list[int]:
    front = A.pareto_front([(m[key], m["score"]) for m in ms])
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([m[key] / scale for m in ms], [100 * m["score"] for m in ms], color="grey", label="models")
    fr = [ms[i] for i in front]
    ax.plot([m[key] / scale for m in fr], [100 * m["score"] for m in fr], color="red", marker="o",
            label="Pareto front")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("dev metric (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    _save_fig(fig, path)
    return front


def _section_pareto(root: Path, data, out_dir: Path) -> list[str]:
    models = {}
    for r in data["downstream"]:
        if r["cell"] in models:
            continue
        nz = _nonzero_params(root / r["cell"] / "model")
        if nz is None:
            continue
        measure = _read_json(root / "measure" / f"{r['cell']}.json")
        models[r["cell"]] = {"cell": r["cell"], "task": r["task"], "score": r["score"], "nonzero": nz,
                             "flops": _effective_flops(measure)}
    if not models:
        return []
    md = ["## Pareto front: dev metric vs non-zero weights and FLOPs", "",
          "Non-zero parameters are counted in each model's weights. Effective FLOPs (sparsity-aware, "
          "FLOPs = 2 x multiply-adds, one example) come from `compress measure` where the pipeline "
          "ran it (measure/). Unstructured zeros save time only on sparse kernels, so dense-kernel "
          "latency does not fall with sparsity and is not plotted here. CSV: "
          "[report/pareto.csv](report/pareto.csv).", ""]
    csv_rows = []
    for task in sorted({m["task"] for m in models.values()}):
        ms = sorted((m for m in models.values() if m["task"] == task), key=lambda m: m["cell"])
        front = set(_front_plot(ms, "nonzero", 1e6, "non-zero parameters (millions)",
                                f"{task}: metric vs non-zero parameters", out_dir / f"pareto_{task}.png"))
        with_flops = [m for m in ms if m["flops"] is not None]
        flops_front: set[int] = set()
        if with_flops:
            idx = _front_plot(with_flops, "flops", 1e9, "effective GFLOPs per example (sparsity-aware)",
                              f"{task}: metric vs effective FLOPs", out_dir / f"pareto_flops_{task}.png")
            flops_front = {with_flops[i]["cell"] for i in idx}
        for i, m in enumerate(ms):
            csv_rows.append([task, m["cell"], m["nonzero"], m["flops"], m["score"], i in front,
                             m["cell"] in flops_front])
        front_rows = [[ms[i]["cell"], ms[i]["nonzero"], ms[i]["flops"], ms[i]["score"]]
                      for i in sorted(front, key=lambda i: ms[i]["nonzero"])]
        header = ["cell", "non-zero params", "effective FLOPs", "dev score"]
        md += [f"### {task}", "", _md_table(header, front_rows), "",
               f"![{task} Pareto front](report/pareto_{task}.png)", ""]
        if with_flops:
            md += [f"![{task} FLOPs Pareto front](report/pareto_flops_{task}.png)", ""]
    _write_csv(out_dir / "pareto.csv", ["task", "cell", "nonzero_params", "effective_flops", "score",
                                        "on_params_front", "on_flops_front"], csv_rows)
    return md


# ---------------------------------------------------------------------------------------------
# pipeline folders (docbert, export-bench): one row per model


def _score(summary: dict | None) -> float | None:
    for key in ("student_eval", "eval"):
        v = ((summary or {}).get(key) or {}).get("score")
        if isinstance(v, (int, float)):
            return float(v)
    return None


def _pipeline_report(root: Path) -> str:
    manifest = _read_json(root / "pipeline.json") or {}
    bench = _read_json(root / "bench" / "bench.json")
    out_dir = root / "report"
    rows = []
    for label, m in (manifest.get("models") or {}).items():
        measure = _read_json(Path(m["measure"])) if m.get("measure") else None
        params = ((measure or {}).get("params") or {}).get("total")
        flops = ((measure or {}).get("flops") or {}).get("dense_flops")
        rows.append({"model": label, "params": params, "flops": flops,
                     "latency_ms": _latency_ms(bench, label) if bench else None,
                     "score": _score(_read_json(Path(m["run"]) / "summary.json")),
                     "hidden": m.get("hidden"), "kd": m.get("kd")})
    ref = "teacher" if any(r["model"] == "teacher" for r in rows) else None
    table = A.distillation_table(rows, reference=ref)
    header = ["model", "params", "flops", "latency_ms", "score", "params_ratio", "speedup"]
    _write_csv(out_dir / "models.csv", header, [[r.get(k) for k in header] for r in table])
    md = [f"# {manifest.get('pipeline', 'pipeline')} report: {root.name}", "",
          "Parameters and dense FLOPs per example (FLOPs = 2 x multiply-adds) from `compress measure`; "
          "latency: median ms at the smallest benchmarked batch (`compress bench`, bench/bench.json); "
          "score: the task's dev metric. Ratios are against "
          f"{ref or 'the largest model'}. CSV: [report/models.csv](report/models.csv).", "",
          _md_table(["model", "params", "FLOPs", "latency ms", "dev score", "params ratio", "speedup"],
                    [[r.get(k) for k in header] for r in table]), ""]
    bench_rows = [[r.get(k) for k in ("model", "runtime", "batch", "seq_len", "median_ms", "p90_ms")]
                  for r in (bench or {}).get("rows", [])]
    if bench_rows:
        _write_csv(out_dir / "bench.csv", ["model", "runtime", "batch", "seq_len", "median_ms", "p90_ms"],
                   bench_rows)
        md += ["## Latency (compress bench)", "", "Every timed model and runtime; CSV: "
               "[report/bench.csv](report/bench.csv).", "",
               _md_table(["model", "runtime", "batch", "tokens", "median ms", "p90 ms"], bench_rows), ""]
    scored = [r for r in table if r["score"] is not None and r["params"]]
    if len(scored) >= 2:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([r["params"] / 1e6 for r in scored], [100 * r["score"] for r in scored])
        for r in scored:
            ax.annotate(r["model"], (r["params"] / 1e6, 100 * r["score"]), fontsize=7)
        front = A.pareto_front([(r["params"], r["score"]) for r in scored])
        ax.plot([scored[i]["params"] / 1e6 for i in front], [100 * scored[i]["score"] for i in front],
                color="red", label="Pareto front")
        ax.set_xscale("log")
        ax.set_xlabel("parameters (millions, log scale)")
        ax.set_ylabel("dev metric (%)")
        ax.set_title("metric vs model size")
        ax.grid(alpha=0.3)
        ax.legend()
        _save_fig(fig, out_dir / "metric_vs_params.png")
        md += ["![metric vs parameters](report/metric_vs_params.png)", ""]
    curve_rows = [r for r in rows if r.get("hidden") is not None and r["score"] is not None]
    if curve_rows:
        curve = A.hidden_size_curve(curve_rows)
        _write_csv(out_dir / "lstm_hidden_curve.csv", ["hidden_size", "score"], [list(c) for c in curve])
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([h for h, _ in curve], [100 * v for _, v in curve], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("BiLSTM hidden size (units per direction)")
        ax.set_ylabel("dev metric (%)")
        ax.set_title("distilled BiLSTM: metric vs hidden size")
        ax.grid(alpha=0.3)
        _save_fig(fig, out_dir / "lstm_hidden_curve.png")
        md += ["## BiLSTM hidden size (DocBERT Figure 1)", "",
               _md_table(["hidden size", "dev score"], [list(c) for c in curve]), "",
               "![hidden-size curve](report/lstm_hidden_curve.png)", ""]
    return "\n".join(md) + "\n"


# ---------------------------------------------------------------------------------------------
# single run


def _scalars(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _scalars(v, key + ".")
        elif isinstance(v, (int, float, str, bool)) or v is None:
            if isinstance(v, float) and not math.isfinite(v):
                v = str(v)
            out.append((key, v))
    return out


def _run_report(root: Path) -> str:
    summary = _read_json(root / "summary.json") or {}
    out_dir = root / "report"
    md = [f"# Run report: {root.name}", ""]
    scalars = [(k, v) for k, v in _scalars(summary) if not k.startswith("prune_history")]
    _write_csv(out_dir / "summary.csv", ["key", "value"], [list(kv) for kv in scalars])
    md += ["## Summary", "", _md_table(["key", "value"], [list(kv) for kv in scalars]), "",
           "CSV: [report/summary.csv](report/summary.csv)", ""]
    plt = _plt()
    losses = []
    mpath = root / "metrics.jsonl"
    if mpath.is_file():
        for line in mpath.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("loss"), (int, float)) and "step" in rec:
                losses.append((rec.get("phase", "train"), rec["step"], rec["loss"]))
    if losses:
        _write_csv(out_dir / "training_loss.csv", ["phase", "step", "loss"], [list(x) for x in losses])
        fig, ax = plt.subplots(figsize=(6, 4))
        for phase in sorted({p for p, _, _ in losses}):
            pts = [(s, v) for p, s, v in losses if p == phase]
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", label=phase)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (nats per example/token)")
        ax.set_title("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
        _save_fig(fig, out_dir / "training_loss.png")
        md += ["## Training loss", "", "![training loss](report/training_loss.png)", ""]
    sp = _read_json(root / "sparsity.json")
    if sp and "layers" in sp:
        rows = [[g, sp[g]["numel"], sp[g]["zeros"], 100 * sp[g]["sparsity"]]
                for g in ("embeddings", "encoder", "other", "global") if g in sp]
        md += ["## Sparsity", "", _md_table(["group", "weights", "zeros", "sparsity %"], rows), ""]
        heads = sp.get("heads") or {}
        layer_rows = []
        for layer, v in sorted(sp["layers"].items(), key=lambda kv: int(kv[0])):
            h = heads.get(layer, {})
            layer_rows.append([int(layer), 100 * v["sparsity"], *(100 * h[k] if k in h else None
                                                                   for k in ("min", "mean", "max"))])
        _write_csv(out_dir / "layer_sparsity.csv",
                   ["layer", "sparsity_pct", "head_min_pct", "head_mean_pct", "head_max_pct"], layer_rows)
        md += [_md_table(["layer", "sparsity %", "head min %", "head mean %", "head max %"], layer_rows), ""]
        if heads:
            fig, ax = plt.subplots(figsize=(6, 4))
            xs = [r[0] for r in layer_rows if r[3] is not None]
            mean = [r[3] for r in layer_rows if r[3] is not None]
            lo = [r[3] - r[2] for r in layer_rows if r[3] is not None]
            hi = [r[4] - r[3] for r in layer_rows if r[3] is not None]
            ax.errorbar(xs, mean, yerr=[lo, hi], marker="o", capsize=3)
            ax.set_xlabel("encoder layer")
            ax.set_ylabel("attention-head sparsity (% zeros; bar = min-max)")
            ax.set_title("per-head sparsity")
            ax.grid(alpha=0.3)
            _save_fig(fig, out_dir / "head_sparsity.png")
            md += ["![per-head sparsity](report/head_sparsity.png)", ""]
    return "\n".join(md) + "\n"
