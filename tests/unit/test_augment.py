"""Tang et al. (2019) augmentation operators on fixed seeds, and the missing-tagger error."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from compress.distill.augment import (
    AugmentConfig,
    TagUnigrams,
    augment_texts,
    mask_words,
    ngram_sample,
    pos_replace,
    require_nltk_data,
    shuffle_sentences,
    tag_texts,
)
from compress.errors import DataError, UsageError

WORDS = "the film is a quiet and moving portrait of grief".split()


def test_mask_words_replays_the_seeded_draws():
    out = mask_words(WORDS, random.Random(7), p=0.3, mask_token="[MASK]")
    draws = random.Random(7)
    expected = ["[MASK]" if draws.random() < 0.3 else w for w in WORDS]
    assert out == expected
    assert out == mask_words(WORDS, random.Random(7), p=0.3)  # deterministic
    assert mask_words(WORDS, random.Random(7), p=0.0) == WORDS
    assert mask_words(WORDS, random.Random(7), p=1.0) == ["[MASK]"] * len(WORDS)


def test_mask_rate_is_p():
    words = ["w"] * 20000
    rate = mask_words(words, random.Random(1), p=0.1).count("[MASK]") / len(words)
    assert 0.09 < rate < 0.11  # binomial sd 0.002


def _unigrams():
    tagged = [[[("cat", "NN"), ("runs", "VBZ")], [("cat", "NN"), ("sleeps", "VBZ")]],
              [[("dog", "NN"), ("cat", "NN")]]]
    return TagUnigrams(tagged)  # NN: cat 3, dog 1; VBZ: runs 1, sleeps 1


def test_tag_unigrams_sample_follows_corpus_counts():
    u = _unigrams()
    rng = random.Random(0)
    counts = Counter(u.sample("NN", rng) for _ in range(8000))
    assert set(counts) == {"cat", "dog"}
    assert 0.72 < counts["cat"] / 8000 < 0.78  # 3 of 4 NN tokens are "cat"
    assert u.sample("JJ", rng) is None


def test_pos_replace_keeps_tags_and_skips_masks():
    u = _unigrams()
    words = ["bird", "flies", "[MASK]", "fish"]
    tags = ["NN", "VBZ", "NN", "JJ"]
    out = pos_replace(words, tags, random.Random(3), u, p=1.0)
    assert out[0] in {"cat", "dog"} and out[1] in {"runs", "sleeps"}
    assert out[2] == "[MASK]"  # masked words stay masked
    assert out[3] == "fish"  # no corpus word has tag JJ: unchanged
    assert pos_replace(words, tags, random.Random(3), u, p=0.0) == words
    assert out == pos_replace(words, tags, random.Random(3), u, p=1.0)


def test_ngram_sample_is_a_window_of_1_to_5():
    seen = set()
    for seed in range(200):
        out = ngram_sample(WORDS, random.Random(seed), max_n=5)
        n = len(out)
        assert 1 <= n <= 5
        starts = [i for i in range(len(WORDS) - n + 1) if WORDS[i:i + n] == out]
        assert starts, out
        seen.add(n)
    assert seen == {1, 2, 3, 4, 5}
    assert ngram_sample(["a", "b"], random.Random(0), max_n=5) in (["a"], ["b"], ["a", "b"])
    assert ngram_sample([], random.Random(0)) == []


def test_shuffle_sentences_is_a_seeded_permutation():
    sents = ["A b.", "C d.", "E f.", "G h."]
    out = shuffle_sentences(sents, random.Random(5))
    assert sorted(out) == sorted(sents)
    assert out == shuffle_sentences(sents, random.Random(5))
    assert sents == ["A b.", "C d.", "E f.", "G h."]  # input untouched
    assert any(shuffle_sentences(sents, random.Random(s)) != sents for s in range(5))


def test_tagger_on_real_nltk_data():
    tagged = tag_texts(["The quick brown fox jumps over the lazy dog .", "It rained. We stayed in."])
    assert tagged[0][0][:2] == [("The", "DT"), ("quick", "JJ")]
    assert ("fox", "NN") in tagged[0][0] and ("jumps", "VBZ") in tagged[0][0]
    assert len(tagged[1]) == 2  # two sentences


def test_augment_texts_counts_determinism_and_pairs():
    texts = ["a gripping and funny film", "dull , slow and far too long"]
    cfg = AugmentConfig(copies=3, seed=11, p_mask=0.3, p_pos=0.3)
    out, pairs = augment_texts(texts, None, cfg)
    assert len(out) == 6 and pairs is None
    assert out == augment_texts(texts, None, cfg)[0]
    assert out != augment_texts(texts, None, AugmentConfig(copies=3, seed=12, p_mask=0.3, p_pos=0.3))[0]
    assert any(o != texts[i // 3] for i, o in enumerate(out))
    out2, pairs2 = augment_texts(texts, ["one", "two"], AugmentConfig(copies=2))
    assert len(out2) == 4 and len(pairs2) == 4
    assert augment_texts(texts, None, AugmentConfig(copies=0)) == ([], None)


def test_sentence_shuffle_in_documents():
    doc = "Oil prices rose. Stocks fell sharply. The dollar held steady."
    cfg = AugmentConfig(copies=20, p_mask=0, p_pos=0, p_ngram=0, p_shuffle=1.0, seed=0)
    out, _ = augment_texts([doc], None, cfg)
    sentences = {"Oil prices rose.", "Stocks fell sharply.", "The dollar held steady."}
    for o in out:  # the same three sentences, in some order
        parts = [p.strip() + "." for p in o.split(".") if p.strip()]
        assert set(parts) == sentences and len(parts) == 3
    assert len(set(out)) > 1 and any(not o.startswith("Oil") for o in out)


def test_config_ranges():
    with pytest.raises(UsageError, match="--augment"):
        AugmentConfig(copies=-1)
    with pytest.raises(UsageError, match="--p-mask"):
        AugmentConfig(p_mask=1.5)


def test_missing_tagger_data_names_the_download_command(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(DataError) as e:
        require_nltk_data()
    msg = str(e.value)
    assert "python -m nltk.downloader averaged_perceptron_tagger_eng" in msg and "NLTK_DATA" in msg
    assert "\n" not in msg
