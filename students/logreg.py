"""Logistic-regression student on tf-idf features computed inside the module.

Design: the vocabulary and idf weights come from scikit-learn's ``TfidfVectorizer`` fitted on the
training token-id sequences (its analyzer maps a sequence to feature indices: WordPiece unigram ids
``0..V-1`` and, optionally, hashed bigrams ``V + (a * P + b) mod B``). The idf vector is stored as a
buffer (zero for features never seen in training, which is what sklearn does with unknown terms), and
the forward pass recomputes the vectorizer in the graph: raw counts by scatter-add of the ids masked
by ``attention_mask`` -> times idf -> l2-normalised -> one linear layer. So the module has the same
``forward(input_ids, attention_mask)`` contract as the other students, can be distilled with the same
loss, and exports to ONNX without scikit-learn at inference. Special tokens ([CLS], [SEP], [PAD]) are
not features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from compress.config import check_range
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

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """tf-idf features (batch, num_features), l2-normalised per row."""
        real = padding_mask(input_ids, attention_mask) & ~self.special[input_ids]
        w = real.to(self.idf.dtype)
        counts = torch.zeros(input_ids.shape[0], self.num_features, device=input_ids.device,
                             dtype=self.idf.dtype)
        counts.scatter_add_(1, input_ids, w)
        b = self.config.bigram_buckets
        if b and input_ids.shape[1] > 1:
            # a bigram of two consecutive real tokens, exactly as ``analyze`` builds them
            x, y = input_ids[:, :-1], input_ids[:, 1:]
            bucket = self.vocab_size + (x * _PRIME + y) % b
            counts.scatter_add_(1, bucket, w[:, :-1] * w[:, 1:])
        tfidf = counts * self.idf
        return nn.functional.normalize(tfidf, p=2.0, dim=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids (batch, seq) -> logits (batch, num_labels)."""
        return self.linear(self.dropout(self.features(input_ids, attention_mask)))

    def flops_per_example(self, seq_len: int) -> int:
        """As implemented (dense): counting (seq_len adds per n-gram order), idf product and l2
        norm (about 3 x num_features), and the linear layer (2 x num_features x num_labels)."""
        orders = 2 if self.config.bigram_buckets else 1
        return orders * seq_len + 3 * self.num_features + 2 * self.num_features * self.config.num_labels
