"""The student contract shared by every student.

A student is a config dataclass plus an ``nn.Module`` built from ``(config, vocab_size)``. Its
``forward(input_ids, attention_mask=None)`` returns logits of shape (batch, num_labels). Students know
nothing about datasets: token ids come from the teacher's WordPiece tokenizer, labels are indices.
``flops_per_example(seq_len)`` is a documented analytic estimate (FLOPs = 2 x multiply-adds) used
until a measured count is available.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compress.core.config import check_range


@dataclass(frozen=True)
class StudentConfig:
    """Options every student has. ``embed_dim`` is replaced by the width of the initial embedding
    matrix when the student starts from the teacher's (384 for MiniLM) or from a vectors file."""

    num_labels: int = 2
    embed_dim: int = 300
    dropout: float = 0.2
    pad_id: int = 0

    def __post_init__(self):
        check_range("num_labels", self.num_labels, 1)
        check_range("embed_dim", self.embed_dim, 1)
        check_range("dropout", self.dropout, 0, 1, hi_open=True)


class Student(nn.Module):
    """Base class: holds the config and the vocabulary size; subclasses define ``forward``."""

    config_class: type[StudentConfig] = StudentConfig
    #: False for students that do not look tokens up in an embedding table (logreg)
    uses_embeddings: bool = True

    def __init__(self, cfg: StudentConfig, vocab_size: int):
        super().__init__()
        if not isinstance(cfg, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, "
                            f"got {type(cfg).__name__}")
        check_range("vocab_size", vocab_size, 1)
        self.config = cfg
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def init_embeddings(self, weight: torch.Tensor) -> None:
        """Copy ``weight`` (vocab_size, embed_dim) into the embedding table."""
        emb = getattr(self, "embedding", None)
        if emb is None:
            raise TypeError(f"{type(self).__name__} has no embedding table")
        if tuple(weight.shape) != tuple(emb.weight.shape):
            raise ValueError(f"embedding matrix has shape {tuple(weight.shape)}, the student expects "
                             f"{tuple(emb.weight.shape)}")
        with torch.no_grad():
            emb.weight.copy_(weight)

    def output_layer(self) -> nn.Linear:
        """The linear layer that produces the logits: the last ``nn.Linear`` with ``num_labels``
        outputs (used to start multi-label students at the label prior)."""
        layers = [m for m in self.modules()
                  if isinstance(m, nn.Linear) and m.out_features == self.config.num_labels]
        if not layers:
            raise TypeError(f"{type(self).__name__} has no linear layer with {self.config.num_labels} "
                            "outputs")
        return layers[-1]

    def prepare(self, sequences: list[list[int]]) -> None:
        """Fit data-derived statistics on the training token-id sequences before training
        (logreg: tf-idf vocabulary and idf). Neural students need nothing."""

    def flops_per_example(self, seq_len: int) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def padding_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Boolean (batch, seq) mask of real tokens; all True when no mask is given."""
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    return attention_mask.bool()


def embed_with_dropout(embedding: nn.Embedding, input_ids: torch.Tensor, p: float,
                       training: bool) -> torch.Tensor:
    """Look ``input_ids`` up with embedding dropout as in AWD-LSTM (Merity et al. 2018, after Gal &
    Ghahramani 2016): whole rows of the table (word types) are dropped for the batch, so every
    occurrence of a dropped word is zeroed; kept rows are scaled by ``1 / (1 - p)``.
    Returns (batch, seq, dim)."""
    if not training or p == 0:
        return embedding(input_ids)
    # one keep/drop draw per word type, looked up per position: same result as masking the table
    # rows, without touching the rows the batch does not use
    keep = torch.empty(embedding.weight.shape[0], device=input_ids.device,
                       dtype=embedding.weight.dtype).bernoulli_(1 - p)
    return embedding(input_ids) * (keep[input_ids] / (1 - p)).unsqueeze(-1)
