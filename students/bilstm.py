"""BiLSTM student: embedding -> (bi)LSTM -> max or last pooling -> MLP.

The regularised LSTM of Adhikari et al. (2020) follows AWD-LSTM (Merity et al. 2018): embedding
dropout (whole word types dropped) and weight dropping, i.e. DropConnect on the hidden-to-hidden
matrices ``weight_hh``. The dropped matrices are passed to the cuDNN/CPU LSTM kernel through
``torch.func.functional_call``, so training keeps the fused kernel and evaluation uses the plain
module (exportable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from compress.core.config import check_choice, check_range
from students.base import Student, StudentConfig, embed_with_dropout, padding_mask


@dataclass(frozen=True)
class BiLSTMConfig(StudentConfig):
    hidden_size: int = 256
    num_layers: int = 1
    bidirectional: bool = True
    pooling: str = "max"
    embed_dropout: float = 0.1
    weight_drop: float = 0.2
    mlp_hidden: int = 256

    def __post_init__(self):
        super().__post_init__()
        check_range("hidden_size", self.hidden_size, 1)
        check_range("num_layers", self.num_layers, 1)
        check_choice("pooling", self.pooling, ("max", "last"))
        check_range("embed_dropout", self.embed_dropout, 0, 1, hi_open=True)
        check_range("weight_drop", self.weight_drop, 0, 1, hi_open=True)
        check_range("mlp_hidden", self.mlp_hidden, 1)


class BiLSTMStudent(Student):
    config_class = BiLSTMConfig

    def __init__(self, cfg: BiLSTMConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        # sparse gradients: a batch touches a few hundred of the ~30k rows (SparseAdam updates only those)
        self.embedding = nn.Embedding(vocab_size, cfg.embed_dim, padding_idx=cfg.pad_id, sparse=True)
        self.lstm = nn.LSTM(cfg.embed_dim, cfg.hidden_size, num_layers=cfg.num_layers,
                            bidirectional=cfg.bidirectional, batch_first=True)
        out = cfg.hidden_size * (2 if cfg.bidirectional else 1)
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(out, cfg.mlp_hidden), nn.ReLU(),
                                  nn.Dropout(cfg.dropout), nn.Linear(cfg.mlp_hidden, cfg.num_labels))

    def _run_lstm(self, x):
        p = self.config.weight_drop
        if not self.training or p == 0:
            return self.lstm(x)[0]
        dropped = {name: nn.functional.dropout(w, p, True)
                   for name, w in self.lstm.named_parameters() if name.startswith("weight_hh")}
        return functional_call(self.lstm, dropped, (x,))[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids (batch, seq) -> logits (batch, num_labels).

        With an attention mask the padded batch is packed, so padding never enters either
        direction; without one every position is a real token (the export path).
        """
        cfg = self.config
        mask = padding_mask(input_ids, attention_mask)
        x = embed_with_dropout(self.embedding, input_ids, cfg.embed_dropout, self.training)
        lengths = mask.sum(1).clamp(min=1)
        if attention_mask is not None:
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            h = self._run_lstm(packed)
            h, _ = pad_packed_sequence(h, batch_first=True, total_length=input_ids.shape[1])
        else:
            h = self._run_lstm(x)
        if cfg.pooling == "max":
            pooled = h.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(1).values
        else:
            # forward direction: output at the last real token; backward: output at the first token
            last = h[torch.arange(h.shape[0], device=h.device), lengths - 1]
            if cfg.bidirectional:
                hs = cfg.hidden_size
                pooled = torch.cat([last[:, :hs], h[:, 0, hs:]], dim=-1)
            else:
                pooled = last
        return self.head(pooled)

    def flops_per_example(self, seq_len: int) -> int:
        """2 x multiply-adds of the gate matmuls (4 gates x hidden x (input + hidden) per token,
        per direction, per layer) and of the MLP; gate nonlinearities and the lookup not counted."""
        cfg = self.config
        dirs = 2 if cfg.bidirectional else 1
        macs = 0
        d_in = cfg.embed_dim
        for _ in range(cfg.num_layers):
            macs += dirs * seq_len * 4 * cfg.hidden_size * (d_in + cfg.hidden_size)
            d_in = dirs * cfg.hidden_size
        macs += d_in * cfg.mlp_hidden + cfg.mlp_hidden * cfg.num_labels
        return 2 * macs
