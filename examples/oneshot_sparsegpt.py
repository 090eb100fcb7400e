"""Prune a fine-tuned BERT-family classifier once, from a few hundred training sentences, with no
training: SparseGPT (or Wanda) through ``compress.prune_model(..., calibration=batches)``.

    python examples/oneshot_sparsegpt.py --model artifacts/finetune/RUN/model --sparsity 0.5 --out out/sgpt
    compress verify out/sgpt                 # every pruned weight is exactly zero
    compress measure out/sgpt                # parameters, FLOPs, the sparsity table

The model must already be fine-tuned on the task (pruning a fresh head would measure nothing); by
default the script first fine-tunes ``--model`` for ``--finetune-steps`` on the bundled smoke
sample, so it runs anywhere. The calibration batches are training sentences only, never dev ones;
the dev accuracy is printed before and after pruning.
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
    p.add_argument("--sparsity", type=float, default=0.5, help="fraction of zeros (default 0.5)")
    p.add_argument("--criterion", choices=("sparsegpt", "wanda"), default="sparsegpt")
    p.add_argument("--pattern", default=None, help="N:M semi-structured instead, e.g. 2:4")
    p.add_argument("--calibration-samples", type=int, default=128)
    p.add_argument("--finetune-steps", type=int, default=30,
                   help="steps of fine-tuning on the sample first (0: --model is already fine-tuned)")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True, help="folder to save the pruned model in")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import compress
    from compress.models.loading import resolve_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sample_data import LABELS, read_sample

    torch.manual_seed(args.seed)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)),
        label2id={n: i for i, n in enumerate(LABELS)}, ignore_mismatched_sizes=True)
    train, dev = read_sample()

    def batch(rows):
        enc = tokenizer([s for s, _ in rows], truncation=True, max_length=args.max_length,
                        padding=True, return_tensors="pt")
        return dict(enc), torch.tensor([y for _, y in rows])

    def dev_accuracy() -> float:
        model.eval()
        with torch.no_grad():
            inputs, labels = batch(dev)
            return float((model(**inputs).logits.argmax(-1) == labels).float().mean())

    if args.finetune_steps:  # a stand-in for your own fine-tuning
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        model.train()
        for step in range(args.finetune_steps):
            i = step * args.batch_size % len(train)
            inputs, labels = batch(train[i:i + args.batch_size] or train[:args.batch_size])
            model(**inputs, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
    dense = dev_accuracy()

    # the calibration set: training sentences only, in batches of the model's inputs
    g = torch.Generator().manual_seed(args.seed)
    chosen = [train[i] for i in torch.randperm(len(train), generator=g)[:args.calibration_samples]]
    calibration = [batch(chosen[i:i + args.batch_size])[0] for i in range(0, len(chosen), args.batch_size)]
    masks = compress.prune_model(model, args.sparsity, criterion=args.criterion, pattern=args.pattern,
                                 calibration=calibration)
    pruned = dev_accuracy()
    meta = {"base_model": args.model, "dataset": "compress bundled sample",
            "pruning": {"sparsity": args.sparsity, "criterion": args.criterion, "schedule": "oneshot",
                        "pattern": args.pattern, "calibration_samples": len(chosen)}}
    compress.save_model(model, tokenizer, args.out, masks, meta=meta, metrics={"accuracy": pruned})
    zeros = sum(int((~m).sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
    print(f"{args.criterion}: sparsity {100 * zeros:.1f}% of {len(masks)} matrices; dev accuracy "
          f"{dense:.4f} dense -> {pruned:.4f} pruned, no training after pruning -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
