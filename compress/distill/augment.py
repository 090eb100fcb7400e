"""Transfer-set augmentation of Tang et al. (2019), "Distilling task-specific knowledge from BERT
into simple neural networks", section 3.3.

Each operator is a pure function of its input and a seeded ``random.Random``:

- ``mask_words``: each word becomes the mask token with probability ``p`` (0.1);
- ``pos_replace``: each word is, with probability ``p`` (0.1), replaced by a word of the same
  part-of-speech tag drawn from the corpus unigram distribution of that tag (NLTK's perceptron
  tagger, Penn Treebank tags);
- ``ngram_sample``: keep a random window of ``n`` units, ``n`` uniform in 1..max_n (5). Units are
  words for a single sentence and sentences for a multi-sentence document (a 5-word fragment of a
  news article is not a useful transfer example);
- ``shuffle_sentences``: permute the sentences of a multi-sentence document.

``augment_texts`` applies them in Tang's order (word-level masking and replacement on every copy,
then n-gram sampling with probability ``p_ngram``), plus sentence shuffling with probability
``p_shuffle`` for documents. Augmented examples carry only teacher labels.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, defaultdict
from dataclasses import dataclass

from compress.config import check_range
from compress.errors import DataError

TAGGER_PACKAGE = "averaged_perceptron_tagger_eng"
NLTK_RESOURCES = {TAGGER_PACKAGE: f"taggers/{TAGGER_PACKAGE}/", "punkt_tab": "tokenizers/punkt_tab/english/"}


@dataclass(frozen=True)
class AugmentConfig:
    copies: int = 0
    p_mask: float = 0.1
    p_pos: float = 0.1
    p_ngram: float = 0.25
    max_ngram: int = 5
    p_shuffle: float = 0.5
    mask_token: str = "[MASK]"
    seed: int = 42

    def __post_init__(self):
        check_range("augment", self.copies, 0)
        for name in ("p_mask", "p_pos", "p_ngram", "p_shuffle"):
            check_range(name, getattr(self, name), 0, 1)
        check_range("max_ngram", self.max_ngram, 1)


# -- NLTK data ----------------------------------------------------------------------------------
def require_nltk_data() -> None:
    """Raise a DataError naming the download command when the tagger or Punkt tables are missing."""
    import nltk

    missing = []
    for package, resource in NLTK_RESOURCES.items():
        try:
            nltk.data.find(resource)
        except LookupError:
            missing.append(package)
    if missing:
        raise DataError(f"NLTK data missing for --augment: {', '.join(missing)}; run 'python -m "
                        f"nltk.downloader {' '.join(missing)}' or set NLTK_DATA to a folder that has "
                        f"it (e.g. ../shared/data/nltk_data); or pass --augment 0")


Tagged = list[list[tuple[str, str]]]  # sentences of (word, tag)


def tag_texts(texts: list[str]) -> list[Tagged]:
    """Split each text into sentences (Punkt) and whitespace words, and POS-tag every sentence."""
    import nltk

    require_nltk_data()
    sents_per_text = [[s.split() for s in nltk.sent_tokenize(t)] or [t.split()] for t in texts]
    flat = [s for sents in sents_per_text for s in sents]
    tagged_flat = nltk.pos_tag_sents(flat)
    out, i = [], 0
    for sents in sents_per_text:
        out.append([list(x) for x in tagged_flat[i:i + len(sents)]])
        i += len(sents)
    return out


class TagUnigrams:
    """Per POS tag, the corpus words and their cumulative counts for weighted sampling."""

    def __init__(self, tagged_texts: list[Tagged]):
        counts: dict[str, Counter] = defaultdict(Counter)
        for text in tagged_texts:
            for sent in text:
                for word, tag in sent:
                    counts[tag][word] += 1
        self.words: dict[str, list[str]] = {}
        self.cum: dict[str, list[int]] = {}
        for tag, c in sorted(counts.items()):
            words = sorted(c)  # a fixed order makes sampling independent of insertion order
            total, cum = 0, []
            for w in words:
                total += c[w]
                cum.append(total)
            self.words[tag], self.cum[tag] = words, cum

    def sample(self, tag: str, rng: random.Random) -> str | None:
        if tag not in self.words:
            return None
        cum = self.cum[tag]
        return self.words[tag][bisect.bisect_right(cum, rng.random() * cum[-1])]


# -- operators ----------------------------------------------------------------------------------
def mask_words(words: list[str], rng: random.Random, p: float = 0.1, mask_token: str = "[MASK]"
               ) -> list[str]:
    return [mask_token if rng.random() < p else w for w in words]


def pos_replace(words: list[str], tags: list[str], rng: random.Random, unigrams: TagUnigrams,
                p: float = 0.1, skip: str = "[MASK]") -> list[str]:
    out = []
    for w, t in zip(words, tags):
        if w != skip and rng.random() < p:
            w = unigrams.sample(t, rng) or w
        out.append(w)
    return out


def ngram_sample(units: list, rng: random.Random, max_n: int = 5) -> list:
    """A random window of n consecutive units, n uniform in 1..max_n (capped at the length)."""
    if not units:
        return units
    n = min(rng.randint(1, max_n), len(units))
    start = rng.randint(0, len(units) - n)
    return units[start:start + n]


def shuffle_sentences(sentences: list, rng: random.Random) -> list:
    out = list(sentences)
    rng.shuffle(out)
    return out


def augment_one(tagged: Tagged, rng: random.Random, unigrams: TagUnigrams, cfg: AugmentConfig) -> str:
    """One augmented copy of a tagged text."""
    sents = [s for s in tagged if s]
    if len(sents) > 1 and rng.random() < cfg.p_shuffle:
        sents = shuffle_sentences(sents, rng)
    new_sents = []
    for sent in sents:
        words = [w for w, _ in sent]
        tags = [t for _, t in sent]
        words = mask_words(words, rng, cfg.p_mask, cfg.mask_token)
        words = pos_replace(words, tags, rng, unigrams, cfg.p_pos, cfg.mask_token)
        new_sents.append(words)
    if rng.random() < cfg.p_ngram:
        if len(new_sents) > 1:
            new_sents = ngram_sample(new_sents, rng, cfg.max_ngram)
        elif new_sents:
            new_sents = [ngram_sample(new_sents[0], rng, cfg.max_ngram)]
    return " ".join(w for s in new_sents for w in s)


def augment_texts(texts: list[str], pairs: list[str] | None, cfg: AugmentConfig
                  ) -> tuple[list[str], list[str] | None]:
    """``cfg.copies`` augmented copies of every example, in example order (copy k of example i at
    ``i * copies + k``). Deterministic for a given seed; pairs are augmented side by side."""
    if cfg.copies == 0:
        return [], [] if pairs is not None else None
    tagged = tag_texts(texts)
    tagged_pairs = tag_texts(pairs) if pairs is not None else None
    unigrams = TagUnigrams(tagged + (tagged_pairs or []))
    rng = random.Random(cfg.seed)
    out_t: list[str] = []
    out_p: list[str] | None = [] if pairs is not None else None
    for i, tg in enumerate(tagged):
        for _ in range(cfg.copies):
            out_t.append(augment_one(tg, rng, unigrams, cfg))
            if out_p is not None and tagged_pairs is not None:
                out_p.append(augment_one(tagged_pairs[i], rng, unigrams, cfg))
    return out_t, out_p
