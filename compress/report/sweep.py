"""The report of a sweep folder (``sweep.json``): the views of Gordon et al. 2020."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress.core.errors import DataError
from compress.report import analysis as A
from compress.report.common import (
    SPARSITY_AXIS,
    _md_table,
    _plt,
    _read_json,
    _save_fig,
    _write_csv,
)


def _percent(x: float) -> float:
    return round(100 * x, 4)


def collect_sweep(root: Path) -> dict[str, Any]:
    """Rows of finished cells: ``downstream`` (task, variant, sparsity, lr, score, metric, cell,
    pretrain), ``pretrain`` (criterion, sparsity, loss, cell) and ``one_shot`` (the cells that
    pruned a fine-tuned model once, ``prune --stage post-training``: task, variant, sparsity, lr,
    cell, the dense, just-pruned and final scores, recovery steps, prune seconds, calibration
    tokens)."""
    state = _read_json(root / "sweep.json")
    if state is None:
        raise DataError(f"{root / 'sweep.json'} cannot be read; re-run the sweep to rewrite it")
    down, pre, one_shot = [], [], []
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
            if summary.get("stage") == "post-training":
                one_shot.append({
                    "task": cell["task"], "variant": variant, "sparsity": cell["sparsity"],
                    "lr": cell["lr"], "cell": cell["name"],
                    "dense": (summary.get("eval_dense") or {}).get("score"),
                    "pruned": (summary.get("eval_pruned_before_recovery") or {}).get("score"),
                    "score": score, "recovery_steps": summary.get("recovery_steps"),
                    "prune_seconds": summary.get("prune_seconds"),
                    "calibration_tokens": (summary.get("calibration") or {}).get("calibration_tokens")})
    return {"state": state, "downstream": down, "pretrain": pre, "one_shot": one_shot,
            "n_finished": n_finished, "n_cells": len(state.get("cells", []))}


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
    md += _section_one_shot(data, out_dir)
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


def _section_one_shot(data, out_dir: Path) -> list[str]:
    """The one-shot cells (sparsegpt, wanda, oneshot-magnitude and their +kd twins): what the
    prune cost and what it lost before any recovery."""
    if not data["one_shot"]:
        return []
    rows = [[r["task"], r["variant"], _percent(r["sparsity"]), r["lr"], r["dense"], r["pruned"],
             r["recovery_steps"], r["score"], r["prune_seconds"], r["calibration_tokens"]]
            for r in sorted(data["one_shot"], key=lambda r: (r["task"], r["variant"], r["sparsity"],
                                                             r["lr"]))]
    header = ["task", "variant", "sparsity_pct", "lr", "dense_score", "pruned_score",
              "recovery_steps", "score", "prune_seconds", "calibration_tokens"]
    _write_csv(out_dir / "one_shot.csv", header, rows)
    return ["## One-shot pruning", "",
            "Each cell pruned its task's dense fine-tuned cell once from calibration data "
            "(`compress prune --stage post-training`): the dense model's dev score, the score right "
            "after the prune, and the final score (after `recovery_steps` steps of training, if "
            "any). Prune seconds are the wall time of encoding the training split, drawing the "
            "calibration set and choosing the masks (SparseGPT also rewrites the kept weights); "
            "evaluation and recovery are not counted. CSV: [report/one_shot.csv](report/one_shot.csv).", "",
            _md_table(["task", "variant", "sparsity %", "lr", "dense", "after prune",
                       "recovery steps", "final", "prune s", "calibration tokens"], rows), ""]


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


def _heldout_texts(root: Path, state: dict, cell: str, n: int) -> list[str]:
    """``n`` lines of the pre-training corpus's held-out slice, as the pre-training cell split it
    (``compress.pruning.mlm.split_heldout`` with that cell's ``--heldout-fraction``): the last
    ``n`` with at least five words, headings left out."""
    from compress.core.errors import DataError as CorpusError
    from compress.pruning.mlm import read_corpus, split_heldout

    corpus = state.get("config", {}).get("pretrain_corpus") or []
    if not corpus:
        return []
    fraction = 0.05
    cfg_file = root / cell / "config.yaml"
    if cfg_file.is_file():
        import yaml

        fraction = float((yaml.safe_load(cfg_file.read_text(encoding="utf-8")) or {}).get(
            "heldout_fraction", fraction))
    try:
        _, held = split_heldout(read_corpus(corpus), fraction)
    except (CorpusError, OSError):
        return []
    lines = [ln.strip() for ln in held if len(ln.split()) >= 5 and not ln.strip().startswith("=")]
    return lines[-n:]

def _section_features(root: Path, data, out_dir: Path, n_texts: int = 32) -> list[str]:
    dense = next((p for p in data["pretrain"] if p["criterion"] == "none"), None)
    pruned = [p for p in data["pretrain"] if p["criterion"] != "none"]
    texts = _heldout_texts(root, data["state"], dense["cell"], n_texts) if dense else []
    if dense is None or not pruned or not texts:
        return []
    import torch
    from transformers import AutoModel, AutoTokenizer

    def load(cell):
        from compress.models.loading import register_model_types

        register_model_types(root / cell / "model")
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
    """A run's masks (``compress.pruning.integrity.load_masks``) by encoder-relative name; None when
    the run has none."""
    from compress.pruning.integrity import load_masks

    if not path.is_file():
        return None
    return {_strip(k): v for k, v in load_masks(path).items()}

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
            from compress.models.loading import resolve_model

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
