"""The latency table of structured-pruned encoders: grids, monotone fits, interpolation and the sum
by hand on a table built by hand; on tiny measured tables, growth with kept units, the cache (a hit
times nothing), two builds agreeing, and the errors."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import BertConfig, DistilBertConfig, GPT2Config

import compress.measure.latency_table as lt
from compress.core.errors import UsageError
from compress.measure.latency_table import (
    LatencyTable,
    head_grid,
    interpolate,
    isotonic,
    latency_table,
    monotone_from_zero,
    width_grid,
)

# small enough to build a table in seconds: every export is a 1-layer model of hidden 32
SMALL = {"batch": 2, "seq_len": 16, "repeats": 3, "width_points": (8, 32)}


def tiny_config(**kw) -> BertConfig:
    values = {"vocab_size": 2000, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 64, "max_position_embeddings": 64, **kw}
    return BertConfig(**values)


def hand_table(reference: str = "empty") -> LatencyTable:
    ref = 0 if reference == "empty" else 1
    return LatencyTable(
        key={}, runtime="ort-int8", batch=1, seq_len=8, num_layers=2, num_heads=4, ffn_width=64,
        reference=reference, base_ms=10.0, layer_fixed_ms=1.5,
        heads=(ref, 1, 2, 3, 4)[1 - ref:], attention_grid_ms=(0.0, 1.0, 1.5, 2.5, 3.0)[1 - ref:],
        attention_raw_ms=(0.0, 1.0, 1.5, 2.5, 3.0)[1 - ref:],
        widths=(ref, 8, 64) if ref == 0 else (1, 8, 64), ffn_grid_ms=(0.0, 2.0, 9.0),
        ffn_raw_ms=(0.0, 2.0, 9.0), dense_ms=37.0, dense_predicted_ms=37.0, build_seconds=1.0, repeats=3)


# ----------------------------------------------------------------------------- pure parts


def test_grids_cover_every_head_and_dense_small_widths():
    assert head_grid(12) == tuple(range(1, 13))
    big = head_grid(32)
    assert big[0] == 1 and big[-1] == 32 and len(big) < 16 and list(big) == sorted(set(big))
    assert width_grid(1536) == (1, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536)
    assert width_grid(3072)[:3] == (1, 8, 16) and width_grid(3072)[-1] == 3072


def test_isotonic_pools_adjacent_violators():
    assert isotonic([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert isotonic([5, 1, 1, 1]) == [2, 2, 2, 2]
    assert monotone_from_zero([-2.0, 5.0, 3.0]) == [0.0, 4.0, 4.0]  # -2 pooled with the 0, clipped


def test_copies_of_a_turn_are_spread_through_the_order():
    order = lt.spread_copies(["ref", "a", "b", "c", "d", "e"], {"ref": 3})
    turns = [t for t, _ in order]
    assert turns == ["ref", "a", "b", "ref#2", "c", "d", "ref#3", "e"]
    assert {name for _, name in order} == {"ref", "a", "b", "c", "d", "e"}


def test_interpolation_between_grid_points_is_linear():
    assert interpolate(36, (0, 8, 64), (0.0, 2.0, 9.0)) == pytest.approx(2.0 + 7.0 * 28 / 56)
    table = hand_table()
    assert table.ffn_ms(36) == pytest.approx(5.5)
    assert table.ffn_ms(4) == pytest.approx(1.0)       # between the empty block and 8 neurons
    assert table.ffn_ms(64) == 9.0 and table.ffn_ms(0) == 0.0
    with pytest.raises(UsageError, match="0..64"):
        table.ffn_ms(65)


def test_predict_is_base_plus_the_sum_by_hand():
    table = hand_table()
    heads, ffn = [4, 0, 2], [36, 8, 0]
    by_hand = 10.0 + (1.5 + 3.0 + 5.5) + (1.5 + 0.0 + 2.0) + (1.5 + 1.5 + 0.0)
    assert table.predict_ms(heads, ffn) == pytest.approx(by_hand)
    dense = 10.0 + 2 * (1.5 + 3.0 + 9.0)
    assert table.predicted_speedup([4, 4], [64, 64]) == pytest.approx(1.0)
    assert table.predicted_speedup([2, 0], [8, 0]) == pytest.approx(dense / (10.0 + 1.5 + 1.5 + 2.0 + 1.5))
    # a layer with nothing left runs its LayerNorms, unless the model ships without it
    assert table.predict_ms([0], [0]) == pytest.approx(11.5)
    assert table.predict_ms([0], [0], drop_empty_layers=True) == pytest.approx(10.0)
    with pytest.raises(UsageError, match="layer_heads has 2 layers"):
        table.predict_ms([1, 1], [8])


def test_a_table_measured_against_the_smallest_blocks_refuses_one_empty_block():
    table = hand_table("smallest")
    assert table.attention_ms(1) == 0.0 and table.ffn_ms(1) == 0.0
    assert table.predict_ms([1, 3], [1, 64]) == pytest.approx(10.0 + 1.5 + (1.5 + 2.5 + 9.0))
    with pytest.raises(UsageError, match="cannot build an empty block"):
        table.predict_ms([0], [8])
    assert table.predict_ms([0, 2], [0, 8], drop_empty_layers=True) == pytest.approx(10.0 + 1.5 + 1.5 + 2.0)


def test_to_dict_round_trips():
    table = hand_table()
    assert LatencyTable.from_dict(table.to_dict()) == table


def test_unknown_runtime_and_unsupported_family_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="ort-int8, ort-fp32, torch"):
        latency_table(tiny_config(), runtime="tensorrt-int4", cache_dir=tmp_path)
    with pytest.raises(UsageError, match="no latency table for model type 'gpt2'"):
        latency_table(GPT2Config(n_layer=1, n_embd=32, n_head=4), runtime="torch", cache_dir=tmp_path)
    with pytest.raises(UsageError, match="outside 1..64"):
        latency_table(tiny_config(), runtime="torch", cache_dir=tmp_path, width_points=(8, 128))


def test_the_cuda_runtime_is_refused_where_its_provider_cannot_run():
    from compress.export.ort import usable_providers

    if "CUDAExecutionProvider" in usable_providers():
        pytest.skip("onnxruntime's CUDA provider runs here")
    with pytest.raises(UsageError, match="runtime 'ort-cuda-fp16'"):
        lt.check_runtime("ort-cuda-fp16")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPRESS_CACHE_DIR", str(tmp_path))
    assert lt.default_cache_dir() == tmp_path / "latency"
    monkeypatch.delenv("COMPRESS_CACHE_DIR")
    assert lt.default_cache_dir().parts[-3:] == (".cache", "compress", "latency")


# ----------------------------------------------------------------------------- measured tables


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One int8 table of the tiny BERT, built and cached."""
    cache = tmp_path_factory.mktemp("latency-cache")
    return latency_table(tiny_config(), cache_dir=cache, **SMALL), cache


def test_table_grows_with_kept_heads_and_width(built):
    table, _ = built
    assert table.reference == "empty" and table.heads[0] == 0 and table.widths[0] == 0
    assert table.attention_ms(0) == 0.0 and table.ffn_ms(0) == 0.0
    assert table.heads[-1] == 4 and table.widths[-1] == 64 and 8 in table.widths
    att = [table.attention_ms(h) for h in range(table.heads[0], 5)]
    ffn = [table.ffn_ms(w) for w in range(table.widths[0], 65)]
    assert att == sorted(att) and ffn == sorted(ffn)
    assert min(att + ffn) >= 0.0 and table.base_ms > 0.0
    assert table.dense_ms > 0.0
    # the block sum, plus the measured dense time it does not explain (never negative)
    assert table.residual_ms == pytest.approx(max(0.0, table.dense_ms - table.dense_predicted_ms))
    assert table.predict_ms([4, 4], [64, 64]) == pytest.approx(table.dense_predicted_ms + table.residual_ms)
    assert table.predict_ms([4, 4], [64, 64]) == pytest.approx(max(table.dense_ms, table.dense_predicted_ms))
    fused = {c["name"]: c["fused_ops"] for c in table.configs}
    assert set(fused) >= {"base", "base_small", "reference", "dense"}
    # the reference layer has no block left to fuse; the 4-head one has its Attention fused
    assert "Attention" not in fused["reference"] and "BiasGelu" not in fused["reference"]
    assert fused["heads=4"]["Attention"] == 1 and fused["dense"]["Attention"] == 2
    assert table.key["runtime"] == "ort-int8" and table.key["shape"]["hidden"] == 32


def test_cache_hit_times_nothing_and_a_rebuild_agrees_with_the_first(tmp_path, monkeypatch):
    # wider and longer than the other tests' tables: a few milliseconds per call, so that two builds
    # compare within a loose bound on a shared machine
    cfg = tiny_config(hidden_size=64, intermediate_size=256)
    small = {"runtime": "ort-fp32", "batch": 8, "seq_len": 64, "repeats": 10, "head_points": (4,),
             "width_points": (256,)}
    table = latency_table(cfg, cache_dir=tmp_path, **small)
    assert table.heads == (0, 1, 4) and table.widths == (0, 1, 256)  # 1 and the full size always
    assert table.attention_ms(2) == pytest.approx((table.attention_ms(1) * 2 + table.attention_ms(4)) / 3)
    calls = []
    real = lt.measure_interleaved

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lt, "measure_interleaved", counting)
    again = latency_table(cfg, cache_dir=tmp_path, **small)
    assert again == table and calls == []
    assert len(list(tmp_path.glob("*.json"))) == 1
    other = latency_table(cfg, cache_dir=tmp_path, rebuild=True, **small)
    # the grid models, then the dense one (timed again if it disagrees with its blocks on a busy machine)
    assert 2 <= len(calls) <= 2 + lt.DENSE_RETRIES
    assert other.key == table.key and other != table
    assert other.dense_predicted_ms == pytest.approx(table.dense_predicted_ms, rel=0.5)


def test_the_cache_key_names_machine_runtime_shape_and_input_size():
    shape = lt.arch_shape(tiny_config())
    rt = lt.check_runtime("ort-int8")
    key = lt.cache_key(shape, rt, 32, 128, 2, (1, 2), (1, 64), "empty")
    assert set(key["machine"]) >= {"cpu", "cores", "onnxruntime", "torch"}
    assert key["shape"] == {"model_type": "bert", "hidden": 32, "heads": 4, "head_dim": 8, "ffn": 64,
                            "layers": 2, "vocab": 2000, "activation": "gelu"}
    for other in (lt.cache_key(shape, rt, 1, 128, 2, (1, 2), (1, 64), "empty"),
                  lt.cache_key(shape, lt.check_runtime("torch"), 32, 128, 2, (1, 2), (1, 64), "empty"),
                  lt.cache_key(dataclasses.replace(shape, hidden=64), rt, 32, 128, 2, (1, 2), (1, 64),
                               "empty"),
                  lt.cache_key(shape, rt, 32, 128, 1, (1, 2), (1, 64), "empty"),  # threads
                  lt.cache_key(shape, rt, 32, 64, 2, (1, 2), (1, 64), "empty"),  # sequence length
                  lt.cache_key(shape, rt, 32, 128, 2, (1, 2), (1, 64), "empty",
                               {"relative_attention": True})):
        assert lt.cache_file(lt.Path("c"), other) != lt.cache_file(lt.Path("c"), key)
    assert key["int8_scheme"] == lt.INT8_SCHEME and key["format"] == lt.FORMAT


def test_two_deberta_configs_of_the_same_sizes_but_other_attention_have_other_keys():
    from transformers import DebertaV2Config

    common = dict(vocab_size=2000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    plain = lt.attention_options(DebertaV2Config(**common, relative_attention=False))
    relative = lt.attention_options(DebertaV2Config(**common, relative_attention=True,
                                                    pos_att_type=["p2c", "c2p"], position_buckets=32))
    assert plain != relative and relative["pos_att_type"] == ["p2c", "c2p"]


def test_family_without_empty_blocks_is_measured_against_the_smallest(tmp_path):
    cfg = DistilBertConfig(vocab_size=500, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                           max_position_embeddings=64)
    table = latency_table(cfg, runtime="torch", cache_dir=tmp_path, **SMALL)
    assert table.reference == "smallest" and table.key["shape"]["model_type"] == "distilbert"
    assert table.heads[0] == 1 and table.widths[0] == 1 and table.attention_ms(1) == 0.0
    with pytest.raises(UsageError, match="cannot build an empty block"):
        table.attention_ms(0)
    # the sum of the blocks, plus what the measured dense model took beyond it (0 when it took less)
    assert table.predict_ms([4, 4], [64, 64]) == pytest.approx(table.dense_predicted_ms + table.residual_ms)


def test_the_dense_prediction_is_stored_beside_the_measurement(built):
    table, _ = built
    fields = {f.name for f in dataclasses.fields(table)}
    assert {"dense_ms", "dense_predicted_ms", "build_seconds", "phase_seconds"} <= fields
    assert table.build_seconds > 0 and set(table.phase_seconds) >= {"export_s", "timing_s"}



def test_the_unexplained_dense_time_scales_every_prediction_and_leaves_speedups_as_ratios_of_sums():
    table = hand_table()
    dense_heads, dense_ffn = table.dense_layout()
    raw = 10.0 + 2 * (1.5 + 3.0 + 9.0)  # base + 2 x (fixed + A(4) + F(64)), by hand
    small = 10.0 + 2 * 1.5 + 1.0 + 2.0  # heads 1 and 0, widths 8 and 0
    unmeasured = dataclasses.replace(table, dense_ms=0.0, dense_predicted_ms=0.0)
    assert unmeasured.dense_scale == 1.0
    assert unmeasured.predict_ms(dense_heads, dense_ffn) == pytest.approx(raw)
    # measured 40 ms against its 37 ms sum: every prediction x 40/37, the dense one exactly 40
    charged = dataclasses.replace(table, dense_ms=40.0, dense_predicted_ms=raw, residual_ms=40.0 - raw)
    assert charged.dense_scale == pytest.approx(40.0 / raw)
    assert charged.predict_ms(dense_heads, dense_ffn) == pytest.approx(40.0)
    assert charged.predict_ms([1, 0], [8, 0]) == pytest.approx(small * 40.0 / raw)
    assert charged.predicted_speedup([1, 0], [8, 0]) == pytest.approx(raw / small)
    # a dense timing below its sum scales nothing
    faster = dataclasses.replace(table, dense_ms=30.0, dense_predicted_ms=raw)
    assert faster.dense_scale == 1.0 and faster.predict_ms([1, 0], [8, 0]) == pytest.approx(small)


# ----------------------------------------------------------------------------- trusting a table


def test_a_dense_timing_far_from_its_blocks_is_retimed_then_refused():
    from compress.core.errors import MeasurementError

    def trusted(dense, predicted, retime_dense, retime_blocks=lambda: 1 / 0):
        return lt.trusted_timings(predicted, dense, lambda p: p, retime_blocks, retime_dense, "32x128")

    assert trusted(100.0, 95.0, lambda: 1 / 0) == (95.0, 100.0)  # within 15%: no retiming
    # far above, then within: the new dense timing is used, the blocks are not timed again
    times = iter([110.0])
    assert trusted(300.0, 100.0, lambda: next(times)) == (100.0, 110.0)
    # far above every time: refused, naming both times and that the dense model ran slow
    calls = []
    refused = r"timed 250\.0 ms at 32x128 against 100\.0 ms.*dense model ran"
    with pytest.raises(MeasurementError, match=refused):
        trusted(250.0, 100.0, lambda: calls.append(1) or 250.0)
    assert len(calls) == lt.DENSE_RETRIES
    # a tiny model's sub-millisecond gap is within the absolute floor, either way
    assert trusted(1.5, 0.5, lambda: 1 / 0) == (0.5, 1.5)
    assert trusted(0.5, 1.5, lambda: 1 / 0) == (1.5, 0.5)


def test_blocks_whose_sum_is_far_above_the_dense_timing_are_timed_again_then_refused():
    from compress.core.errors import MeasurementError

    # the sum 598 against 173: the grid ran on a busy machine; timed again it sums to 160
    sums = iter([160.0])
    assert lt.trusted_timings(598.0, 173.0, lambda p: p, lambda: next(sums), lambda: 1 / 0, "32x128") == (
        160.0, 173.0)
    assert lt.dense_gap(173.0, 598.0) == -1 and lt.dense_gap(173.0, 160.0) == 0
    assert lt.dense_gap(173.0, 173.0 * 1.15 + 0.1) == -1  # 15% of the smaller of the two
    calls = []
    with pytest.raises(MeasurementError, match=r"timed 173\.0 ms at 32x128 against 598\.0 ms.*blocks ran"):
        lt.trusted_timings(598.0, 173.0, lambda p: p, lambda: calls.append(1) or 598.0, lambda: 1 / 0,
                           "32x128")
    assert len(calls) == lt.DENSE_RETRIES
    # a sum of nothing is never trusted
    assert lt.dense_gap(5.0, 0.0) == -1


def test_a_table_built_while_its_blocks_ran_slow_keeps_the_calm_retiming(monkeypatch):
    cfg = tiny_config()
    rt = lt.check_runtime("ort-int8")
    shape, heads, widths, reference, key = lt.table_plan(cfg, rt, 2, 16, 1, width_points=(8, 32))
    runs = []

    def fake_time_layouts(config, layouts, runtime, batch, seq_len, threads, repeats, copies=None):
        runs.append(sorted(layouts))
        slow = 4.0 if len(runs) == 1 else 1.0  # the first grid run on a busy machine
        stats = {}
        for name, (h, w, _) in layouts.items():
            ms = 2.0 + sum(0.5 + 0.25 * x + 0.01 * y for x, y in zip(h, w))
            ms = ms if name == "dense" else ms * slow
            stats[name] = {"median_ms": ms, "p90_ms": ms, "fused_ops": {}}
        return stats, {"export_s": 0.1, "timing_s": 0.2}

    monkeypatch.setattr(lt, "time_layouts", fake_time_layouts)
    table = lt.build_table(cfg, shape, rt, 2, 16, 1, heads, widths, reference, 3, key)
    # grid (slow), dense, grid again (calm); the dense model is not timed twice
    assert [r == ["dense"] for r in runs] == [False, True, False]
    assert lt.dense_gap(table.dense_ms, table.dense_predicted_ms) == 0
    assert table.attention_ms(4) == pytest.approx(1.0)  # the calm grid's 4 x 0.25
    assert table.dense_ms == pytest.approx(2.0 + 2 * (0.5 + 1.0 + 0.64))


@pytest.mark.parametrize("change", [
    {"base_ms": -1000.0}, {"layer_fixed_ms": float("nan")}, {"dense_ms": float("inf")},
    {"attention_grid_ms": (0.0, 1.0, 1.5)}, {"ffn_grid_ms": (0.0, "2", 9.0)}, {"dense_ms": 400.0},
    {"dense_ms": 20.0},  # the blocks' 37 ms sum far above it: a grid timed on a busy machine
    {"key": {"other": 1}},
])
def test_a_cached_table_that_is_not_sane_is_measured_again(change, tmp_path, monkeypatch):
    good = hand_table()
    assert lt.sane_table(good, good.key)
    bad = dataclasses.replace(good, **change)
    assert not lt.sane_table(bad, good.key)
    # written where the cache looks for the key, it is not used: the table is built again
    cfg = tiny_config()
    shape = lt.arch_shape(cfg)
    heads = lt._grid(None, lt.head_grid(shape.heads), shape.heads, "head")
    widths = lt._grid((8, 32), lt.width_grid(shape.ffn), shape.ffn, "width")
    import torch

    key = lt.cache_key(shape, lt.check_runtime("ort-int8"), 2, 16, torch.get_num_threads(), heads, widths,
                       "empty")
    stored = dataclasses.replace(bad, key=key) if "key" not in change else bad
    path = lt.cache_file(tmp_path, key)
    path.write_text(__import__("json").dumps({"key": key, "table": stored.to_dict()}))
    built = []
    monkeypatch.setattr(lt, "build_table",
                        lambda *a, **k: built.append(1) or dataclasses.replace(good, key=key))
    table = latency_table(cfg, cache_dir=tmp_path, **SMALL)
    assert built == [1] and table.key == key


def test_an_unwritable_cache_folder_is_refused_before_any_timing(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(lt, "build_table", lambda *a, **k: pytest.fail("timed before refusing"))
    with pytest.raises(UsageError, match="not writable.*COMPRESS_CACHE_DIR"):
        latency_table(tiny_config(), cache_dir=blocker / "cache", **SMALL)


def test_a_built_table_charges_the_dense_time_its_blocks_do_not_explain(monkeypatch):
    """build_table on stubbed timings (no model is timed): A(h) = 0.5 h ms, F(w) = 0.05 w ms, 1 ms
    fixed per layer, a 10 ms base; the 2-layer dense model's blocks sum to 22.4 ms and it is timed
    at 24 ms, so the table stores a 1.6 ms residual and scales every prediction by 24 / 22.4."""
    def medians(name: str) -> float:
        if name.startswith("heads="):
            return 7.0 + 0.5 * int(name[6:])
        if name.startswith("ffn="):
            return 7.0 + 0.05 * int(name[4:])
        return {"base": 10.0, "base_small": 6.0, "reference": 7.0, "dense": 24.0}[name]

    def time_layouts(config, layouts, *args, **kwargs):
        stats = {n: {"median_ms": medians(n), "p90_ms": medians(n), "fused_ops": {}} for n in layouts}
        return stats, {"export_s": 0.0, "timing_s": 0.0}

    monkeypatch.setattr(lt, "time_layouts", time_layouts)
    cfg = tiny_config()
    table = lt.build_table(cfg, lt.arch_shape(cfg), lt.check_runtime("ort-int8"), 2, 16, 1, (1, 2, 3, 4),
                           (1, 8, 32, 64), "empty", 3, {})
    assert table.layer_fixed_ms == pytest.approx(1.0) and table.base_ms == 10.0
    assert table.attention_ms(4) == pytest.approx(2.0) and table.ffn_ms(64) == pytest.approx(3.2)
    assert table.dense_predicted_ms == pytest.approx(10.0 + 2 * (1.0 + 2.0 + 3.2))
    assert table.dense_ms == 24.0 and table.residual_ms == pytest.approx(1.6)
    assert table.predict_ms(*table.dense_layout()) == pytest.approx(24.0)
    assert table.predict_ms([1, 0], [8, 0]) == pytest.approx((10.0 + 2 * 1.0 + 0.5 + 0.4) * 24.0 / 22.4)


def test_tables_of_another_length_or_thread_count_are_measured_and_cached_apart(tmp_path, monkeypatch):
    built = []

    def build_table(config, shape, runtime, batch, seq_len, threads, *args):
        built.append((seq_len, threads))
        return dataclasses.replace(hand_table(), key=args[-1], batch=batch, seq_len=seq_len)

    monkeypatch.setattr(lt, "build_table", build_table)
    cfg = tiny_config()
    for seq_len, threads in ((16, 1), (16, 1), (32, 1), (16, 2), (32, 1)):
        table = latency_table(cfg, cache_dir=tmp_path, batch=2, seq_len=seq_len, threads=threads,
                              width_points=(8, 32))
        assert table.seq_len == seq_len and table.key["threads"] == threads
    assert built == [(16, 1), (32, 1), (16, 2)]  # the repeats were read from the cache
    assert len(list(tmp_path.glob("*.json"))) == 3
