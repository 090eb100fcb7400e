import dataclasses
import json

from compress.cli.common import add_config_args, config_from_args, explicit_options
from compress.errors import UsageError
from compress.qa.options import QAOptions
from compress.recipes.finetune import TaskDataConfig
from compress.recipes.prune import PruneConfig, run_prune

HELP = "magnitude-prune a BERT encoder during pre-training, fine-tuning, or after fine-tuning"
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
  compress prune --checkpoint-every 200 --out runs/p40     # interrupted? the same command + --resume
then: compress finetune --model RUN (keeps the masks) and compress verify RUN
"""
HELPS = {
    "task": "task to fine-tune on (stages finetune/after-finetune)",
    "model": "minilm, a model folder, a run folder or a hub name",
    "data_dir": "folder holding the task's files (else $COMPRESS_DATA_DIR, else the hub)",
    "train_limit": "use only the first N training examples", "out": "run folder to create",
    "sparsity": "fraction of the pruned matrices' weights set to zero, in [0, 1)",
    "criterion": "magnitude (smallest |w| first) or random (the paper's control)",
    "scope": "local (one threshold per matrix, the paper's default) or global (one over all)",
    "schedule": "oneshot, or gradual (Zhu & Gupta cubic: s_f + (s_i - s_f)(1 - (t - t0)/span)^3)",
    "stage": "pretrain (masked LM on --corpus), finetune (prune while fine-tuning), after-finetune",
    "prune_steps": "steps over which gradual pruning ramps up; unset = the first half of training",
    "prune_every": "recompute masks every N steps while ramping; unset = a tenth of --prune-steps",
    "prune_start": "step t0 at which pruning begins",
    "initial_sparsity": "s_i of the gradual schedule",
    "schedule_power": "exponent of the gradual schedule (3 = cubic)",
    "include": "extra parameters to prune: comma-separated globs, or re:REGEX",
    "exclude": "parameters not to prune: comma-separated globs, or re:REGEX",
    "recovery_steps": "after-finetune: training steps with masks after pruning; unset = as many as "
                      "the dense fine-tuning",
    "corpus": "pretrain: text file(s), comma-separated, or a folder of .txt/.raw/.tokens files",
    "mlm_probability": "pretrain: fraction of tokens masked (80% [MASK], 10% random, 10% kept)",
    "heldout_fraction": "pretrain: last fraction of the corpus lines kept out for the MLM loss",
    "heldout_blocks": "pretrain: at most this many held-out blocks are scored",
    "no_dense_baseline": "pretrain: skip training the unpruned model for comparison",
    "structured": "remove whole units instead: heads,ffn (uses compress.pruning.structured)",
    "pattern": "N:M semi-structured sparsity, e.g. 2:4: the N smallest |w| of every group of M "
               "consecutive weights along each pruned matrix's input dimension are zeroed (sparsity "
               "N/M by definition; gradual: in a growing share of the groups). 2:4 runs faster with "
               "PyTorch's semi-structured kernels on CUDA capability >= 8.0; elsewhere it saves "
               "storage only",
    "teacher": "distil from this fine-tuned run/model folder while pruning and recovering (loss = task "
               "+ lambda * T^2 * KL); 'self' = the dense model the run starts from (after-finetune: "
               "the model its dense phase made)",
    "kd_lambda": "weight of the KD term; unset = 4 single-label, 1 multi-label (as compress distill)",
    "temperature": "softmax temperature T of the KD term",
    "kd_hidden": "weight of an MSE between the last layer's hidden states of student and teacher; "
                 "0 = off (the teacher then runs every step)",
    "resume": "continue an interrupted run in --out from its last checkpoint (same options; save "
              "checkpoints with --checkpoint-every N)",
}


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
    from compress.runs import launch_rank

    if launch_rank()[0] > 0:  # a multi-process launch: rank 0 wrote the run folder and reports it
        return 0
    report = json.loads((path / "sparsity.json").read_text(encoding="utf-8"))
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    print(format_sparsity_table(report))
    if "mlm_loss" in summary:
        m = summary["mlm_loss"]
        dense = "not trained" if m["dense_after"] is None else f"{m['dense_after']:.4f}"
        print(f"held-out MLM loss ({m['heldout_tokens_scored']} tokens): before {m['before']:.4f} | "
              f"unpruned after {summary['steps']} steps {dense} | pruned after {summary['steps']} "
              f"steps {m['pruned_after']:.4f}")
    if "eval" in summary:
        e = summary["eval"]
        extra = ""
        if summary.get("eval_dense"):
            extra = f" (dense before pruning: {summary['eval_dense']['score']:.4f})"
        print(f"{summary['task']}: {summary['metric']} = {e['score']:.4f} on {e['n']} examples{extra}")
    print(f"run folder: {path}")
    return 0
