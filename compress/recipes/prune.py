"""``compress prune``: magnitude pruning during pre-training, fine-tuning, or after fine-tuning.

Each stage reads top to bottom: validate everything (config, data, model, targets) -> open the run
folder -> train with the pruning hook -> finalize masks -> evaluate -> save model, masks, report.
Nothing is written before validation passes, so bad input leaves no run folder.

``--resume`` continues an interrupted run from its checkpoints (``--checkpoint-every``). The
stages of several training phases (pretrain: dense baseline, then pruning; after-finetune: dense
fine-tuning, then pruning and recovery) checkpoint each phase in its own folder and record it once
finished (``RunDir.finish_phase``), so a resumed run skips the finished phases and continues the
interrupted one; the finished run equals an uninterrupted one with the same seed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from compress.api.functions import make_pruner as api_make_pruner
from compress.core.config import check_range, check_sparsity, option, to_dict
from compress.core.errors import DataError, UsageError
from compress.core.runs import RunDir, write_json
from compress.distill.teacher_kd import (
    TEACHER_SELF,
    SpanDistillation,
    TeacherKDOptions,
    load_teacher,
    teacher_summary,
    teacher_training,
)
from compress.measure.sparsity import sparsity_report
from compress.models.loading import (
    load_classifier,
    load_pretrained,
    load_tokenizer,
    resolve_model,
)
from compress.pruning.calibration import calibration_sample
from compress.pruning.criteria import CRITERIA, get_criterion
from compress.pruning.fisher_search import MAX_SWAPS
from compress.pruning.fisher_tuning import SCALE_BOUND
from compress.pruning.integrity import (
    MASKS_FILE,
    check_masks,
    check_pattern,
    load_masks,
    load_saved_model,
    recorded_pattern,
    save_masks,
)
from compress.pruning.masks import SCOPES, NMPattern, get_scope
from compress.pruning.pruner import (
    PruningHook,
    ScheduledPruner,
    add_meta,
    check_pattern_fits,
    matching_masks,
)
from compress.pruning.schedules import DEFAULT_POWER, SCHEDULES, make_schedule
from compress.pruning.targets import select_targets
from compress.qa.options import QAOptions
from compress.recipes.finetune import TaskDataConfig, evaluate_classifier, load_task_data, run_finetune
from compress.recipes.saving import save_model
from compress.tasks import get_task
from compress.training.loop import TrainConfig, TrainHook, encode, set_seed, train
from compress.training.trackers import start_tracking


@dataclass(frozen=True)
class PruneConfig(TrainConfig, TaskDataConfig, QAOptions, TeacherKDOptions):
    # QAOptions: --doc-stride, --split-by-article, --objective, ... (squad/reqa only).
    # TeacherKDOptions: --teacher, --kd-lambda, --temperature, --kd-hidden (distillation-aware pruning).
    sparsity: float = option(0.4, help="fraction of the pruned matrices' weights set to zero, in "
                                       "[0, 1)")
    criterion: str = option("magnitude", choices=lambda: tuple(CRITERIA),
                            help="magnitude (smallest |w| first), random (the paper's control); "
                                 "post-training also: wanda (|w| x input norm) and sparsegpt "
                                 "(layer-wise reconstruction), both calibrated on training data")
    scope: str = option("local", choices=lambda: tuple(SCOPES),
                        help="local (one threshold per matrix, the paper's default) or global (one "
                             "over all)")
    schedule: str = option("gradual", choices=lambda: tuple(SCHEDULES),
                           help="oneshot, or gradual (Zhu & Gupta cubic: s_f + (s_i - s_f)(1 - "
                                "(t - t0)/span)^3)")
    stage: str = option("finetune", choices=lambda: tuple(STAGES),
                        help="pretrain (masked LM on --corpus), finetune (prune while "
                             "fine-tuning), after-finetune (fine-tune dense, then prune), "
                             "post-training (prune a fine-tuned --model once, from calibration "
                             "data; --recovery-steps N to train after)")
    prune_steps: int | None = option(None, help="steps over which gradual pruning ramps up; unset = "
                                                "the first half of training")
    prune_every: int | None = option(None, help="recompute masks every N steps while ramping; unset "
                                                "= a tenth of --prune-steps")
    prune_start: int = option(0, help="step t0 at which pruning begins")
    initial_sparsity: float = option(0.0, help="s_i of the gradual schedule")
    schedule_power: float = option(DEFAULT_POWER, help="exponent of the gradual schedule (3 = cubic)")
    include: tuple[str, ...] = option((), help="extra parameters to prune: comma-separated globs, or "
                                               "re:REGEX")
    exclude: tuple[str, ...] = option((), help="parameters not to prune: comma-separated globs, or "
                                               "re:REGEX")
    recovery_steps: int | None = option(None, help="after-finetune: training steps with masks after "
                                                   "pruning; unset = as many as the dense "
                                                   "fine-tuning. post-training: unset = none")
    calibration_samples: int = option(512, help="post-training: training examples (never the dev "
                                                "split) run through the model to choose the masks")
    calibration_data: str | None = option(None, help="post-training: calibrate on this text file, or "
                                                     "folder of .txt files, one text per line, "
                                                     "instead of the training split")
    corpus: tuple[str, ...] = option((), help="pretrain: text file(s), comma-separated, or a folder "
                                              "of .txt/.raw/.tokens files")
    mlm_probability: float = option(0.15, help="pretrain: fraction of tokens masked (80% [MASK], "
                                               "10% random, 10% kept)")
    heldout_fraction: float = option(0.05, help="pretrain: last fraction of the corpus lines kept "
                                                "out for the MLM loss")
    heldout_blocks: int = option(256, help="pretrain: at most this many held-out blocks are scored")
    no_dense_baseline: bool = option(False, help="pretrain: skip training the unpruned model for "
                                                 "comparison")
    structured: tuple[str, ...] = option((), help="remove whole units instead: heads,ffn (uses "
                                                  "compress.pruning.structured)")
    flops_reduction: float | None = option(None, help="--structured with --criterion fisher: fraction "
                                                      "of the encoder's FLOPs at --max-length to "
                                                      "remove, in (0, 1)")
    max_swaps: int = option(MAX_SWAPS, help="--criterion fisher: most swaps per layer of the mask "
                                            "rearrangement (it stops sooner when no swap lowers "
                                            "the Fisher cost); 0 = none")
    scale_bound: float = option(SCALE_BOUND, help="--criterion fisher: the least-squares scales of "
                                                  "the kept heads and neurons stay in [-B, B], B >= 1; "
                                                  "0 = unbounded")
    no_mask_tuning: bool = option(False, help="--criterion fisher: keep the kept heads and neurons "
                                              "at scale 1 (no least-squares tuning)")
    pattern: str | None = option(None, help="N:M semi-structured sparsity, e.g. 2:4: the N smallest "
                                            "|w| of every group of M consecutive weights along each "
                                            "pruned matrix's input dimension are zeroed (sparsity "
                                            "N/M by definition; gradual: in a growing share of the "
                                            "groups). 2:4 runs faster with PyTorch's semi-structured "
                                            "kernels on CUDA capability >= 8.0; elsewhere it saves "
                                            "storage only")
    resume: bool = option(False, help="continue an interrupted run in --out from its last checkpoint "
                                      "(same options; save checkpoints with --checkpoint-every N)")

    def __post_init__(self):
        TrainConfig.__post_init__(self)
        QAOptions.__post_init__(self)
        TeacherKDOptions.__post_init__(self)
        for lim in ("train_limit", "eval_limit"):
            v = getattr(self, lim)
            if v is not None and v < 1:
                raise UsageError(f"--{lim.replace('_', '-')} must be >= 1, got {v}")
        check_sparsity(self.sparsity)
        if self.teacher is not None and self.stage == "pretrain":
            raise UsageError("--teacher applies to --stage finetune and after-finetune (the masked-LM "
                             "stage has no task logits to distil); drop --teacher")
        get_criterion(self.criterion)
        get_scope(self.scope)
        if self.pattern is not None:  # before the checks that read the sparsity it may set
            self._check_pattern()
        if self.schedule not in SCHEDULES:
            raise UsageError(f"unknown schedule '{self.schedule}'; choose one of: {', '.join(SCHEDULES)}")
        if self.stage not in STAGES:
            raise UsageError(f"unknown stage '{self.stage}'; choose one of: {', '.join(STAGES)}")
        for name in ("prune_steps", "prune_every", "recovery_steps", "heldout_blocks"):
            v = getattr(self, name)
            if v is not None:
                check_range(name, v, 1)
        check_range("prune_start", self.prune_start, 0)
        check_range("initial_sparsity", self.initial_sparsity, 0, self.sparsity)
        check_range("schedule_power", self.schedule_power, 0, None, lo_open=True)
        check_range("mlm_probability", self.mlm_probability, 0, 1, lo_open=True, hi_open=True)
        check_range("heldout_fraction", self.heldout_fraction, 0, 0.5, lo_open=True)
        if self.recovery_steps is not None and self.stage not in ("after-finetune", "post-training"):
            raise UsageError("--recovery-steps applies to --stage after-finetune and post-training only")
        check_range("calibration_samples", self.calibration_samples, 1)
        self._check_calibration()
        if self.corpus and self.stage != "pretrain":
            raise UsageError("--corpus applies to --stage pretrain only")
        if self.structured and self.criterion not in ("magnitude", "fisher"):
            raise UsageError("--structured ranks heads / FFN neurons by magnitude or by fisher (--stage "
                             f"post-training); drop --criterion '{self.criterion}'")
        if get_criterion(self.criterion).structured_only and not self.structured:
            raise UsageError(f"--criterion {self.criterion} removes whole heads / FFN neurons: add "
                             "--structured heads,ffn and --flops-reduction F")
        if (self.flops_reduction is None) != (self.criterion != "fisher"):
            raise UsageError("--flops-reduction sets the target of --criterion fisher (with --structured), "
                             "and fisher needs it: use both or neither")
        if self.flops_reduction is not None:
            check_range("flops_reduction", self.flops_reduction, 0, 1, lo_open=True, hi_open=True)
        check_range("max_swaps", self.max_swaps, 0)
        if self.scale_bound != 0:
            check_range("scale_bound", self.scale_bound, 1)
        if self.criterion != "fisher" and (self.max_swaps != MAX_SWAPS or self.scale_bound != SCALE_BOUND
                                           or self.no_mask_tuning):
            raise UsageError("--max-swaps, --scale-bound and --no-mask-tuning tune --criterion fisher; "
                             "drop them or use --structured heads,ffn --criterion fisher")
        if self.resume and self.out is None:  # checked here too, before any data or model is loaded
            raise UsageError("--resume needs --out naming the interrupted run's folder "
                             "(the folder it was started with)")

    def _check_calibration(self) -> None:
        """Data-aware criteria prune once, from calibration data, in the post-training stage; the
        calibration and schedule flags apply there only as far as they make sense."""
        default = {f.name: f.default for f in dataclasses.fields(self)}
        if get_criterion(self.criterion).data_aware and self.stage != "post-training":
            raise UsageError(f"--criterion {self.criterion} chooses the masks from calibration data, "
                             "once: use --stage post-training on a fine-tuned --model (add "
                             "--recovery-steps N to train after)")
        if self.stage != "post-training":
            for name in ("calibration_samples", "calibration_data"):
                if getattr(self, name) != default[name]:
                    raise UsageError(f"--{name.replace('_', '-')} applies to --stage post-training only")
            return
        for name in ("prune_steps", "prune_every", "prune_start", "initial_sparsity", "schedule_power"):
            if getattr(self, name) != default[name]:
                raise UsageError(f"--stage post-training prunes once, before any training; drop "
                                 f"--{name.replace('_', '-')}")
        if self.resume:
            raise UsageError("--stage post-training runs in minutes and does not resume; run it again "
                             "without --resume")

    def _check_pattern(self) -> None:
        """N:M pruning is per matrix, by magnitude, at sparsity N/M: the default sparsity becomes
        N/M and any other is refused (the CLI also refuses a typed --sparsity equal to the default,
        see ``compress.cli.prune``)."""
        pattern = NMPattern.parse(self.pattern)
        object.__setattr__(self, "pattern", str(pattern))  # '2 : 4' -> '2:4'
        if self.structured:
            raise UsageError(f"--pattern {pattern} keeps the matrices' shapes and zeros weights in "
                             "groups; --structured removes whole heads/FFN neurons: use one of them")
        default = next(f.default for f in dataclasses.fields(self) if f.name == "sparsity")
        if self.sparsity == default and default != pattern.sparsity:
            object.__setattr__(self, "sparsity", pattern.sparsity)
        check_pattern_fits(pattern, {}, self.criterion, self.scope, self.sparsity)


# ---------------------------------------------------------------------------------------------
# shared pieces


def total_steps(cfg: PruneConfig, n_examples: int, max_steps: int | None = None) -> int:
    """Optimizer steps of one ``train`` call on one process (the loop's own formula)."""
    max_steps = max_steps or cfg.max_steps
    per_epoch = max(1, math.ceil(n_examples / cfg.batch_size))
    return max_steps or max(1, math.ceil(per_epoch * cfg.epochs))


def _schedule_factory(cfg: PruneConfig):
    def build(total: int):
        return make_schedule(cfg.schedule, cfg.sparsity, total, cfg.prune_steps, cfg.prune_every,
                             cfg.prune_start, cfg.initial_sparsity, cfg.schedule_power)
    return build


class _ScheduledPruningHook(PruningHook):
    """Builds the schedule from the loop's real step count (it differs on several processes)."""

    def __init__(self, pruner, module, factory):
        super().__init__(pruner, module)
        self.factory = factory

    def on_train_begin(self, model, total_steps: int) -> None:
        if self.pruner.phase == "new":
            self.pruner.schedule = self.factory(total_steps)
        super().on_train_begin(model, total_steps)


def make_pruner(cfg: PruneConfig, module: torch.nn.Module, model_dir: str, n_steps: int
                ) -> tuple[ScheduledPruner, _ScheduledPruningHook]:
    """Validate targets and schedule for ``module`` and build the pruner (before any run folder)."""
    targets = select_targets(module, cfg.include, cfg.exclude)
    factory = _schedule_factory(cfg)
    initial = {}
    if (Path(model_dir) / MASKS_FILE).is_file():  # re-pruning a pruned model keeps its zeros
        initial, _ = matching_masks(module, load_masks(Path(model_dir) / MASKS_FILE))
        left_out = sorted(n for n, m in initial.items() if n not in targets and not m.all())
        if left_out:  # the pruner only enforces masks of its targets: these zeros would regrow
            raise UsageError(f"{model_dir} is pruned in {len(left_out)} matrices that --include/--exclude "
                             f"leave out ({', '.join(left_out[:2])}); add --include for them so their "
                             "zeros are kept")
    # the pruner of the Python API (compress.make_pruner); the schedule is rebuilt from the loop's
    # real step count at train begin (factory)
    pruner = api_make_pruner(module, cfg.sparsity, schedule=cfg.schedule, total_steps=n_steps,
                             prune_steps=cfg.prune_steps, prune_every=cfg.prune_every,
                             start_step=cfg.prune_start, initial_sparsity=cfg.initial_sparsity,
                             power=cfg.schedule_power, criterion=cfg.criterion, scope=cfg.scope,
                             include=cfg.include, exclude=cfg.exclude, seed=cfg.seed, initial_masks=initial,
                             pattern=cfg.pattern)
    return pruner, _ScheduledPruningHook(pruner, module, factory)


def run_structured(module: torch.nn.Module, cfg: PruneConfig, batches: list[dict] | None = None) -> dict:
    """Remove whole heads / FFN neurons: by L2 norm (``compress.pruning.structured``), or with
    ``--criterion fisher`` by Kwon et al.'s search on the calibration ``batches``
    (``compress.pruning.fisher_structured``)."""
    if cfg.criterion == "fisher":
        from compress.pruning.fisher_structured import fisher_prune_structured

        return fisher_prune_structured(module, batches, cfg.flops_reduction, cfg.max_length,
                                       tuple(cfg.structured), tune=not cfg.no_mask_tuning,
                                       max_swaps=cfg.max_swaps,
                                       scale_bound=cfg.scale_bound or None)
    from compress.pruning.structured import prune_structured

    return prune_structured(module, cfg.sparsity, tuple(cfg.structured))


def pruning_meta(cfg: PruneConfig, pruner: ScheduledPruner | None, structured: dict | None) -> dict:
    meta = {"stage": cfg.stage, "sparsity": cfg.sparsity, "criterion": cfg.criterion,
            "scope": cfg.scope, "seed": cfg.seed,
            # structured pruning removes its units once, at the start of training or recovery
            "schedule": "oneshot" if cfg.structured else cfg.schedule}
    if pruner is not None:
        sch = pruner.schedule
        meta.update({"masks_file": MASKS_FILE, "targets": list(pruner.params),
                     "schedule_params": {k: getattr(sch, k) for k in sch.__dataclass_fields__},
                     "history": pruner.history})
    if structured is not None:
        meta["structured"] = {"targets": list(cfg.structured), "result": structured}
    if cfg.pattern is not None:
        meta["pattern"] = cfg.pattern  # 'compress verify' checks every group of the saved matrices
    return meta


def save_pruned(run: RunDir, model, tokenizer, masks: dict | None, meta: dict, summary: dict) -> dict:
    """Model (HF format, zeros stored) + masks + sparsity.json + summary.json; the saved model is
    reloaded with plain ``from_pretrained`` and every mask checked on it. Rank 0 of a multi-process
    launch alone writes and checks (the other ranks hold the same weights and masks)."""
    if run.rank > 0:
        return summary
    save_model(model, tokenizer, run.path / "model", meta)
    report = write_masks_and_sparsity(run.path, masks)
    summary = {**summary, "sparsity": {g: report[g]["sparsity"] for g in ("global", "embeddings",
                                                                          "encoder")},
               "heads_overall": report["heads_overall"]}
    if meta.get("pruning", {}).get("pattern"):
        summary["pattern"] = meta["pruning"]["pattern"]
    run.write_summary(summary)
    return summary


def write_masks_and_sparsity(run_path: Path, masks: dict | None) -> dict:
    """Next to the saved ``run_path/model``: its masks (checked on the model reloaded with plain
    ``from_pretrained``) and ``sparsity.json``; returns the sparsity report."""
    model_dir = run_path / "model"
    reloaded = load_saved_model(model_dir)
    pattern = recorded_pattern(model_dir)
    if masks:
        save_masks(masks, model_dir / MASKS_FILE)
        _link_or_copy(model_dir / MASKS_FILE, run_path / MASKS_FILE)
        check_masks(reloaded, load_masks(model_dir / MASKS_FILE))
        if pattern:
            check_pattern(reloaded, list(masks), pattern)
    report = sparsity_report(reloaded, masks or None, pattern)
    write_json(run_path / "sparsity.json", report)
    return report


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _name(cfg: PruneConfig, what: str) -> str:
    amount = cfg.pattern.replace(":", "of") if cfg.pattern else round(100 * cfg.sparsity)
    return cfg.name or f"{what}-{cfg.stage}-{cfg.criterion}-{amount}"


# ---------------------------------------------------------------------------------------------
# stages


def prune_finetune(cfg: PruneConfig) -> Path:
    """Prune while fine-tuning on a task: masks follow the schedule, then stay fixed."""
    spec, data = load_task_data(cfg)
    labels = data["train"].label_names
    set_seed(cfg.seed)  # a fresh task head is initialised here: same seed, same run
    multilabel = data["train"].multilabel
    model, tokenizer, _ = load_classifier(cfg.model, labels, multilabel=multilabel)
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel) if cfg.teacher
                            else (None, None))
    n_steps = total_steps(cfg, len(data["train"]))
    pruner, hooks = None, []
    if not cfg.structured:
        pruner, hook = make_pruner(cfg, model, resolve_model(cfg.model), n_steps)
        hooks = [hook]
    with RunDir("prune", name=_name(cfg, spec.name), out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
        t0 = time.time()
        structured = run_structured(model, cfg) if cfg.structured else None
        feats = encode(tokenizer, data["train"], cfg.max_length)
        kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], feats, multilabel, run)
        result = train(model, tokenizer, kd.pop("feats"), cfg, hooks, log=run.log_metrics,
                       checkpoint_dir=run.checkpoint_dir, resume=cfg.resume, **kd)
        masks = pruner.finalize() if pruner else None
        metrics = evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                      cfg.eval_batch_size)
        run.log_metrics({"step": result["steps"], "eval": metrics})
        distill = (teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"], multilabel)
                   if teacher is not None else None)
        meta = {"task": spec.name, "label_names": list(labels), "multilabel": multilabel,
                "max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": pruning_meta(cfg, pruner, structured)}
        save_pruned(run, model, tokenizer, masks, meta, {
            "command": "prune", "stage": cfg.stage, "task": spec.name, "model": cfg.model,
            "steps": result["steps"], "train_seconds": round(time.time() - t0, 1),
            "metric": spec.metric, "eval": metrics, "structured": structured, "distillation": distill,
            "prune_history": pruner.history if pruner else None})
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


def prune_after_finetune(cfg: PruneConfig) -> Path:
    """Fine-tune dense, prune (oneshot or gradual), keep training with masks to recover."""
    spec, data = load_task_data(cfg)
    labels = data["train"].label_names
    set_seed(cfg.seed)  # a fresh task head is initialised here: same seed, same run
    multilabel = data["train"].multilabel
    model, tokenizer, _ = load_classifier(cfg.model, labels, multilabel=multilabel)
    # an external teacher is loaded and checked before the run folder exists; 'self' after phase 1
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel)
                            if cfg.teacher and cfg.teacher != TEACHER_SELF else (None, None))
    n_dense = total_steps(cfg, len(data["train"]))
    n_recover = cfg.recovery_steps or n_dense
    pruner, hooks = None, []
    if not cfg.structured:
        pruner, hook = make_pruner(cfg, model, resolve_model(cfg.model), n_recover)
        hooks = [hook]
    with RunDir("prune", name=_name(cfg, spec.name), out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
        t0 = time.time()
        feats = encode(tokenizer, data["train"], cfg.max_length)
        # Phase 1, dense fine-tuning; its last step is checkpointed too, so that once it is finished a
        # resumed run restores its weights without training (and logs nothing again).
        dense = run.phase_results("dense")
        steps = train(model, tokenizer, feats, cfg, [], log=None if dense else run.log_metrics,
                      checkpoint_dir=run.phase_checkpoint_dir("dense"), resume=cfg.resume,
                      checkpoint_last=True)["steps"]
        if dense is None:
            dense = {"steps": steps,
                     "eval": evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                                 cfg.eval_batch_size)}
            run.finish_phase("dense", dense, [{"phase": "dense", "step": dense["steps"],
                                               "eval": dense["eval"]}])
        if cfg.teacher == TEACHER_SELF:  # the dense model, before any weight is pruned
            teacher, teacher_dir = load_teacher(cfg, labels, tokenizer, multilabel, dense=model)
        # Pruning the dense model is deterministic and cheap, so a resumed run redoes it (the
        # recovery checkpoints hold the structured model's shapes and the masks); its score is kept.
        structured, before_recovery = None, None
        # A one-shot prune at step 0 happens now, so the unrecovered model can be scored; with
        # --prune-start N > 0 it happens N recovery steps in, and there is no such score (None).
        oneshot_now = cfg.schedule == "oneshot" and not cfg.prune_start
        if cfg.structured:
            structured = run_structured(model, cfg)
        elif oneshot_now:
            hooks[0].on_train_begin(model, n_recover)
        if cfg.structured or oneshot_now:
            pruned = run.phase_results("pruned")
            if pruned is None:
                pruned = {"eval": evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                                      cfg.eval_batch_size)}
                run.finish_phase("pruned", pruned)
            before_recovery = pruned["eval"]
        # Phase 2, recovery with the masks (and the teacher's KD term, with --teacher).
        recover_cfg = replace(cfg, max_steps=n_recover)
        kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], feats, multilabel, run)
        rec = train(model, tokenizer, kd.pop("feats"), recover_cfg, hooks,
                    log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                    checkpoint_dir=run.phase_checkpoint_dir("recovery"), resume=cfg.resume, **kd)
        masks = pruner.finalize() if pruner else None
        metrics = evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                      cfg.eval_batch_size)
        run.log_metrics({"phase": "recovery", "step": rec["steps"], "eval": metrics})
        distill = (teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"], multilabel)
                   if teacher is not None else None)
        meta = {"task": spec.name, "label_names": list(labels), "multilabel": multilabel,
                "max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": pruning_meta(cfg, pruner, structured)}
        save_pruned(run, model, tokenizer, masks, meta, {
            "command": "prune", "stage": cfg.stage, "task": spec.name, "model": cfg.model,
            "dense_steps": dense["steps"], "recovery_steps": rec["steps"],
            "train_seconds": round(time.time() - t0, 1), "metric": spec.metric,
            "eval_dense": dense["eval"], "eval_pruned_before_recovery": before_recovery,
            "eval": metrics, "structured": structured, "distillation": distill,
            "prune_history": pruner.history if pruner else None})
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


def prune_pretrain(cfg: PruneConfig) -> Path:
    """Continued masked-LM pre-training with pruning, then recovery; held-out MLM loss of the dense
    model (same steps, same seed, same batches) beside the pruned one."""
    from transformers import AutoModel

    from compress.pruning.mlm import (
        HEAD_NOTES,
        MaskedLMObjective,
        build_mlm_model,
        heldout_loss,
        make_blocks,
        mask_heldout,
        pretrained_head,
        read_corpus,
        save_head,
        split_heldout,
    )

    lines = read_corpus(cfg.corpus)
    train_lines, held_lines = split_heldout(lines, cfg.heldout_fraction)
    model_dir = resolve_model(cfg.model)
    tokenizer = load_tokenizer(cfg.model)
    encoder = load_pretrained(AutoModel, cfg.model, model_dir, "an encoder")
    need = cfg.max_steps * cfg.batch_size if cfg.max_steps else None
    blocks = make_blocks(tokenizer, train_lines, cfg.max_length, max_blocks=need)
    held = mask_heldout(tokenizer, make_blocks(tokenizer, held_lines, cfg.max_length, cfg.heldout_blocks),
                        cfg.seed, cfg.mlm_probability)
    if not blocks or not held:
        raise DataError(f"the corpus is too small: {len(blocks)} training and {len(held)} held-out "
                        f"blocks of {cfg.max_length} tokens; add text or lower --max-length")
    n_steps = total_steps(cfg, len(blocks))
    head, head_source = pretrained_head(model_dir)
    dense_encoder = copy.deepcopy(encoder) if not cfg.no_dense_baseline else None
    objective = MaskedLMObjective(build_mlm_model(encoder, head), tokenizer, cfg.mlm_probability)
    pruner, hooks = None, []
    if not cfg.structured:
        pruner, hook = make_pruner(cfg, objective.mlm, model_dir, n_steps)
        hooks = [hook]
    with RunDir("prune", name=_name(cfg, "mlm"), out=cfg.out, resume=cfg.resume) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
        t0 = time.time()
        before = run.phase_results("before")
        if before is None:
            before = {"loss": heldout_loss(objective, tokenizer, held, cfg.eval_batch_size)}
            run.finish_phase("before", before)
        loss_dense = None
        if dense_encoder is not None:  # phase 1, the dense baseline: only its loss is kept
            baseline = run.phase_results("dense")
            if baseline is None:
                dense = MaskedLMObjective(build_mlm_model(dense_encoder, head), tokenizer,
                                          cfg.mlm_probability)
                train(dense, tokenizer, blocks, cfg, [],
                      log=lambda r: run.log_metrics({"phase": "dense", **r}),
                      checkpoint_dir=run.phase_checkpoint_dir("dense"), resume=cfg.resume)
                baseline = {"loss": heldout_loss(dense, tokenizer, held, cfg.eval_batch_size)}
                run.finish_phase("dense", baseline)
                del dense
            loss_dense = baseline["loss"]
            del dense_encoder
        structured = None
        if cfg.structured:
            structured = run_structured(encoder, cfg)
            objective = MaskedLMObjective(build_mlm_model(encoder, head), tokenizer, cfg.mlm_probability)
        result = train(objective, tokenizer, blocks, cfg, hooks,  # phase 2, pruning
                       log=lambda r: run.log_metrics({"phase": "pruned", **r}),
                       checkpoint_dir=run.phase_checkpoint_dir("pruned"), resume=cfg.resume)
        masks = pruner.finalize() if pruner else None
        loss_pruned = heldout_loss(objective, tokenizer, held, cfg.eval_batch_size)
        mlm_loss = {"before": before["loss"], "dense_after": loss_dense, "pruned_after": loss_pruned,
                    "heldout_blocks": len(held),
                    "heldout_tokens_scored": sum(sum(t != -100 for t in b["mlm_labels"]) for b in held),
                    "head": head_source, "note": HEAD_NOTES[head_source]}
        run.log_metrics({"step": result["steps"], "mlm_loss": mlm_loss})
        meta = {"max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": pruning_meta(cfg, pruner, structured)}
        save_pruned(run, encoder, tokenizer, masks, meta, {
            "command": "prune", "stage": cfg.stage, "model": cfg.model,
            "corpus": [str(c) for c in cfg.corpus], "train_blocks": len(blocks),
            "steps": result["steps"], "train_seconds": round(time.time() - t0, 1),
            "mlm_loss": mlm_loss, "structured": structured,
            "prune_history": pruner.history if pruner else None})
        save_head(objective.mlm, run.path / "model")
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


def calibration_batches(cfg: PruneConfig, tokenizer, feats: list[dict]) -> list[dict]:
    """The calibration set, batched: ``--calibration-samples`` training examples drawn with
    ``--seed`` (the dev split is never read here), or the lines of ``--calibration-data``."""
    from compress.pruning.mlm import read_corpus
    from compress.training.loop import make_collate

    if cfg.calibration_data is not None:
        lines = read_corpus((cfg.calibration_data,))
        enc = tokenizer(lines, truncation=True, max_length=cfg.max_length)
        feats = [{**{k: enc[k][i] for k in enc.keys()}, "labels": 0} for i in range(len(lines))]
    chosen = [feats[i] for i in calibration_sample(len(feats), cfg.calibration_samples, cfg.seed)]
    collate = make_collate(tokenizer)
    return [collate(chosen[i:i + cfg.batch_size]) for i in range(0, len(chosen), cfg.batch_size)]


def prune_once(cfg: PruneConfig, model, targets: dict, batches: list[dict], initial: dict, run: RunDir
               ) -> tuple[dict | None, dict | None, dict | None]:
    """The post-training prune itself: whole heads / FFN neurons with --structured, else the
    calibrated criterion on ``targets``; returns (masks, calibration report, structured report) and
    writes ``calibration.json``."""
    from compress.pruning.calibration import prune_calibrated

    if cfg.structured:
        return None, None, run_structured(model, cfg, batches)
    pattern = NMPattern.parse(cfg.pattern) if cfg.pattern else None
    masks, calibration = prune_calibrated(model, targets, batches, cfg.criterion, cfg.sparsity, cfg.scope,
                                          pattern, initial, seed=cfg.seed)
    write_json(run.path / "calibration.json", calibration)
    return masks, calibration, None


def post_training_targets(cfg: PruneConfig, model) -> tuple[dict, dict]:
    """The matrices to prune (none with --structured), checked against --pattern, and the masks of
    an already pruned ``--model`` (kept pruned); before any run folder exists."""
    targets = {} if cfg.structured else select_targets(model, cfg.include, cfg.exclude)
    if cfg.pattern is not None:
        check_pattern_fits(NMPattern.parse(cfg.pattern), targets, cfg.criterion, cfg.scope, cfg.sparsity)
    initial, model_dir = {}, Path(resolve_model(cfg.model))
    if (model_dir / MASKS_FILE).is_file():  # re-pruning a pruned model keeps its zeros
        initial, _ = matching_masks(model, load_masks(model_dir / MASKS_FILE))
    return targets, initial


def post_training_meta(cfg: PruneConfig, masks: dict | None, structured: dict | None) -> dict:
    return {**pruning_meta(cfg, None, structured), "schedule": "oneshot",
            **({"masks_file": MASKS_FILE, "targets": sorted(masks)} if masks else {})}


@dataclass
class OneShot:
    """What the post-training prune gave: the scores before and after it, the encoded training
    split (for a recovery), the masks or the structured report, and the prune's own seconds."""

    dense: dict
    pruned: dict
    feats: list
    masks: dict | None
    calibration: dict | None
    structured: dict | None
    seconds: float


def score_prune_score(cfg: PruneConfig, model, targets: dict, initial: dict, run: RunDir,
                      score: Callable[[], dict], encode_train: Callable[[], list],
                      calibration_set: Callable[[list], list[dict]]) -> OneShot:
    """Score the dense model, prune it once from calibration batches, score it again; both scores
    logged. The prune's seconds cover encoding the training split, drawing the calibration set and
    choosing the masks, not the evaluations."""
    dense = score()
    run.log_metrics({"phase": "dense", "eval": dense})
    t_prune = time.time()
    feats = encode_train()
    masks, calibration, structured = prune_once(cfg, model, targets, calibration_set(feats), initial, run)
    seconds = round(time.time() - t_prune, 1)
    pruned = score()
    run.log_metrics({"phase": "pruned", "step": 0, "eval": pruned})
    return OneShot(dense, pruned, feats, masks, calibration, structured, seconds)


def post_training_summary(cfg: PruneConfig, task: str, metric: str, once: OneShot, metrics: dict,
                          steps: int, started: float) -> dict:
    """The summary fields both post-training stages (classification, squad) write."""
    return {"command": "prune", "stage": cfg.stage, "task": task, "model": cfg.model,
            "criterion": cfg.criterion, "recovery_steps": steps, "prune_seconds": once.seconds,
            "train_seconds": round(time.time() - started, 1), "metric": metric,
            "eval_dense": once.dense, "eval_pruned_before_recovery": once.pruned, "eval": metrics,
            "structured": once.structured,
            "calibration": {k: v for k, v in (once.calibration or {}).items() if k != "matrices"} or None}


def prune_post_training(cfg: PruneConfig) -> Path:
    """Prune a model already fine-tuned on the task, once, with masks chosen from calibration data
    (``compress.pruning.calibration``; SparseGPT also rewrites the kept weights), then optionally
    train ``--recovery-steps`` with the masks kept (and the dense model as teacher with --teacher self)."""
    from compress.pruning.pruner import KeepMasksHook

    spec, data = load_task_data(cfg)
    labels = data["train"].label_names
    multilabel = data["train"].multilabel
    set_seed(cfg.seed)
    model, tokenizer, _ = load_classifier(cfg.model, labels, multilabel=multilabel, strict_labels=True)
    teacher, teacher_dir = (load_teacher(cfg, labels, tokenizer, multilabel) if cfg.teacher
                            else (None, None))
    targets, initial = post_training_targets(cfg, model)
    with RunDir("prune", name=_name(cfg, spec.name), out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        t0 = time.time()

        def score() -> dict:
            return evaluate_classifier(model, tokenizer, spec, data["eval"], cfg.max_length,
                                       cfg.eval_batch_size)

        once = score_prune_score(cfg, model, targets, initial, run, score,
                                 lambda: encode(tokenizer, data["train"], cfg.max_length),
                                 lambda feats: calibration_batches(cfg, tokenizer, feats))
        metrics, steps = once.pruned, 0
        if cfg.recovery_steps:
            hooks = [KeepMasksHook(model, once.masks, {})] if once.masks else []
            hooks = start_tracking(run, cfg.report_to, to_dict(cfg), "prune", hooks)
            kd = teacher_training(cfg, teacher, teacher_dir, tokenizer, data["train"], once.feats, multilabel,
                                  run)
            steps = train(model, tokenizer, kd.pop("feats"), replace(cfg, max_steps=cfg.recovery_steps),
                          hooks, log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                          checkpoint_dir=run.checkpoint_dir, **kd)["steps"]
            metrics = score()
            run.log_metrics({"phase": "recovery", "step": steps, "eval": metrics})
        distill = (teacher_summary(cfg, teacher, model, tokenizer, spec, data["eval"], multilabel)
                   if teacher is not None and cfg.recovery_steps else None)
        meta = {"task": spec.name, "label_names": list(labels), "multilabel": multilabel,
                "max_length": cfg.max_length, "base_model": cfg.model,
                "pruning": post_training_meta(cfg, once.masks, once.structured)}
        save_pruned(run, model, tokenizer, once.masks, meta, {
            **post_training_summary(cfg, spec.name, spec.metric, once, metrics, steps, t0),
            "distillation": distill})
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


def prune_post_training_qa(cfg: PruneConfig) -> Path:
    """squad: the post-training prune of a model fine-tuned on squad, calibrated on training
    windows, scored by EM/F1 before and after; ``--recovery-steps`` train on the span loss (with
    ``--teacher``, plus KD on the start/end logits) with the masks kept."""
    from compress.pruning.pruner import KeepMasksHook
    from compress.qa.features import collate_features, prepare_train_features
    from compress.qa.objectives import make_objective
    from compress.qa.options import effective_doc_stride
    from compress.recipes.qa import QA_TASK, evaluate_qa, load_qa_data, load_qa_model, load_span_teacher

    doc_stride = effective_doc_stride(cfg, cfg.max_length)
    data = load_qa_data(cfg)
    set_seed(cfg.seed)
    model, tokenizer, _ = load_qa_model(cfg.model, require_finetuned=True)
    teacher = load_span_teacher(cfg, tokenizer) if cfg.teacher else None
    targets, initial = post_training_targets(cfg, model)
    with RunDir("prune", name=_name(cfg, QA_TASK), out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(cfg.seed)
        t0 = time.time()

        def score() -> dict:
            return evaluate_qa(model, tokenizer, data["dev"], cfg.max_length, doc_stride, cfg.n_best,
                               cfg.max_answer_length, cfg.eval_batch_size)[0]

        def calibration_set(feats: list) -> list[dict]:
            chosen = [feats[i] for i in calibration_sample(len(feats), cfg.calibration_samples, cfg.seed)]
            return [collate_features(tokenizer, chosen[i:i + cfg.batch_size])
                    for i in range(0, len(chosen), cfg.batch_size)]

        once = score_prune_score(cfg, model, targets, initial, run, score, lambda: prepare_train_features(
            tokenizer, data["train"].examples, cfg.max_length, doc_stride), calibration_set)
        metrics, steps = once.pruned, 0
        if cfg.recovery_steps:
            objective = (SpanDistillation(teacher, cfg.lambda_for(False), cfg.temperature) if teacher
                         else make_objective("plain", model, cfg))
            hooks = [KeepMasksHook(model, once.masks, {})] if once.masks else []
            steps = train(model, tokenizer, once.feats, replace(cfg, max_steps=cfg.recovery_steps), hooks,
                          log=lambda r: run.log_metrics({"phase": "recovery", **r}),
                          checkpoint_dir=run.checkpoint_dir, collate=partial(collate_features, tokenizer),
                          loss_fn=objective.loss, extra_modules=[objective])["steps"]
            metrics = score()
            run.log_metrics({"phase": "recovery", "step": steps, "eval": metrics})
        meta = {"task": QA_TASK, "head": "question-answering", "max_length": cfg.max_length,
                "doc_stride": doc_stride, "n_best": cfg.n_best, "max_answer_length": cfg.max_answer_length,
                "base_model": cfg.model, "pruning": post_training_meta(cfg, once.masks, once.structured)}
        save_pruned(run, model, tokenizer, once.masks, meta,
                    post_training_summary(cfg, QA_TASK, "f1", once, metrics, steps, t0))
        shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    return run.path


STAGES = {"pretrain": prune_pretrain, "finetune": prune_finetune, "after-finetune": prune_after_finetune,
          "post-training": prune_post_training}


def run_prune(cfg: PruneConfig) -> Path:
    """Run the configured stage; returns the finished run folder."""
    family = get_task(cfg.task).family
    if cfg.stage == "post-training" and family == "qa":
        return prune_post_training_qa(cfg)
    if cfg.stage != "pretrain" and family in OTHER_FAMILIES:
        return prune_finetune_workflow(cfg, family)
    return STAGES[cfg.stage](cfg)


# Task families whose fine-tuning workflow lives with the task (compress.recipes.finetune.FINETUNE_FAMILIES):
# pruning rides on it as a hook instead of a loop of its own.
OTHER_FAMILIES = ("qa", "retrieval")


class _FinalizeAndWrite(TrainHook):
    """Fixes the masks at the last step (before the workflow evaluates and saves the model), then
    writes them, the pruning metadata and ``sparsity.json`` into the run folder before it is renamed."""

    def __init__(self, pruner: ScheduledPruner, cfg: PruneConfig):
        self.pruner, self.cfg, self.total, self.masks = pruner, cfg, None, None

    def on_train_begin(self, model, total_steps: int) -> None:
        self.total = total_steps

    def on_step_end(self, model, step: int) -> None:
        if step == self.total:
            self.masks = self.pruner.finalize()

    def save(self, run_path: Path) -> None:
        add_meta(Path(run_path) / "model", {"pruning": pruning_meta(self.cfg, self.pruner, None)})
        write_masks_and_sparsity(Path(run_path), self.masks)


def prune_finetune_workflow(cfg: PruneConfig, family: str) -> Path:
    """squad / reqa: the task's own fine-tuning workflow (``run_finetune``) with the pruning hook."""
    if cfg.structured:
        raise UsageError(f"--structured supports classification tasks; '{cfg.task}' is a {family} task "
                         "(leave --structured unset)")
    if cfg.stage != "finetune":
        raise UsageError(f"--task {cfg.task} is pruned with --stage finetune (or --stage pretrain, then "
                         f"'compress finetune --task {cfg.task}' on the pruned model)")

    def hooks(module: torch.nn.Module) -> list[TrainHook]:
        # the schedule is rebuilt from the loop's real step count when training begins
        pruner, hook = make_pruner(cfg, module, resolve_model(cfg.model), cfg.max_steps or 10**6)
        return [hook, _FinalizeAndWrite(pruner, cfg)]

    return run_finetune(cfg, command="prune", hook_factory=hooks)
