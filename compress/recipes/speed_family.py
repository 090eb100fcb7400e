"""``compress prune --stage post-training --structured heads,ffn --criterion fisher --speedup 2,3,4``:
a family of structured models, one per speedup target, from one calibration, compared in one bench.

Reads top to bottom: check -> measure the latency table (cached per machine, runtime and shape) ->
one Fisher importance on the dense model -> per target, the post-training prune with the
latency-constrained search (``compress.api.post_training.prune_classifier_once``: its own run folder,
its recovery steps, its dev score) and the export in the shipping runtime with its dev score ->
the dense export -> one ``compress bench`` run of the dense model in PyTorch eager fp32, the dense
export and every member, at batch 1 and at the table's shape -> the report (``family.json``,
``family.md``, ``family.png``) naming the fastest model within ``--max-drop`` points of the dense
model's dev score.

``--family-mode gradual`` (the default for classification): each target starts from the previous
member after its recovery (ZipLM's gradual mode), its importance (or removal database) taken anew on
that member, its target still relative to the dense model, its teacher (``--teacher self``) the
dense model. ``--family-mode independent`` (and every embedding family): each target starts from
the dense model with the same importance, so a later target's search is not tied to an earlier
one's choices and the members can be run or re-run independently.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from compress.api.embedding_prune import (
    check_embedding_config,
    load_dense_embedding,
    load_unlabelled_text,
    prune_embedding_once,
)
from compress.api.post_training import (
    calibration_batches,
    load_post_training_data,
    prune_classifier_once,
    refuse_pruned_model,
)
from compress.api.prune_stages import (
    PruneConfig,
    check_latency_shape_fits,
    latency_shape_from,
    latency_shape_of,
)
from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir, write_json
from compress.embedding.evaluation import load_eval_data
from compress.models.loading import resolve_model
from compress.pruning.criteria import STRUCTURED_SEARCHES
from compress.pruning.structured import layer_sizes
from compress.tasks import get_task

# a member is one target: the family's own options go back to their defaults in its config
_MEMBER_DEFAULTS = {f.name: f.default for f in fields(PruneConfig)
                    if f.name in ("max_drop", "max_drop_metric", "family_mode")}
# latency runtime -> how the family ships it: export options (None: the model folder itself) and
# the bench provider
SHIPPING = {"ort-int8": ({"optimize": True, "quantize": "int8"}, "cpu"),
            "ort-fp32": ({"optimize": True}, "cpu"),
            "ort-cuda-fp16": ({"optimize": True, "precision": "fp16", "provider": "cuda"}, "cuda"),
            "torch": (None, "cpu")}
# how the report's columns name the shipped form (family.json keeps its keys: score_int8, vs_dense_int8_*)
SHIPPED_LABEL = {"ort-int8": "int8", "ort-fp32": "ort fp32", "ort-cuda-fp16": "fp16", "torch": "torch fp32"}


def check_family(cfg: PruneConfig) -> None:
    """What a family needs, before any data or model is read."""
    if cfg.stage != "post-training" or not cfg.structured or cfg.criterion not in STRUCTURED_SEARCHES:
        raise UsageError("--speedup with several targets builds a family of structured models: use it with "
                         "--stage post-training --structured heads,ffn --criterion obs (or fisher)")
    family = get_task(cfg.task).family
    if family not in ("classification", "multilabel", "embedding"):
        raise UsageError(f"a --speedup family is scored on classification and embedding tasks; task "
                         f"'{cfg.task}' is neither: give one target (--speedup X) for it")
    if family == "embedding":
        check_embedding_config(cfg)
    else:
        refuse_pruned_model(Path(resolve_model(cfg.model)))  # before the latency table and calibration
    check_latency_shape_fits(cfg)
    if cfg.latency_runtime not in SHIPPING:
        raise UsageError(f"--latency-runtime {cfg.latency_runtime}: a family ships in one of "
                         f"{', '.join(SHIPPING)}")


def run_speed_family(cfg: PruneConfig) -> Path:
    """Build, score, export and bench one structured model per ``cfg.speedup`` target."""
    from compress.measure.latency_table import latency_table

    check_family(cfg)
    spec = get_task(cfg.task)
    dense_model = _embedding_dense if spec.family == "embedding" else _classifier_dense
    with RunDir("prune", name=cfg.name or f"{spec.name}-speed-family", out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        module, batches, importance, task = dense_model(cfg)  # the task's data, read once for all members
        batch, tokens = latency_shape_of(cfg.latency_shape, batches, cfg.max_length)
        shape_from = latency_shape_from(cfg.latency_shape)
        cfg = replace(cfg, latency_shape=f"{batch}x{tokens}")  # the members aim at the same shape
        print(f"latency table: {cfg.latency_runtime} at {batch} x {tokens} ({shape_from})", flush=True)
        table = latency_table(module, cfg.latency_runtime, batch, tokens)
        write_json(run.path / "latency_table.json", table.to_dict())
        dense_sizes = tuple(layer_sizes(module).values())
        fisher = importance()
        del module, batches, importance
        gradual = cfg.family_mode == "gradual" and spec.family != "embedding"
        members, start = [], cfg.model
        for x in cfg.speedup:
            members.append(_member(cfg, run.path, x, fisher, start, dense_sizes, task))
            if gradual:  # the next target starts from this member, with an importance of its own
                start, fisher = str(run.path / members[-1]["run"]), None
        for m in members:
            m["started_from"] = m["started_from"] if m["started_from"] == cfg.model else \
                _relative(m["started_from"], run.path)
        dense = _ship(cfg, cfg.model, run.path / f"dense-{cfg.latency_runtime}.onnx")
        bench = _bench(cfg, run.path, dense, members, batch, tokens)
        _report(cfg, run.path, spec.metric, members, dense, bench, batch, tokens)
    return run.path


def _classifier_dense(cfg: PruneConfig):
    """(the dense classifier, its calibration batches, its Fisher importance when called, the task's
    data that every member is pruned, recovered and scored on)."""
    from compress.models.loading import load_classifier
    from compress.pruning.fisher_masks import fisher_importance
    from compress.pruning.integrity import check_finite_parameters
    from compress.training.loop import encode, set_seed

    task = load_post_training_data(cfg)
    lines, data = task.lines, task.data
    set_seed(cfg.seed)
    model, tokenizer, _ = load_classifier(cfg.model, data["train"].label_names,
                                          multilabel=data["train"].multilabel, strict_labels=True)
    check_finite_parameters(model, cfg.model)
    batches = calibration_batches(cfg, tokenizer, encode(tokenizer, data["train"], cfg.max_length), lines)
    return model, batches, lambda: _importance(cfg, model, batches, fisher_importance), task


def _embedding_dense(cfg: PruneConfig):
    """(the dense sentence encoder's Hugging Face model, the calibration batches of unlabelled text,
    the Fisher of the distance to its embeddings when called, the scored sets and the unlabelled text
    that every member is pruned, recovered and scored on), as ``compress prune --task embedding``
    builds them."""
    from compress.embedding.losses import embedding_fisher

    texts = load_unlabelled_text(cfg)
    model, _, _, batches, _ = load_dense_embedding(cfg, texts)
    return model.encoder, batches, lambda: _importance(
        cfg, model.encoder, batches, lambda m, b: embedding_fisher(model, b, seed=cfg.seed)), (
        load_eval_data(cfg), texts)


def _importance(cfg: PruneConfig, module, batches: list[dict], fisher):
    """What the search reads, taken once on the dense model: the removal database of
    ``--criterion obs`` (``compress.pruning.obs_structured``), or ``fisher(module, batches)``."""
    if cfg.criterion == "obs":
        from compress.pruning.obs_structured import removal_database

        print("removal database: every head and FFN neuron of every layer, removed one at a time", flush=True)
        return removal_database(module, batches, tuple(cfg.structured))
    print("Fisher importance of every head and FFN neuron", flush=True)
    return fisher(module, batches)


def _member(cfg: PruneConfig, family_dir: Path, target: float, fisher, start: str,
            dense_sizes: tuple[list[int], list[int]], task) -> dict[str, Any]:
    """One target: the post-training prune of ``start`` (the dense model, or the previous member of a
    gradual family; its own run folder) on the family's ``task`` data, and its shipped form."""
    import time

    from compress.distill.teacher_kd import TEACHER_SELF

    t0 = time.time()
    teacher = cfg.model if cfg.teacher == TEACHER_SELF and start != cfg.model else cfg.teacher
    member_cfg = replace(cfg, model=start, teacher=teacher, speedup=(target,), name=None,
                         out=str(family_dir / f"speedup-{target:g}x"), **_MEMBER_DEFAULTS)
    print(f"member {target:g}x: pruning {'the dense model' if start == cfg.model else Path(start).name}",
          flush=True)
    if get_task(cfg.task).family == "embedding":
        check_embedding_config(member_cfg)
        path = prune_embedding_once(member_cfg, *task, fisher=fisher)
    else:
        check_latency_shape_fits(member_cfg)
        path = prune_classifier_once(member_cfg, task, fisher=fisher, dense_sizes=dense_sizes)
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    s = summary["structured"]
    shipped = _ship(cfg, str(path), path / f"model-{cfg.latency_runtime}.onnx")
    if shipped["score"] is None:  # the PyTorch runtime ships the model folder itself, as scored
        shipped = {**shipped, "score": summary["eval"]["score"], "metrics": summary["eval"]}
    return {"label": f"{target:g}x", "target": target, "run": path.name, "summary": summary,
            "started_from": start, "seconds": round(time.time() - t0, 1),
            "score_fp32": summary["eval"]["score"],
            "score_before_recovery": summary["eval_pruned_before_recovery"]["score"],
            "macro_f1_fp32": summary["eval"].get("macro_f1"),
            "macro_f1_before_recovery": summary["eval_pruned_before_recovery"].get("macro_f1"),
            "macro_f1_int8": (shipped.get("metrics") or {}).get("macro_f1"),
            "score_int8": shipped["score"], "shipped": shipped,
            "predicted_speedup": s["predicted_speedup"], "heads_kept": sum(s["layer_heads"]),
            "ffn_kept": sum(s["layer_ffn"]), "attention_blocks_removed": s["attention_blocks_removed"],
            "ffn_blocks_removed": s["ffn_blocks_removed"], "layers_removed": s["layers_removed"],
            "layer_heads": s["layer_heads"], "layer_ffn": s["layer_ffn"],
            "params_after": s["params_after"], "flops_reduction": s["flops_reduction"]}


def _ship(cfg: PruneConfig, model: str, to: Path) -> dict[str, Any]:
    """``model`` in the shipping runtime: the export to ``to`` (with its dev score), or the model
    folder itself for the PyTorch runtime."""
    from compress.export.model_export import ExportConfig, export_model

    options, _ = SHIPPING[cfg.latency_runtime]
    if options is None:
        return {"path": model, "score": None}
    report = export_model(ExportConfig(model=model, to=str(to), task=cfg.task, data_dir=cfg.data_dir,
                                     eval_limit=cfg.eval_limit, max_length=cfg.max_length,
                                     split_by_article=cfg.split_by_article, **options))
    acc = report["accuracy"]
    shipped = acc.get(options.get("quantize") or options.get("precision") or "fp32") or acc["fp32"]
    return {"path": str(to), "score": shipped.get("score"), "metrics": shipped,
            "fp32_graph_score": acc["fp32"].get("score"), "export_report": to.with_suffix(".json").name}


def _bench(cfg: PruneConfig, family_dir: Path, dense: dict, members: list[dict], batch: int,
           tokens: int) -> dict[str, Any]:
    from compress.measure.bench import BenchConfig, bench_models

    _, provider = SHIPPING[cfg.latency_runtime]
    entries = [f"dense-eager-fp32={cfg.model}", f"dense-{cfg.latency_runtime}={dense['path']}"]
    entries += [f"{m['label']}={m['shipped']['path']}" for m in members]
    # at the table's shape, and at 128 tokens for comparison with the usual benchmark shape
    return bench_models(BenchConfig(models=tuple(entries), batch_sizes=tuple(sorted({1, batch})),
                                 seq_lens=tuple(sorted({tokens, 128})), runtimes=("torch",),
                                 provider=provider,
                                 out=str(family_dir / "bench")))


def _report(cfg: PruneConfig, family_dir: Path, metric: str, members: list[dict], dense: dict,
            bench: dict, batch: int, tokens: int) -> None:
    from compress.report.speed_family import family_rows, fastest_within, format_family_table, plot_family

    shapes = sorted({(1, tokens), (batch, tokens), (1, 128), (batch, 128)})
    dense_eval = members[0]["summary"]["eval_dense"]  # the first member always starts from dense
    dense_fp32 = dense_eval["score"]
    rows = family_rows([{k: v for k, v in m.items() if k != "summary"} for m in members], bench["rows"],
                       shapes, dense_int8=f"dense-{cfg.latency_runtime}")
    speed_key = f"vs_dense_int8_{batch}x{tokens}"
    by_macro = cfg.max_drop_metric == "macro_f1"
    judged = "macro-F1" if by_macro else metric
    dense_judged = dense_eval.get("macro_f1") if by_macro else dense_fp32
    if dense_judged is None:
        raise UsageError(f"--max-drop-metric macro_f1: task '{cfg.task}' reports no macro-F1; use "
                         "--max-drop-metric task")
    best = fastest_within(rows, dense_judged, cfg.max_drop, speed_key,
                          "macro_f1_int8" if by_macro else "score_int8")
    table = format_family_table(rows, shapes, dense_fp32, metric, SHIPPED_LABEL[cfg.latency_runtime])
    verdict = (f"fastest within {cfg.max_drop:g} point(s) of dense {judged} ({100 * dense_judged:.2f}): "
               f"{best['label']} ({best[speed_key]:.2f}x the dense {cfg.latency_runtime} export at "
               f"{batch}x{tokens})" if best else
               f"no model is within {cfg.max_drop:g} point(s) of dense {judged} ({100 * dense_judged:.2f})")
    shipped = "" if dense["score"] is None else f", {dense['score']:.4f} ({cfg.latency_runtime})"
    macro = "" if dense_eval.get("macro_f1") is None else f"; macro-F1 {dense_eval['macro_f1']:.4f}"
    gradual = cfg.family_mode == "gradual" and get_task(cfg.task).family != "embedding"
    mode = ("gradual: each target from the previous member after its recovery" if gradual
            else "independent: each target from the dense model")
    dense_line = (f"dense: {metric} {dense_fp32:.4f} (PyTorch fp32){shipped}{macro}\n"
                  f"criterion: {cfg.criterion}; family: {mode}; latency table at {batch} x {tokens}; "
                  f"family wall clock {sum(m['seconds'] for m in members):.0f} s for the members")
    for shipped in [dense] + [r["shipped"] for r in rows]:  # the folder is renamed when done
        shipped["path"] = _relative(shipped["path"], family_dir)
    write_json(family_dir / "family.json", {"metric": metric, "dense_score": dense_fp32,
                                            "dense_macro_f1": dense_eval.get("macro_f1"),
                                            "dense_shipped": dense, "max_drop": cfg.max_drop,
                                            "max_drop_metric": cfg.max_drop_metric,
                                            "criterion": cfg.criterion,
                                            "family_mode": "gradual" if gradual else "independent",
                                            "members_seconds": sum(m["seconds"] for m in members),
                                            "speed_key": speed_key, "rows": rows,
                                            "fastest_within_budget": best and best["label"],
                                            "bench_run": Path(bench["run_dir"]).name,
                                            "latency_runtime": cfg.latency_runtime,
                                            "latency_shape": cfg.latency_shape})
    (family_dir / "family.md").write_text(f"{dense_line}\n\n{table}\n\n{verdict}\n", encoding="utf-8")
    plot_family(rows, speed_key, dense_fp32, cfg.max_drop, family_dir / "family.png", metric)


def _relative(path: str, folder: Path) -> str:
    """``path`` relative to ``folder`` when it lies inside it (the family's own files), else as is."""
    p = Path(path)
    return str(p.relative_to(folder)) if p.is_relative_to(folder) else path
