"""Sparsity sweeps: a grid of cells, each one run of the real CLI in its own process.

A sweep folder holds ``sweep.json`` (the resolved options and the plan) and one run folder per
cell. Run folders are written as ``.tmp-<name>`` and renamed when complete, so a cell is finished
if and only if ``<sweep>/<cell>/summary.json`` exists. Re-running the same sweep skips finished
cells and redoes any cell that was killed (its ``.tmp-*`` folder is removed first). ``--jobs N``
runs up to N ready cells at once; a cell waits for the cells it depends on (a fine-tuning cell
waits for the pre-training cell whose pruned model it starts from).

The grid (Gordon et al. 2020, "Compressing BERT"): for every sparsity and variant, either

* with ``--pretrain-corpus``: prune during continued masked-LM pre-training (one cell per
  sparsity and criterion), then fine-tune that model on every task at every learning rate, or
* without it: prune while fine-tuning on every task (``compress prune --stage finetune``).

Variants (``VARIANTS``): ``magnitude`` and ``random`` (the criterion), ``information-deletion``
(the magnitude-pruned pre-trained model fine-tuned with its zeros free to regrow) and
``after-finetune`` (fine-tune dense, then prune and recover on the task), and the one-shot variants
``sparsegpt``, ``wanda`` and ``oneshot-magnitude``, which prune the shared dense cell of their task
and rate once from ``--calibration-samples`` training examples, with no training
(``compress prune --stage post-training``; they depend on that cell, which the grid holds even
without sparsity 0). At sparsity 0 every variant is the same dense model, so the grid holds one
shared dense cell per task and rate.

``--teacher`` adds a distillation-aware twin (``<variant>+kd``, ``compress prune --teacher``) of
every cell pruned on the task: ``--teacher self`` distils each after-finetune cell from its own
dense phase, and each one-shot cell from the dense cell it prunes, during ``--recovery-steps`` steps
after the prune (the one-shot cells themselves never train, so such a twin's gain over its base is
recovery and distillation together); ``--teacher RUN`` (a model fine-tuned on the task) is the
teacher of every such cell.
Cells pruned during pre-training have no twin (the masked-LM stage has no task logits to distil).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compress.core.config import check_range, option, to_dict
from compress.core.errors import DataError, UsageError
from compress.core.runs import artifacts_root, write_json
from compress.core.security import resolve_out
from compress.core.sweep_backends import BACKENDS, check_address, import_ray, make_backend, runner_prefix


@dataclass(frozen=True)
class Variant:
    """How one variant's cells are built: pruning criterion and where pruning happens."""

    criterion: str
    description: str
    finetune_flags: tuple[str, ...] = ()
    after_finetune: bool = False
    needs_pretrain: bool = False
    one_shot: bool = False  # prune the shared dense cell once from calibration data, no training


VARIANTS: dict[str, Variant] = {
    "magnitude": Variant("magnitude", "prune the smallest |w| (Gordon et al. 2020)"),
    "random": Variant("random", "prune weights chosen at random (the paper's control)"),
    "information-deletion": Variant(
        "magnitude", "magnitude-pruned pre-trained model, fine-tuned with its zeros free to regrow",
        finetune_flags=("--information-deletion",), needs_pretrain=True),
    "after-finetune": Variant("magnitude", "fine-tune dense, then prune and recover on the task",
                              after_finetune=True),
    "sparsegpt": Variant("sparsegpt", "prune the dense fine-tuned cell once by layer-wise "
                         "reconstruction on calibration data (SparseGPT), no training", one_shot=True),
    "wanda": Variant("wanda", "prune the dense fine-tuned cell once by |w| x input norm on calibration "
                     "data (Wanda), no training", one_shot=True),
    "oneshot-magnitude": Variant("magnitude", "prune the dense fine-tuned cell once by |w|, no "
                                 "training (the one-shot baseline)", one_shot=True),
}

ONE_SHOT = tuple(name for name, v in VARIANTS.items() if v.one_shot)


KD_SUFFIX = "+kd"


def kd_twin_applies(v: Variant, cfg: SweepConfig) -> bool:
    """Whether a variant's pruned cells get a ``+kd`` twin under ``cfg.teacher``."""
    if cfg.teacher is None:
        return False
    if v.one_shot:  # prunes a fine-tuned model; 'self' is that model
        return True
    if cfg.pretrain_corpus and not v.after_finetune:
        return False  # pruned during pre-training: no task logits to distil
    return v.after_finetune or cfg.teacher != "self"


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise UsageError(f"unknown variant '{name}'; choose from: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def _number(text: str, item: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--sparsities: '{item}' is not a number or a START:STOP:STEP range "
                         "(e.g. 0,0.2,0.4 or 0:0.9:0.1)") from None
    if not math.isfinite(value):
        raise UsageError(f"--sparsities: '{item}' is not a finite number")
    return value


def parse_sparsities(items: tuple[str, ...] | list[str] | str) -> tuple[float, ...]:
    """Sparsities from a list of numbers and ``START:STOP:STEP`` ranges (STOP included).

    ``("0:0.9:0.1",)`` -> ``(0.0, 0.1, ..., 0.9)``; ``("0", "0.5", "0.2")`` -> ``(0.0, 0.2, 0.5)``.
    Values are rounded to 6 decimals, de-duplicated and sorted; each must lie in [0, 1).
    """
    if isinstance(items, str):
        items = [p for p in items.split(",")]
    values: set[float] = set()
    for raw in items:
        item = str(raw).strip()
        if not item:
            continue
        if ":" in item:
            parts = item.split(":")
            if len(parts) != 3:
                raise UsageError(f"--sparsities: range '{item}' must be START:STOP:STEP, e.g. 0:0.9:0.1")
            start, stop, step = (_number(p, item) for p in parts)
            if step <= 0:
                raise UsageError(f"--sparsities: range '{item}' needs a positive STEP, got {step}")
            if stop < start:
                raise UsageError(f"--sparsities: range '{item}' has STOP < START")
            n = int(math.floor((stop - start) / step + 1e-9)) + 1
            values.update(round(start + i * step, 6) for i in range(n))
        else:
            values.add(round(_number(item, item), 6))
    if not values:
        raise UsageError("--sparsities is empty; pass e.g. 0,0.2,0.4 or 0:0.9:0.1")
    for v in values:
        if not 0 <= v < 1:
            raise UsageError(f"--sparsities: {v} is outside [0, 1); a sparsity is the fraction of "
                             "weights set to zero")
    return tuple(sorted(values))


@dataclass(frozen=True)
class SweepConfig:
    sparsities: tuple[str, ...] = option(("0", "0.2", "0.4", "0.6", "0.8"),
                                         help="numbers and START:STOP:STEP ranges (STOP included), "
                                              "e.g. 0,0.2 or 0:0.9:0.1")
    tasks: tuple[str, ...] = option(("sst2",), help="comma-separated task names")
    variants: tuple[str, ...] = option(("magnitude", "random"), choices=lambda: tuple(VARIANTS),
                                       help="comma-separated cell variants; sparsegpt, wanda and "
                                            "oneshot-magnitude prune the dense fine-tuned cell once "
                                            "from calibration data (prune --stage post-training)")
    lrs: tuple[float, ...] = option((5e-5,), help="fine-tuning learning rates (the best one is "
                                                  "reported)")
    model: str = option("minilm", help="start model: minilm, a model folder, a run folder or a hub "
                                       "name")
    data_dir: str | None = option(None, help="folder holding the task files (e.g. ../shared/data)")
    train_limit: int | None = option(None, help="use only the first N training examples of each "
                                                "task")
    eval_limit: int | None = option(None, help="score only the first N dev examples")
    max_steps: int | None = option(None, help="fine-tuning steps per cell (unset: --epochs over the "
                                              "data)")
    epochs: float = option(1.0, help="fine-tuning epochs per cell")
    batch_size: int = option(32, help="fine-tuning batch size")
    max_length: int = option(128, help="fine-tuning sequence length (tokens)")
    seed: int = option(42, help="seed of every cell")
    schedule: str = option("gradual", choices=("oneshot", "gradual"),
                           help="pruning schedule of every cell")
    pretrain_corpus: tuple[str, ...] = option((), help="prune during masked-LM pre-training on this "
                                                       "text first (file(s) or folder)")
    pretrain_steps: int = option(100, help="optimizer steps of each pre-training cell")
    pretrain_lr: float = option(5e-5, help="learning rate of the pre-training cells")
    pretrain_batch_size: int = option(16, help="batch size of the pre-training cells")
    pretrain_max_length: int = option(128, help="block length (tokens) of the pre-training cells")
    pretrain_heldout_blocks: int = option(256, help="held-out corpus blocks scored for the MLM loss")
    jobs: int = option(1, help="--backend local: cells run at once (each gets cores/jobs threads)")
    out: str | None = option(None, help="sweep folder; re-run with the same --out to resume")
    runner: str | None = option(None, help="command prefix that runs one cell (default: this "
                                           "Python's 'python -m compress')")
    teacher: str | None = option(None, help="add a distillation-aware twin (<variant>+kd, prune "
                                            "--teacher) of every cell pruned on the task: 'self' "
                                            "(after-finetune cells distil from their dense phase, "
                                            "one-shot cells from the dense cell they prune, for "
                                            "--recovery-steps) or a run fine-tuned on the task")
    backend: str = option("local", choices=BACKENDS,
                          help="where cells run: 'local' (child processes here, --jobs at a time) "
                               "or 'ray' (one Ray task per cell; the sweep folder must be on "
                               "storage every node sees)")
    address: str | None = option(None, help="--backend ray: the cluster to join ('auto': the one "
                                            "running on this node; HOST:PORT or ray://HOST:10001); "
                                            "unset: start Ray on this machine")
    cpus_per_cell: float = option(1.0, help="--backend ray: CPUs each cell reserves (also its "
                                            "thread count)")
    gpus_per_cell: float = option(0.0, help="--backend ray: GPUs each cell reserves (1 for the "
                                            "Gordon grid on GPUs; fractions share a GPU)")
    calibration_samples: int = option(512, help="one-shot variants (sparsegpt, wanda, "
                                                "oneshot-magnitude): training examples, drawn with "
                                                "--seed, that choose the masks")
    recovery_steps: int = option(250, help="one-shot variants with --teacher: steps their +kd twins "
                                           "train after the prune, distilling with the masks kept "
                                           "(the one-shot cells themselves never train)")
    split_by_article: str | None = option(None, help="squad, reqa and embedding tasks: TRAIN/EVAL "
                                                     "article counts of one SQuAD file (e.g. 38/10)")

    def __post_init__(self):
        parse_sparsities(self.sparsities)
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend '{self.backend}'; choose one of: {', '.join(BACKENDS)}")
        if self.backend != "ray":
            given = [flag for flag, value, default in (
                ("--address", self.address, None), ("--cpus-per-cell", self.cpus_per_cell, 1.0),
                ("--gpus-per-cell", self.gpus_per_cell, 0.0)) if value != default]
            if given:
                verb = "applies" if len(given) == 1 else "apply"
                raise UsageError(f"{', '.join(given)} only {verb} to --backend ray; add --backend ray "
                                 f"or drop {'it' if len(given) == 1 else 'them'}")
        check_range("cpus_per_cell", self.cpus_per_cell, 0, None, lo_open=True)
        check_range("gpus_per_cell", self.gpus_per_cell, 0, None)
        if self.address is not None and not self.address.strip():
            raise UsageError("--address is empty; pass 'auto', a cluster address, or leave it unset")
        if self.teacher is not None:
            twins = [v for v in self.variants if kd_twin_applies(get_variant(v), self)]
            if not twins:
                need = ("after-finetune variants (--teacher self distils from their dense phase) and "
                        "one-shot variants (from the dense cell they prune)"
                        if self.teacher == "self" else "variants pruned on the task")
                raise UsageError(f"--teacher {self.teacher} adds KD twins to {need}, and --variants "
                                 f"{','.join(self.variants)} has none; add --variants after-finetune "
                                 "or sparsegpt")
        self._check_one_shot()
        self._check_embedding()
        if self.split_by_article is not None:
            from compress.tasks.qa import parse_split_by_article

            parse_split_by_article(self.split_by_article)
        if not self.tasks:
            raise UsageError("--tasks is empty; pass e.g. sst2,rte")
        if not self.variants:
            raise UsageError(f"--variants is empty; choose from: {', '.join(VARIANTS)}")
        if not self.lrs:
            raise UsageError("--lrs is empty; pass e.g. 5e-5 or 2e-5,5e-5")
        for name in self.variants:
            v = get_variant(name)
            if v.needs_pretrain and not self.pretrain_corpus:
                raise UsageError(f"variant '{name}' fine-tunes a model pruned during pre-training; "
                                 "pass --pretrain-corpus (e.g. ../shared/data/wikitext2)")
        for lr in self.lrs:
            check_range("lrs", lr, 0, None, lo_open=True)
        check_range("pretrain_lr", self.pretrain_lr, 0, None, lo_open=True)
        for name in ("jobs", "pretrain_steps", "pretrain_batch_size", "batch_size",
                     "pretrain_heldout_blocks"):
            check_range(name, getattr(self, name), 1)
        for name in ("train_limit", "eval_limit", "max_steps"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), 1)
        check_range("epochs", self.epochs, 0, None, lo_open=True)
        check_range("max_length", self.max_length, 8, 512)
        check_range("pretrain_max_length", self.pretrain_max_length, 8, 512)
        if self.schedule not in ("oneshot", "gradual"):
            raise UsageError(f"unknown schedule '{self.schedule}'; choose one of: oneshot, gradual")
        if self.runner is not None and not shlex.split(self.runner):
            raise UsageError("--runner is empty; leave it unset to run cells with this compress")

    def _check_one_shot(self) -> None:
        """The one-shot options apply to the one-shot variants only; a value set for nothing is
        refused rather than silently ignored (defaults never are)."""
        check_range("calibration_samples", self.calibration_samples, 1)
        check_range("recovery_steps", self.recovery_steps, 1)
        default = {f.name: f.default for f in dataclasses.fields(self)}
        one_shot = [v for v in self.variants if v in VARIANTS and VARIANTS[v].one_shot]
        if self.calibration_samples != default["calibration_samples"] and not one_shot:
            raise UsageError(f"--calibration-samples applies to the one-shot variants "
                             f"({', '.join(ONE_SHOT)}); add one to --variants or drop it")
        if self.recovery_steps != default["recovery_steps"] and not (one_shot and self.teacher is not None):
            raise UsageError(f"--recovery-steps sets the training of the one-shot variants' +kd twins; "
                             f"add --teacher and one of {', '.join(ONE_SHOT)} to --variants, or drop it")

    def _check_embedding(self) -> None:
        """The embedding task prunes the given model once from unlabelled text (no fine-tuning):
        the one-shot variants only, and ``+kd`` twins distil from the dense model itself."""
        if "embedding" not in self.tasks:
            return
        trained = [v for v in self.variants if v in VARIANTS and not VARIANTS[v].one_shot]
        if trained:
            raise UsageError(f"task embedding is pruned once, from unlabelled text, without fine-tuning: "
                             f"--variants {','.join(trained)} train on labels; use {', '.join(ONE_SHOT)}")
        if self.teacher not in (None, "self"):
            raise UsageError("task embedding distils from the dense model's own embeddings: use --teacher "
                             "self (or no --teacher)")
        if self.pretrain_corpus:
            raise UsageError("task embedding is not pre-trained in a sweep; drop --pretrain-corpus")

    @property
    def sparsity_values(self) -> tuple[float, ...]:
        return parse_sparsities(self.sparsities)


@dataclass(frozen=True)
class Cell:
    """One run of the CLI: ``argv`` after the runner prefix; ``deps`` are cell names."""

    name: str
    kind: str  # "pretrain" | "downstream"
    argv: tuple[str, ...]
    deps: tuple[str, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)


def percent(s: float) -> str:
    """``0.4`` -> ``'40'``, ``0.125`` -> ``'12.5'``: sparsity in a cell name. Six significant
    digits hold every sparsity ``parse_sparsities`` keeps (6 decimals), so distinct sparsities
    never share a cell."""
    return f"{100 * s:.6g}"


def lr_tag(lr: float) -> str:
    return f"{lr:g}"


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def _train_flags(cfg: SweepConfig, task: str, lr: float) -> list[str]:
    flags = ["--task", task, "--lr", repr(lr), "--epochs", repr(cfg.epochs),
             "--batch-size", str(cfg.batch_size), "--max-length", str(cfg.max_length),
             "--seed", str(cfg.seed)]
    if cfg.data_dir:
        flags += ["--data-dir", _abs(cfg.data_dir)]
    for name in ("train_limit", "eval_limit", "max_steps"):
        value = getattr(cfg, name)
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    if cfg.split_by_article is not None and task in ("squad", "reqa"):
        flags += ["--split-by-article", cfg.split_by_article]
    return flags


def _model_arg(model: str) -> str:
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else model


def build_plan(cfg: SweepConfig, sweep_dir: Path) -> list[Cell]:
    """The cells of the grid, dependencies before dependants (pure: nothing is run or written)."""
    cells: dict[str, Cell] = {}
    model = _model_arg(cfg.model)
    pretrain = bool(cfg.pretrain_corpus)

    def add(cell: Cell) -> None:
        if cell.name in cells:  # a shared cell (e.g. the dense model) serves several variants
            old = cells[cell.name]
            served = sorted(set(old.info.get("variants", [])) | set(cell.info.get("variants", [])))
            cells[cell.name] = Cell(old.name, old.kind, old.argv, old.deps, {**old.info, "variants": served})
        else:
            cells[cell.name] = cell

    def pretrain_cell(s: float, criterion: str) -> str:
        name = "pt-dense" if s == 0 else f"pt-{criterion}-s{percent(s)}"
        argv = ["prune", "--stage", "pretrain", "--sparsity", repr(s), "--criterion", criterion,
                "--schedule", cfg.schedule, "--corpus", ",".join(_abs(c) for c in cfg.pretrain_corpus),
                "--max-steps", str(cfg.pretrain_steps), "--lr", repr(cfg.pretrain_lr),
                "--batch-size", str(cfg.pretrain_batch_size), "--max-length", str(cfg.pretrain_max_length),
                "--heldout-blocks", str(cfg.pretrain_heldout_blocks), "--no-dense-baseline",
                "--seed", str(cfg.seed), "--model", model, "--out", str(sweep_dir / name)]
        info = {"sparsity": s, "criterion": "none" if s == 0 else criterion}
        add(Cell(name, "pretrain", tuple(argv), (), info))
        return name

    def dense_cell(task: str, lr: float, v: Variant, variants: list[str]) -> str:
        """The dense model fine-tuned on ``task`` at ``lr``, shared by every variant: their point at
        sparsity 0 (``variants``) and the model the one-shot variants prune."""
        name = f"ft-{task}-dense-lr{lr_tag(lr)}"
        flags = _train_flags(cfg, task, lr)
        if pretrain:
            # the criterion of a sparsity-0 pre-training cell prunes nothing; a one-shot criterion
            # is refused by that stage, so those variants name magnitude
            dep = pretrain_cell(0.0, "magnitude" if v.one_shot else v.criterion)
            argv = ["finetune", "--model", str(sweep_dir / dep), *flags]
            deps: tuple[str, ...] = (dep,)
        else:
            argv, deps = ["finetune", "--model", model, *flags], ()
        info = {"task": task, "sparsity": 0.0, "lr": lr, "variants": variants}
        add(Cell(name, "downstream", (*argv, "--out", str(sweep_dir / name)), deps, info))
        return name

    for s in cfg.sparsity_values:
        for vname in cfg.variants:
            v = VARIANTS[vname]
            for task in (t for t in cfg.tasks if t != "embedding"):  # embedding: embedding_cells
                for lr in cfg.lrs:
                    info = {"task": task, "sparsity": s, "lr": lr, "variants": [vname]}
                    tag = f"{task}-{{}}-s{percent(s)}-lr{lr_tag(lr)}"
                    flags = _train_flags(cfg, task, lr)
                    if s == 0:
                        # every variant at sparsity 0 is the dense model: one shared cell
                        dense_cell(task, lr, v, [vname])
                        if kd_twin_applies(v, cfg):  # the twin's curve starts at the same dense point
                            dense_cell(task, lr, v, [vname + KD_SUFFIX])
                    elif v.one_shot:
                        # prune the shared dense cell once; without sparsity 0 in the grid that cell
                        # is still run, as no variant's point
                        dense = dense_cell(task, lr, v, [])
                        twins = [("", [])]
                        if kd_twin_applies(v, cfg):
                            teacher = cfg.teacher if cfg.teacher == "self" else _model_arg(cfg.teacher)
                            twins.append((KD_SUFFIX, ["--teacher", teacher, "--recovery-steps",
                                                      str(cfg.recovery_steps)]))
                        for suffix, kd_flags in twins:
                            name = "ft-" + tag.format(vname + suffix)
                            argv = ["prune", "--stage", "post-training", "--sparsity", repr(s),
                                    "--criterion", v.criterion, "--calibration-samples",
                                    str(cfg.calibration_samples), "--model", str(sweep_dir / dense),
                                    *flags, *kd_flags, "--out", str(sweep_dir / name)]
                            add(Cell(name, "downstream", tuple(argv), (dense,),
                                     {**info, "variants": [vname + suffix]}))
                    elif v.after_finetune or not pretrain:
                        # after-finetune starts from the same (continued pre-trained) dense model
                        # as the sparsity-0 cell, so the two are comparable
                        stage = "after-finetune" if v.after_finetune else "finetune"
                        deps = (pretrain_cell(0.0, v.criterion),) if pretrain else ()
                        start = str(sweep_dir / deps[0]) if deps else model
                        twins = [("", [])]
                        if kd_twin_applies(v, cfg):
                            teacher = cfg.teacher if cfg.teacher == "self" else _model_arg(cfg.teacher)
                            twins.append((KD_SUFFIX, ["--teacher", teacher]))
                        for suffix, kd_flags in twins:
                            name = "ft-" + tag.format(vname + suffix)
                            argv = ["prune", "--stage", stage, "--sparsity", repr(s), "--criterion",
                                    v.criterion, "--schedule", cfg.schedule, "--model", start, *flags,
                                    *kd_flags, "--out", str(sweep_dir / name)]
                            add(Cell(name, "downstream", tuple(argv), deps,
                                     {**info, "variants": [vname + suffix]}))
                    else:
                        dep = pretrain_cell(s, v.criterion)
                        name = "ft-" + tag.format(vname)
                        argv = ["finetune", "--model", str(sweep_dir / dep), *flags, *v.finetune_flags,
                                "--out", str(sweep_dir / name)]
                        add(Cell(name, "downstream", tuple(argv), (dep,), info))
    for cell in embedding_cells(cfg, sweep_dir, model):
        add(cell)
    return sorted(cells.values(), key=lambda c: c.kind != "pretrain")  # stable: pre-training cells first


def _embedding_flags(cfg: SweepConfig) -> list[str]:
    flags = ["--task", "embedding", "--max-length", str(cfg.max_length)]
    if cfg.data_dir:
        flags += ["--data-dir", _abs(cfg.data_dir)]
    for name in ("eval_limit", "split_by_article"):
        value = getattr(cfg, name)
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def embedding_cells(cfg: SweepConfig, sweep_dir: Path, model: str) -> list[Cell]:
    """The embedding task's cells (none without it in ``--tasks``), per sparsity, variant and rate."""
    if "embedding" not in cfg.tasks:
        return []
    return [c for s in cfg.sparsity_values for v in cfg.variants for lr in cfg.lrs
            for c in _embedding_cells(cfg, sweep_dir, model, s, v, lr)]


def _embedding_cells(cfg: SweepConfig, sweep_dir: Path, model: str, s: float, vname: str, lr: float
                     ) -> list[Cell]:
    """At sparsity 0 the model scored as is (``compress eval``), else the one-shot prune of the
    model itself from unlabelled text (``prune --stage post-training --task embedding``), and with
    ``--teacher self`` its ``+kd`` twin recovering ``--recovery-steps`` by embedding distillation."""
    v = VARIANTS[vname]
    info = {"task": "embedding", "sparsity": s, "lr": lr, "variants": [vname]}
    if s == 0:
        name = f"ft-embedding-dense-lr{lr_tag(lr)}"
        variants = [vname] + ([vname + KD_SUFFIX] if cfg.teacher else [])
        argv = ["eval", "--model", model, *_embedding_flags(cfg), "--out", str(sweep_dir / name)]
        return [Cell(name, "downstream", tuple(argv), (), {**info, "variants": variants})]
    cells = []
    twins = [("", [])] + ([(KD_SUFFIX, ["--recovery-steps", str(cfg.recovery_steps), "--lr", repr(lr),
                                        "--batch-size", str(cfg.batch_size)])] if cfg.teacher else [])
    for suffix, extra in twins:
        name = f"ft-embedding-{vname}{suffix}-s{percent(s)}-lr{lr_tag(lr)}"
        argv = ["prune", "--stage", "post-training", "--sparsity", repr(s), "--criterion", v.criterion,
                "--calibration-samples", str(cfg.calibration_samples), "--seed", str(cfg.seed),
                "--model", model, *_embedding_flags(cfg), *extra, "--out", str(sweep_dir / name)]
        cells.append(Cell(name, "downstream", tuple(argv), (), {**info, "variants": [vname + suffix]}))
    return cells


def validate_inputs(cfg: SweepConfig) -> None:
    """Check names and paths before anything is written or run."""
    from compress.tasks import get_task

    for task in cfg.tasks:
        get_task(task)
    if cfg.data_dir is not None and not Path(cfg.data_dir).expanduser().is_dir():
        raise DataError(f"--data-dir {cfg.data_dir} is not a folder; pass the folder holding the "
                        "task files (e.g. ../shared/data)")
    for c in cfg.pretrain_corpus:
        if not Path(c).expanduser().exists():
            raise DataError(f"--pretrain-corpus {c} does not exist; pass a text file or a folder of "
                            ".txt/.raw/.tokens files (e.g. ../shared/data/wikitext2)")
    if cfg.runner is None:
        from compress.models.loading import resolve_model

        resolve_model(cfg.model)
        check_sweep_teacher(cfg)
    if cfg.backend == "ray":
        import_ray()
        check_address(cfg.address)


def _task_labels(cfg: SweepConfig, spec) -> tuple[str, ...]:
    """The label names a cell of ``spec`` trains on: the task's fixed set, else its training file's."""
    if spec.labels is not None:
        return tuple(spec.labels)
    from compress.tasks import DataOptions, data_dir_from_env, load_split

    data_dir = Path(cfg.data_dir).expanduser() if cfg.data_dir else data_dir_from_env()
    return tuple(load_split(spec, DataOptions(data_dir=data_dir), spec.train_split).label_names)


def check_sweep_teacher(cfg: SweepConfig) -> None:
    """``--teacher RUN``: load it once and check it against every task and ``--model``'s tokenizer,
    with the check each KD cell would make (``check_teacher_fits``), so a teacher that does not fit
    is one line now rather than a failed ``+kd`` cell per sparsity, task and rate later. ``self``
    is each cell's own dense model, checked by the cell."""
    if cfg.teacher is None or cfg.teacher == "self":
        return
    from compress.distill.teacher_kd import check_teacher_fits
    from compress.models.loading import load_classifier, load_tokenizer, read_meta, resolve_model
    from compress.tasks import get_task

    student_tok = load_tokenizer(cfg.model)
    specs = [get_task(t) for t in cfg.tasks]
    classifiers = [s for s in specs if s.family in ("classification", "multilabel")]
    if classifiers:
        saved = tuple(read_meta(resolve_model(cfg.teacher)).get("label_names") or ())
        # strict: a model no compress run fine-tuned is refused here, as the cells would refuse it
        _, teacher_tok, _ = load_classifier(cfg.teacher, saved, strict_labels=True,
                                            multilabel=classifiers[0].family == "multilabel")
    else:  # SQuAD: the teacher's span logits must read the same token ids
        teacher_tok = load_tokenizer(cfg.teacher)
    for spec in specs:
        labels = _task_labels(cfg, spec) if spec in classifiers else ()
        teacher_labels = saved if spec in classifiers else ()
        check_teacher_fits(teacher_tok, student_tok, teacher_labels, labels, cfg.teacher)


def is_finished(sweep_dir: Path, name: str) -> bool:
    """A cell is finished iff its run folder exists with ``summary.json``."""
    return (sweep_dir / name / "summary.json").is_file()


def clean_unfinished(sweep_dir: Path, name: str) -> None:
    """Remove what a killed cell left behind (``.tmp-<name>``, or a folder without summary.json)."""
    for p in (sweep_dir / f".tmp-{name}", sweep_dir / name):
        if p.exists() and not is_finished(sweep_dir, name):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


# Options that do not change what a cell computes: a re-run may change them.
_RESUMABLE = {"jobs", "runner", "out", "backend", "address", "cpus_per_cell", "gpus_per_cell"}


def _defaults() -> dict[str, Any]:
    """Every option at its default, as ``to_dict`` writes them into ``sweep.json``."""
    return to_dict(SweepConfig())


def _comparable(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg_dict.items() if k not in _RESUMABLE}


def _refuse_if_locked(sweep_dir: Path) -> None:
    """A live driver's ``.lock``: refused now, as ``_Lock`` would refuse it later."""
    try:
        pid = int((sweep_dir / ".lock").read_text().strip() or 0)
    except (OSError, ValueError):
        return
    if pid and pid != os.getpid() and _alive(pid):
        raise UsageError(f"another sweep (pid {pid}) is running in {sweep_dir}; wait for it or stop it "
                         "first")


class _Lock:
    """``<sweep>/.lock`` holding the pid: two sweeps must not run the same cells at once."""

    def __init__(self, sweep_dir: Path):
        self.path = sweep_dir / ".lock"

    def __enter__(self):
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(self.path.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid):
                raise UsageError(f"another sweep (pid {pid}) is running in {self.path.parent}; wait "
                                 "for it or stop it first") from None
            self.path.unlink(missing_ok=True)  # left by a killed sweep
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_sweep(cfg: SweepConfig, log=print) -> Path:
    """Run (or resume) the sweep; returns its folder. Raises CompressError if a cell failed."""
    validate_inputs(cfg)
    if cfg.out is not None:
        sweep_dir = resolve_out(cfg.out)
    else:
        sweep_dir = (artifacts_root() / "sweep" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    plan = build_plan(cfg, sweep_dir)
    cfg_dict = to_dict(cfg)
    state_path = sweep_dir / "sweep.json"
    if sweep_dir.exists():
        if not state_path.is_file():
            if any(sweep_dir.iterdir()):
                raise UsageError(f"{sweep_dir} exists and is not a sweep folder (no sweep.json); "
                                 "choose a new --out")
        else:
            old = json.loads(state_path.read_text(encoding="utf-8"))
            # an option added after the sweep was started holds its default there
            old_cfg = {**_defaults(), **old.get("config", {})}
            diff = sorted(k for k in set(_comparable(old_cfg)) | set(_comparable(cfg_dict))
                          if old_cfg.get(k) != cfg_dict.get(k))
            if diff:
                shown = ", ".join(f"{k}: {old_cfg.get(k)!r} -> {cfg_dict.get(k)!r}" for k in diff)
                raise UsageError(f"{sweep_dir} holds a sweep with other options ({shown}); re-run "
                                 "with the same options to resume it, or choose a new --out")
    if not all(is_finished(sweep_dir, c.name) for c in plan):
        _refuse_if_locked(sweep_dir)  # before Ray is started for a sweep that cannot run
        # Reach the cluster and check that a cell fits a node before anything is written.
        backend = make_backend(cfg.backend, cfg.jobs, cfg.runner, cfg.address, cfg.cpus_per_cell,
                               cfg.gpus_per_cell)
    else:
        backend = None
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with _Lock(sweep_dir):
            return _execute(cfg, cfg_dict, plan, sweep_dir, log, backend)
    finally:
        if backend is not None:
            backend.close()


def _log_tail(path: Path) -> str:
    """The last non-empty line of a cell's log: usually the one-line error that ended it."""
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def _execute(cfg, cfg_dict, plan: list[Cell], sweep_dir: Path, log, backend) -> Path:
    state_path = sweep_dir / "sweep.json"
    logs = sweep_dir / "logs"
    logs.mkdir(exist_ok=True)
    status: dict[str, dict[str, Any]] = {}
    for c in plan:
        done = is_finished(sweep_dir, c.name)
        status[c.name] = {"status": "finished" if done else "pending", "skipped": done}

    def save() -> None:
        write_json(state_path, {
            "config": cfg_dict, "sparsities": list(cfg.sparsity_values),
            "runner": runner_prefix(cfg.runner), "backend": cfg.backend,
            "cells": [{"name": c.name, "kind": c.kind, "deps": list(c.deps), **c.info,
                       "argv": list(c.argv), **status[c.name]} for c in plan]})

    save()
    pending = [c for c in plan if status[c.name]["status"] != "finished"]
    n_skip = len(plan) - len(pending)
    if not pending:
        log(f"sweep {sweep_dir}: {len(plan)} cells, {n_skip} finished already, 0 to run")
        return sweep_dir
    backend.prepare(sweep_dir)
    log(f"sweep {sweep_dir}: {len(plan)} cells, {n_skip} finished already, {len(pending)} to run "
        f"({backend.describe()})")
    in_flight: set[str] = set()
    try:
        while pending or in_flight:
            for c in list(pending):
                if not backend.has_room():
                    break
                dep_state = [status[d]["status"] for d in c.deps]
                if any(s in ("failed", "blocked") for s in dep_state):
                    pending.remove(c)
                    status[c.name].update(status="blocked",
                                          reason=f"needs failed cell(s) {', '.join(c.deps)}")
                    save()
                    continue
                if all(is_finished(sweep_dir, d) for d in c.deps):
                    pending.remove(c)
                    clean_unfinished(sweep_dir, c.name)
                    for key in ("reason", "returncode", "seconds", "host", "log_tail"):
                        status[c.name].pop(key, None)
                    status[c.name].update(backend.start(c.name, c.argv, logs / f"{c.name}.log"))
                    in_flight.add(c.name)
                    save()
                    log(f"  start {c.name}")
            if not in_flight:
                if pending:  # cannot happen with a topologically ordered plan; never spin
                    raise UsageError(f"cells wait on unknown dependencies: {[c.name for c in pending]}")
                break
            for end in backend.wait(0.2):
                in_flight.discard(end.name)
                st = status[end.name]
                st.pop("pid", None)
                st.update(returncode=end.returncode, seconds=end.seconds, host=end.host)
                if end.returncode == 0 and is_finished(sweep_dir, end.name):
                    st.update(status="finished")
                    log(f"  done  {end.name} ({end.seconds:.0f}s)")
                else:
                    why = end.reason or (f"exit code {end.returncode}" if end.returncode != 0
                                         else "exit code 0 but no summary.json")
                    tail = _log_tail(logs / f"{end.name}.log")
                    st.update(status="failed", reason=why, log=str(logs / f"{end.name}.log"), log_tail=tail)
                    log(f"  FAILED {end.name} ({why}; see {logs / (end.name + '.log')})"
                        + (f": {tail}" if tail else ""))
                save()
    except BaseException:
        # Ctrl-C or a crash of the sweep itself: stop the cells it started (their .tmp folders are
        # removed by the next run) and record where things stood.
        for name in backend.stop():
            status[name].update(status="interrupted")
            status[name].pop("pid", None)
        save()
        raise
    bad = [n for n, s in status.items() if s["status"] in ("failed", "blocked")]
    if bad:
        from compress.core.errors import CompressError

        raise CompressError(f"{len(bad)} of {len(plan)} cells did not finish ({', '.join(bad[:5])}"
                            f"{', ...' if len(bad) > 5 else ''}); see {sweep_dir / 'logs'}, fix the "
                            "cause and re-run the same command (finished cells are kept)")
    return sweep_dir
