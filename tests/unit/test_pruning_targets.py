"""Which parameters are pruned: defaults, --include/--exclude, never biases/LayerNorm."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

from compress.core.errors import UsageError
from compress.pruning.targets import select_targets

CFG = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=16, max_position_embeddings=16)
SIX = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
       "intermediate.dense", "output.dense")
DEFAULT = {f"encoder.layer.{i}.{s}.weight" for i in range(2) for s in SIX} | {
    "embeddings.word_embeddings.weight"}


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification, BertForMaskedLM])
def test_default_targets_same_canonical_names_for_every_head(cls):
    t = select_targets(cls(CFG))
    assert set(t) == DEFAULT
    assert list(t) == sorted(t)


def test_include_exclude_globs_and_regex():
    m = BertForSequenceClassification(CFG)
    t = select_targets(m, include=("pooler", "classifier.*"))
    assert set(t) == DEFAULT | {"pooler.dense.weight", "classifier.weight"}  # biases never
    t = select_targets(m, exclude=("embeddings.*",))
    assert set(t) == DEFAULT - {"embeddings.word_embeddings.weight"}
    t = select_targets(m, exclude=(r"re:layer\.1\.",))
    assert set(t) == {n for n in DEFAULT if "layer.1." not in n}
    t = select_targets(m, include=("position_embeddings",))
    assert "embeddings.position_embeddings.weight" in t
    assert t["embeddings.position_embeddings.weight"] is \
        m.bert.embeddings.position_embeddings.weight


@pytest.mark.parametrize("kw, needle", [
    (dict(include=("nothing_like_this",)), "--include 'nothing_like_this' matches no parameter"),
    (dict(include=("LayerNorm",)), "matches only biases/LayerNorm weights"),
    (dict(include=("*.bias",)), "matches only biases/LayerNorm weights"),
    (dict(exclude=("decoder_xyz",)), "--exclude 'decoder_xyz' matches no parameter"),
    (dict(exclude=("*",)), "no parameter is left to prune"),
    (dict(include=("re:(",)), "invalid regular expression"),
])
def test_bad_patterns(kw, needle):
    with pytest.raises(UsageError) as e:
        select_targets(BertModel(CFG), **kw)
    assert needle in str(e.value)


def test_the_post_training_default_leaves_the_word_embeddings_out_unless_included():
    m = BertForSequenceClassification(CFG)
    emb = "embeddings.word_embeddings.weight"
    assert set(select_targets(m, word_embeddings=False)) == DEFAULT - {emb}
    assert set(select_targets(m, ("role:word_embeddings",), word_embeddings=False)) == DEFAULT
    assert set(select_targets(m, ("word_embeddings",), word_embeddings=False)) == DEFAULT
    # excluding what is already out is no error (scripts written for the old default still run)
    assert set(select_targets(m, (), ("role:word_embeddings",), word_embeddings=False)) == DEFAULT - {emb}
