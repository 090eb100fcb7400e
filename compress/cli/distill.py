from compress.cli.common import add_config_args, config_from_args
from compress.distill.workflow import DistillConfig, run_distill

HELP = "distil a fine-tuned teacher into a BiLSTM, KimCNN or logistic-regression student"
EXAMPLES = """examples:
  compress distill --student bilstm                   # MiniLM teacher fine-tuned on the bundled sample
  compress distill --student kimcnn --task sst2 --data-dir ../shared/data --train-limit 20000 \\
      --teacher minilm --augment 10 --epochs 3
  compress distill --student logreg --teacher artifacts/finetune/RUN --task sst2 --data-dir ../shared/data
  compress distill --student bilstm --no-kd --teacher RUN --teacher-cache DISTILL_RUN   # baseline
  compress distill --student bilstm --student-options hidden_size=128,pooling=last --task reuters \\
      --data-dir ../shared/data --max-length 256
"""
HELPS = {
    "student": "student architecture: bilstm, kimcnn or logreg",
    "teacher": "a fine-tuned run or model folder for the task, or 'minilm' to fine-tune one first",
    "task": "task name (see README)",
    "student_options": "student config as KEY=VALUE,... (e.g. hidden_size=128,pooling=last; "
                       "tuples with ';': widths=3;4;5)",
    "student_embeddings": "initial embeddings: teacher, random, or a word2vec/GloVe text file",
    "data_dir": "folder holding the task's files (else $COMPRESS_DATA_DIR, else the hub)",
    "train_limit": "use only the first N training examples (teacher and student)",
    "augment": "augmented copies per training example (Tang et al. 2019); needs NLTK tagger data",
    "temperature": "softmax/sigmoid temperature T of the distillation term (> 0)",
    "kd_lambda": "weight of the distillation term: L = L_task + lambda L_KD "
                 "(default 4 single-label, 1 multi-label)",
    "no_kd": "train the same student on gold labels only (the baseline)",
    "lr": "student Adam learning rate (default: per student, 1e-3 bilstm/kimcnn, 3e-2 logreg)",
    "teacher_epochs": "epochs when fine-tuning the teacher first (--teacher minilm)",
    "teacher_cache": "an earlier distill run folder whose cached teacher logits to reuse",
    "out": "run folder to create", "resume": "continue an interrupted run in --out",
}


def add_arguments(parser):
    add_config_args(parser, DistillConfig, HELPS)


def run(args):
    run_distill(config_from_args(DistillConfig, args))
    return 0
