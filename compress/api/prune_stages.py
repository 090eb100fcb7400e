"""What every ``compress prune`` stage shares: its config (``PruneConfig``, every flag checked), the
pruner and its hook, structured removal (``structured_prune``), the latency shape of a ``--speedup``,
the pruning record, and the saved model with its masks and sparsity. The stages themselves are
recipes (``compress.recipes.prune``, ``compress.recipes.post_training``, ...); the library pieces
of the post-training stage are in ``compress.api.post_training``. Not re-exported by ``import
compress``."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from compress.api.functions import make_pruner as api_make_pruner
from compress.core.config import check_range, check_sparsity, option
from compress.core.errors import UsageError
from compress.core.runs import RunDir, write_json
from compress.distill.teacher_kd import (
    TeacherKDOptions,
)
from compress.measure.sparsity import sparsity_report
from compress.pruning.criteria import CRITERIA, STRUCTURED_SEARCHES, default_structured_search, get_criterion
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
    check_pattern_fits,
    matching_masks,
)
from compress.pruning.schedules import DEFAULT_POWER, SCHEDULES, make_schedule
from compress.pruning.targets import select_targets
from compress.qa.options import QAOptions
from compress.report.saving import save_model
from compress.tasks import get_task
from compress.tasks.task_data import TaskDataConfig
from compress.training.loop import TrainConfig

# the stages of ``compress prune --stage`` (compress.cli.prune maps each to its recipe)
STAGES = ("pretrain", "finetune", "after-finetune", "post-training")


@dataclass(frozen=True)
class PruneConfig(TrainConfig, TaskDataConfig, QAOptions, TeacherKDOptions):
    # QAOptions: --doc-stride, --split-by-article, --objective, ... (squad/reqa only).
    # TeacherKDOptions: --teacher, --kd-lambda, --temperature, --kd-hidden, --kd-layers (distillation-aware
    # pruning).
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
    recovery_class_floor: float = option(0.5, help="post-training recovery, single-label tasks: a class "
                                                   "with fewer than F x its even share of the training "
                                                   "examples is drawn again up to that share, so the "
                                                   "recovery keeps it; 0 = off")
    recovery_unlabeled: int = option(0, help="post-training recovery with --teacher: add N texts of the "
                                             "task's training split beyond --train-limit to the transfer "
                                             "set, labelled by the teacher only (their gold labels are "
                                             "never read)")
    recovery_augment: int = option(0, help="post-training recovery with --teacher: add N augmented "
                                           "copies of each labelled example (compress distill's "
                                           "--augment operators, Tang et al. 2019) to the transfer set, "
                                           "labelled by the teacher only; needs NLTK's tagger")
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
    flops_reduction: float | None = option(None, help="--structured with --criterion obs or fisher: fraction "
                                                      "of the encoder's FLOPs at --max-length to "
                                                      "remove, in (0, 1)")
    speedup: tuple[float, ...] = option((), help="--structured with --criterion obs or fisher: times the "
                                                 "dense model's speed in --latency-runtime at "
                                                 "--latency-shape, from a latency table measured on this "
                                                 "machine (e.g. 3); several (2,3,4) give a family of models, "
                                                 "one run folder each, exported, benched and compared in one "
                                                 "report")
    latency_runtime: str = option("ort-int8", choices=lambda: tuple(_runtimes()),
                                  help="--speedup: the runtime the model will ship in (ort-int8 = what "
                                       "'compress export --optimize --quantize int8' writes)")
    latency_shape: str = option("task", help="--speedup: batch x tokens at which the latency table is "
                                             "measured and the speedup aimed; 'task' (default): 32 x "
                                             "--max-length, the longest input the model reads; 'auto': "
                                             "32 x the 90th percentile of the calibration texts' token "
                                             "counts")
    max_drop: float = option(1.0, help="--speedup family: the report names the fastest model whose int8 "
                                       "dev score is at most this many points below the dense model's")
    max_drop_metric: str = option("task", choices=("task", "macro_f1"),
                                  help="--speedup family: what --max-drop judges: the task's metric or "
                                       "macro-F1 (every class counts alike)")
    family_mode: str = option("gradual", choices=("gradual", "independent"),
                              help="--speedup family: 'gradual': each target starts from the previous "
                                   "member after its recovery (ZipLM's gradual mode; embedding models run "
                                   "independent); 'independent': each from the dense model")
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
        self._refuse_logit_kd_of_embeddings()  # before the generic check would ask for a --teacher
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
        searched = bool(self.speedup) or self.flops_reduction is not None
        if self.structured and self.criterion == "magnitude" and searched:
            # a FLOPs or speed target is searched, and the L2-norm ranking searches nothing: the target
            # goes to the search measured better for the task's family (docs/results.md)
            object.__setattr__(self, "criterion", default_structured_search(get_task(self.task).family))
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
        check_range("recovery_class_floor", self.recovery_class_floor, 0, 1)
        self._check_transfer_extras()
        self._check_calibration()
        if self.corpus and self.stage != "pretrain":
            raise UsageError("--corpus applies to --stage pretrain only")
        if self.structured and self.criterion not in ("magnitude", *STRUCTURED_SEARCHES):
            raise UsageError("--structured ranks heads / FFN neurons by magnitude, fisher or obs (--stage "
                             f"post-training); drop --criterion '{self.criterion}'")
        if get_criterion(self.criterion).structured_only and not self.structured:
            raise UsageError(f"--criterion {self.criterion} removes whole heads / FFN neurons: add "
                             "--structured heads,ffn and --flops-reduction F")
        self._check_speed_target()
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

    def _check_speed_target(self) -> None:
        """--criterion fisher / obs aims at one of --flops-reduction or --speedup; nothing else reads them."""
        targets = (self.flops_reduction is not None) + bool(self.speedup)
        if self.criterion in STRUCTURED_SEARCHES and targets != 1:
            raise UsageError(f"--criterion {self.criterion} needs one target: --flops-reduction F (fewer "
                             "FLOPs) or "
                             "--speedup X (times the dense speed, measured)" if targets == 0 else
                             "--flops-reduction and --speedup are two targets for the same search; use one")
        if self.criterion not in STRUCTURED_SEARCHES and targets:
            raise UsageError("--flops-reduction and --speedup set the target of --criterion obs or fisher "
                             "(with "
                             "--structured heads,ffn and --stage post-training); add them or drop the target")
        for x in self.speedup:
            check_range("speedup", x, 1, None, lo_open=True)
        labels = [f"{x:g}" for x in self.speedup]
        if len(set(labels)) != len(labels):
            raise UsageError(f"--speedup {','.join(str(x) for x in self.speedup)}: two targets would share "
                             "one name (and run folder); give targets that differ in their first 6 digits")
        if list(self.speedup) != sorted(set(self.speedup)):
            raise UsageError(f"--speedup {','.join(f'{x:g}' for x in self.speedup)}: give distinct targets "
                             "in increasing order, e.g. 2,3,4")
        if self.latency_shape not in (AUTO_SHAPE, TASK_SHAPE):
            parse_shape(self.latency_shape)
        check_range("max_drop", self.max_drop, 0)
        default = {f.name: f.default for f in dataclasses.fields(self)}
        for name in ("latency_runtime", "latency_shape", "max_drop", "max_drop_metric", "family_mode"):
            if not self.speedup and getattr(self, name) != default[name]:
                raise UsageError(f"--{name.replace('_', '-')} applies with --speedup only; add --speedup X "
                                 "or drop it")
        for name in ("max_drop", "max_drop_metric", "family_mode"):
            if len(self.speedup) < 2 and getattr(self, name) != default[name]:
                raise UsageError(f"--{name.replace('_', '-')} applies to a --speedup family (several "
                                 "targets, "
                                 "e.g. 2,3,4); drop it or give several targets")

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
        refuse_post_training_flags(self)

    def _refuse_logit_kd_of_embeddings(self) -> None:
        """--kd-lambda, --kd-hidden and --temperature weigh a KD term over logits; a sentence-embedding
        model has none, so for --task embedding they are refused with that reason (the fix is to drop
        them, not to add a --teacher)."""
        from compress.distill.losses import DEFAULT_TEMPERATURE

        given = [f"--{n.replace('_', '-')}" for n, default in
                 (("kd_lambda", None), ("kd_hidden", 0.0), ("temperature", DEFAULT_TEMPERATURE))
                 if getattr(self, n) != default]
        if not given:
            return
        try:
            family = get_task(self.task).family
        except UsageError:
            return  # an unknown task is refused by its own check
        if family == "embedding":
            raise UsageError(f"{', '.join(given)}: an embedding model has no logits to distil; its recovery "
                             "(--recovery-steps N) matches embeddings, and layers with --kd-layers W; drop "
                             f"{', '.join(given)}")

    def _check_transfer_extras(self) -> None:
        """Teacher-only transfer examples (--recovery-unlabeled, --recovery-augment) need a recovery
        that distils: post-training, --recovery-steps and --teacher; the unlabeled texts lie beyond
        a --train-limit."""
        check_range("recovery_unlabeled", self.recovery_unlabeled, 0)
        check_range("recovery_augment", self.recovery_augment, 0)
        given = [f"--recovery-{n} {getattr(self, 'recovery_' + n)}" for n in ("unlabeled", "augment")
                 if getattr(self, "recovery_" + n)]
        if not given:
            return
        if self.stage != "post-training" or not self.recovery_steps or self.teacher is None:
            raise UsageError(f"{' and '.join(given)} adds examples only a teacher labels to a recovery: "
                             "it needs --stage post-training, --recovery-steps N and --teacher (or "
                             "--teacher self); drop it or add those")
        if self.recovery_unlabeled and self.train_limit is None:
            raise UsageError(f"--recovery-unlabeled {self.recovery_unlabeled} reads the training texts after "
                             "the first --train-limit; set --train-limit N (the labelled examples)")

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


def refuse_post_training_flags(cfg: PruneConfig) -> None:
    """What --stage post-training would ignore or contradict, refused before anything loads."""
    if cfg.teacher is not None and not cfg.recovery_steps:
        raise UsageError("--teacher distils during the --recovery-steps training, and without it "
                         "--stage post-training trains nothing; add --recovery-steps N or drop --teacher")
    if cfg.checkpoint_every:
        raise UsageError("--stage post-training does not resume, so its checkpoints would never be read; "
                         "drop --checkpoint-every")
    if cfg.calibration_data is not None and get_task(cfg.task).family == "qa":
        raise UsageError(f"--calibration-data is plain text, and --task {cfg.task} calibrates on its "
                         "training windows (question + context); drop --calibration-data and set "
                         "--calibration-samples")


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


def _runtimes() -> dict:
    from compress.measure.latency_table import RUNTIMES

    return RUNTIMES


def parse_shape(text: str) -> tuple[int, int]:
    """'32x128' -> (32, 128); UsageError naming --latency-shape otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(re.fullmatch(r"[0-9]+", p.strip()) and int(p) > 0 for p in parts):
        raise UsageError(f"--latency-shape '{text}': give batch x tokens, e.g. 32x128, 'task' or 'auto'")
    return int(parts[0]), int(parts[1])


AUTO_SHAPE = "auto"
TASK_SHAPE = "task"
AUTO_BATCH = 32
AUTO_QUANTILE = 0.9


def latency_shape_of(text: str, batches: list[dict] | None, max_length: int | None = None
                     ) -> tuple[int, int]:
    """(batch, tokens) of ``--latency-shape``; ``task``: ``AUTO_BATCH`` x ``max_length`` (the
    longest input the task's model reads); ``auto``: ``AUTO_BATCH`` x the ``AUTO_QUANTILE``
    quantile of the calibration inputs' token counts (their attention masks), rounded up to a
    multiple of 8: the speedup aimed at the lengths the model will read."""
    if text == TASK_SHAPE:
        if not max_length:
            raise UsageError("--latency-shape task reads --max-length; give it, or batch x tokens, "
                             "e.g. 32x128")
        return AUTO_BATCH, int(max_length)
    if text != AUTO_SHAPE:
        return parse_shape(text)
    lengths = [b["attention_mask"].sum(1) for b in batches or [] if "attention_mask" in b]
    if not lengths:
        raise UsageError("--latency-shape auto reads the calibration texts' lengths, and there are none; "
                         "give batch x tokens, e.g. 32x128")
    q = float(torch.quantile(torch.cat(lengths).float(), AUTO_QUANTILE))
    return AUTO_BATCH, 8 * math.ceil(q / 8)


def check_latency_shape_fits(cfg: PruneConfig) -> None:
    """A ``--latency-shape`` (or ``task`` length) longer than ``--model``'s position table is refused
    in one line, from its config alone, before any model or data is loaded."""
    if not cfg.speedup or cfg.latency_shape == AUTO_SHAPE:
        return
    tokens = cfg.max_length if cfg.latency_shape == TASK_SHAPE else parse_shape(cfg.latency_shape)[1]
    from compress.measure.latency_table import encoder_config

    try:
        positions = getattr(encoder_config(cfg.model), "max_position_embeddings", None)
    except Exception:  # noqa: BLE001 - a model that cannot be read is reported where it is loaded
        return
    if isinstance(positions, int) and tokens > positions:
        raise UsageError(f"--latency-shape: {tokens} tokens is longer than {cfg.model}'s {positions} "
                         f"positions; give at most {positions} (or a shorter --max-length)")


def latency_shape_from(text: str) -> str:
    """How ``--latency-shape`` was chosen, in words, for the summary."""
    if text == AUTO_SHAPE:
        return f"auto: {AUTO_BATCH} x the {AUTO_QUANTILE:.0%} quantile of the calibration texts' token counts"
    if text == TASK_SHAPE:
        return f"task: {AUTO_BATCH} x --max-length"
    return "given"


def structured_prune(module: torch.nn.Module, cfg: PruneConfig, batches: list[dict] | None = None,
                   fisher=None, dense_sizes: tuple[list[int], list[int]] | None = None) -> dict:
    """Remove whole heads / FFN neurons: by L2 norm (``compress.pruning.structured``), or with
    ``--criterion fisher`` by Kwon et al.'s search on the calibration ``batches``
    (``compress.pruning.fisher_structured``), against a FLOPs target or, with ``--speedup``, a
    latency table of the shipping runtime (``compress.pruning.latency_structured``; ``fisher``: an
    importance already computed on the same dense model and batches); with ``--criterion obs`` by
    structured OBS removal with reconstruction (``compress.pruning.obs_structured``; ``fisher`` is
    then its removal database). ``dense_sizes``: the unpruned model's heads and FFN neurons per
    layer, which a ``--speedup`` target is relative to, when ``module`` is already pruned (a gradual
    family's later members)."""
    if cfg.speedup:
        from compress.measure.latency_table import latency_table

        batch, tokens = latency_shape_of(cfg.latency_shape, batches, cfg.max_length)
        table = latency_table(module, cfg.latency_runtime, batch, tokens)
        if cfg.criterion == "obs":
            from compress.pruning.obs_structured import obs_prune_to_speedup

            report = obs_prune_to_speedup(module, batches, table, cfg.speedup[0], tuple(cfg.structured),
                                          database=fisher, dense_sizes=dense_sizes)
        else:
            from compress.pruning.latency_structured import prune_to_speedup

            report = prune_to_speedup(module, batches, table, cfg.speedup[0], tuple(cfg.structured),
                                      tune=not cfg.no_mask_tuning, fisher=fisher, max_swaps=cfg.max_swaps,
                                      scale_bound=cfg.scale_bound or None, dense_sizes=dense_sizes)
        return {**report, "latency_runtime": cfg.latency_runtime, "latency_shape": f"{batch}x{tokens}",
                "latency_shape_from": latency_shape_from(cfg.latency_shape),
                "latency_table": table.to_dict()}
    if cfg.criterion == "obs":
        from compress.pruning.obs_structured import obs_prune_structured

        return obs_prune_structured(module, batches, cfg.flops_reduction, cfg.max_length,
                                    tuple(cfg.structured),
                                    database=fisher)
    if cfg.criterion == "fisher":
        from compress.pruning.fisher_structured import fisher_prune_structured

        return fisher_prune_structured(module, batches, cfg.flops_reduction, cfg.max_length,
                                       tuple(cfg.structured), tune=not cfg.no_mask_tuning,
                                       max_swaps=cfg.max_swaps,
                                       scale_bound=cfg.scale_bound or None, fisher=fisher)
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
    summary = {"run": run.final.name, **summary,
               "sparsity": {g: report[g]["sparsity"] for g in ("global", "embeddings", "encoder")},
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


def prune_run_name(cfg: PruneConfig, what: str) -> str:
    amount = cfg.pattern.replace(":", "of") if cfg.pattern else round(100 * cfg.sparsity)
    return cfg.name or f"{what}-{cfg.stage}-{cfg.criterion}-{amount}"
