"""Tang et al. (2019) augmentation operators on fixed seeds, and the missing-tagger error."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from compress.core.errors import DataError, UsageError
from compress.distill.augment import (
    AugmentConfig,
    TagUnigrams,
    augment_texts,
    mask_and_replace,
    ngram_sample,
    render,
    require_nltk_data,
    shuffle_sentences,
    split_spaced,
    split_words,
    tag_texts,
)

WORDS = "the film is a quiet and moving portrait of grief".split()


def _unigrams():
    tagged = [[[("cat", "NN"), ("runs", "VBZ")], [("cat", "NN"), ("sleeps", "VBZ")]],
              [[("dog", "NN"), ("cat", "NN"), ("the", "DT"), (",", ",")]]]
    return TagUnigrams(tagged)  # NN: cat 3, dog 1; VBZ: runs 1, sleeps 1; DT: the 1; ",": "," 1


def test_tag_unigrams_sample_follows_corpus_counts_and_excludes_the_word():
    u = _unigrams()
    rng = random.Random(0)
    counts = Counter(u.sample("NN", rng) for _ in range(8000))
    assert set(counts) == {"cat", "dog"}
    assert 0.72 < counts["cat"] / 8000 < 0.78  # 3 of 4 NN tokens are "cat"
    assert u.sample("JJ", rng) is None
    assert {u.sample("NN", rng, exclude="cat") for _ in range(200)} == {"dog"}  # another word
    assert u.sample("DT", rng, exclude="the") is None  # the tag has no other word


def test_mask_and_replace_replays_one_draw_per_word():
    u = _unigrams()
    words, tags = ["bird", "flies", "the", ",", "fish"], ["NN", "VBZ", "DT", ",", "JJ"]
    out = mask_and_replace(words, tags, random.Random(7), u, p_mask=0.3, p_pos=0.4)
    draws, expected = random.Random(7), []
    for w, t in zip(words, tags):
        x = draws.random()
        if x < 0.3:
            w = "[MASK]"
        elif x < 0.7 and t != ",":
            w = u.sample(t, draws, exclude=w) or w
        expected.append(w)
    assert out == expected and out == mask_and_replace(words, tags, random.Random(7), u, 0.3, 0.4)
    assert mask_and_replace(words, tags, random.Random(7), u, 0.0, 0.0) == words
    assert mask_and_replace(words, tags, random.Random(7), u, 1.0, 0.0) == ["[MASK]"] * 5
    # p_pos 1: every word is replaced by another of its tag where the corpus has one; the DT "the"
    # has no other word, JJ none at all, and punctuation is never replaced
    out = mask_and_replace(words, tags, random.Random(1), u, 0.0, 1.0)
    assert out[0] in {"cat", "dog"} and out[1] in {"runs", "sleeps"} and out[2:] == ["the", ",", "fish"]


def test_mask_and_replace_rates_are_exclusive_and_p_each():
    u = TagUnigrams([[[("a", "NN"), ("b", "NN")]]])
    words = ["a"] * 40000
    out = mask_and_replace(words, ["NN"] * len(words), random.Random(1), u, 0.1, 0.1)
    masked, replaced = out.count("[MASK]") / len(words), out.count("b") / len(words)
    assert 0.095 < masked < 0.105 and 0.095 < replaced < 0.105  # binomial sd 0.0015


def test_split_words_separates_punctuation():
    assert split_words('A gripping, funny film. It\'s "great"!') == [
        "A", "gripping", ",", "funny", "film", ".", "It's", '"', "great", '"!']


def test_split_spaced_and_render_keep_the_spacing_of_the_text():
    text = 'A gripping, funny film. It\'s "great"!'
    spaced = split_spaced(text)
    assert [w for w, _ in spaced] == split_words(text)
    # A gripping , funny film . It's " great "!
    assert [sp for _, sp in spaced] == [False, True, False, True, True, False, True, True, False, False]
    assert render([spaced]) == text
    assert render([split_spaced("Oil rose."), split_spaced("Stocks fell.")]) == "Oil rose. Stocks fell."


def test_render_writes_the_mask_without_the_space_before_it():
    """``<mask>`` stands for the word and its space (RoBERTa's lstrip mask): a byte-level BPE then
    reads no lone space piece beside it."""
    words = [("a", False), ("<mask>", True), (",", False), ("<mask>", True), ("film", True)]
    assert render([words], mask_token="<mask>") == "a<mask>,<mask> film"
    assert render([[("<mask>", False), ("film", True)]], mask_token="<mask>") == "<mask> film"


def test_augmented_copies_tokenize_as_the_example_does_on_bpe_and_sentencepiece(nltk_data):
    """Unchanged words give the teacher's tokenizer the pieces of the example itself (no ``Ġ,``
    or ``▁,`` from a space put before punctuation), and a masked word is exactly one mask id."""
    from tests.tiny_encoders import build

    text = "A gripping, funny film. It's great!"
    for arch in ("roberta", "deberta-v2"):
        tok = build(arch)[1]
        unchanged, _ = augment_texts([text], None, AugmentConfig(copies=1, p_mask=0, p_pos=0, p_ngram=0,
                                                                 p_shuffle=0, mask_token=tok.mask_token))
        assert unchanged == [text]
        masked, _ = augment_texts([text], None, AugmentConfig(copies=1, p_mask=1, p_pos=0, p_ngram=0,
                                                              p_shuffle=0, mask_token=tok.mask_token))
        ids = tok(masked[0], add_special_tokens=False)["input_ids"]
        assert ids == [tok.mask_token_id] * len(split_words(text)), tok.convert_ids_to_tokens(ids)


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


def test_tagger_on_real_nltk_data(nltk_data):
    tagged = tag_texts(["The quick brown fox jumps over the lazy dog .", "It rained. We stayed in.",
                        "A great movie, however long."])
    assert tagged[0][0][:2] == [("The", "DT", False), ("quick", "JJ", True)]
    assert ("fox", "NN", True) in tagged[0][0] and ("jumps", "VBZ", True) in tagged[0][0]
    assert len(tagged[1]) == 2  # two sentences
    # not "movie," as a noun; the comma had no space before it
    assert ("movie", "NN", True) in tagged[2][0] and (",", ",", False) in tagged[2][0]


def test_augment_texts_counts_determinism_and_pairs(nltk_data):
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


def test_copies_identical_to_their_example_are_drawn_again(nltk_data):
    texts = ["a gripping and funny film", "dull , slow and far too long", "one"]
    out, _ = augment_texts(texts, None, AugmentConfig(copies=10, seed=3, p_ngram=0.0))
    # p = 0.1 + 0.1 per word: a 6-word copy is unchanged with probability 0.8^6 = 0.26 per draw
    assert all(o != texts[i // 10] for i, o in enumerate(out[:20]))
    assert len(out) == 30  # "one" may stay itself after MAX_REDRAWS draws; the count never changes


def test_sentence_shuffle_in_documents(nltk_data):
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
    with pytest.raises(UsageError, match="--p-mask 0.5 plus --p-pos 0.6 exceeds 1"):
        AugmentConfig(p_mask=0.5, p_pos=0.6)
    AugmentConfig(p_mask=0.5, p_pos=0.5)  # the whole draw shared out is allowed


def test_distill_defaults_are_tang_et_al():
    """compress distill's operator defaults are Tang et al. (2019)'s: p_mask = p_pos = 0.1,
    p_ng = 0.25, n-grams of 1..5; its flags reach the augmenter's config."""
    from compress.recipes.distill import DistillConfig

    cfg = DistillConfig(augment=20).augment_config(seed=3)
    assert (cfg.p_mask, cfg.p_pos, cfg.p_ngram, cfg.max_ngram) == (0.1, 0.1, 0.25, 5)
    assert cfg == AugmentConfig(copies=20, seed=3)
    cfg = DistillConfig(augment=2, p_mask=0.0, p_pos=0.3, p_ngram=1.0, max_ngram=2,
                        p_shuffle=0.0).augment_config()
    assert (cfg.copies, cfg.p_mask, cfg.p_pos, cfg.p_ngram, cfg.max_ngram, cfg.p_shuffle) == (
        2, 0.0, 0.3, 1.0, 2, 0.0)


def test_missing_tagger_data_names_the_download_command(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(DataError) as e:
        require_nltk_data()
    msg = str(e.value)
    assert "python -m nltk.downloader averaged_perceptron_tagger_eng" in msg and "NLTK_DATA" in msg
    assert "\n" not in msg


def test_wordpiece_reads_copies_as_it_read_space_joined_words(nltk_data):
    """Keeping the example's spacing changes nothing for WordPiece, which splits punctuation and
    added tokens itself: every copy tokenizes as its words and masks joined by single spaces (how
    copies were written before), so WordPiece transfer sets give the same token ids as then."""
    import re

    from compress.models.loading import load_tokenizer
    from compress.tasks import DataOptions, get_task

    tok = load_tokenizer("minilm")
    texts = get_task("sample").load(DataOptions(), "train").texts[:40]
    copies, _ = augment_texts(texts, None, AugmentConfig(copies=2, p_mask=0.3, p_pos=0.2, seed=5))
    # words, masks, and runs of punctuation that stop before a mask (",[MASK]" is two units)
    words = re.compile(r"\[MASK\]|\w+(?:['\u2019]\w+)*|(?:(?!\[MASK\])[^\w\s])+")
    spaced = [" ".join(words.findall(c)) for c in copies]
    assert sum(c != s for c, s in zip(copies, spaced)) > 10  # the spacing did change
    assert tok(copies)["input_ids"] == tok(spaced)["input_ids"]
