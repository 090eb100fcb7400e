"""Gordon et al. 2020, "Compressing BERT: Studying the Effects of Weight Pruning on Transfer Learning".

Stages, top to bottom:
  1. pretrain  prune during continued masked-LM pre-training, one model per sparsity and criterion
               (magnitude / random), plus the dense model trained the same way;
  2. finetune  fine-tune every pre-trained model on every task over a small learning-rate grid;
               variants: magnitude, random, information-deletion (zeros free to regrow) and
               after-finetune (fine-tune dense, then prune on the task);
  3. measure   parameters and FLOPs (dense and sparsity-aware) of every fine-tuned model;
  4. report    metric vs sparsity per variant, pre-training loss vs sparsity, the Figure 2/3/4 and
               Table 2 analyses, the Pareto front.
Stages 1-2 are one ``compress sweep`` (resumable: re-running skips finished cells); stage 3
skips models already measured. Run with ``compress run pipelines/configs/gordon.yaml``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.config import to_dict
from compress.recipes.sweep import SweepConfig, run_sweep
from compress.report import write_report

try:  # loaded by path from ``compress run``: find stages.py beside this file
    from pipelines.stages import json_stage, section, top_level
except ImportError:  # pragma: no cover - pipelines/ not on sys.path
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipelines.stages import json_stage, section, top_level

SECTIONS = ("pretrain", "finetune", "sweep")


@dataclass(frozen=True)
class GordonOptions:
    out: str = "artifacts/gordon"
    model: str = "minilm"
    data_dir: str | None = None
    measure: bool = True
    measure_seq_len: int = 128


@dataclass(frozen=True)
class PretrainStage:
    corpus: tuple[str, ...] = ()  # empty: skip pre-training, prune while fine-tuning instead
    steps: int = 100
    lr: float = 5e-5
    batch_size: int = 16
    max_length: int = 128
    heldout_blocks: int = 256


@dataclass(frozen=True)
class FinetuneStage:
    tasks: tuple[str, ...] = ("sst2",)
    lrs: tuple[float, ...] = (5e-5,)
    train_limit: int | None = None
    eval_limit: int | None = None
    max_steps: int | None = None
    epochs: float = 1.0
    batch_size: int = 32
    max_length: int = 128


@dataclass(frozen=True)
class SweepStage:
    sparsities: tuple[str, ...] = ("0:0.9:0.1",)
    variants: tuple[str, ...] = ("magnitude", "random")
    schedule: str = "gradual"
    jobs: int = 1
    seed: int = 42
    backend: str = "local"  # or "ray": every cell a Ray task (compress sweep --backend ray)
    address: str | None = None
    cpus_per_cell: float = 1.0
    gpus_per_cell: float = 0.0


def run(values: dict[str, Any], log=print) -> Path:
    # setup: every section is a typed config, so a typo in the YAML fails here, before any work
    opts = top_level(values, GordonOptions, SECTIONS)
    pre = section(values, "pretrain", PretrainStage)
    ft = section(values, "finetune", FinetuneStage)
    sw = section(values, "sweep", SweepStage)
    sweep_cfg = SweepConfig(
        sparsities=sw.sparsities, tasks=ft.tasks, variants=sw.variants, lrs=ft.lrs, model=opts.model,
        data_dir=opts.data_dir, train_limit=ft.train_limit, eval_limit=ft.eval_limit,
        max_steps=ft.max_steps, epochs=ft.epochs, batch_size=ft.batch_size, max_length=ft.max_length,
        seed=sw.seed, schedule=sw.schedule, pretrain_corpus=pre.corpus, pretrain_steps=pre.steps,
        pretrain_lr=pre.lr, pretrain_batch_size=pre.batch_size, pretrain_max_length=pre.max_length,
        pretrain_heldout_blocks=pre.heldout_blocks, jobs=sw.jobs, out=opts.out, backend=sw.backend,
        address=sw.address, cpus_per_cell=sw.cpus_per_cell, gpus_per_cell=sw.gpus_per_cell)

    # stages 1-2: pre-training pruning and the fine-tuning grid, one resumable sweep
    log("gordon: pretrain + finetune (compress sweep)")
    sweep_dir = run_sweep(sweep_cfg, log=log)

    # stage 3: parameters and FLOPs of every fine-tuned model (kept under measure/)
    if opts.measure:
        log("gordon: measure")
        state = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
        for cell in state["cells"]:
            if cell["kind"] == "downstream":
                json_stage(sweep_dir / "measure" / f"{cell['name']}.json",
                           ["measure", str(sweep_dir / cell["name"]), "--json",
                            "--seq-len", str(opts.measure_seq_len)], log=log)

    # stage 4: report
    (sweep_dir / "pipeline-config.json").write_text(json.dumps(
        {"pipeline": "gordon", "options": to_dict(opts), "pretrain": to_dict(pre),
         "finetune": to_dict(ft), "sweep": to_dict(sw)}, indent=2) + "\n", encoding="utf-8")
    report = write_report(sweep_dir)
    log(f"gordon: report {report}")
    return sweep_dir
