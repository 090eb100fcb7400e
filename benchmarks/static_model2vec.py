"""The static student beside Model2Vec's default, both from the packaged all-MiniLM-L6-v2 at 256 dims,
in one process on one machine: ReQA (38/10) and MRPC scores, sentences/s at batch 32 and 1,024
(each round times both on the same held-out texts in turn; median of the rounds, and the median
of the per-round ratios, which the other jobs of a shared machine disturb less), the file sizes,
and whether each folder opens in model2vec and sentence-transformers with equal embeddings.

    python benchmarks/static_model2vec.py --data-dir ../shared/data [--out artifacts/static_model2vec]

Writes OUT/static_model2vec.json; the student's run folder is OUT/static (``compress distill
--task embedding --student static --teacher minilm --split-by-article 38/10 --no-peer``) and the
peer's folder OUT/model2vec-256 (``model2vec.distill.distill(model_name=<MiniLM folder>,
pca_dims=256)``).
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

ROOT = Path(__file__).resolve().parents[1]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", default=str(ROOT / "artifacts" / "static_model2vec"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timed-texts", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    sys.path.insert(0, str(ROOT))
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

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"uptime_before": uptime(), "threads": args.threads, "cpus": os.cpu_count()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    result["commit"] = commit.stdout.strip()
    run = out / "static"
    cmd = [sys.executable, "-m", "compress", "distill", "--task", "embedding", "--student", "static",
           "--teacher", "minilm", "--data-dir", args.data_dir, "--split-by-article", "38/10", "--no-peer",
           "--out", str(run)]
    if not (run / "summary.json").is_file():
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT)
        result["compress_distill_wall_s"] = round(time.perf_counter() - t0, 1)
    result["compress_command"] = " ".join(cmd[1:])
    summary = json.loads((run / "summary.json").read_text())
    peer_dir = out / "model2vec-256"
    if not (peer_dir / "model.safetensors").is_file():
        t0 = time.perf_counter()
        distill(model_name=str(packaged_model_path("minilm")), pca_dims=256).save_pretrained(peer_dir)
        result["model2vec_distill_wall_s"] = round(time.perf_counter() - t0, 1)

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
    result["uptime_after"] = uptime()
    (out / "static_model2vec.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("scores", "sentences_per_second", "bytes", "opens",
                                             "uptime_before", "uptime_after")}, indent=2))


if __name__ == "__main__":
    main()
