"""Reuters-21578 (ModApte, 90 topics, multi-label micro-F1) distillation benchmark (issue 4): a
MiniLM teacher fine-tuned on the training documents, KD-BiLSTM vs the --no-kd BiLSTM, KD-LR vs LR
(Bernoulli KD, lambda 1). Writes one JSON to artifacts/benchmarks/. Examples:

    python benchmarks/distill_reuters.py --teacher artifacts/finetune/<reuters run>
    python benchmarks/distill_reuters.py --train-limit 1000 --epochs 3 --augment 1 --teacher-epochs 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distill_sst2 import run_suite, suite_arguments  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    suite_arguments(p, train_limit=None, augment=2, epochs=10, max_length=256,
                    students="bilstm,logreg", teacher_epochs=5.0, teacher_lr=1e-4)
    run_suite("reuters", p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
