"""Static-embedding student: one fixed vector per vocabulary token, a sentence is the mean of its
tokens' vectors (special tokens left out), optionally l2-normalised. No attention, no layers: the
embedding counterpart of the logistic-regression student. Its vectors come from a teacher
(``compress.distill.static_embedding``); the model itself knows nothing about how.

Saved as ``static.safetensors`` (the ``[vocab, dims]`` table) and ``static.json`` (its config)
beside the teacher's tokenizer files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from compress.core.errors import ModelError

WEIGHTS_FILE = "static.safetensors"
CONFIG_FILE = "static.json"


@dataclass(frozen=True)
class StaticEmbeddingConfig:
    vocab_size: int
    dims: int
    normalize: bool = True
    skip_ids: tuple[int, ...] = ()  # special tokens (CLS, SEP, PAD): not part of any mean


class StaticEmbeddingStudent(nn.Module):
    """``forward(input_ids, attention_mask) -> (B, dims)`` sentence embeddings."""

    def __init__(self, config: StaticEmbeddingConfig, vectors: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.dims)
        if vectors is not None:
            if tuple(vectors.shape) != (config.vocab_size, config.dims):
                raise ModelError(f"static vectors have shape {tuple(vectors.shape)}, the config says "
                                 f"({config.vocab_size}, {config.dims})")
            self.embedding.weight.data.copy_(vectors)
        skip = torch.zeros(config.vocab_size, dtype=torch.bool)
        skip[list(config.skip_ids)] = True
        self.register_buffer("skip", skip, persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        keep = ~self.skip[input_ids]
        if attention_mask is not None:
            keep &= attention_mask.bool()
        w = keep.to(self.embedding.weight.dtype)[..., None]
        e = (self.embedding(input_ids) * w).sum(1) / w.sum(1).clamp_min(1.0)
        return F.normalize(e, dim=-1) if self.config.normalize else e

    def save(self, folder: Path, tokenizer) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({"embedding": self.embedding.weight.detach().contiguous()}, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2) + "\n", encoding="utf-8")
        tokenizer.save_pretrained(folder)

    @classmethod
    def load(cls, folder: Path) -> StaticEmbeddingStudent:
        from safetensors.torch import load_file

        if not (folder / CONFIG_FILE).is_file():
            raise ModelError(f"{folder} holds no static-embedding student ({CONFIG_FILE} is missing)")
        raw = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        config = StaticEmbeddingConfig(**{**raw, "skip_ids": tuple(raw.get("skip_ids", ()))})
        return cls(config, load_file(str(folder / WEIGHTS_FILE))["embedding"])


@torch.no_grad()
def encode_static(model: StaticEmbeddingStudent, tokenizer, texts: Sequence[str], max_length: int = 512,
                  batch_size: int = 1024) -> torch.Tensor:
    """(N, dims) embeddings of ``texts``."""
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[i:i + batch_size]), truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        out.append(model(enc["input_ids"], enc["attention_mask"]))
    return torch.cat(out) if out else torch.zeros(0, model.config.dims)
