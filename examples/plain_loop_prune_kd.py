"""Prune and distil in a plain PyTorch loop: a teacher's logits teach a student that is pruned on
the gradual schedule as it learns.

The pruner takes four calls (``initialize``, ``mask_grads`` after backward, ``step`` after the
optimizer step, ``finalize``); ``compress.kd_loss`` is the task loss plus lambda times the KL of the
teacher's and the student's softened outputs. Teacher and student may use different tokenizers:
each reads its own encoding of the same sentences.

    compress finetune --out out/teacher                      # a teacher fine-tuned on the sample
    python examples/plain_loop_prune_kd.py --teacher out/teacher --student minilm --sparsity 0.5 \\
        --epochs 3 --out out/kd-pruned
    compress verify out/kd-pruned                            # the masks held through training
"""

from __future__ import annotations

import argparse
import math
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--teacher", required=True, help="a fine-tuned classifier: model or run folder, hub id")
    p.add_argument("--student", default="minilm", help="model folder, hub id or 'minilm' (default)")
    p.add_argument("--sparsity", type=float, default=0.5, help="final fraction of zeros (default 0.5)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-steps", type=int, default=0, help="overrides --epochs when > 0")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--kd-lambda", type=float, default=None, help="weight of the KD term (default 4)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder to save the pruned student in")
    return p.parse_args(argv)


def batches(rows, batch_size: int, seed: int):
    """Endless shuffled batches of (sentences, labels)."""
    import random

    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [rows[j] for j in order[i:i + batch_size]]
            yield [s for s, _ in chunk], [y for _, y in chunk]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from sample_data import read_sample
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_linear_schedule_with_warmup,
    )

    import compress
    from compress.models.loading import resolve_model

    torch.manual_seed(args.seed)
    t_path, s_path = resolve_model(args.teacher), resolve_model(args.student)
    teacher = AutoModelForSequenceClassification.from_pretrained(t_path, use_safetensors=True).eval()
    labels = teacher.config.id2label
    # the student predicts the teacher's labels, in the teacher's order
    student = AutoModelForSequenceClassification.from_pretrained(
        s_path, num_labels=len(labels), id2label=labels, label2id=teacher.config.label2id,
        use_safetensors=True)
    t_tok, s_tok = AutoTokenizer.from_pretrained(t_path), AutoTokenizer.from_pretrained(s_path)
    train_rows, dev_rows = read_sample()

    def encode(tok, sentences):
        return tok(sentences, truncation=True, max_length=args.max_length, padding=True, return_tensors="pt")

    steps = args.max_steps or math.ceil(args.epochs * len(train_rows) / args.batch_size)
    pruner = compress.make_pruner(student, args.sparsity, total_steps=steps)  # gradual: first half
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, steps // 10, steps)

    pruner.initialize()
    student.train()
    for step, (sentences, gold) in zip(range(1, steps + 1), batches(train_rows, args.batch_size, args.seed)):
        with torch.no_grad():
            teacher_logits = teacher(**encode(t_tok, sentences)).logits
        logits = student(**encode(s_tok, sentences)).logits
        loss = compress.kd_loss(logits, teacher_logits, torch.tensor(gold), temperature=args.temperature,
                                kd_lambda=args.kd_lambda)
        loss["loss"].backward()
        pruner.mask_grads()  # before clipping: pruned weights add nothing to the norm
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        pruner.step(step)  # prune when the schedule says so; re-apply the masks every step
        if step % 10 == 0 or step == steps:
            print(f"step {step}/{steps}: loss {loss['loss'].item():.4f} (task {loss['task'].item():.4f}, "
                  f"kd {loss['distill'].item():.4f}), sparsity {pruner.history[-1]['sparsity']:.1%}")
    masks = pruner.finalize()

    student.eval()
    with torch.no_grad():
        sentences, gold = [s for s, _ in dev_rows], torch.tensor([y for _, y in dev_rows])
        accuracy = (student(**encode(s_tok, sentences)).logits.argmax(-1) == gold).float().mean().item()
    meta = {"base_model": args.student, "dataset": "compress bundled sample",
            "distillation": {"teacher": args.teacher, "temperature": args.temperature,
                             "kd_lambda": args.kd_lambda if args.kd_lambda is not None else 4.0},
            "pruning": {"sparsity": args.sparsity, "schedule": "gradual", "history": pruner.history}}
    report = compress.save_model(student, s_tok, args.out, masks, meta=meta, metrics={"accuracy": accuracy})
    print(f"sparsity {report['global']['sparsity']:.1%}; dev accuracy {accuracy:.3f}; saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
