"""Half-precision export (--precision fp16|bf16): valid ONNX, half initializers, float32 I/O, its own
parity tolerance, and a clean one-line skip where the provider has no kernels for the precision."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper

from compress.core.errors import UsageError
from compress.export.loading import load_torch_model, wrap_module
from compress.export.onnx import check_parity, export_onnx
from compress.export.optimize import optimize_onnx
from compress.export.precision import BF16_ATOL, FP16_ATOL, convert_to_half
from compress.recipes.export import ExportConfig, run_export

pytestmark = pytest.mark.filterwarnings("ignore")

HALF_TYPE = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def _io_types(model: onnx.ModelProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}


@pytest.fixture(scope="module")
def half_exports(tiny_bert, tmp_path_factory):
    """(report, path) of the tiny BERT exported at fp16 and at bf16 on the CPU provider."""
    out = {}
    folder = tmp_path_factory.mktemp("half")
    for precision in ("fp16", "bf16"):
        path = folder / f"tiny-{precision}.onnx"
        cfg = ExportConfig(model=str(tiny_bert), to=str(path), precision=precision)
        out[precision] = run_export(cfg), path
    return out


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_export_is_valid_onnx_with_half_weights_and_float32_io(half_exports, precision):
    report, path = half_exports[precision]
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert _io_types(model) == {"input_ids": TensorProto.INT64, "attention_mask": TensorProto.INT64,
                                "token_type_ids": TensorProto.INT64, "logits": TensorProto.FLOAT}
    types = {i.name: i.data_type for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    weights = [n.input[1] for n in model.graph.node if n.op_type in ("MatMul", "Attention", "Gemm")]
    assert weights and all(types[w] == HALF_TYPE[precision] for w in weights if w in types)
    # float32 -> half right after nothing float comes in (ids are int64); half -> float32 before logits
    assert producer["logits"].op_type == "Cast"
    assert report["half"]["half_initializers"] >= len(weights)
    ops = {n.op_type for n in model.graph.node}
    assert "Attention" in ops  # optimized (fused) before conversion, without --optimize
    assert report["fused_ops"]["Attention"] == 2
    assert json.loads(path.with_suffix(".json").read_text())["half"]["precision"] == precision


def test_fp16_runs_on_cpu_within_its_tolerance(half_exports):
    report, _ = half_exports["fp16"]
    p = report["parity_fp16"]
    assert "skipped" not in p and p["atol"] == FP16_ATOL
    assert p["max_abs_diff"]["logits"] <= FP16_ATOL and p["argmax_agreement"] == 1.0
    assert "float32" in p["note"]  # what the CPU provider really computes is said


def test_bf16_check_is_skipped_in_one_line_on_a_cpu_without_bf16_kernels(half_exports):
    report, path = half_exports["bf16"]
    p = report["parity_bf16"]
    assert path.is_file()
    if "skipped" not in p:  # an onnxruntime whose CPU provider gained bfloat16 kernels: a real check
        assert p["max_abs_diff"]["logits"] <= BF16_ATOL
        return
    assert "\n" not in p["skipped"] and "no kernel for" in p["skipped"] and "--provider cuda" in p["skipped"]
    assert report["half"]["float32_ops"] == ["EmbedLayerNormalization"]  # no CUDA bf16 kernel


def _widened_to_float32(src, dst) -> None:
    """The bf16 graph with every bfloat16 type read back as float32 (same rounded values), so the CPU
    provider can run the graph the conversion built: its Casts, its blocked ops, its weights."""
    model = onnx.load(str(src))
    bf16, f32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    for init in model.graph.initializer:
        if init.data_type == bf16:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for vi in (*model.graph.input, *model.graph.output, *model.graph.value_info):
        if vi.type.tensor_type.elem_type == bf16:
            vi.type.tensor_type.elem_type = f32
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == bf16:
                attr.i = f32
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == bf16:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float32),
                                                        attr.t.name))
    onnx.save(model, str(dst))


def test_bf16_graph_computes_the_model_with_bf16_rounded_weights(tiny_bert, tmp_path):
    loaded = load_torch_model(str(tiny_bert))
    fp32 = export_onnx(loaded, tmp_path / "m.onnx")
    optimize_onnx(fp32, tmp_path / "o.onnx", 4, 32)
    info = convert_to_half(tmp_path / "o.onnx", tmp_path / "b.onnx", "bf16")
    assert info["precision"] == "bf16" and info["half_initializers"] > 0
    model = onnx.load(str(tmp_path / "b.onnx"))
    rounded = [numpy_helper.to_array(i) for i in model.graph.initializer
               if i.data_type == TensorProto.BFLOAT16]
    assert rounded and all(a.dtype.name == "bfloat16" for a in rounded)
    _widened_to_float32(tmp_path / "b.onnx", tmp_path / "w.onnx")
    r = check_parity(loaded, tmp_path / "w.onnx", atol=BF16_ATOL, label="bf16 widened")
    assert 0 < r["max_abs_diff"]["logits"] <= BF16_ATOL  # bf16-rounded weights differ, within tolerance


def test_bf16_weights_round_from_float32_not_from_float16(tmp_path):
    """1 + 2**-8 is exactly bf16's tie to 1; 1 + 2**-8 + 2**-11 rounds up to 1 + 2**-7 in bf16, but
    float16 first rounds it to 1 + 2**-8 (11 bits) and bf16 would then round down to 1."""
    from onnx import helper

    w = np.full((2, 2), 1 + 2**-8 + 2**-11, np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                              [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    convert_to_half(tmp_path / "m.onnx", tmp_path / "b.onnx", "bf16")
    model = onnx.load(str(tmp_path / "b.onnx"))
    got = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w")).astype(np.float32)
    assert np.all(got == 1 + 2**-7)
    assert _io_types(model) == {"x": TensorProto.FLOAT, "y": TensorProto.FLOAT}
    onnx.checker.check_model(model, full_check=True)


def test_bf16_keeps_ops_without_a_bf16_schema_in_float32(tmp_path):
    """Conv (opset 17) has no bfloat16 type: KimCNN-like graphs keep it in float32 and stay valid."""
    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(300, 8)
            self.conv = torch.nn.Conv1d(8, 4, 3, padding=1)
            self.out = torch.nn.Linear(4, 2)

        def forward(self, input_ids, attention_mask=None):
            return self.out(self.conv(self.emb(input_ids).transpose(1, 2)).amax(-1))

    torch.manual_seed(0)
    path = export_onnx(wrap_module(ConvNet()), tmp_path / "m.onnx")
    info = convert_to_half(path, tmp_path / "b.onnx", "bf16")
    assert "Conv" in info["float32_ops"] and info["half_initializers"] > 0
    onnx.checker.check_model(onnx.load(str(tmp_path / "b.onnx")), full_check=True)


def test_pruning_zeros_of_half_precision_weights_are_counted(tmp_path):
    """bfloat16 arrays (ml_dtypes) are not numpy kind "f": their zeros still count as pruning."""
    from onnx import helper

    from compress.measure.params import onnx_initializer_stats

    w = np.ones((4, 4), np.float32)
    w[:2] = 0
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "encoder.w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "encoder.w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    for precision in ("fp16", "bf16"):
        convert_to_half(tmp_path / "m.onnx", tmp_path / f"{precision}.onnx", precision)
        assert onnx_initializer_stats(tmp_path / f"{precision}.onnx")["float_matrix_sparsity"] == 0.5


def test_precision_options_are_validated():
    with pytest.raises(UsageError, match="fp32, fp16, bf16"):
        ExportConfig(to="m.onnx", precision="fp8")
    with pytest.raises(UsageError, match="exclude each other"):
        ExportConfig(to="m.onnx", precision="fp16", quantize="int8")
    with pytest.raises(UsageError, match="--half-atol"):
        ExportConfig(to="m.onnx", half_atol=0.1)
    assert ExportConfig(to="m.onnx").precision == "fp32"  # the default stays float32


def test_cli_says_in_one_line_why_the_bf16_check_did_not_run(tiny_bert, tmp_path, capsys):
    from compress.cli.main import main

    assert main(["export", str(tiny_bert), "--to", str(tmp_path / "b.onnx"), "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("parity bf16")]
    assert len(lines) == 1, out
    assert "not run" in lines[0] or "<= 0.4" in lines[0]
    assert "bf16: " in out and "float32 inputs and outputs" in out


def test_half_precision_dev_set_agreement(tiny_bert, tmp_path):
    report = run_export(ExportConfig(model=str(tiny_bert), to=str(tmp_path / "h.onnx"), precision="fp16",
                                     task="sample", eval_limit=16))
    acc = report["accuracy"]
    assert acc["fp32"]["n"] == 16 and 0 <= acc["fp16"]["score"] <= 1
    assert acc["fp16"]["argmax_agreement"] >= 0.9 and acc["fp16"]["max_abs_diff"] <= FP16_ATOL


def test_precision_is_a_documented_cli_option(capsys):
    from compress.cli.main import main

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--precision" in text and "choices: fp32, fp16, bf16" in text and "--half-atol" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_exports_run_on_onnxruntime_cuda_within_tolerance(tiny_bert, tmp_path, precision):
    """On a GPU the check really runs half-precision kernels; a bf16 node without a CUDA kernel fails
    here (the session refuses it) rather than being skipped."""
    from compress.export.precision import half_session_error

    path = tmp_path / f"{precision}.onnx"
    cfg = ExportConfig(model=str(tiny_bert), to=str(path), precision=precision, provider="cuda")
    report = run_export(cfg)
    assert half_session_error(path, "CUDAExecutionProvider") is None
    p = report[f"parity_{precision}"]
    assert "skipped" not in p and p["max_abs_diff"]["logits"] <= p["atol"]
