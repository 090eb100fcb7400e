"""Transfer-set augmentation of Tang et al. (2019), "Distilling task-specific knowledge from BERT
into simple neural networks", section 3.3.

Each operator is a pure function of its input and a seeded ``random.Random``:

- ``mask_and_replace``: one uniform draw X per word: X < p_mask (0.1) -> the mask token;
  p_mask <= X < p_mask + p_pos (0.1) -> another word with the same part-of-speech tag, drawn from
  the corpus unigram distribution of that tag (NLTK's perceptron tagger, Penn Treebank tags);
  punctuation is never POS-replaced;
- ``ngram_sample``: keep a random window of ``n`` units, ``n`` uniform in 1..max_n (5). Units are
  words for a single sentence and sentences for a multi-sentence document (a 5-word fragment of a
  news article is not a useful transfer example);
- ``shuffle_sentences``: permute the sentences of a multi-sentence document.

``augment_texts`` applies them in Tang's order (word-level masking and replacement on every copy,
then n-gram sampling with probability ``p_ngram``), plus sentence shuffling with probability
``p_shuffle`` for documents. A copy that comes out identical to its example is drawn again (up to
``MAX_REDRAWS`` times): it would only repeat the example. Words are split from punctuation
(``movie,`` -> ``movie`` ``,``) before tagging, so tags and replacements see bare words, and each
word remembers whether a space preceded it: a copy is written back with the example's own spacing
(``movie,`` stays ``movie,``). WordPiece splits punctuation anyway, but byte-level BPE (RoBERTa's
``Ġ``) and SentencePiece (``▁``) mark word starts, so ``movie ,`` would give the teacher pieces the
example never had. The mask token (the teacher's: ``[MASK]``, ``<mask>``) is written without the
space before it, as RoBERTa's and ALBERT's masks strip it (``lstrip``): it stands for the word and
its space, so no tokenizer reads a stray space piece beside it.
Augmented examples carry only teacher labels; the two sides of a pair are augmented independently.
"""

from __future__ import annotations

import bisect
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from compress.core.config import check_range
from compress.core.errors import DataError, UsageError

TAGGER_PACKAGE = "averaged_perceptron_tagger_eng"
NLTK_RESOURCES = {TAGGER_PACKAGE: f"taggers/{TAGGER_PACKAGE}/", "punkt_tab": "tokenizers/punkt_tab/english/"}


# The settings of the operators (the fields of AugmentConfig that ``compress distill`` exposes as flags).
OPERATORS = ("p_mask", "p_pos", "p_ngram", "max_ngram", "p_shuffle")


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
        if self.p_mask + self.p_pos > 1:  # one draw per word decides between the two
            raise UsageError(f"--p-mask {self.p_mask} plus --p-pos {self.p_pos} exceeds 1; lower one of them")


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


def mask_token_of(tokenizer, fix: str = "pass --p-mask 0") -> str:
    """The mask token augmentation writes (``[MASK]``, RoBERTa's ``<mask>``); a tokenizer without
    one gets its unknown token, which every vocabulary reads as a word it cannot see."""
    token = tokenizer.mask_token or tokenizer.unk_token
    if token is None:
        raise UsageError("augmentation masks words, but the teacher's tokenizer has neither a mask nor an "
                         f"unknown token; {fix}")
    return token


class TaggedWord(NamedTuple):
    word: str
    tag: str  # Penn Treebank
    space_before: bool  # whitespace preceded the word in its sentence


Tagged = list[list[TaggedWord]]  # sentences of words

# a word (with inner apostrophes: it's, don't) or a run of punctuation
_TOKEN = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]+")
MAX_REDRAWS = 10


def split_words(sentence: str) -> list[str]:
    """``'A gripping, funny film.'`` -> ``['A', 'gripping', ',', 'funny', 'film', '.']``."""
    return _TOKEN.findall(sentence)


def split_spaced(sentence: str) -> list[tuple[str, bool]]:
    """``split_words`` with, per word, whether whitespace preceded it:
    ``'Fun, too'`` -> ``[('Fun', False), (',', False), ('too', True)]``."""
    return [(m.group(), m.start() > 0 and sentence[m.start() - 1].isspace())
            for m in _TOKEN.finditer(sentence)]


def tag_texts(texts: list[str]) -> list[Tagged]:
    """Split each text into sentences (Punkt) and words (``split_spaced``), and POS-tag them."""
    import nltk

    require_nltk_data()
    sents_per_text = [[split_spaced(s) for s in nltk.sent_tokenize(t)] or [split_spaced(t)] for t in texts]
    flat = [s for sents in sents_per_text for s in sents]
    tagged_flat = nltk.pos_tag_sents([[w for w, _ in s] for s in flat])
    out, i = [], 0
    for sents in sents_per_text:
        out.append([[TaggedWord(w, t, sp) for (w, t), (_, sp) in zip(tagged, spaced)]
                    for tagged, spaced in zip(tagged_flat[i:i + len(sents)], sents)])
        i += len(sents)
    return out


def render(sentences: list[list[tuple[str, bool]]], mask_token: str | None = None) -> str:
    """Sentences of (word, space_before) back to text: sentences joined by a space, words with the
    space they had; ``mask_token`` never takes the space before it (see the module docstring)."""
    parts: list[str] = []
    for sent in sentences:
        for k, (word, space) in enumerate(sent):
            if parts and (k == 0 or space) and word != mask_token:
                parts.append(" ")
            parts.append(word)
    return "".join(parts)


class TagUnigrams:
    """Per POS tag, the corpus words and their cumulative counts for weighted sampling."""

    def __init__(self, tagged_texts: list[Tagged]):
        counts: dict[str, Counter] = defaultdict(Counter)
        for text in tagged_texts:
            for sent in text:
                for word, tag, *_ in sent:
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

    def sample(self, tag: str, rng: random.Random, exclude: str | None = None) -> str | None:
        """A corpus word with ``tag``, by its count; never ``exclude`` (None when the tag has no
        other word)."""
        if tag not in self.words or self.words[tag] == [exclude]:
            return None
        cum = self.cum[tag]
        while True:
            w = self.words[tag][bisect.bisect_right(cum, rng.random() * cum[-1])]
            if w != exclude:
                return w


# -- operators ----------------------------------------------------------------------------------
def is_word_tag(tag: str) -> bool:
    """Penn Treebank tags of words start with a letter; punctuation tags (, . : `` '' ( ) $ #) do not."""
    return tag[:1].isalpha()


def mask_and_replace(words: list[str], tags: list[str], rng: random.Random, unigrams: TagUnigrams,
                     p_mask: float = 0.1, p_pos: float = 0.1, mask_token: str = "[MASK]") -> list[str]:
    """One draw X per word: X < p_mask masks it, p_mask <= X < p_mask + p_pos replaces a word by
    another of its tag (kept when the corpus has no other), otherwise it stays."""
    out = []
    for w, t in zip(words, tags):
        x = rng.random()
        if x < p_mask:
            w = mask_token
        elif x < p_mask + p_pos and is_word_tag(t):
            w = unigrams.sample(t, rng, exclude=w) or w
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
    new_sents = []  # sentences of (word, space_before)
    for sent in sents:
        words = mask_and_replace([w.word for w in sent], [w.tag for w in sent], rng, unigrams,
                                 cfg.p_mask, cfg.p_pos, cfg.mask_token)
        new_sents.append(list(zip(words, [w.space_before for w in sent])))
    if rng.random() < cfg.p_ngram:
        if len(new_sents) > 1:
            new_sents = ngram_sample(new_sents, rng, cfg.max_ngram)
        elif new_sents:
            new_sents = [ngram_sample(new_sents[0], rng, cfg.max_ngram)]
    return render(new_sents, cfg.mask_token)


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

    def joined(tg: Tagged) -> str:  # what augment_one returns when nothing changed
        return render([[(w.word, w.space_before) for w in sent] for sent in tg if sent])

    for i, tg in enumerate(tagged):
        side = tagged_pairs[i] if tagged_pairs is not None else None
        same = (joined(tg), joined(side) if side is not None else None)
        for _ in range(cfg.copies):
            for _ in range(MAX_REDRAWS):
                copy = (augment_one(tg, rng, unigrams, cfg),
                        augment_one(side, rng, unigrams, cfg) if side is not None else None)
                if copy != same:
                    break
            out_t.append(copy[0])
            if out_p is not None:
                out_p.append(copy[1])
    return out_t, out_p
