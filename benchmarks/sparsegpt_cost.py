"""What one-shot SparseGPT costs on this machine: wall time and peak memory of
``compress.pruning.calibration.prune_calibrated`` on a random-weight BERT classifier of a given
shape, with random-token calibration batches (the cost depends on the shapes, not the values).

    python -m benchmarks sparsegpt-cost --shape bert-base
    python -m benchmarks sparsegpt-cost --shape minilm --samples 512 --seq-len 64

Results: shape, samples, sequence length, threads, seconds, peak resident memory of the process
(MB, ``ru_maxrss``), and the time of one dense forward pass over the calibration set for scale.
"""

from __future__ import annotations

import resource
import time

SHAPES = {"minilm": (6, 384, 12, 1536), "bert-base": (12, 768, 12, 3072)}


def add_arguments(p) -> None:
    p.add_argument("--shape", choices=tuple(SHAPES), default="bert-base")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--criterion", default="sparsegpt")
    p.add_argument("--sparsity", type=float, default=0.5)


def budget(args) -> str:
    return (f"one {args.criterion} prune of a random {args.shape}-shaped model at {args.sparsity:g} from "
            f"{args.samples} random sequences of {args.seq_len} tokens")


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        print(f"# {budget(args)}")
        return None
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from compress.pruning.calibration import prune_calibrated
    from compress.pruning.targets import select_targets

    layers, hidden, heads, ffn = SHAPES[args.shape]
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, num_labels=2)).eval()
    g = torch.Generator().manual_seed(0)
    batches = []
    for i in range(0, args.samples, args.batch_size):
        n = min(args.batch_size, args.samples - i)
        batches.append({"input_ids": torch.randint(1000, 30522, (n, args.seq_len), generator=g),
                        "attention_mask": torch.ones(n, args.seq_len, dtype=torch.long)})
    t0 = time.time()
    with torch.no_grad():
        for b in batches:
            model(**b)
    forward_s = time.time() - t0
    targets = select_targets(model, (), ("role:word_embeddings",))
    t0 = time.time()
    _, report = prune_calibrated(model, targets, batches, args.criterion, args.sparsity)
    row = {"shape": args.shape, "layers": layers, "hidden": hidden, "criterion": args.criterion,
           "sparsity": args.sparsity, "samples": args.samples, "seq_len": args.seq_len,
           "threads": torch.get_num_threads(), "seconds": round(time.time() - t0, 1),
           "dense_forward_s": round(forward_s, 1),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "calibration_tokens": report["calibration_tokens"]}
    print(row)
    return row
