import dataclasses

from compress.cli.common import add_config_args, config_from_args
from compress.core.config import load_yaml
from compress.core.errors import UsageError
from compress.recipes.distill import DistillConfig, run_distill
from compress.recipes.embedding_static import StaticDistillConfig, run_static_distill
from compress.recipes.reqa_mining import ReQAMiningConfig, run_reqa_mining_distill

HELP = ("distil a fine-tuned teacher into a BiLSTM, KimCNN or logistic-regression student, or a "
        "sentence-embedding model into static token vectors")
EXAMPLES = """examples:
  compress distill --student bilstm                   # MiniLM teacher fine-tuned on the bundled sample
  compress distill --student kimcnn --task sst2 --data-dir ../shared/data --train-limit 20000 \\
      --teacher minilm --augment 10 --epochs 3
  compress distill --student logreg --teacher artifacts/finetune/RUN --task sst2 --data-dir ../shared/data
  compress distill --student bilstm --no-kd --teacher RUN --teacher-cache DISTILL_RUN   # baseline
  compress distill --student bilstm --student-options hidden_size=128,pooling=last --task reuters \\
      --data-dir ../shared/data --max-length 256
  compress distill --task reqa --student dual-encoder --teacher CROSS_ENCODER_RUN \\
      --data-dir ../shared/data --split-by-article 38/10     # ReQA: cross-attention mined pairs
  compress distill --task embedding --student static --teacher minilm --data-dir ../shared/data \\
      --split-by-article 38/10                              # static token vectors, Model2Vec beside
"""


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# --task reqa trains a dual encoder on gold + cross-encoder-mined pairs (compress.recipes.reqa_mining);
# its options that the classification students lack are added as flags of their own.
REQA_ONLY = sorted(_fields(ReQAMiningConfig) - _fields(DistillConfig))
# --task embedding --student static (compress.recipes.embedding_static): its own flags likewise.
STATIC_ONLY = sorted(_fields(StaticDistillConfig) - _fields(DistillConfig) - _fields(ReQAMiningConfig))


def add_arguments(parser):
    add_config_args(parser, DistillConfig)
    group = parser.add_argument_group("--task reqa --student dual-encoder (cross-attention mining)")
    add_config_args(group, ReQAMiningConfig, only=REQA_ONLY)
    group = parser.add_argument_group("--task embedding --student static (static token vectors)")
    add_config_args(group, StaticDistillConfig, only=STATIC_ONLY)


def run(args):
    values = {k: v for k, v in vars(args).items() if k not in ("config", "command", "func", "verbose")}
    file_values = load_yaml(args.config) if getattr(args, "config", None) else {}
    task = values.get("task", file_values.get("task"))
    if task == "reqa":
        cls, runner = ReQAMiningConfig, run_reqa_mining_distill
    elif task == "embedding":
        cls, runner = StaticDistillConfig, run_static_distill
    else:
        cls, runner = DistillConfig, run_distill
        if values.get("student", file_values.get("student")) == "dual-encoder":
            raise UsageError("--student dual-encoder distils for retrieval only: add --task reqa")
        if values.get("student", file_values.get("student")) == "static":
            raise UsageError("--student static distils a sentence-embedding model: add --task embedding")
    wrong = sorted((set(values) | set(file_values)) - _fields(cls))
    if wrong:
        flags = ", ".join("--" + w.replace("_", "-") for w in wrong)
        where = f"--task {task}" if cls is not DistillConfig else f"--task {task or 'sample'}"
        raise UsageError(f"{flags} not used with {where}; remove it")
    runner(config_from_args(cls, args))
    return 0
