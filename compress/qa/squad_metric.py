"""The official SQuAD v1.1 exact match and F1 (Rajpurkar et al. 2016, evaluate-v1.1.py).

Answers are normalised (lowercase, punctuation removed, the articles a/an/the removed, whitespace
collapsed); a prediction scores the maximum over the question's reference answers; EM and F1 are
averaged over questions and reported in percent, as the official script does.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match_score(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(truth).split()
    common = Counter(pred) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred)
    recall = same / len(gold)
    return 2 * precision * recall / (precision + recall)


def max_over_references(fn, prediction: str, references: Sequence[str]) -> float:
    return max(fn(prediction, r) for r in references)


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]
                 ) -> dict[str, float]:
    """``{'exact_match', 'f1'}`` in percent over the questions of ``references``.

    A question without a prediction scores 0, as in the official script.
    """
    if not references:
        raise ValueError("no reference answers")
    em = f1 = 0.0
    for qid, refs in references.items():
        if qid not in predictions:
            continue
        em += max_over_references(exact_match_score, predictions[qid], refs)
        f1 += max_over_references(f1_score, predictions[qid], refs)
    n = len(references)
    return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}
