"""The speedup family's verdict on hand-made rows: the fastest model whose shipped score (not its
fp32 one) is within --max-drop points (not a fraction) of dense, on the task metric or macro-F1;
and the table's columns named by the shipped form."""

from __future__ import annotations

from compress.report.speed_family import fastest_within, format_family_table

ROWS = [
    # fast, but its shipped score is 1.5 points down (its fp32 score is within 1 point)
    {"label": "4x", "score_fp32": 0.855, "score_int8": 0.845, "macro_f1_int8": 0.80, "vs": 4.0},
    {"label": "3x", "score_fp32": 0.852, "score_int8": 0.853, "macro_f1_int8": 0.85, "vs": 3.0},
    {"label": "2x", "score_fp32": 0.860, "score_int8": 0.859, "macro_f1_int8": 0.858, "vs": 2.0},
]


def test_the_fastest_within_the_budget_is_judged_on_the_shipped_score_in_points():
    assert fastest_within(ROWS, 0.860, 1.0, "vs")["label"] == "3x"  # 4x is 1.5 points down int8
    assert fastest_within(ROWS, 0.860, 1.6, "vs")["label"] == "4x"
    assert fastest_within(ROWS, 0.860, 0.1, "vs")["label"] == "2x"
    # a fraction read as points would let everything through at 0.01 (1 point) or nothing at 1.0
    assert fastest_within(ROWS, 0.860, 0.01, "vs") is None


def test_macro_f1_can_judge_instead():
    # within 1 point of a dense macro-F1 of 0.86: 3x (0.85) and 2x; 4x (0.80) is out
    assert fastest_within(ROWS, 0.86, 1.0, "vs", "macro_f1_int8")["label"] == "3x"
    assert fastest_within(ROWS, 0.86, 0.5, "vs", "macro_f1_int8")["label"] == "2x"


def test_the_table_names_the_shipped_form():
    table = format_family_table(ROWS, [(1, 16)], 0.86, "accuracy", "torch fp32")
    head = table.splitlines()[0]
    assert "accuracy torch fp32" in head and "vs dense torch fp32 1x16" in head and "int8" not in head
    assert "| 4x |" in table and "+1.50" in table  # the drop of the shipped score, in points
