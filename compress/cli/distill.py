import dataclasses

from compress.cli.common import add_config_args, config_from_args
from compress.config import load_yaml
from compress.errors import UsageError
from compress.recipes.distill import DistillConfig, run_distill
from compress.recipes.reqa_mining import ReQAMiningConfig, run_reqa_mining_distill

HELP = "distil a fine-tuned teacher into a BiLSTM, KimCNN or logistic-regression student"
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
"""
HELPS = {
    "student": "student architecture",
    "teacher": "a fine-tuned run or model folder for the task, or 'minilm' to fine-tune one first",
    "student_options": "student config as KEY=VALUE,... (e.g. hidden_size=128,pooling=last; "
                       "tuples with ';': widths=3;4;5)",
    "student_embeddings": "initial embeddings: teacher, random, or a word2vec/GloVe text file",
    "data_dir": "folder holding the task's files (else $COMPRESS_DATA_DIR, else the hub)",
    "train_limit": "use only the first N training examples (teacher and student)",
    "val_fraction": "hold out this share of the training examples (not trained on, not augmented) "
                    "and keep the student's best epoch on them (default 0: the last epoch)",
    "augment": "augmented copies per training example (Tang et al. 2019); needs NLTK tagger data",
    "p_mask": "--augment: probability of masking each word (the defaults of the operators are "
              "Tang et al. 2019's)",
    "p_pos": "--augment: probability of replacing each word by another of its POS tag",
    "p_ngram": "--augment: probability of cutting a copy to an n-gram of 1..--max-ngram words, "
               "or sentences for a multi-sentence document",
    "max_ngram": "--augment: longest n-gram that --p-ngram keeps",
    "p_shuffle": "--augment: probability of shuffling the sentences of a multi-sentence document",
    "unlabeled_examples": "N more training examples after --train-limit whose gold labels stay hidden: "
                          "the teacher labels them for the transfer set (not augmented)",
    "data_seed": "seed of the --val-fraction split and the augmented copies (default: --seed); fix it "
                 "while varying --seed to reuse one transfer set and its --teacher-cache",
    "temperature": "softmax/sigmoid temperature T of the distillation term (> 0)",
    "kd_lambda": "weight of the distillation term: L = L_task + lambda L_KD "
                 "(default 4 single-label, 1 multi-label)",
    "kd_loss": "distillation term: kl (KL of T-softened outputs; per-label Bernoulli KL for "
               "multi-label) or mse (squared error of raw logits, Tang et al. 2019)",
    "no_kd": "train the same student on gold labels only (the baseline)",
    "lr": ("student Adam learning rate (default: per student, 1e-3 bilstm/kimcnn, 3e-2 logreg; "
           "1.0 logreg on multi-label tasks)"),
    "weight_decay": ("Adam L2 penalty of the student (default: per student, 0 bilstm/kimcnn, 5e-5 logreg; "
                     "on multi-label tasks 2e-6 logreg divided by the number of labels)"),
    "lr_schedule": "student learning rate: constant or linear (decay to 0); default per student, "
                   "constant bilstm/kimcnn, linear logreg",
    "teacher_epochs": "epochs when fine-tuning the teacher first (--teacher minilm)",
    "teacher_cache": "an earlier distill run folder whose cached teacher logits to reuse",
    "out": "run folder to create", "resume": "continue an interrupted run in --out",
    # --task reqa only
    "teacher_train_limit": "train the cross-encoder on the first N training questions only",
    "mining_top_k": "BM25 candidates per question that the cross-encoder scores",
    "mining_threshold": "a candidate with p(relevant) >= this becomes a positive of weight p^2",
    "unlabeled_questions": "N more training questions after --train-limit whose gold stays hidden: "
                           "only mined pairs speak for them",
}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# --task reqa trains a dual encoder on gold + cross-encoder-mined pairs (compress.recipes.reqa_mining);
# its options that the classification students lack are added as flags of their own.
REQA_ONLY = sorted(_fields(ReQAMiningConfig) - _fields(DistillConfig))


def add_arguments(parser):
    add_config_args(parser, DistillConfig, HELPS)
    group = parser.add_argument_group("--task reqa --student dual-encoder (cross-attention mining)")
    add_config_args(group, ReQAMiningConfig, HELPS, only=REQA_ONLY)


def run(args):
    values = {k: v for k, v in vars(args).items() if k not in ("config", "command", "func", "verbose")}
    file_values = load_yaml(args.config) if getattr(args, "config", None) else {}
    task = values.get("task", file_values.get("task"))
    if task == "reqa":
        cls, runner = ReQAMiningConfig, run_reqa_mining_distill
    else:
        cls, runner = DistillConfig, run_distill
        if values.get("student", file_values.get("student")) == "dual-encoder":
            raise UsageError("--student dual-encoder distils for retrieval only: add --task reqa")
    wrong = sorted((set(values) | set(file_values)) - _fields(cls))
    if wrong:
        flags = ", ".join("--" + w.replace("_", "-") for w in wrong)
        where = "--task reqa" if cls is ReQAMiningConfig else f"--task {task or 'sample'}"
        raise UsageError(f"{flags} not used with {where}; remove it")
    runner(config_from_args(cls, args))
    return 0
