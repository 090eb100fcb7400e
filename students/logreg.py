"""Logistic-regression student on tf-idf features computed inside the module.

Design: the vocabulary and idf weights come from scikit-learn's ``TfidfVectorizer`` fitted on the
token-id sequences of the transfer set, augmented copies included (its analyzer maps a sequence to
feature indices: the teacher tokenizer's unigram ids ``0..V-1`` (WordPiece, BPE or SentencePiece)
and, optionally, hashed bigrams
``V + (a * P + b) mod B``). The idf vector is stored as a
buffer (zero for features never seen in training, which is what sklearn does with unknown terms), and
the forward pass recomputes the vectorizer in the graph: raw counts by scatter-add of the ids masked
by ``attention_mask`` -> times idf -> l2-normalised -> one linear layer. So the module has the same
``forward(input_ids, attention_mask)`` contract as the other students, can be distilled with the same
loss, and exports to ONNX without scikit-learn at inference. The ids in ``special_ids`` are not
features; ``compress distill`` passes the tokenizer's special ids ([CLS]/``<s>``, [SEP]/``</s>``,
padding, unknown) but not its mask id, so the masked copies of an augmented transfer set keep a
token where the teacher saw one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compress.core.config import check_range
from students.base import Student, StudentConfig, padding_mask

_PRIME = 1_000_003


@dataclass(frozen=True)
class LogRegConfig(StudentConfig):
    bigram_buckets: int = 2 ** 17  # 0 = unigrams only
    special_ids: tuple[int, ...] = ()
    dropout: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_range("bigram_buckets", self.bigram_buckets, 0)


class LogRegStudent(Student):
    config_class = LogRegConfig
    uses_embeddings = False

    def __init__(self, cfg: LogRegConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        self.num_features = vocab_size + cfg.bigram_buckets
        self.register_buffer("idf", torch.zeros(self.num_features))
        special = torch.zeros(vocab_size, dtype=torch.bool)
        for i in cfg.special_ids:
            if 0 <= i < vocab_size:
                special[i] = True
        self.register_buffer("special", special)
        self.dropout = nn.Dropout(cfg.dropout)
        self.linear = nn.Linear(self.num_features, cfg.num_labels)

    # -- the feature map, in Python (for sklearn) and in the graph ------------------------------
    def analyze(self, ids) -> list[int]:
        """Feature indices of one token-id sequence, as sklearn sees it: every non-special token,
        and every pair of consecutive tokens of which neither is special (hashed)."""
        special = set(self.config.special_ids)
        ids = [int(i) for i in ids]
        feats = [i for i in ids if i not in special]
        b = self.config.bigram_buckets
        if b:
            feats += [self.vocab_size + (x * _PRIME + y) % b for x, y in zip(ids, ids[1:])
                      if x not in special and y not in special]
        return feats

    def prepare(self, sequences: list[list[int]]) -> None:
        """Fit the tf-idf vocabulary and idf on training token-id sequences (sklearn defaults:
        smooth idf, raw term counts, l2 norm) and store idf as a buffer."""
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer(analyzer=self.analyze, lowercase=False)
        vec.fit(sequences)
        idf = torch.zeros(self.num_features)
        cols = torch.tensor(list(vec.vocabulary_.keys()), dtype=torch.long)
        idx = torch.tensor(list(vec.vocabulary_.values()), dtype=torch.long)
        idf[cols] = torch.tensor(vec.idf_, dtype=torch.float32)[idx]
        self.idf.copy_(idf.to(self.idf.device))

    def _positions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feature index and 0/1 weight of every unigram and bigram position, exactly as
        ``analyze`` builds them: (batch, n_positions) each."""
        real = padding_mask(input_ids, attention_mask) & ~self.special[input_ids]
        w = real.to(self.idf.dtype)
        b = self.config.bigram_buckets
        if b and input_ids.shape[1] > 1:
            x, y = input_ids[:, :-1], input_ids[:, 1:]
            bucket = self.vocab_size + (x * _PRIME + y) % b
            return torch.cat([input_ids, bucket], dim=1), torch.cat([w, w[:, :-1] * w[:, 1:]], dim=1)
        return input_ids, w

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """tf-idf features (batch, num_features), l2-normalised per row (raw counts by scatter-add)."""
        ids, w = self._positions(input_ids, attention_mask)
        counts = torch.zeros(input_ids.shape[0], self.num_features, device=input_ids.device,
                             dtype=self.idf.dtype)
        counts.scatter_add_(1, ids, w)
        return nn.functional.normalize(counts * self.idf, p=2.0, dim=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids (batch, seq) -> logits (batch, num_labels).

        Without dropout the dense (batch, num_features) tf-idf vector is never built: with
        a_t = idf[id_t] at each real position t, W v = sum_t a_t W[:, id_t] is a gather, and
        ||v||^2 = sum_{t,s} a_t a_s [id_t == id_s] needs only the positions' pairwise equality
        (raw counts make this exact). That is O(seq^2) per example instead of O(num_features),
        which is what makes the exported graph fast. With dropout (training) the dense path runs.
        """
        if self.training and self.config.dropout > 0:
            return self.linear(self.dropout(self.features(input_ids, attention_mask)))
        ids, w = self._positions(input_ids, attention_mask)
        a = w * self.idf[ids]  # (batch, n)
        raw = (a.unsqueeze(-1) * self.linear.weight.t()[ids]).sum(dim=1)  # (batch, num_labels)
        same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(a.dtype)  # (batch, n, n)
        norm_sq = torch.matmul(torch.matmul(a.unsqueeze(1), same), a.unsqueeze(2)).reshape(-1, 1)
        norm = norm_sq.clamp_min(0).sqrt().clamp_min(1e-12)  # F.normalize's eps
        return raw / norm + self.linear.bias

    def flops_per_example(self, seq_len: int) -> int:
        """As implemented at inference (gather path), n = n-gram positions: idf products (n), the
        gathered weight rows times a (2 x n x num_labels), the pairwise norm (2 x n^2 + 2 x n)."""
        n = 2 * seq_len - 1 if self.config.bigram_buckets and seq_len > 1 else seq_len
        return n + 2 * n * self.config.num_labels + 2 * n * n + 2 * n
