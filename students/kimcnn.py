"""KimCNN student (Kim 2014): embedding -> 1-d convolutions of widths 3, 4, 5 -> ReLU ->
max-over-time pooling -> dropout -> linear."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compress.core.config import check_range
from students.base import Student, StudentConfig, padding_mask


@dataclass(frozen=True)
class KimCNNConfig(StudentConfig):
    widths: tuple[int, ...] = (3, 4, 5)
    num_filters: int = 100
    dropout: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not self.widths:
            raise ValueError("widths must not be empty")
        for w in self.widths:
            check_range("widths", w, 1)
        check_range("num_filters", self.num_filters, 1)


class KimCNNStudent(Student):
    config_class = KimCNNConfig

    def __init__(self, cfg: KimCNNConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        # sparse gradients: a batch touches a few hundred of the ~30k rows (SparseAdam updates only those)
        self.embedding = nn.Embedding(vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id, sparse=True)
        self.convs = nn.ModuleList(nn.Conv1d(cfg.embed_dim, cfg.num_filters, w) for w in cfg.widths)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.num_filters * len(cfg.widths), cfg.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids (batch, seq) -> logits (batch, num_labels).

        A window is pooled only if it starts inside the text and, for texts at least as long as the
        window, also ends inside it; texts shorter than a width are zero-padded to it.
        """
        mask = padding_mask(input_ids, attention_mask)
        lengths = mask.sum(1)
        x = self.embedding(input_ids) * mask.unsqueeze(-1)
        x = x.transpose(1, 2)  # (batch, dim, seq)
        pooled = []
        for w, conv in zip(self.config.widths, self.convs):
            # Pad every batch by w - 1 zero positions, so that width w has a window however short
            # the text (one- and two-word sentences). A pad only for batches shorter than w would be
            # a Python branch, frozen into an exported graph at the length it was traced with; the
            # windows this adds start past the text and are masked out below.
            c = torch.relu(conv(nn.functional.pad(x, (0, w - 1))))  # (batch, filters, seq)
            starts = torch.arange(c.shape[-1], device=c.device)
            last_start = (lengths - w).clamp(min=0)
            valid = starts.unsqueeze(0) <= last_start.unsqueeze(1)
            pooled.append(c.masked_fill(~valid.unsqueeze(1), float("-inf")).max(-1).values)
        return self.out(self.dropout(torch.cat(pooled, dim=-1)))

    def flops_per_example(self, seq_len: int) -> int:
        """2 x multiply-adds, as computed: each width w has seq_len windows (the text padded by
        w - 1) of w x embed_dim x filters; plus the output layer. ReLU, pooling and the lookup are
        not counted."""
        cfg = self.config
        macs = sum(seq_len * w * cfg.embed_dim * cfg.num_filters for w in cfg.widths)
        macs += cfg.num_filters * len(cfg.widths) * cfg.num_labels
        return 2 * macs
