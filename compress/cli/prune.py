import dataclasses
import json
from pathlib import Path

from compress.api.prune_stages import STAGES, PruneConfig
from compress.cli.common import add_config_args, config_from_args, explicit_options
from compress.cli.finetune import finetune_task
from compress.core.errors import UsageError
from compress.qa.options import QAOptions
from compress.recipes.embedding_prune import prune_post_training_embedding
from compress.recipes.post_training import prune_post_training, prune_post_training_qa
from compress.recipes.prune import (
    OTHER_FAMILIES,
    finetune_workflow_hooks,
    prune_after_finetune,
    prune_finetune,
    prune_pretrain,
)
from compress.recipes.speed_family import run_speed_family
from compress.tasks import get_task
from compress.tasks.task_data import TaskDataConfig

HELP = ("prune a BERT encoder by magnitude during pre-training, fine-tuning or after it, or once from "
        "calibration data (SparseGPT, Wanda, Fisher-structured)")
EXAMPLES = """examples:
  compress prune --sparsity 0.4                       # packaged MiniLM, bundled sample, stage finetune
  compress prune --sparsity 0.4 --task sst2 --data-dir ../shared/data --train-limit 20000
  compress prune --sparsity 0.4 --criterion random    # the paper's random-pruning control
  compress prune --sparsity 0.6 --scope global --schedule oneshot --stage after-finetune
  compress prune --stage pretrain --sparsity 0.4 --corpus ../shared/data/wikitext2 --max-steps 200
  compress prune --include pooler --exclude 'embeddings.*'   # globs, or re:REGEX
  compress prune --sparsity 0.6 --stage after-finetune --teacher self   # distillation-aware pruning
  compress prune --sparsity 0.8 --model minilm --teacher artifacts/finetune/RUN --task sst2 ...
  compress prune --pattern 2:4 --schedule oneshot --stage after-finetune   # 2:4 semi-structured
  compress prune --stage post-training --model artifacts/finetune/RUN --criterion sparsegpt --sparsity 0.6 \\
      --task sst2 --data-dir ../shared/data      # one-shot from 512 training sentences, no training
  compress prune --stage post-training --model RUN --criterion sparsegpt --pattern 2:4 --recovery-steps 250 \\
      --teacher self --task sst2 ...             # then 250 steps distilling from the dense model
  compress prune --stage post-training --model RUN --structured heads,ffn --criterion fisher \\
      --flops-reduction 0.4 --task sst2 ...      # Kwon et al.: Fisher search + least-squares tuning
  compress prune --stage post-training --model RUN --structured heads,ffn --criterion fisher \\
      --speedup 2,3,4 --recovery-steps 500 --teacher self --kd-layers 1 --task sst2 ...
                                                 # a family aimed at measured int8 speedups, benched
  compress prune --checkpoint-every 200 --out runs/p40     # interrupted? the same command + --resume
then: compress finetune --model RUN (keeps the masks) and compress verify RUN
"""
HELPS = {"task": "task to fine-tune on (stages finetune/after-finetune)"}  # this command's wording


# Which recipe runs a PruneConfig: the stage's (STAGE_RUNS), squad's post-training stage, the task's own
# fine-tuning recipe with the pruning hooks for squad / reqa, the embedding stage, or a family of
# --speedup targets.
STAGE_RUNS = {"pretrain": prune_pretrain, "finetune": prune_finetune, "after-finetune": prune_after_finetune,
              "post-training": prune_post_training}
assert tuple(STAGE_RUNS) == STAGES


def run_prune(cfg: PruneConfig) -> Path:
    """Run the configured stage's recipe; returns the finished run folder."""
    family = get_task(cfg.task).family
    if len(cfg.speedup) > 1:
        return run_speed_family(cfg)
    if family == "embedding":
        return prune_post_training_embedding(cfg)
    if cfg.stage == "post-training" and family == "qa":
        return prune_post_training_qa(cfg)
    if cfg.stage != "pretrain" and family in OTHER_FAMILIES:
        return finetune_task(cfg, command="prune", hook_factory=finetune_workflow_hooks(cfg, family))
    return STAGE_RUNS[cfg.stage](cfg)


def add_arguments(parser):
    add_config_args(parser, PruneConfig, HELPS)


# What --stage pretrain never reads: it trains a masked LM on --corpus and evaluates its held-out
# loss, with no task and no task data (PruneConfig itself refuses --teacher there, and
# TeacherKDOptions the KD options without --teacher).
PRETRAIN_IGNORES = ({f.name for f in dataclasses.fields(TaskDataConfig)} - {"model", "out", "name"}
                    | {f.name for f in dataclasses.fields(QAOptions)})
# What --structured never reads: it removes the lowest-L2 heads / FFN neurons, ranked across layers,
# once (at the start of training, of recovery after-finetune, or after the dense masked-LM phase);
# --schedule oneshot says just that and is accepted.
STRUCTURED_IGNORES = ("schedule", "prune_steps", "prune_every", "prune_start", "initial_sparsity",
                      "schedule_power", "scope", "include", "exclude")

# What --schedule oneshot never reads: the ramp of the gradual schedule.
ONESHOT_IGNORES = ("prune_steps", "prune_every", "initial_sparsity", "schedule_power")


def refuse_ignored_options(cfg: PruneConfig, given: set[str]) -> None:
    """UsageError naming every option the user set (``given``: typed, or in --config) that the
    configured run would silently ignore; defaults are never refused."""
    ignored: dict[str, list[str]] = {}
    if cfg.stage == "pretrain":
        why = ("--stage pretrain (a masked LM on --corpus: no task or task data; fine-tune the "
               "pruned model on a task afterwards)")
        ignored[why] = sorted(given & PRETRAIN_IGNORES)
    if cfg.structured:
        why = ("--structured (whole heads/FFN neurons removed once by L2 norm ranked across "
               "layers: no schedule, scope or --include/--exclude)")
        ignored[why] = [f for f in STRUCTURED_IGNORES if f in given
                        and not (f == "schedule" and cfg.schedule == "oneshot")]
    if cfg.criterion == "fisher":
        ignored["--criterion fisher (its target is --flops-reduction or --speedup)"] = [
            f for f in ("sparsity",) if f in given]
    if cfg.stage == "post-training":
        ignored["--stage post-training (one prune from calibration data, before any training)"] = [
            f for f in ("schedule",) if f in given]
    if cfg.schedule == "oneshot" and not cfg.structured:
        ignored["--schedule oneshot (all pruning at --prune-start: no ramp)"] = [
            f for f in ONESHOT_IGNORES if f in given]
    if cfg.stage != "pretrain":
        ignored[f"--stage {cfg.stage} (no masked-LM training: it applies to --stage pretrain)"] = [
            f for f in ("mlm_probability",) if f in given]
    if cfg.objective != "pfa" and cfg.stage != "pretrain":  # pretrain refuses every QA option above
        ignored[f"--objective {cfg.objective} (it applies to squad --objective pfa)"] = [
            f for f in ("pfa_epsilon", "pfa_alignment") if f in given]
    parts = [f"{', '.join('--' + f.replace('_', '-') for f in fields)} "
             f"{'does' if len(fields) == 1 else 'do'} not apply with {why}"
             for why, fields in ignored.items() if fields]
    if parts:
        n = sum(len(fields) for fields in ignored.values())
        raise UsageError("; ".join(parts) + ("; remove it" if n == 1 else "; remove them"))


def refuse_other_sparsity(cfg: PruneConfig, args) -> None:
    """With --pattern N:M the sparsity is N/M: a typed --sparsity of another value is refused (the
    config keeps an explicit value only when it equals N/M, so it cannot tell a typed default)."""
    typed = getattr(args, "sparsity", None)
    if cfg.pattern is not None and typed is not None:
        from compress.pruning.masks import NMPattern
        from compress.pruning.pruner import check_pattern_fits

        check_pattern_fits(NMPattern.parse(cfg.pattern), {}, sparsity=typed)


def run(args):
    from compress.measure.sparsity import format_sparsity_table

    cfg = config_from_args(PruneConfig, args)
    refuse_other_sparsity(cfg, args)
    refuse_ignored_options(cfg, explicit_options(PruneConfig, args))
    path = run_prune(cfg)
    from compress.core.runs import launch_rank

    if launch_rank()[0] > 0:  # a multi-process launch: rank 0 wrote the run folder and reports it
        return 0
    if (path / "family.md").is_file():  # a --speedup family: its report, then the folder
        print((path / "family.md").read_text(encoding="utf-8"))
        print(f"run folder: {path}")
        return 0
    report = json.loads((path / "sparsity.json").read_text(encoding="utf-8"))
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    if summary.get("structured"):  # nothing is zeroed in place: say what was removed instead
        from compress.report.structure import format_structure_change

        print(format_structure_change(summary["structured"]))
    else:
        print(format_sparsity_table(report))
    if "mlm_loss" in summary:
        m = summary["mlm_loss"]
        dense = "not trained" if m["dense_after"] is None else f"{m['dense_after']:.4f}"
        print(f"held-out MLM loss ({m['heldout_tokens_scored']} tokens): before {m['before']:.4f} | "
              f"unpruned after {summary['steps']} steps {dense} | pruned after {summary['steps']} "
              f"steps {m['pruned_after']:.4f}")
    if "eval" in summary and summary["task"] != "embedding":  # the embedding stage prints its own scores
        e = summary["eval"]
        extra = ""
        if summary.get("eval_dense"):
            extra = f" (dense before pruning: {summary['eval_dense']['score']:.4f})"
        print(f"{summary['task']}: {summary['metric']} = {e['score']:.4f} on {e['n']} examples{extra}")
    print(f"run folder: {path}")
    return 0
