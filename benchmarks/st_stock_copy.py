"""What a structured-pruned embedding folder gives a sentence-transformers user: the bare
``SentenceTransformer(folder)`` opens its stock copy (``0_Transformer``, removed units zero); this
script checks that its embeddings equal this project's of the pruned model, and times, in one run,
sentences per second of the dense model in sentence-transformers, of the stock copy in
sentence-transformers and of the pruned model in PyTorch (this project's ``embed``), round-robin.

    python benchmarks/st_stock_copy.py RUN --data-dir ../shared/data \
        --out artifacts/embedding-minilm/st_stock_copy.json

Texts: WikiText-2 sentences (the unlabelled text of the embedding task), the first ``--texts``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a structured-pruned embedding run folder (or its model folder)")
    ap.add_argument("--dense", default="minilm", help="the dense model (default: the packaged MiniLM)")
    ap.add_argument("--data-dir", required=True, type=Path)
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    from sentence_transformers import SentenceTransformer

    from compress.embedding.model import STOCK_DIR, embed, load_sentence_encoder
    from compress.models.loading import resolve_model
    from compress.tasks.base import DataOptions
    from compress.tasks.embedding import unlabelled_text

    torch.set_num_threads(os.cpu_count() or 1)
    folder = Path(resolve_model(args.run))
    if not (folder / STOCK_DIR).is_dir():
        sys.exit(f"error: {folder} has no {STOCK_DIR}/; pass a structured-pruned embedding run folder")
    texts = unlabelled_text(DataOptions(args.data_dir), None)[:args.texts]
    pruned, tokenizer, _ = load_sentence_encoder(args.run)
    st_pruned = SentenceTransformer(str(folder), device="cpu")
    st_dense = SentenceTransformer(resolve_model(args.dense), device="cpu")
    ours = embed(pruned, tokenizer, texts, batch_size=args.batch_size)
    theirs = torch.as_tensor(st_pruned.encode(texts, batch_size=args.batch_size))
    runs = {
        "dense, sentence-transformers": lambda: st_dense.encode(texts, batch_size=args.batch_size),
        "structured stock copy, sentence-transformers":
            lambda: st_pruned.encode(texts, batch_size=args.batch_size),
        "structured, this project's PyTorch model":
            lambda: embed(pruned, tokenizer, texts, batch_size=args.batch_size),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - start)
    dense_s = statistics.median(seconds["dense, sentence-transformers"])
    rows = {name: {"median_s": statistics.median(s), "rounds_s": s,
                   "sentences_per_s": len(texts) / statistics.median(s),
                   "x_dense_st": dense_s / statistics.median(s)} for name, s in seconds.items()}
    st_module = st_pruned[0].auto_model
    out = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "run": str(args.run),
           "texts": len(texts), "batch_size": args.batch_size, "rounds": args.rounds,
           "threads": torch.get_num_threads(),
           "st_opens": {"class": type(st_module).__name__, "model_type": st_module.config.model_type,
                        "params": sum(p.numel() for p in st_module.parameters())},
           "pruned_params": sum(p.numel() for p in pruned.encoder.parameters()),
           "max_abs_diff_st_vs_compress": float((theirs - ours).abs().max()),
           "speed": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in out.items() if k != "speed"}, indent=2))
    for name, r in rows.items():
        print(f"{name}: {r['sentences_per_s']:.0f} sentences/s, {r['x_dense_st']:.2f}x the dense model")


if __name__ == "__main__":
    main()
