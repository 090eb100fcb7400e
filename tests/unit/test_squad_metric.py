"""The official SQuAD v1.1 EM/F1 on hand-computed cases."""

from __future__ import annotations

import pytest

from compress.qa.squad_metric import exact_match_score, f1_score, normalize_answer, squad_scores


@pytest.mark.parametrize("raw, norm", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an  apple,  a pear!  ", "apple pear"),
    ("Theatre of the Absurd", "theatre of absurd"),  # 'the' removed only as a word
    ("U.S.A.", "usa"),
    ("Denver Broncos.", "denver broncos"),
    ("A", ""),
])
def test_normalisation(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_ignores_case_articles_punctuation_whitespace():
    assert exact_match_score("the  Denver Broncos!", "Denver Broncos") == 1.0
    assert exact_match_score("Denver", "Denver Broncos") == 0.0


def test_f1_hand_computed():
    # pred tokens {denver, broncos, team}, gold {denver, broncos}: P = 2/3, R = 1, F1 = 0.8
    assert f1_score("the Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)
    # repeated tokens count with multiplicity: pred [a, a, b] -> [b] after article removal? no:
    # 'a' is an article, so use 'x': pred [x, x, y], gold [x, y, y]: common x1 y1 = 2, P = R = 2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1_score("cat", "dog") == 0.0
    assert f1_score("", "dog") == 0.0


def test_multiple_references_take_the_maximum_and_average_over_questions():
    preds = {"q1": "Denver Broncos", "q2": "in 1990", "q3": "nothing"}
    refs = {"q1": ["Carolina Panthers", "the Denver Broncos"],  # EM 1, F1 1
            "q2": ["1990", "the year 1990"],                    # EM 0; F1 max(2/3, 2*(1/2)(1/2)/1=0.5)
            "q3": ["something else"]}                           # 0, 0
    s = squad_scores(preds, refs)
    assert s["exact_match"] == pytest.approx(100 * 1 / 3)
    assert s["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)


def test_missing_prediction_scores_zero():
    assert squad_scores({}, {"q": ["x"]}) == {"exact_match": 0.0, "f1": 0.0}
