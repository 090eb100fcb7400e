"""compress bench's PyTorch peers (torch-fp16/bf16/compile/int8) beside eager and onnxruntime: each
one runs, matches eager fp32 logits, appears in the table; runtimes that cannot run here are listed
with their reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compress.export.loading import LoadedModel, load_torch_model
from compress.export.onnx import export_onnx
from compress.export.optimize import optimize_onnx
from compress.export.precision import convert_to_half
from compress.measure.bench import (
    PEER_ATOL,
    RUNTIMES,
    TORCH_PEERS,
    BenchConfig,
    _onnx_vocab,
    check_peer_parity,
    format_bench,
    onnx_precision,
    torch_peer,
)
from compress.recipes.bench import run_bench
from compress.recipes.export import ExportConfig, run_export

pytestmark = pytest.mark.filterwarnings("ignore")
GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def bench(tiny_bert, tmp_path_factory):
    """Every runtime at once on the tiny BERT, plus its fp16 export, at the one shape torch.compile
    already compiled for its parity check (batch 2 x 16), so the test compiles once."""
    folder = tmp_path_factory.mktemp("bench")
    half = folder / "half.onnx"
    run_export(ExportConfig(model=str(tiny_bert), to=str(half), precision="fp16"))
    cfg = BenchConfig(models=(f"base={tiny_bert}", f"half={half}"), runtimes=RUNTIMES, batch_sizes=(2,),
                      seq_lens=(16,), warmup=1, iterations=2, rounds=1, settle_s=0.0, matmul_n=64,
                      provider="auto", out=str(folder / "run"))
    return run_bench(cfg)


def test_every_runtime_runs_or_says_why_not(bench):
    runs = {(r["model"], r["runtime"]) for r in bench["rows"]}
    here = {"torch", "ort", "torch-compile"} | ({"torch-fp16", "torch-bf16"} if GPU else {"torch-int8"})
    assert runs == {("base", rt) for rt in here} | {("half", "ort-fp16")}
    skipped = {(s["model"], s["runtime"]): s["reason"] for s in bench["skipped"]}
    if GPU:  # the tiny BERT is dense (and its 32-wide matrices too small for the 2:4 kernels)
        assert set(skipped) == {("base", "torch-int8"), ("base", "torch-sparse")}
        assert "CPU only" in skipped[("base", "torch-int8")]
    else:
        assert set(skipped) == {("base", "torch-fp16"), ("base", "torch-bf16"), ("base", "torch-sparse")}
        assert all(why.startswith("GPU only") for why in skipped.values())


def test_peers_match_eager_fp32_logits(bench):
    parity = bench["models"][0]["peer_parity"]
    assert set(parity) == set(TORCH_PEERS) - {s["runtime"] for s in bench["skipped"]}
    for runtime, p in parity.items():
        assert p["max_abs_diff"] <= PEER_ATOL[runtime] and p["argmax_agreement"] == 1.0, runtime
    assert parity["torch-compile"]["max_abs_diff"] <= 1e-4  # float32 both sides
    assert parity["torch-compile"]["compile_s"] > 0


def test_peer_rows_are_timed_against_the_same_baseline(bench):
    by = {(r["model"], r["runtime"]): r for r in bench["rows"]}
    assert bench["baseline"] == "base (torch)" and by[("base", "torch")]["vs_baseline"] == pytest.approx(1.0)
    for r in bench["rows"]:
        assert r["iterations"] == 2 and r["mean_ms"] > 0 and r["vs_baseline"] > 0
    compiled = by[("base", "torch-compile")]
    assert compiled["compile_s"] > 0  # the first call at the grid shape, taken before the timed calls
    assert all("compile_s" not in r for r in bench["rows"] if r["runtime"] != "torch-compile")
    saved = json.loads((Path(bench["run_dir"]) / "bench.json").read_text())
    assert saved["skipped"] == bench["skipped"]


def test_table_names_every_row_skip_and_compile_time(bench):
    text = format_bench(bench)
    for r in bench["rows"]:
        assert any(line.startswith(f"{r['model']:<28} {r['runtime']:<13}") for line in text.splitlines())
    skips = [line for line in text.splitlines() if line.startswith("skipped: ")]
    assert len(skips) == len(bench["skipped"]) and all(s["reason"] in text for s in bench["skipped"])
    assert "torch-compile: compilation (first call at each shape, not in the timings): base 2x16" in text


def test_peers_that_cannot_run_on_the_device_give_one_line_reasons(tiny_bert):
    loaded = load_torch_model(str(tiny_bert), attn_implementation=None)
    for runtime in ("torch-fp16", "torch-bf16"):
        assert torch_peer(loaded, runtime, "cpu").startswith("GPU only")
    assert torch_peer(loaded, "torch-int8", "cuda").startswith("CPU only")  # decided before any copy


def test_int8_peer_quantizes_every_linear_on_a_copy(tiny_bert):
    loaded = load_torch_model(str(tiny_bert), attn_implementation=None)
    call = torch_peer(loaded, "torch-int8", "cpu")
    p = check_peer_parity(loaded, call, "torch-int8", "cpu")
    assert p["max_abs_diff"] <= PEER_ATOL["torch-int8"]
    assert any(isinstance(m, torch.nn.Linear) for m in loaded.model.modules())  # eager model untouched


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("runtime", ["torch-fp16", "torch-bf16"])
def test_half_precision_peers_on_the_gpu(tiny_bert, runtime):
    loaded = load_torch_model(str(tiny_bert), attn_implementation=None)
    loaded.model.to("cuda")
    p = check_peer_parity(loaded, torch_peer(loaded, runtime, "cuda"), runtime, "cuda")
    assert p["max_abs_diff"] <= PEER_ATOL[runtime]


def test_onnx_rows_say_their_precision_and_token_range_through_fused_embeddings(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64, attn_implementation="eager")
    loaded = LoadedModel(BertForSequenceClassification(cfg).eval(),
                         ("input_ids", "attention_mask", "token_type_ids"), "bert")
    fp32 = export_onnx(loaded, tmp_path / "m.onnx")
    optimize_onnx(fp32, tmp_path / "o.onnx", 4, 32)
    assert _onnx_vocab(str(tmp_path / "o.onnx")) == 500  # EmbedLayerNormalization holds the word table
    assert onnx_precision(str(tmp_path / "o.onnx")) == "fp32"
    convert_to_half(tmp_path / "o.onnx", tmp_path / "h.onnx", "bf16")
    assert onnx_precision(str(tmp_path / "h.onnx")) == "bf16" and _onnx_vocab(str(tmp_path / "h.onnx")) == 500


def test_two_four_linears_are_found_and_torch_sparse_says_why_not_on_a_cpu():
    from compress.measure.bench import semi_structured_unavailable, two_four_linears

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.Linear(64, 48))
    with torch.no_grad():
        for i in (0, 3):  # 2:4 on the first (shape fits the kernels) and the last (48 rows do not):
            groups = model[i].weight.data.reshape(-1, 4)  # the two smallest |w| of each group of 4 -> 0
            groups.scatter_(1, groups.abs().argsort(dim=1)[:, :2], 0.0)
    assert two_four_linears(model) == ["0"]  # "2" is dense, "3" has 48 output rows
    model[0].weight.data[0, 0:4] = 1.0  # one group with no zero left
    assert two_four_linears(model) == []
    if not torch.cuda.is_available():
        assert "GPU only" in semi_structured_unavailable("cpu")


def test_torch_sparse_peer_is_skipped_with_its_reason_on_a_cpu(tiny_bert):
    loaded = load_torch_model(str(tiny_bert), attn_implementation=None)
    why = torch_peer(loaded, "torch-sparse", "cpu")
    assert isinstance(why, str) and "compute capability >= 8.0" in why


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_torch_sparse_peer_runs_a_two_four_model_on_the_gpu():
    from transformers import BertConfig, BertForSequenceClassification

    from compress.export.loading import LoadedModel as LM
    from compress.measure.bench import semi_structured_unavailable, two_four_linears

    if semi_structured_unavailable("cuda"):
        pytest.skip(semi_structured_unavailable("cuda"))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=256)
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for mod in model.bert.encoder.modules():
            if isinstance(mod, torch.nn.Linear):
                groups = mod.weight.data.reshape(-1, 4)
                groups.scatter_(1, groups.abs().argsort(dim=1)[:, :2], 0.0)
    assert len(two_four_linears(model.bert.encoder)) == 12
    loaded = LM(model.to("cuda"), ("input_ids", "attention_mask", "token_type_ids"), "bert")
    call = torch_peer(loaded, "torch-sparse", "cuda")
    assert not isinstance(call, str), call
    p = check_peer_parity(loaded, call, "torch-sparse", "cuda", batch=32, length=64)
    assert p["max_abs_diff"] <= PEER_ATOL["torch-sparse"]
