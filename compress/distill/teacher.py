"""Teacher outputs for the transfer set: computed once, cached as safetensors, reused.

The cache file holds one float32 tensor ``logits`` (n, num_labels) and, in its metadata, the key it
was computed for: a SHA-256 over the teacher's fingerprint (its weight file and label set), the max
length and every text (and second text). A re-run or a resumed run with the same key loads the file
instead of running the teacher; a different key recomputes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from compress.core.errors import UsageError

CACHE_DIR = "teacher_logits"


# Besides the weights: the label names and every file a tokenizer is read from.
FINGERPRINTED = ("compress.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                 "merges.txt", "special_tokens_map.json", "added_tokens.json", "spiece.model",
                 "sentencepiece.bpe.model", "spm.model")


def teacher_fingerprint(model_dir: str | Path) -> str:
    """SHA-256 of the teacher's weight file(s), saved label names and tokenizer files (the same
    texts tokenized by another vocabulary give other logits)."""
    p = Path(model_dir)
    h = hashlib.sha256()
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise UsageError(f"teacher folder {p} has no *.safetensors weights")
    files = weights + sorted(f for f in p.iterdir() if f.name in FINGERPRINTED)
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def transfer_key(teacher_fp: str, texts: list[str], pairs: list[str] | None, max_length: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"teacher": teacher_fp, "max_length": max_length, "n": len(texts),
                         "pairs": pairs is not None}).encode())
    for i, t in enumerate(texts):
        h.update(t.encode("utf-8"))
        h.update(b"\x1f")
        if pairs is not None:
            h.update(pairs[i].encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()


def read_cache(path: Path) -> tuple[str | None, np.ndarray | None]:
    """(key, logits) of a cache file, or (None, None) when absent or unreadable."""
    from safetensors import safe_open

    if not path.is_file():
        return None, None
    try:
        with safe_open(str(path), framework="np") as f:
            key = (f.metadata() or {}).get("key")
            return key, f.get_tensor("logits")
    except Exception:  # noqa: BLE001 - a damaged cache is recomputed, not fatal
        return None, None


def write_cache(path: Path, key: str, logits: np.ndarray) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({"logits": np.ascontiguousarray(logits, dtype=np.float32)}, str(tmp), metadata={"key": key})
    tmp.replace(path)


def cached_logits(path: Path, key: str, compute: Callable[[], np.ndarray],
                  source: Path | None = None, strict_source: bool = True) -> tuple[np.ndarray, str]:
    """Logits for ``key``: from ``path`` if it holds that key, else from ``source`` (an earlier
    run's cache file) if it does, else ``compute()``; the result is written to ``path``.
    A ``source`` with another key is an error when ``strict_source``, else ignored.
    Returns (logits, where) with where in {"cache", "source", "computed"}."""
    k, logits = read_cache(path)
    if k == key and logits is not None:
        return logits, "cache"
    if source is not None:
        k, logits = read_cache(source)
        if (k != key or logits is None) and not strict_source:
            source = None
        elif k != key or logits is None:
            raise UsageError(f"--teacher-cache {source} was computed for another teacher or other "
                             "texts (key mismatch); drop --teacher-cache or pass the same --teacher, "
                             "task, --train-limit, --augment, --seed and --max-length")
        if source is not None:
            write_cache(path, key, logits)
            return logits, "source"
    logits = compute()
    write_cache(path, key, logits)
    return logits, "computed"


def resolve_cache_source(spec: str | None, role: str) -> Path | None:
    """``--teacher-cache``: a distill run folder (its ``teacher_logits/<role>.safetensors``) or,
    for the transfer set, a cache file itself."""
    if spec is None:
        return None
    p = Path(spec)
    if p.is_dir():
        f = p / CACHE_DIR / f"{role}.safetensors"
        return f if f.is_file() else None
    if p.is_file():
        return p if role == "transfer" else None
    raise UsageError(f"--teacher-cache {spec} does not exist (pass an earlier distill run folder)")


def teacher_predict(model, tokenizer, texts: list[str], pairs: list[str] | None, max_length: int,
                    batch_size: int = 128) -> np.ndarray:
    """Teacher logits (n, num_labels) in input order; batches are built from length-sorted
    examples so padding stays small."""
    import torch

    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    n = len(texts)
    order = sorted(range(n), key=lambda i: len(enc["input_ids"][i]))
    device = next(model.parameters()).device
    model.eval()
    out = np.zeros((n, model.config.num_labels), dtype=np.float32)
    with torch.no_grad():
        for s in range(0, n, batch_size):
            idx = order[s:s + batch_size]
            rows = [{k: enc[k][i] for k in enc.keys()} for i in idx]
            batch = tokenizer.pad(rows, return_tensors="pt")
            batch = {k: v.to(device) for k, v in batch.items()}
            out[idx] = model(**batch).logits.float().cpu().numpy()
    return out
