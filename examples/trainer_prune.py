"""Prune a BERT-family classifier inside your own ``transformers.Trainer``: one callback.

``compress.PruningCallback`` prunes by weight magnitude on Zhu & Gupta's gradual schedule (Gordon
et al. 2020) over the first half of training, keeps pruned weights at zero (their gradients too),
logs ``sparsity``, and writes ``masks.safetensors``, ``sparsity.json`` and a model card into every
checkpoint and into ``--out``, which the ``compress`` commands read:

    python examples/trainer_prune.py --model minilm --sparsity 0.5 --epochs 3 --out out/trainer-prune
    compress verify out/trainer-prune        # every pruned weight is still exactly zero
    compress measure out/trainer-prune       # parameters, FLOPs, the sparsity table
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", default="minilm",
                   help="a model folder, a hub id, or 'minilm' (the packaged all-MiniLM-L6-v2)")
    p.add_argument("--sparsity", type=float, default=0.5, help="final fraction of zeros (default 0.5)")
    p.add_argument("--schedule", choices=("gradual", "oneshot"), default="gradual")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when > 0")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder (the Trainer's output_dir)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # heavy imports after parsing, so --help is instant
    from sample_data import LABELS, accuracy, encode, read_sample
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    import compress
    from compress.models import resolve_model

    set_seed(args.seed)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
        label2id={n: i for i, n in enumerate(LABELS)}, use_safetensors=True)
    train_rows, dev_rows = read_sample()

    # The one line compress adds to a Trainer script (the model is passed to check it is prunable).
    pruning = compress.PruningCallback(sparsity=args.sparsity, schedule=args.schedule, model=model,
                                       base_model=args.model, dataset="compress bundled sample")
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=args.out, num_train_epochs=args.epochs, max_steps=args.max_steps,
                               per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
                               logging_steps=5, save_strategy="epoch" if args.max_steps <= 0 else "steps",
                               save_steps=max(args.max_steps, 1), save_total_limit=1, report_to="none",
                               seed=args.seed, disable_tqdm=True),
        train_dataset=encode(tokenizer, train_rows, args.max_length),
        eval_dataset=encode(tokenizer, dev_rows, args.max_length),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=accuracy,
        callbacks=[pruning],
    )
    trainer.train()
    trainer.save_model(args.out)  # the weights, beside the masks the callback wrote at the end
    metrics = trainer.evaluate()
    report = pruning.save(args.out, metrics=metrics)  # re-checks the masks on the saved model; card
    print(f"sparsity {report['global']['sparsity']:.1%} of {report['global']['numel']:,} pruned-matrix "
          f"weights; dev accuracy {metrics['eval_accuracy']:.3f}; saved to {Path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
