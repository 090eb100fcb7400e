"""One member of a finished gradual speedup family rebuilt from the member before it, changing only its
recovery: the number of KD steps and the teacher-only texts added to the transfer set
(``--recovery-unlabeled``), and optionally the layer-wise KD weight and the learning rate. Everything
else is the family's: its config (calibration seed, teacher = the dense model, targets relative to the
dense sizes) and its own latency table, put into a fresh cache folder under today's key so the search
picks the member's layout again. The one-shot score before recovery is then the family member's, and the
recovered scores pair with it.

    python -m benchmarks member-recovery --family artifacts/fam/obs-gradual-s42 --member 4 \\
        --previous 3 --variants 1000:0,1000:20000 --work artifacts/member-recovery

Each variant VARIANT = STEPS:UNLABELED[:layers=W][:lr=X] (``layers``: ``--kd-layers W``, ``lr``:
``--lr X``; unset, the family's) writes WORK/STEPS-UNLABELED[-layersW][-lrX] (a post-training run
folder, skipped when its summary.json exists); the result holds the family member's scores beside each
variant's (accuracy and macro-F1 before and after recovery, PyTorch fp32 on the dev split).
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

from benchmarks.suite import BenchmarkError, read_json

COMMON = ("data_dir", "work")


def add_arguments(p) -> None:
    p.add_argument("--family", type=Path, required=True, help="a finished gradual family (its folder)")
    p.add_argument("--member", type=float, required=True, help="the target to rebuild, e.g. 4")
    p.add_argument("--previous", type=float, required=True, help="the member it starts from, e.g. 3")
    p.add_argument("--variants", default="1000:0,1000:20000",
                   help="comma-separated STEPS:UNLABELED recoveries (default: %(default)s)")


OVERRIDES = {"layers": "kd_layers", "lr": "lr"}  # variant key -> PruneConfig field


def _variants(text: str) -> list[tuple[int, int, dict]]:
    """``STEPS:UNLABELED[:layers=W][:lr=X]`` pairs, comma-separated, as (steps, unlabeled, overrides)."""
    out = []
    try:
        for v in (v.strip() for v in text.split(",")):
            if not v:
                continue
            steps, unlabeled, *rest = v.split(":")
            extra = dict(kv.split("=", 1) for kv in rest)
            if set(extra) - set(OVERRIDES):
                raise ValueError(v)
            out.append((int(steps), int(unlabeled), {OVERRIDES[k]: float(x) for k, x in extra.items()}))
    except ValueError:
        out = []
    if not out or any(s < 1 or u < 0 or any(x < 0 for x in o.values()) for s, u, o in out):
        raise BenchmarkError(f"--variants {text!r}: give STEPS:UNLABELED[:layers=W][:lr=X] items, e.g. "
                             "1000:0,1000:20000,1000:0:layers=1")
    return out


def variant_name(steps: int, unlabeled: int, overrides: dict) -> str:
    """The variant's folder name: ``1000-0``, ``1000-0-layers1``, ``1000-0-lr0.0002``."""
    keys = {f: k for k, f in OVERRIDES.items()}
    return "-".join([str(steps), str(unlabeled), *(f"{keys[f]}{v:g}" for f, v in sorted(overrides.items()))])


def budget(args) -> str:
    variants = _variants(args.variants)
    steps = ", ".join(f"{s} KD steps + {u} teacher-labelled texts"
                      + "".join(f", {k} {v:g}" for k, v in sorted(o.items())) for s, u, o in variants)
    return f"the {args.member:g}x member of {args.family} rebuilt {len(variants)} times: {steps}"


def seed_cache(member_dir: Path, dense_model: str, cache: Path) -> Path:
    """The member's latency table, written into ``cache`` under the key today's code computes for
    the same architecture, runtime, shape and threads (its grids must be the table's)."""
    import torch

    from compress.measure import latency_table as lt

    old = read_json(member_dir / "latency_table.json")
    _, heads, widths, _, key = lt.table_plan(lt.encoder_config(dense_model), lt.check_runtime(old["runtime"]),
                                             old["batch"], old["seq_len"], torch.get_num_threads())
    if list(heads) != old["key"]["heads"] or list(widths) != old["key"]["widths"]:
        raise BenchmarkError(f"{member_dir}/latency_table.json was built on other grids than today's")
    table = {**old, "key": key}
    if not lt.sane_table(lt.LatencyTable.from_dict(table), key):
        raise BenchmarkError(f"{member_dir}/latency_table.json fails today's sanity check")
    path = lt.cache_file(cache, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "table": table}), encoding="utf-8")
    return path


def rebuild(member_cfg: dict, start: Path, out: Path, steps: int, unlabeled: int, data_dir: str,
            dense_sizes, overrides: dict | None = None) -> Path:
    from compress.api.prune_stages import PruneConfig
    from compress.recipes.post_training import prune_post_training

    names = {f.name for f in fields(PruneConfig)}
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in member_cfg.items() if k in names}
    d.update(model=str(start), out=str(out), data_dir=data_dir, recovery_steps=steps,
             recovery_unlabeled=unlabeled, name=None, **(overrides or {}))
    return prune_post_training(PruneConfig(**d), dense_sizes=dense_sizes)


def dense_sizes(model: str) -> tuple[list[int], list[int]]:
    """Heads and FFN neurons per layer of the family's dense model (the targets are relative to it)."""
    from compress.measure.latency_table import encoder_config

    c = encoder_config(model)
    return [c.num_attention_heads] * c.num_hidden_layers, [c.intermediate_size] * c.num_hidden_layers


def _scores(summary: dict) -> dict:
    def pick(e):
        return {"accuracy": e.get("accuracy"), "macro_f1": e.get("macro_f1")}

    return {"one_shot": pick(summary["eval_pruned_before_recovery"]), "recovered": pick(summary["eval"]),
            "recovery_steps": summary["recovery_steps"], "transfer_extras": summary.get("transfer_extras"),
            "train_seconds": summary.get("train_seconds")}


def run(args, ctx) -> dict | None:
    import yaml

    family = read_json(args.family / "family.json")
    by_target = {m["target"]: m for m in family["rows"]}
    if args.member not in by_target or args.previous not in by_target:
        raise BenchmarkError(f"{args.family} has members {sorted(by_target)}; pick --member and --previous "
                             "among them")
    member_dir = args.family / by_target[args.member]["run"]
    start = args.family / by_target[args.previous]["run"]
    member_cfg = yaml.safe_load((member_dir / "config.yaml").read_text(encoding="utf-8"))
    dense_model = yaml.safe_load((args.family / "config.yaml").read_text(encoding="utf-8"))["model"]
    cache = Path(args.work) / "cache"
    os.environ["COMPRESS_CACHE_DIR"] = str(cache)  # latency_table() then reads its latency/ folder
    from compress.measure.latency_table import default_cache_dir

    ctx.call("seed-latency-cache", seed_cache, member_dir, dense_model, default_cache_dir())
    sizes = None if ctx.dry_run else dense_sizes(dense_model)
    results = {"family_member": _scores(read_json(member_dir / "summary.json")), "variants": {}}
    for steps, unlabeled, overrides in _variants(args.variants):
        name = variant_name(steps, unlabeled, overrides)
        out = Path(args.work) / name
        if not (out / "summary.json").is_file():
            ctx.call(f"recover-{name}", rebuild, member_cfg, start, out, steps, unlabeled, args.data_dir,
                     sizes, overrides)
        if not ctx.dry_run:
            results["variants"][name] = {**_scores(read_json(out / "summary.json")), "overrides": overrides}
    return None if ctx.dry_run else results
