"""Latency statistics, matmul peak, and the report helpers (VNNI detection, verdicts, disk sizes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.core.errors import UsageError
from compress.measure.latency import (
    latency_stats,
    matmul_peak_gflops,
    measure_interleaved,
    measure_latency,
    percentile,
)
from compress.measure.params import count_params
from compress.measure.verdict import (
    cpu_has_avx2,
    cpu_vnni_flags,
    disk_sizes,
    exported_kind,
    is_structured_source,
    read_export_report,
    speed_verdict,
)


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50):
        xs = rng.random(n).tolist()
        for q in (0, 50, 90, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_measure_latency_with_a_fake_clock():
    calls = []
    ticks = iter([0.0, 0.010, 1.0, 1.030, 2.0, 2.020, 3.0, 3.100])  # 10, 30, 20, 100 ms

    def fn():
        calls.append(1)

    s = measure_latency(fn, warmup=2, iterations=4, clock=lambda: next(ticks))
    assert len(calls) == 6  # warm-up calls are made but not timed
    assert s["iterations"] == 4 and s["warmup"] == 2
    assert s["mean_ms"] == pytest.approx(40.0)
    assert s["median_ms"] == pytest.approx(25.0)
    assert s["min_ms"] == pytest.approx(10.0) and s["max_ms"] == pytest.approx(100.0)
    assert s["p90_ms"] == pytest.approx(float(np.percentile([10, 30, 20, 100], 90)))
    assert latency_stats([0.001])["p90_ms"] == pytest.approx(1.0)


def test_measure_interleaved_takes_turns_and_pools_rounds(monkeypatch):
    calls = []
    now = [0.0]

    def sleep(s):  # the idle pause moves the clock: timing it would show in the means
        calls.append(f"sleep {s}")
        now[0] += s

    monkeypatch.setattr("compress.measure.latency.time.sleep", sleep)
    cost = {"a": 0.010, "b": 0.030}  # seconds per call; round 2 runs twice as slow (drift)

    def make(name):
        def fn():
            calls.append(name)
            # warm-up a, b; round 1: 2 x (turn call + 2 timed); the calls after those 8 are slower
            now[0] += cost[name] * (2 if len([c for c in calls if "sleep" not in c]) > 2 + 6 else 1)
        return fn

    s = measure_interleaved({"a": make("a"), "b": make("b")}, warmup=1, iterations=2, rounds=2,
                            clock=lambda: now[0])
    # one warm-up each; each turn: idle pause, one untimed call, two timed; order reversed in round 2
    turn = {n: ["sleep 0.1", n, n, n] for n in "ab"}
    assert calls == ["a", "b", *turn["a"], *turn["b"], *turn["b"], *turn["a"]]
    assert s["a"]["round_mean_ms"] == pytest.approx([10.0, 20.0])
    assert s["b"]["round_mean_ms"] == pytest.approx([30.0, 60.0])
    assert s["a"]["iterations"] == 4 and s["a"]["rounds"] == 2
    assert s["a"]["mean_ms"] == pytest.approx(15.0) and s["b"]["mean_ms"] == pytest.approx(45.0)
    with pytest.raises(UsageError, match="--rounds"):
        measure_interleaved({"a": make("a")}, rounds=0)
    with pytest.raises(UsageError, match="--settle-s"):
        measure_interleaved({"a": make("a")}, settle_s=-1.0)


def test_measure_interleaved_alone_or_without_pause_never_sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr("compress.measure.latency.time.sleep", slept.append)
    calls = []
    measure_interleaved({"a": lambda: calls.append("a")}, warmup=1, iterations=3, rounds=2)
    assert slept == [] and calls == ["a"] * 7  # alone: no pause and no per-turn call
    measure_interleaved({"a": lambda: None, "b": lambda: None}, warmup=0, iterations=1, rounds=3,
                        settle_s=0.0)
    assert slept == []


def test_measure_latency_rejects_zero_iterations():
    with pytest.raises(UsageError, match="--iterations"):
        measure_latency(lambda: None, iterations=0)


def test_matmul_peak_is_a_positive_rate():
    r = matmul_peak_gflops(n=256, repeats=2)
    assert r["gflops"] > 0.1 and r["n"] == 256 and r["threads"] >= 1


def test_vnni_detection_from_cpuinfo_text():
    assert cpu_vnni_flags("processor : 0\nflags : fpu sse avx2 avx512_vnni\n") == ["avx512_vnni"]
    assert cpu_vnni_flags("flags\t\t: fpu avx_vnni avx2\n") == ["avx_vnni"]
    assert cpu_vnni_flags("flags : fpu sse avx2\n") == []
    assert cpu_has_avx2("flags : fpu sse avx2\n") and not cpu_has_avx2("flags : fpu sse4_2\n")


def test_speed_verdicts():
    assert speed_verdict(unstructured_sparsity=0.9, vnni=[])["faster"] == "storage only"
    assert speed_verdict(structured=True, vnni=[])["faster"] == "yes"
    assert speed_verdict(int8=True, vnni=["avx512_vnni"])["faster"] == "yes"
    assert speed_verdict(int8=True, vnni=[], avx2=False)["faster"] == "unlikely"
    assert speed_verdict(int8=True, vnni=[], avx2=True)["faster"] == "likely"  # AVX2 int8 kernels
    assert speed_verdict(vnni=[])["faster"] == "no compression"
    assert speed_verdict(distilled=True, vnni=[])["faster"] == "yes"
    assert speed_verdict(distilled=True, int8=True, vnni=[])["faster"] == "yes"  # still a student
    assert speed_verdict(structured=True, int8=True, vnni=[])["faster"] == "yes"


def test_exported_kind_reads_the_export_report(tmp_path):
    onnx_file = tmp_path / "m.onnx"
    assert exported_kind(onnx_file) is None  # no report
    (tmp_path / "m.json").write_text('{"kind": "student"}')
    assert exported_kind(onnx_file) == "student"
    (tmp_path / "m.json").write_text("not json")
    assert exported_kind(onnx_file) is None
    (tmp_path / "m.json").write_text("[1, 2]")  # JSON, but not a report
    assert read_export_report(onnx_file) is None and exported_kind(onnx_file) is None


def test_structured_source_is_read_from_the_config(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "layer_heads": [4, 2]}')
    assert is_structured_source(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert not is_structured_source(str(tmp_path))
    assert not is_structured_source(None) and not is_structured_source(str(tmp_path / "gone"))


def test_zeros_compress_on_disk(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    dense = torch.randn(256, 256)
    sparse = dense.clone()
    sparse[sparse.abs() < 1.0] = 0.0  # ~68% zeros
    save_file({"w": dense}, tmp_path / "dense.safetensors")
    save_file({"w": sparse}, tmp_path / "sparse.safetensors")
    d, s = disk_sizes(tmp_path / "dense.safetensors"), disk_sizes(tmp_path / "sparse.safetensors")
    assert d["bytes"] == s["bytes"]  # stored densely: same raw size
    assert s["gzip_bytes"] < 0.6 * d["gzip_bytes"]  # but zeros compress
    assert d["gzip_ratio"] > 0.85  # random fp32 barely compresses


def test_disk_size_of_a_folder_is_the_model_without_masks_or_mlm_head(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.randn(64, 64)}, tmp_path / "model.safetensors")
    alone = disk_sizes(tmp_path)
    save_file({"w": torch.ones(64, 64, dtype=torch.bool)}, tmp_path / "masks.safetensors")
    save_file({"b": torch.randn(64)}, tmp_path / "mlm_head.safetensors")
    r = disk_sizes(tmp_path)
    assert r["files"] == ["model.safetensors"] and r["bytes"] == alone["bytes"]
    assert r["bytes"] == (tmp_path / "model.safetensors").stat().st_size


def test_count_params_groups_and_nonzeros():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.body = torch.nn.Linear(4, 4, bias=False)
            self.classifier = torch.nn.Linear(4, 2)

    m = M()
    with torch.no_grad():
        m.body.weight[:2] = 0
    r = count_params(m)
    assert (r["embeddings"], r["encoder"], r["head"]) == (40, 16, 10)
    assert r["total"] == 66 and r["encoder_nonzero"] == 8
    assert r["encoder_sparsity"] == pytest.approx(0.5)
