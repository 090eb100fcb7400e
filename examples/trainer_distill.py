"""Distil a fine-tuned teacher into any student inside your own ``transformers.Trainer``.

``compress.DistillationTrainer`` is a ``Trainer`` whose loss is the task loss plus lambda times the
KL of the teacher's and the student's softened outputs (``compress.kd_loss``); everything else is
the ``Trainer``'s. The teacher reads the student's batches, so both share a tokenizer (for
different ones, see examples/plain_loop_prune_kd.py). ``--sparsity`` adds the pruning callback:
the student is pruned while it is distilled.

    compress finetune --out out/teacher                      # a teacher fine-tuned on the sample
    python examples/trainer_distill.py --teacher out/teacher --student minilm --out out/distilled
    python examples/trainer_distill.py --teacher out/teacher --sparsity 0.5 --out out/distilled-pruned
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--teacher", required=True, help="a fine-tuned classifier: model or run folder, hub id")
    p.add_argument("--student", default="minilm", help="model folder, hub id or 'minilm' (default)")
    p.add_argument("--sparsity", type=float, default=0.0, help="also prune the student to this sparsity")
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--kd-lambda", type=float, default=None, help="weight of the KD term (default 4)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when > 0")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from sample_data import accuracy, encode, read_sample
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        TrainingArguments,
        set_seed,
    )

    import compress
    from compress.models.loading import resolve_model

    set_seed(args.seed)
    t_path, s_path = resolve_model(args.teacher), resolve_model(args.student)
    teacher = AutoModelForSequenceClassification.from_pretrained(t_path, use_safetensors=True)
    student = AutoModelForSequenceClassification.from_pretrained(
        s_path, num_labels=teacher.config.num_labels, id2label=teacher.config.id2label,
        label2id=teacher.config.label2id, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(s_path)
    train_rows, dev_rows = read_sample()
    callbacks = [compress.PruningCallback(args.sparsity, model=student, base_model=args.student)] \
        if args.sparsity > 0 else []

    trainer = compress.DistillationTrainer(
        model=student, teacher=teacher, temperature=args.temperature, kd_lambda=args.kd_lambda,
        args=TrainingArguments(output_dir=args.out, num_train_epochs=args.epochs, max_steps=args.max_steps,
                               per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
                               logging_steps=5, save_strategy="no", report_to="none", seed=args.seed,
                               disable_tqdm=True),
        train_dataset=encode(tokenizer, train_rows, args.max_length),
        eval_dataset=encode(tokenizer, dev_rows, args.max_length),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=accuracy,
        callbacks=callbacks,
    )
    trainer.train()
    metrics = trainer.evaluate()
    masks = callbacks[0].masks if callbacks else None
    meta = {"base_model": args.student, "dataset": "compress bundled sample",
            "distillation": {"teacher": args.teacher, "temperature": args.temperature,
                             "kd_lambda": args.kd_lambda if args.kd_lambda is not None else 4.0}}
    if callbacks:
        meta["pruning"] = callbacks[0].meta()["pruning"]
    report = compress.save_model(student, tokenizer, args.out, masks, meta=meta,
                                 metrics={"accuracy": metrics["eval_accuracy"]})
    print(f"dev accuracy {metrics['eval_accuracy']:.3f} (teacher's soft labels, T={args.temperature}); "
          f"sparsity {report['global']['sparsity']:.1%}; saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
