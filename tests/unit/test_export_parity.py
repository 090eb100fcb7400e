"""ONNX export parity (fp32 within 1e-4 on several shapes), optimizer fusion, int8, typed failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from compress.core.errors import ModelError, ParityError, UsageError
from compress.export.loading import load_torch_model, wrap_module
from compress.export.onnx import FP32_ATOL, check_parity, export_onnx
from compress.export.optimize import (
    attention_executions,
    attention_shape,
    fusion_summary,
    optimize_onnx,
    optimizer_model_type,
    order_residual_adds,
)
from compress.export.ort import OrtModel, resolve_provider, session_providers
from compress.export.quantize import INT8_ATOL, quantize_int8
from compress.measure.params import count_params, onnx_initializer_stats
from compress.recipes.export import ExportConfig, run_export
from tests.tiny_encoders import ARCHITECTURES

pytestmark = pytest.mark.filterwarnings("ignore")


# Stand-ins with the students' contract (forward(input_ids, attention_mask=None) -> logits), used
# until/in addition to the real students package.
class TinyBiLSTM(nn.Module):
    def __init__(self, vocab=300, dim=16, hidden=24, labels=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.rnn = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, labels)

    def forward(self, input_ids, attention_mask=None):
        h, _ = self.rnn(self.emb(input_ids))
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        m = m.unsqueeze(-1).to(h.dtype)
        return self.out((h * m).sum(1) / m.sum(1).clamp(min=1.0))


class TinyKimCNN(nn.Module):
    def __init__(self, vocab=300, dim=16, filters=8, labels=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(dim, filters, k, padding=k // 2) for k in (3, 4, 5))
        self.out = nn.Linear(3 * filters, labels)

    def forward(self, input_ids, attention_mask=None):
        x = self.emb(input_ids).transpose(1, 2)
        return self.out(torch.cat([F.relu(c(x)).amax(-1) for c in self.convs], dim=1))


class TinyLR(nn.Module):
    def __init__(self, vocab=300, labels=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, labels)

    def forward(self, input_ids, attention_mask=None):
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        e = self.emb(input_ids) * m.unsqueeze(-1)
        return self.out(e.sum(1) / m.sum(1, keepdim=True).clamp(min=1))


def _prune_magnitude(model: nn.Module, fraction: float) -> None:
    """Zero the smallest-magnitude ``fraction`` of every encoder Linear weight (unstructured)."""
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear) and "encoder" in name:
                k = int(mod.weight.numel() * fraction)
                thresh = mod.weight.abs().flatten().kthvalue(k).values
                mod.weight[mod.weight.abs() <= thresh] = 0.0


def test_bert_fp32_parity_on_several_shapes(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    assert loaded.input_names == ("input_ids", "attention_mask", "token_type_ids")
    path = export_onnx(loaded, tmp_path / "m.onnx")
    r = check_parity(loaded, path)
    assert r["max_abs_diff"]["logits"] <= FP32_ATOL and len(r["shapes"]) >= 3
    ort = OrtModel(path)
    assert ort.input_names == loaded.input_names  # declared inputs
    ids = torch.randint(100, 1000, (5, 23))  # a batch/length never seen at export: dynamic axes
    assert ort(ids).shape == (5, loaded.model.config.num_labels)


def test_bound_call_gives_the_plain_run_outputs_on_inputs_placed_once(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    ort = OrtModel(export_onnx(loaded, tmp_path / "m.onnx"))
    ids = torch.randint(100, 1000, (3, 11))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    want = ort.run({"input_ids": ids, "attention_mask": mask})["logits"]
    call = ort.bind({"input_ids": ids, "attention_mask": mask})
    assert call() is None  # timed calls copy nothing back
    ids.fill_(101)  # the bound inputs were copied at bind time, not views of the tensor
    np.testing.assert_allclose(call(fetch=True)["logits"], want, rtol=0, atol=1e-6)
    assert not np.allclose(ort.run({"input_ids": ids, "attention_mask": mask})["logits"], want)


@pytest.mark.skipif("CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers()
                    or not torch.cuda.is_available(), reason="needs a GPU and onnxruntime's CUDA provider")
@pytest.mark.gpu
def test_bound_call_keeps_inputs_and_outputs_on_the_gpu(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    ort = OrtModel(export_onnx(loaded, tmp_path / "m.onnx"), provider="cuda")
    ids = torch.randint(100, 1000, (2, 9))
    want = ort.run({"input_ids": ids})["logits"]
    call = ort.bind({"input_ids": ids})
    assert all(v.device_name().lower() == "cuda" for v in call.inputs.values())
    np.testing.assert_allclose(call(fetch=True)["logits"], want, rtol=0, atol=1e-5)


def test_unstructured_pruned_bert_parity(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    _prune_magnitude(loaded.model, 0.6)
    path = export_onnx(loaded, tmp_path / "p.onnx")
    assert check_parity(loaded, path)["max_abs_diff"]["logits"] <= FP32_ATOL


def test_optimizer_fuses_attention_and_keeps_parity(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")
    fused = optimize_onnx(path, tmp_path / "o.onnx", 4, 32)
    assert fused["Attention"] == 2  # one per layer
    assert check_parity(loaded, tmp_path / "o.onnx")["max_abs_diff"]["logits"] <= FP32_ATOL


def _op_types(path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_optimizer_keeps_residual_layer_norm_unfused_unless_asked(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")
    fused = optimize_onnx(path, tmp_path / "o.onnx", 4, 32)
    assert "SkipLayerNormalization" not in fused
    assert "SkipLayerNormalization" not in _op_types(tmp_path / "o.onnx")
    assert fused["LayerNormalization"] == 4  # two per layer
    fused_skip = optimize_onnx(path, tmp_path / "s.onnx", 4, 32, skip_layer_norm=True)
    assert fused_skip["SkipLayerNormalization"] == 4
    for p in ("o.onnx", "s.onnx"):
        assert check_parity(loaded, tmp_path / p)["max_abs_diff"]["logits"] <= FP32_ATOL


def test_cpu_sessions_leave_skip_layer_norm_unfused(tiny_bert, tmp_path):
    """The optimizer name in CPU_DISABLED_OPTIMIZERS is one onnxruntime knows: with it disabled the
    graph the session runs keeps LayerNormalization; without, onnxruntime fuses it itself."""
    import onnxruntime as ort

    from compress.export.ort import CPU_DISABLED_OPTIMIZERS

    loaded = load_torch_model(str(tiny_bert))
    path = tmp_path / "o.onnx"
    optimize_onnx(export_onnx(loaded, tmp_path / "m.onnx"), path, 4, 32)
    ran = {}
    for name, disabled in (("off", list(CPU_DISABLED_OPTIMIZERS)), ("on", None)):
        opts = ort.SessionOptions()
        opts.optimized_model_filepath = str(tmp_path / f"session-{name}.onnx")
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"],
                             disabled_optimizers=disabled)
        ran[name] = _op_types(tmp_path / f"session-{name}.onnx")
    assert "SkipLayerNormalization" not in ran["off"] and "LayerNormalization" in ran["off"]
    assert "SkipLayerNormalization" in ran["on"]


def test_ort_model_disables_the_fusion_on_cpu(tiny_bert, tmp_path, monkeypatch):
    import onnxruntime as ort

    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")
    seen = []
    real = ort.InferenceSession

    def spy(*args, **kwargs):
        seen.append(kwargs.get("disabled_optimizers"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    OrtModel(path, provider="cpu")
    assert seen == [["SkipLayerNormFusion"]]


def test_structured_pruned_bert_exports_with_fusion(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    from compress.export.optimize import attention_shape
    from compress.pruning.structured import prune_structured

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64)
    model = BertForSequenceClassification(cfg).eval()
    prune_structured(model, 0.4)
    assert len(set(model.config.layer_heads)) > 1 or len(set(model.config.layer_intermediate)) > 1
    model.save_pretrained(tmp_path / "sp")
    loaded = load_torch_model(str(tmp_path / "sp"))
    assert loaded.model.config.layer_heads == model.config.layer_heads
    path = export_onnx(loaded, tmp_path / "sp.onnx")
    assert check_parity(loaded, path)["max_abs_diff"]["logits"] <= FP32_ATOL
    fused = optimize_onnx(path, tmp_path / "spo.onnx", *attention_shape(loaded))
    assert fused["Attention"] == 3
    line = fusion_summary("bert", "", fused, attention_executions(loaded))
    assert line.startswith("model type 'bert': Attention fused in 3 of 3 attention blocks")
    assert check_parity(loaded, tmp_path / "spo.onnx")["max_abs_diff"]["logits"] <= FP32_ATOL


def test_int8_parity_with_looser_tolerance(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")
    optimize_onnx(path, tmp_path / "o.onnx", 4, 32)
    q = quantize_int8(tmp_path / "o.onnx", tmp_path / "q.onnx")
    r = check_parity(loaded, q, atol=INT8_ATOL, label="int8")
    assert 0 < r["max_abs_diff"]["logits"] <= INT8_ATOL  # int8 is not bit-exact, but close
    assert q.stat().st_size < 0.5 * path.stat().st_size


def test_int8_per_channel_scales(tiny_bert, tmp_path):
    import onnx

    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")

    def scale_sizes(q):  # element counts of the weight scales of the quantized matrices
        inits = {i.name: i for i in onnx.load(str(q)).graph.initializer}
        return [int(np.prod(inits[n].dims)) for n in inits if n.endswith("_scale")]

    per_tensor = quantize_int8(path, tmp_path / "t.onnx", per_channel=False)
    per_channel = quantize_int8(path, tmp_path / "c.onnx")  # the default
    assert set(scale_sizes(per_tensor)) == {1}
    assert max(scale_sizes(per_channel)) == loaded.model.config.intermediate_size  # FFN up-projection
    r = check_parity(loaded, per_channel, atol=INT8_ATOL, label="int8")
    assert r["max_abs_diff"]["logits"] <= INT8_ATOL


def _weight_scale_sizes(path) -> list[int]:
    """Element counts of the weight scales of an int8 file's quantized matrices."""
    import onnx

    inits = {i.name: i for i in onnx.load(str(path)).graph.initializer}
    return [int(np.prod(inits[n].dims)) for n in inits if n.endswith("_scale")]


def test_the_int8_export_and_conversion_write_per_channel_scales_unless_per_tensor_is_asked(tiny_bert,
                                                                                           tmp_path):
    from compress.export.precision import PRECISIONS

    ffn = load_torch_model(str(tiny_bert)).model.config.intermediate_size
    fp32 = export_onnx(load_torch_model(str(tiny_bert)), tmp_path / "m.onnx")
    # the conversion the export and the latency table's timed models call, at its default
    PRECISIONS["int8"].convert(fp32, tmp_path / "c.onnx")
    assert max(_weight_scale_sizes(tmp_path / "c.onnx")) == ffn
    # compress export --quantize int8, then with --per-tensor
    run_export(ExportConfig(model=str(tiny_bert), to=str(tmp_path / "e.onnx"), quantize="int8"))
    assert max(_weight_scale_sizes(tmp_path / "e.onnx")) == ffn
    run_export(ExportConfig(model=str(tiny_bert), to=str(tmp_path / "t.onnx"), quantize="int8",
                            per_tensor=True))
    assert set(_weight_scale_sizes(tmp_path / "t.onnx")) == {1}


def test_int8_scales_per_output_column_keep_an_outlier_row_from_costing_the_others(tmp_path):
    # one output dimension of a linear layer has weights 50x the others' (BERT's FFN output
    # projection has such rows): one int8 scale per matrix leaves the other dimensions a handful
    # of levels, one per output column keeps them to within int8 rounding
    torch.manual_seed(0)
    lin = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        lin.weight[3] *= 50
    path = tmp_path / "lin.onnx"
    torch.onnx.export(lin, (torch.randn(4, 64),), str(path), input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    x = torch.randn(256, 64)
    want = lin(x).detach().numpy()

    def error(q):  # relative error of the 15 ordinary output dimensions
        got = OrtModel(q).run({"x": x.numpy()})["logits"]
        rest = [i for i in range(16) if i != 3]
        return float(np.abs(got[:, rest] - want[:, rest]).mean() / np.abs(want[:, rest]).mean())

    per_tensor = error(quantize_int8(path, tmp_path / "t.onnx", per_channel=False))
    per_channel = error(quantize_int8(path, tmp_path / "c.onnx"))
    assert per_channel < 0.02 < per_tensor and per_channel < per_tensor / 5
    # a node left out stays float32: the output is the float one
    import onnx

    matmul = next(n.name for n in onnx.load(str(path)).graph.node if n.op_type in ("MatMul", "Gemm"))
    kept = quantize_int8(path, tmp_path / "f.onnx", exclude=(matmul,))
    assert "MatMulInteger" not in {n.op_type for n in onnx.load(str(kept)).graph.node}
    assert error(kept) < 1e-6
    assert ExportConfig(to="m.onnx", quantize="int8").per_tensor is False  # per channel by default


def test_int8_dev_set_agreement_with_fp32(tiny_bert, tmp_path):
    report = run_export(ExportConfig(model=str(tiny_bert), to=str(tmp_path / "q.onnx"), quantize="int8",
                                     task="sample", eval_limit=16))
    acc = report["accuracy"]
    assert acc["fp32"]["n"] == acc["int8"]["n"] == 16 and "logits" not in acc["fp32"]
    assert 0.5 <= acc["int8"]["argmax_agreement"] <= 1.0
    assert 0 < acc["int8"]["max_abs_diff"] <= INT8_ATOL
    # agreement of 1.0 with equal scores is possible; a lower one means the scores may differ
    if acc["int8"]["argmax_agreement"] == 1.0:
        assert acc["int8"]["score"] == acc["fp32"]["score"]


def test_sdpa_export_does_not_fuse_but_eager_does(tiny_bert, tmp_path):
    """Why the exporter loads BERT with eager attention: the optimizer only fuses that graph."""
    counts = {}
    for attn in ("sdpa", "eager"):
        loaded = load_torch_model(str(tiny_bert), attn_implementation=attn)
        path = export_onnx(loaded, tmp_path / f"{attn}.onnx")
        counts[attn] = optimize_onnx(path, tmp_path / f"{attn}-opt.onnx", 4, 32).get("Attention", 0)
    assert counts == {"sdpa": 0, "eager": 2}
    line = fusion_summary("bert", "", {})
    assert line.startswith("the optimizer (model type 'bert') fused no Attention node")


@pytest.mark.parametrize("cls", [TinyBiLSTM, TinyKimCNN, TinyLR])
def test_student_like_modules_parity(cls, tmp_path):
    torch.manual_seed(0)
    loaded = wrap_module(cls())
    path = export_onnx(loaded, tmp_path / "s.onnx")
    assert check_parity(loaded, path)["max_abs_diff"]["logits"] <= FP32_ATOL


def test_parity_failure_names_output_and_max_difference(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")
    with torch.no_grad():
        loaded.model.classifier.bias += 0.25  # the torch model now differs from the exported one
    pattern = r"output 'logits' max \|diff\| 0\.25.* > 0\.0001 at batch x length 1x8"
    with pytest.raises(ParityError, match=pattern):
        check_parity(loaded, path)


def test_not_a_model(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_text("not a model")
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        OrtModel(junk)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelError, match="notes.txt is a file, not a model"):
        load_torch_model(str(text))
    with pytest.raises(ModelError, match="neither a model folder"):
        load_torch_model(str(tmp_path))
    with pytest.raises(UsageError, match="is an ONNX file"):
        load_torch_model(str(junk))


def test_cuda_sessions_run_float32_without_tf32():
    # onnxruntime's CUDA provider defaults to TF32 GEMMs, PyTorch's fp32 matmul does not: an fp32
    # comparison or a 1e-4 parity check on an Ampere/Hopper GPU would not compare like with like.
    assert session_providers("CUDAExecutionProvider") == [
        ("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert session_providers("CPUExecutionProvider") == ["CPUExecutionProvider"]
    if torch.cuda.is_available():
        assert not torch.backends.cuda.matmul.allow_tf32  # the PyTorch side of the comparison


def test_provider_validation():
    with pytest.raises(UsageError, match="unknown or unavailable provider 'tpu'.*CPUExecutionProvider"):
        resolve_provider("tpu", ["CPUExecutionProvider"])
    assert resolve_provider("cpu", ["CPUExecutionProvider"]) == "CPUExecutionProvider"
    assert resolve_provider(None, ["CPUExecutionProvider"]) == "CPUExecutionProvider"
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA device"):
            resolve_provider("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"])


def _registry():
    return pytest.importorskip("students.registry")


@pytest.mark.parametrize("name", ["bilstm", "kimcnn", "logreg"])
def test_every_registered_student_exports_with_parity(name, tmp_path):
    registry = _registry()
    assert set(registry.STUDENTS) == {"bilstm", "kimcnn", "logreg"}  # a new student needs a case here
    torch.manual_seed(0)
    model = registry.build_student(name, registry.student_config(name, {}), 3000)
    if name == "logreg":
        model.prepare([[int(i) for i in torch.randint(100, 3000, (12,))] for _ in range(30)])
    registry.save_student(model, name, tmp_path / name, {"task": "sst2"})
    loaded = load_torch_model(str(tmp_path / name))
    assert loaded.kind == "student" and loaded.input_names == ("input_ids", "attention_mask")
    path = export_onnx(loaded, tmp_path / f"{name}.onnx")
    # example_inputs pads rows after the first, so the mask path (packing, masked pooling) is checked
    r = check_parity(loaded, path)
    assert r["max_abs_diff"]["logits"] <= FP32_ATOL and r["argmax_agreement"] == 1.0
    if name != "logreg":  # logreg's graph also holds its idf/special buffers, which are not parameters
        _assert_same_groups(onnx_initializer_stats(path), count_params(loaded.model))


GROUPS = ("total", "embeddings", "encoder", "head", "nonzero", "embeddings_nonzero", "encoder_nonzero",
          "head_nonzero")


def _assert_same_groups(onnx_stats, torch_stats):
    assert {g: onnx_stats[g] for g in GROUPS} == {g: torch_stats[g] for g in GROUPS}


def test_onnx_parameter_groups_are_pytorchs(tiny_bert, tmp_path):
    # transposed Linear weights are stored as onnx::MatMul_N: their module comes from the node that
    # reads them; the pooler and classifier count as head, as in PyTorch, fused graph included
    loaded = load_torch_model(str(tiny_bert))
    with torch.no_grad():  # as trained: the exporter stores identical tensors (fresh zero biases) once
        for p in loaded.model.parameters():
            if p.dim() == 1:
                p.normal_()
    _prune_magnitude(loaded.model, 0.5)
    path = export_onnx(loaded, tmp_path / "m.onnx")
    stats = onnx_initializer_stats(path)
    assert any(t["name"].startswith("onnx::MatMul") and t["module"].startswith("bert.encoder.layer.1.")
               for t in stats["matrices"])
    _assert_same_groups(stats, count_params(loaded.model))
    heads, hidden = attention_shape(loaded)
    optimize_onnx(path, tmp_path / "o.onnx", heads, hidden)
    _assert_same_groups(onnx_initializer_stats(tmp_path / "o.onnx"), count_params(loaded.model))


def test_bench_token_range_is_the_word_table_of_each_onnx_file(tiny_bert, tmp_path):
    # The tiny BERT gathers from a 30522-row word table and a 512-row position table; benchmark
    # inputs must draw ids from the word table (the position table gave every id = 511).
    from compress.measure.bench import _onnx_vocab

    loaded = load_torch_model(str(tiny_bert))
    path = export_onnx(loaded, tmp_path / "m.onnx")
    optimize_onnx(path, tmp_path / "o.onnx", 4, 32)
    q = quantize_int8(tmp_path / "o.onnx", tmp_path / "q.onnx")
    for f in (path, tmp_path / "o.onnx", q):
        assert _onnx_vocab(f) == 30522, f
    registry = _registry()
    student = registry.build_student("kimcnn", registry.student_config("kimcnn", {}), 3000)
    registry.save_student(student, "kimcnn", tmp_path / "s", {"task": "sst2"})
    s_path = export_onnx(load_torch_model(str(tmp_path / "s")), tmp_path / "s.onnx")
    assert _onnx_vocab(quantize_int8(s_path, tmp_path / "s8.onnx")) == _onnx_vocab(s_path) == 3000


# ----------------------------------------------------------------------------- every architecture

# The inputs each tiny encoder is exported with: token_type_ids only where the model has a segment
# table of two or more rows (RoBERTa/XLM-R have one, the tiny DeBERTa-v3 none, DistilBERT and
# ModernBERT take no such argument).
EXPECTED_INPUTS = {arch: ("input_ids", "attention_mask", "token_type_ids")
                   if arch in ("bert", "electra", "albert") else ("input_ids", "attention_mask")
                   for arch in ARCHITECTURES}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_exports_with_parity(arch, tiny_encoder, tmp_path):
    from transformers import AutoTokenizer

    folder = tiny_encoder(arch)
    loaded = load_torch_model(str(folder))
    assert loaded.input_names == EXPECTED_INPUTS[arch]
    path = export_onnx(loaded, tmp_path / f"{arch}.onnx")
    r = check_parity(loaded, path)  # three (batch, length) shapes with padded rows
    assert r["max_abs_diff"]["logits"] <= FP32_ATOL and r["argmax_agreement"] == 1.0
    ort = OrtModel(path)
    assert ort.input_names == loaded.input_names
    # the graph runs on what the model's own tokenizer produces
    tok = AutoTokenizer.from_pretrained(folder)
    assert set(loaded.input_names) <= set(tok.model_input_names)
    enc = tok(["Paris is the capital of France.", "Tower?"], padding=True, return_tensors="pt")
    feeds = {k: v for k, v in enc.items() if k in loaded.input_names}
    with torch.no_grad():
        want = loaded.model(**feeds).logits.numpy()
    np.testing.assert_allclose(ort.run(feeds)["logits"], want, rtol=0, atol=FP32_ATOL)


def test_role_tables_name_optimizer_types_onnxruntime_has():
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    from compress.models.architectures import LAYOUTS

    for layout in LAYOUTS.values():
        assert layout.ort_model_type is None or layout.ort_model_type in MODEL_TYPES, layout.name
    assert optimizer_model_type(wrap_module(TinyLR())) == (None, "a module has no transformer attention "
                                                                   "layers to fuse")


# (optimizer model type, the report's fusion line starts with); ALBERT runs its one shared layer
# twice, and both executions fuse once its residual Adds are ordered (order_residual_adds).
EXPECTED_FUSION = {
    "bert": ("bert", "model type 'bert': Attention fused in 2 of 2 attention blocks"),
    "roberta": ("bert", "model type 'bert': Attention fused in 2 of 2 attention blocks"),
    "distilbert": ("bert", "model type 'bert': Attention fused in 2 of 2 attention blocks"),
    "electra": ("bert", "model type 'bert': Attention fused in 2 of 2 attention blocks"),
    "albert": ("bert", "model type 'bert': Attention fused in 2 of 2 attention blocks"),
    "deberta-v2": (None, "none applies (deberta-v2: disentangled attention"),
    "modernbert": (None, "none applies (modernbert: fused QKV, rotary embeddings and a gated FFN"),
}


@pytest.mark.parametrize("arch", EXPECTED_FUSION)
def test_optimize_uses_the_role_tables_model_type_and_says_what_fused(arch, tiny_encoder, tmp_path):
    model_type, line = EXPECTED_FUSION[arch]
    out = tmp_path / f"{arch}.onnx"
    report = run_export(ExportConfig(model=str(tiny_encoder(arch)), to=str(out), optimize=True))
    assert report["optimizer_model_type"] == model_type
    assert report["fusion"].startswith(line), report["fusion"]
    assert "\n" not in report["fusion"]
    assert report["parity_fp32"]["max_abs_diff"]["logits"] <= FP32_ATOL
    if model_type is None:
        assert report["fused_ops"] == {} and "parity_optimized" not in report  # no second graph
    else:
        assert report["fused_ops"]["Attention"] >= 1
        assert report["parity_optimized"]["max_abs_diff"]["logits"] <= FP32_ATOL
        assert "Attention" in _op_types(out)
    assert OrtModel(out).input_names == EXPECTED_INPUTS[arch]


def test_residual_adds_are_ordered_for_the_attention_matcher(tiny_encoder, tmp_path, monkeypatch):
    """ALBERT adds residual + attention output (BERT the other way round); onnxruntime's matcher
    then misses its first layer, whose residual is the embedding projection's Add. Swapping the
    operands leaves the sum, and the parity, as they were."""
    import compress.export.optimize as optimize_module

    loaded = load_torch_model(str(tiny_encoder("albert")))
    path = export_onnx(loaded, tmp_path / "albert.onnx")
    with monkeypatch.context() as m:
        m.setattr(optimize_module, "order_residual_adds", lambda p: 0)
        unordered = optimize_onnx(path, tmp_path / "unordered.onnx", *attention_shape(loaded))
    assert unordered["Attention"] == 1  # what onnxruntime fuses of the graph as exported
    assert optimize_onnx(path, tmp_path / "ordered.onnx", *attention_shape(loaded))["Attention"] == 2
    assert order_residual_adds(path) == 2  # both executions of the shared layer
    assert order_residual_adds(path) == 0  # idempotent
    assert check_parity(loaded, path)["max_abs_diff"]["logits"] <= FP32_ATOL
    bert = load_torch_model(str(tiny_encoder("bert")))
    assert order_residual_adds(export_onnx(bert, tmp_path / "bert.onnx")) == 0


def test_default_parity_shapes_reach_lengths_one_and_three():
    from compress.export.inputs import DEFAULT_SHAPES

    lengths = {n for _, n in DEFAULT_SHAPES}
    assert {1, 3} <= lengths and max(lengths) > 16  # shorter and longer than the traced length 16
    assert ExportConfig(to="m.onnx").shapes.split(",")[-2:] == ["1x1", "2x3"]


def test_kimcnn_graph_runs_texts_shorter_than_its_widest_filter(tmp_path):
    registry = _registry()
    torch.manual_seed(0)
    cfg = registry.student_config("kimcnn", {"embed_dim": 8, "num_filters": 4, "widths": (2, 3, 5)})
    loaded = wrap_module(registry.build_student("kimcnn", cfg, 500))
    path = export_onnx(loaded, tmp_path / "kimcnn.onnx")  # traced at length 16
    r = check_parity(loaded, path, shapes=((1, 1), (2, 2), (1, 3), (3, 4), (2, 5), (2, 16)))
    assert r["max_abs_diff"]["logits"] <= FP32_ATOL and r["argmax_agreement"] == 1.0


def test_student_export_with_optimize_says_in_one_line_that_no_fusion_applies(tmp_path, capsys):
    from compress.cli.main import main

    registry = _registry()
    torch.manual_seed(0)
    model = registry.build_student("kimcnn", registry.student_config("kimcnn", {"embed_dim": 8}), 500)
    registry.save_student(model, "kimcnn", tmp_path / "student", {"task": "sst2"})
    assert main(["export", str(tmp_path / "student"), "--to", str(tmp_path / "s.onnx"), "--optimize"]) == 0
    out = capsys.readouterr()
    fusion = [line for line in out.out.splitlines() if "fus" in line]
    assert fusion == ["fusion: none applies (a student has no transformer attention layers to fuse); "
                      "the exported graph is kept unoptimized (onnxruntime still applies its own "
                      "session-level graph optimizations)"], out.out
    assert "Traceback" not in out.err and (tmp_path / "s.onnx").is_file()


def _tiny_deberta_v1(max_relative_positions: int = 16):
    import transformers

    config = transformers.DebertaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, relative_attention=True,
                                        pos_att_type=["c2p", "p2c"],
                                        max_relative_positions=max_relative_positions)
    torch.manual_seed(0)
    return transformers.DebertaForSequenceClassification(config).eval()


def test_a_graph_whose_trace_froze_a_size_is_traced_again_at_the_longest_input(tmp_path):
    """DeBERTa v1 turns min(length, max_relative_positions) into a Python number: traced on 2x16 it
    fails to run at length 37 (a gather index out of range); traced at its longest input (the span
    saturated) it matches PyTorch at every checked shape, and the note says why it was retraced."""
    from compress.export.loading import as_loaded
    from compress.export.onnx import TRACE_LENGTH, export_checked

    loaded = as_loaded(_tiny_deberta_v1())
    short = export_onnx(loaded, tmp_path / "short.onnx")
    with pytest.raises(ParityError, match=r"fails to run at batch 3 x length 37 \(.*GatherElements"):
        check_parity(loaded, short, ((1, 8), (3, 37)))
    path, parity, note = export_checked(loaded, tmp_path / "m.onnx", ((1, 8), (2, 16), (3, 37), (1, 1)))
    assert path.is_file() and max(parity["max_abs_diff"].values()) <= FP32_ATOL
    assert note.startswith(f"traced at 2x512: the graph traced at 2x{TRACE_LENGTH} failed its check")
    assert check_parity(loaded, path, ((2, 100),))["argmax_agreement"] == 1.0  # a length not checked before


def test_a_graph_that_matches_when_traced_short_is_not_traced_again(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    from compress.export.onnx import export_checked

    _, parity, note = export_checked(loaded, tmp_path / "m.onnx")
    assert note is None and max(parity["max_abs_diff"].values()) <= FP32_ATOL


def test_a_retrace_that_fails_too_is_one_parity_error_naming_both(tmp_path, monkeypatch):
    import compress.export.onnx as onnx_export
    from compress.export.loading import as_loaded

    traced = []
    real_export = onnx_export.export_onnx

    def export(loaded, path, opset=17, length=onnx_export.TRACE_LENGTH):
        traced.append(length)
        return real_export(loaded, path, opset, length)

    def failing(loaded, path, shapes, atol, provider, label):
        raise ParityError(f"{label} ONNX model traced at {traced[-1]} does not match PyTorch")

    monkeypatch.setattr(onnx_export, "export_onnx", export)
    monkeypatch.setattr(onnx_export, "check_parity", failing)
    with pytest.raises(ParityError) as err:
        onnx_export.export_checked(as_loaded(_tiny_deberta_v1()), tmp_path / "m.onnx", ((1, 8),))
    assert traced == [16, 512]
    assert str(err.value) == ("fp32 ONNX model traced at 16 does not match PyTorch; traced again at length "
                              "512: fp32 ONNX model traced at 512 does not match PyTorch")


def test_a_retrace_whose_export_fails_is_one_parity_error_and_leaves_no_file(tmp_path, monkeypatch):
    import compress.export.onnx as onnx_export
    from compress.export.loading import as_loaded

    real_export = onnx_export.export_onnx

    def export(loaded, path, opset=17, length=onnx_export.TRACE_LENGTH):
        if length != onnx_export.TRACE_LENGTH:
            Path(path).write_bytes(b"half")
            raise IndexError("index out of range in self")
        return real_export(loaded, path, opset, length)

    monkeypatch.setattr(onnx_export, "export_onnx", export)
    with pytest.raises(ParityError) as err:
        onnx_export.export_checked(as_loaded(_tiny_deberta_v1()), tmp_path / "m.onnx", ((1, 8), (3, 37)))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("fp32 ONNX model m.onnx fails to run at batch 3 x length 37")
    assert message.endswith("traced again at length 512, the export failed "
                            "(IndexError: index out of range in self)")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("model_type, operator", [("fnet", "fft"), ("tapas", "scatter_reduce")])
def test_a_model_with_an_operator_onnx_lacks_is_one_model_error_and_no_file(model_type, operator, tmp_path):
    """FNet mixes tokens with a Fourier transform, TAPAS reduces over table cells with
    ``scatter_reduce(include_self=False)``: the exporter has no ONNX operator for either. TAPAS gets
    one token type id per kind (its 3-D ``token_type_ids``), so the trace reaches that operator."""
    import transformers

    from compress.export.loading import as_loaded

    config = transformers.AutoConfig.for_model(model_type, vocab_size=300, hidden_size=32,
                                               num_hidden_layers=1, num_attention_heads=4,
                                               intermediate_size=64)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    with pytest.raises(ModelError) as err:
        export_onnx(as_loaded(model), tmp_path / "f.onnx")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"the ONNX exporter cannot export this {model_type} (")
    assert operator in message and "--opset" in message
    assert not (tmp_path / "f.onnx").exists()


def test_the_longest_retrace_stays_inside_the_position_table():
    import transformers

    from compress.export.loading import as_loaded
    from compress.export.onnx import longest_trace

    sizes = dict(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(**sizes))
    roberta = transformers.RobertaForSequenceClassification(
        transformers.RobertaConfig(**sizes, pad_token_id=1))
    assert longest_trace(as_loaded(bert)) == 64
    assert longest_trace(as_loaded(roberta)) == 62  # positions 2..63: after the padding index 1
    assert longest_trace(wrap_module(TinyLR())) is None
