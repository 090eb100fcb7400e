"""The static student beside Model2Vec's default, both from the packaged all-MiniLM-L6-v2 at 256 dims,
in one process on one machine: ReQA (38/10) and MRPC scores, sentences/s at batch 32 and 1,024
(each round times both on the same held-out texts in turn; median of the rounds, and the median
of the per-round ratios, which the other jobs of a shared machine disturb less), the file sizes,
and whether each folder opens in model2vec and sentence-transformers with equal embeddings.

    python -m benchmarks static-model2vec [--work artifacts/static-model2vec] [--rounds 5]

The student's run folder is WORK/static (``compress distill --task embedding --student static
--teacher minilm --split-by-article 38/10 --no-peer``) and the peer's folder WORK/model2vec-256
(``model2vec.distill.distill(model_name=<MiniLM folder>, pca_dims=256)``); each is kept and reused
by a later run.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

COMMON = ("data_dir", "work", "python")


def add_arguments(p) -> None:
    p.add_argument("--rounds", type=int, default=5, help="timed rounds, each timing both encoders in turn")
    p.add_argument("--timed-texts", type=int, default=2000, help="held-out texts each round encodes")
    p.add_argument("--threads", type=int, default=2)


def budget(args) -> str:
    return (f"one static distillation (WikiText-2 transfer text, as compress distill's defaults) and one "
            f"Model2Vec distillation at 256 dims; {args.rounds} rounds of {args.timed_texts} texts at "
            f"batch 32 and 1,024, {args.threads} threads")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name in ("model.safetensors", "tokenizer.json",
                                                                       "config.json", "modules.json"))


def opens_equal(folder: Path, encode, texts: list[str]) -> dict:
    """Largest difference of model2vec's and sentence-transformers' embeddings to ``encode``'s."""
    import numpy as np
    from model2vec import StaticModel
    from sentence_transformers import SentenceTransformer

    ours = np.asarray(encode(texts), dtype=np.float32)
    m2v = StaticModel.from_pretrained(folder).encode(texts).astype(np.float32)
    st = SentenceTransformer(str(folder), device="cpu").encode(texts).astype(np.float32)
    return {"model2vec_max_abs_diff": float(np.abs(m2v - ours).max()),
            "sentence_transformers_max_abs_diff": float(np.abs(st - ours).max()), "texts": len(texts)}


def run(args, ctx) -> dict | None:
    run_dir, peer_dir = Path(args.work) / "static", Path(args.work) / "model2vec-256"
    ctx.compress("static-student", ["distill", "--task", "embedding", "--student", "static", "--teacher",
                                    "minilm", "--data-dir", args.data_dir, "--split-by-article", "38/10",
                                    "--no-peer", "--out", run_dir], done=(run_dir / "summary.json",))
    if ctx.dry_run:
        print(f"# model2vec.distill.distill(model_name=<packaged MiniLM>, pca_dims=256) -> {peer_dir}")
        return None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from model2vec import StaticModel
    from model2vec.distill import distill

    from compress.embedding.scores import embedding_scores
    from compress.models.loading import packaged_model_path
    from compress.tasks.base import DataOptions
    from compress.tasks.embedding import load_embedding_eval
    from students.static_embedding import StaticEncoder, load_static

    result: dict = {"threads": args.threads}
    summary = json.loads((run_dir / "summary.json").read_text())
    if not (peer_dir / "model.safetensors").is_file():
        t0 = time.perf_counter()
        distill(model_name=str(packaged_model_path("minilm")), pca_dims=256).save_pretrained(peer_dir)
        result["model2vec_distill_wall_s"] = round(time.perf_counter() - t0, 1)
    run = run_dir
    data = load_embedding_eval(DataOptions(Path(args.data_dir)), "38/10")
    texts = data.heldout_texts()[:args.timed_texts]
    student = load_static(run)
    peer = StaticModel.from_pretrained(peer_dir)
    ours = StaticEncoder(student)
    peer_scores, _ = embedding_scores(lambda t: torch.as_tensor(peer.encode(list(t)).astype(np.float32)),
                                      data)
    own_scores, _ = embedding_scores(ours, data)
    entries = {"compress": own_scores, "model2vec": peer_scores}
    speed = {}
    for bs in (32, 1024):
        enc = {"compress": StaticEncoder(student, bs),
               "model2vec": lambda t, bs=bs: peer.encode(t, batch_size=bs)}
        for f in enc.values():
            f(texts[:bs])  # warm-up
        seconds = {k: [] for k in enc}
        for _ in range(args.rounds):
            for k, f in enc.items():
                t0 = time.perf_counter()
                f(texts)
                seconds[k].append(time.perf_counter() - t0)
        ratios = [p / c for c, p in zip(seconds["compress"], seconds["model2vec"])]
        speed[str(bs)] = {**{k: len(texts) / statistics.median(v) for k, v in seconds.items()},
                          "compress_over_model2vec_median_round_ratio": statistics.median(ratios),
                          "rounds": args.rounds}
    result.update({
        "scores": {k: {"p@1": v["reqa"]["p@1"], "mrr": v["reqa"]["mrr"], "questions": v["reqa"]["n"],
                       "pair_auc": v.get("pairs", {}).get("roc_auc")} for k, v in entries.items()},
        "sentences_per_second": speed, "timed_texts": len(texts),
        "bytes": {"compress": folder_bytes(run / "student"), "model2vec": folder_bytes(peer_dir)},
        "vocab": {"compress": len(student.tokens), "model2vec": len(peer.tokens)},
        "dims": {"compress": student.dim, "model2vec": peer.dim},
        "opens": opens_equal(run / "student", ours, texts[:500]),
        "static_report": summary["static"],
    })
    return result
