"""Prune a BERT-family classifier inside your own ``transformers.Trainer``: one callback.

``compress.PruningCallback`` prunes by weight magnitude on Zhu & Gupta's gradual schedule (Gordon
et al. 2020) over the first half of training, keeps pruned weights at zero (their gradients too),
logs ``sparsity``, and writes ``masks.safetensors``, ``sparsity.json`` and a model card into every
checkpoint and into ``--out``, which the ``compress`` commands read:

    python examples/trainer_prune.py --model minilm --sparsity 0.5 --epochs 3 --out out/trainer-prune
    compress verify out/trainer-prune        # every pruned weight is still exactly zero
    compress measure out/trainer-prune       # parameters, FLOPs, the sparsity table

The data is a task of ``compress`` (default: the bundled smoke sample), read by its own loaders, so
``--task sst2 --data-dir ../shared/data --train-limit 20000`` trains on the examples ``compress
prune`` trains on with the same flags. The training defaults are ``compress prune``'s (batch 32, lr
5e-5, 10% warm-up, weight decay 0.01, one epoch, seed 42, 40% sparsity), so the two compare on one
budget.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", default="minilm",
                   help="a model folder, a hub id, or 'minilm' (the packaged all-MiniLM-L6-v2)")
    p.add_argument("--task", default="sample",
                   help="a single-label classification task of compress: sample (the bundled smoke "
                        "sample, default), sst2, cola, mrpc, rte, qnli, ag_news, csv, ...")
    p.add_argument("--data-dir", default=None, help="folder holding the task's files (as compress's)")
    p.add_argument("--train-limit", type=int, default=None, help="train on the first N examples only")
    p.add_argument("--sparsity", type=float, default=0.4, help="final fraction of zeros (default 0.4)")
    p.add_argument("--schedule", choices=("gradual", "oneshot"), default="gradual")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when > 0")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True, help="output folder (the Trainer's output_dir)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # heavy imports after parsing, so --help is instant
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    import compress
    from compress.models.loading import resolve_model
    from compress.tasks.metrics import compute_metrics
    from compress.tasks.task_data import TaskDataConfig, load_task_data
    from compress.training.loop import encode

    try:  # the task's train and dev splits, through the loaders `compress prune` uses
        spec, data = load_task_data(TaskDataConfig(task=args.task, data_dir=args.data_dir,
                                                   train_limit=args.train_limit))
    except compress.CompressError as exc:  # an unknown task, a missing file: one line
        raise SystemExit(f"error: {exc}") from None
    if data["train"].multilabel:
        raise SystemExit(f"--task {args.task} is multi-label; this example trains single-label heads")
    labels = data["train"].label_names
    set_seed(args.seed)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)}, use_safetensors=True)

    # The one line compress adds to a Trainer script (the model is passed to check it is prunable).
    pruning = compress.PruningCallback(sparsity=args.sparsity, schedule=args.schedule, model=model,
                                       seed=args.seed, base_model=args.model, dataset=spec.name)
    # warm-up steps counted as compress prune counts them: int(ratio x optimizer steps)
    steps = args.max_steps if args.max_steps > 0 else math.ceil(
        math.ceil(len(data["train"]) / args.batch_size) * args.epochs)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=args.out, num_train_epochs=args.epochs, max_steps=args.max_steps,
                               per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
                               warmup_steps=int(args.warmup_ratio * steps), weight_decay=args.weight_decay,
                               logging_steps=5, save_strategy="epoch" if args.max_steps <= 0 else "steps",
                               save_steps=max(args.max_steps, 1), save_total_limit=1, report_to="none",
                               seed=args.seed, disable_tqdm=True),
        train_dataset=encode(tokenizer, data["train"], args.max_length),
        eval_dataset=encode(tokenizer, data["eval"], args.max_length),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=lambda p: compute_metrics(spec.family, p.predictions, p.label_ids),
        callbacks=[pruning],
    )
    trainer.train()
    trainer.save_model(args.out)  # the weights, beside the masks the callback wrote at the end
    metrics = trainer.evaluate()
    report = pruning.save(args.out, metrics=metrics)  # re-checks the masks on the saved model; card
    print(f"sparsity {report['global']['sparsity']:.1%} of {report['global']['numel']:,} pruned-matrix "
          f"weights; dev {spec.metric} {metrics['eval_' + spec.metric]:.4f} on {len(data['eval'])} "
          f"{spec.name} examples; saved to {Path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
