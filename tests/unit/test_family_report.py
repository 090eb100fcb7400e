"""The speedup family's verdict on hand-made rows: the fastest model whose shipped score (not its
fp32 one) is within --max-drop points (not a fraction) of dense, on the task metric or macro-F1;
and the table's columns named by the shipped form."""

from __future__ import annotations

import pytest

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


def _family_cfg(out, **kw):
    from compress.api.prune_stages import PruneConfig

    values = dict(task="sst2", stage="post-training", structured=("heads", "ffn"), criterion="fisher",
                  speedup=(2.0, 3.0, 4.0), latency_shape="4x24", max_length=64, out=str(out))
    return PruneConfig(**{**values, **kw})


def test_the_family_report_names_the_fastest_by_its_shipped_score_within_max_drop_points(tmp_path):
    """The recipe's report, on hand-made members and bench rows: 4x is fastest and within 1 point of
    dense by its fp32 score, but 1.5 points down as shipped (int8), so 3x is named; --max-drop 1 is
    one point (as a fraction, 0.01 points, nothing would be)."""
    from compress.recipes.speed_family import _report

    members = [{**r, "target": float(r["label"][:-1]), "seconds": 1.0,
                "shipped": {"path": str(tmp_path / f"{r['label']}.onnx")},
                "summary": {"eval_dense": {"score": 0.86}}} for r in ROWS]
    ms = {"dense-eager-fp32": 80.0, "dense-ort-int8": 40.0, "4x": 10.0, "3x": 40 / 3, "2x": 20.0}
    bench = {"rows": [{"model": m, "batch": 4, "seq_len": 24, "median_ms": v} for m, v in ms.items()],
             "run_dir": str(tmp_path / "bench")}
    dense = {"path": str(tmp_path / "dense-ort-int8.onnx"), "score": 0.858}
    _report(_family_cfg(tmp_path, max_drop=1.0), tmp_path, "accuracy", members, dense, bench, 4, 24)
    family = __import__("json").loads((tmp_path / "family.json").read_text())
    assert family["speed_key"] == "vs_dense_int8_4x24"
    assert [r["vs_dense_int8_4x24"] for r in family["rows"]] == pytest.approx([4.0, 3.0, 2.0])
    assert family["fastest_within_budget"] == "3x"
    verdict = ("fastest within 1 point(s) of dense accuracy (86.00): 3x (3.00x the dense ort-int8 export "
               "at 4x24)")
    assert verdict in (tmp_path / "family.md").read_text()


def test_the_family_benches_at_the_latency_tables_shape_not_max_length(tiny_bert, tmp_path, monkeypatch):
    """Everything but the order of the recipe is stubbed: the latency table is taken at the
    --latency-shape's 24 tokens (--max-length is 64), and the bench and the report use that shape."""
    import compress.measure.bench as bench
    import compress.measure.latency_table as lt
    import compress.recipes.speed_family as sf
    from tests.unit.test_empty_blocks import tiny_classifier

    seen = {}

    class Table:
        def to_dict(self):
            return {}

    def table(module, runtime, batch, tokens):
        seen["table"] = (runtime, batch, tokens)
        return Table()

    def member(cfg, family_dir, target, fisher, start, dense_sizes, task):
        return {"label": f"{target:g}x", "run": f"speedup-{target:g}x", "started_from": start, "seconds": 1.0,
                "shipped": {"path": str(family_dir / f"{target:g}x.onnx")}}

    def bench_models(cfg):
        seen["bench"] = cfg
        return {"rows": [], "run_dir": str(tmp_path / "bench")}

    monkeypatch.setattr(sf, "_classifier_dense", lambda cfg: (tiny_classifier(), [], lambda: None, None))
    monkeypatch.setattr(lt, "latency_table", table)
    monkeypatch.setattr(sf, "_member", member)
    monkeypatch.setattr(sf, "_ship", lambda cfg, model, to: {"path": str(to), "score": 0.5})
    monkeypatch.setattr(bench, "bench_models", bench_models)
    monkeypatch.setattr(sf, "_report", lambda *args: seen.setdefault("report", args[-2:]))
    sf.run_speed_family(_family_cfg(tmp_path / "out", model=str(tiny_bert), speedup=(2.0, 3.0)))
    assert seen["table"] == ("ort-int8", 4, 24)
    assert seen["bench"].seq_lens == (24, 128) and seen["bench"].batch_sizes == (1, 4)
    labels = [m.split("=")[0] for m in seen["bench"].models]
    assert labels == ["dense-eager-fp32", "dense-ort-int8", "2x", "3x"]
    assert seen["report"] == (4, 24)
