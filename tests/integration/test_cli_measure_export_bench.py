"""The real CLI: measure, export (parity, fusion, int8, accuracy) and bench, plus their bad-input errors."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli
from tests.tiny_encoders import ARCHITECTURES

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore")]


def _one_line_error(proc, code: int) -> str:
    assert proc.returncode == code, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("compress")]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def exported(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "tiny-int8.onnx"
    proc = run_cli("export", str(tiny_bert), "--to", str(out), "--optimize", "--quantize", "int8",
                   "--task", "sample", "--eval-limit", "40")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_measure_bert_json(tiny_bert):
    proc = run_cli("measure", str(tiny_bert), "--seq-len", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    f = r["flops"]
    # tiny BERT: 2 layers, hidden 32, FFN 64, length 16; + pooler and a 2-label head on [CLS]
    linear = 2 * 16 * (4 * 32 * 32 + 2 * 32 * 64) + 32 * 32 + 32 * 2
    attention = 2 * 2 * 16 * 16 * 32
    assert f["dense_macs_by_operator"]["linear"] == linear
    assert f["dense_macs_by_operator"]["scaled_dot_product_attention"] == attention
    assert f["dense_flops"] == 2 * f["dense_macs"]
    assert "not_counted" in f and "1 MAC" in f["unit"] and f["attention_implementation"] == "sdpa"
    assert r["params"]["total"] > 0 and r["verdict"]["faster"] == "no compression"
    assert r["disk"]["bytes"] > 0


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_measure_every_architecture(arch, tiny_encoder):
    """The CLI measures each architecture under the attention it has (DeBERTa: eager only); the
    exact counts are checked against hand formulas in tests/unit/test_flops.py."""
    proc = run_cli("measure", str(tiny_encoder(arch)), "--seq-len", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    f = json.loads(proc.stdout)["flops"]
    assert f["attention_implementation"] == ("eager" if arch == "deberta-v2" else "sdpa")
    attention = sum(f["dense_macs_by_operator"].get(op, 0)
                    for op in ("matmul", "bmm", "scaled_dot_product_attention"))
    assert attention >= 2 * 2 * 16 * 16 * 32  # at least Q K^T and P V in two layers of hidden 32
    assert f["dense_flops"] == 2 * f["dense_macs"] > 0


def test_measure_text_report_has_sparsity_table(tiny_bert):
    proc = run_cli("measure", str(tiny_bert))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "effective" in proc.stdout and "not counted" in proc.stdout
    assert "will it be faster" in proc.stdout and "heads min/mean/max" in proc.stdout


def test_export_optimize_int8_with_accuracy(exported):
    out, proc = exported
    assert out.is_file()
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["fused_ops"]["Attention"] == 2
    assert report["parity_fp32"]["max_abs_diff"]["logits"] <= 1e-4
    assert report["parity_optimized"]["max_abs_diff"]["logits"] <= 1e-4
    assert report["parity_int8"]["atol"] == 1.0
    acc = report["accuracy"]
    assert acc["task"] == "sample" and acc["fp32"]["n"] == 40 and 0 <= acc["int8"]["score"] <= 1
    assert "fused ops: " in proc.stdout and "Attention 2" in proc.stdout
    assert "fusion: model type 'bert': Attention fused in 2 of 2 attention blocks" in proc.stdout


def test_measure_onnx(exported):
    out, _ = exported
    proc = run_cli("measure", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["kind"] == "onnx" and r["params"]["int8_elements"] > 0
    assert r["fused_ops"]["QAttention"] == 2


def test_bench_torch_vs_ort(tiny_bert, exported, tmp_path):
    out, _ = exported
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = run_cli("bench", f"base={tiny_bert}", f"int8={out}", "--batch-sizes", "1,2", "--seq-lens", "8",
                   "--iterations", "2", "--rounds", "2", "--warmup", "1", "--matmul-n", "128",
                   "--out", str(tmp_path / "b"), env={"TMPDIR": str(tmp)},
                   isolated=True)  # tempfile reads TMPDIR once
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(tmp.glob("compress-bench-*"))  # the export of base for ort is removed
    r = json.loads((tmp_path / "b" / "bench.json").read_text())
    runs = {(x["model"], x["runtime"], x["batch"]) for x in r["rows"]}
    assert runs == {(m, rt, b) for m, rt in (("base", "torch"), ("base", "ort"), ("int8", "ort"))
                    for b in (1, 2)}
    for row in r["rows"]:
        assert row["iterations"] == 4 and row["mean_ms"] > 0 and row["p90_ms"] >= row["min_ms"]
        assert row["rounds"] == 2 and len(row["round_mean_ms"]) == 2
        base = next(x for x in r["rows"]
                    if (x["model"], x["runtime"], x["batch"]) == ("base", "torch", row["batch"]))
        assert row["vs_baseline_by_round"] == pytest.approx(
            [b / m for b, m in zip(base["round_mean_ms"], row["round_mean_ms"])])
        # rounds hold equally many calls, so the pooled ratio lies between the per-round ones
        lo, hi = min(row["vs_baseline_by_round"]), max(row["vs_baseline_by_round"])
        assert lo * (1 - 1e-9) <= row["vs_baseline"] <= hi * (1 + 1e-9)
        assert row["throughput"] == pytest.approx(row["batch"] / (row["mean_ms"] / 1000))
        assert row["achieved_gflops"] > 0  # the int8 file's FLOPs come from its export report
    assert all(x["vs_baseline"] == pytest.approx(1.0)
               and x["vs_baseline_by_round"] == pytest.approx([1.0, 1.0])
               for x in r["rows"] if (x["model"], x["runtime"]) == ("base", "torch"))
    config = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    assert config["settle_s"] == 0.1 and config["rounds"] == 2  # the timing method is recorded
    assert r["matmul_peak"]["gflops"] > 0
    assert "matmul peak" in proc.stdout and "x base" in proc.stdout
    # the exporter's warnings on the export for ort land in bench.json, not on the terminal
    caught = next(m for m in r["models"] if m["label"] == "base")["exporter_warnings"]
    assert caught and all(w.split(":")[0].endswith("Warning") for w in caught)
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]


def test_bad_inputs(tiny_bert, tmp_path):
    err = _one_line_error(run_cli("bench", str(tiny_bert), "--batch-sizes", "1.5"), 2)
    assert "batch_sizes" in err and "1.5" in err
    err = _one_line_error(run_cli("bench", str(tiny_bert), "--provider", "tpu"), 2)
    assert "'tpu'" in err and "CPUExecutionProvider" in err
    err = _one_line_error(run_cli("bench", str(tiny_bert), "--rounds", "0"), 2)
    assert "--rounds" in err and "got 0" in err
    proc = run_cli("export", str(tiny_bert), "--to", str(tmp_path / "p.onnx"), "--per-tensor")
    err = _one_line_error(proc, 2)
    assert "--per-tensor" in err and "--quantize int8" in err and not (tmp_path / "p.onnx").exists()
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    err = _one_line_error(run_cli("export", str(notes), "--to", str(tmp_path / "n.onnx")), 1)
    assert "notes.txt is a file, not a model" in err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00garbage")
    err = _one_line_error(run_cli("measure", str(junk)), 1)
    assert "junk.onnx is not a readable ONNX model" in err
    # parity failure: a tolerance no float computation meets; nothing is left behind
    target = tmp_path / "strict.onnx"
    err = _one_line_error(run_cli("export", str(tiny_bert), "--to", str(target), "--atol", "1e-15"), 1)
    assert "output 'logits' max |diff|" in err and "> 1e-15" in err
    assert not target.exists() and not list(tmp_path.glob(".tmp-*"))
    assert not (tmp_path / "bench").exists()


def test_student_export_and_measure(tmp_path):
    registry = pytest.importorskip("students.registry")
    import torch

    for name in registry.STUDENTS:
        torch.manual_seed(0)
        model = registry.build_student(name, registry.student_config(name, {}), 3000)
        if name == "logreg":
            model.prepare([[int(i) for i in torch.randint(100, 3000, (12,))] for _ in range(30)])
        registry.save_student(model, name, tmp_path / name, {"task": "sst2"})
        out = tmp_path / f"{name}.onnx"
        proc = run_cli("export", str(tmp_path / name), "--to", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(out.with_suffix(".json").read_text())
        assert report["kind"] == "student" and report["inputs"] == ["input_ids", "attention_mask"]
        assert report["parity_fp32"]["max_abs_diff"]["logits"] <= 1e-4
        proc = run_cli("measure", str(tmp_path / name), "--seq-len", "32", "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        r = json.loads(proc.stdout)
        assert r["kind"] == "student" and r["flops"]["dense_macs"] > 0


def test_measure_unstructured_pruned_bert(tiny_bert, tmp_path):
    """Half of every encoder matrix zeroed: effective FLOPs drop by exactly that, dense ones do not,
    the verdict is 'storage only', and the zeros show up in the gzip size only."""
    import torch
    from transformers import AutoTokenizer, BertModel

    model = BertModel.from_pretrained(tiny_bert)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name.startswith("encoder."):
                mod.weight.view(-1)[: mod.weight.numel() // 2] = 0.0
    model.save_pretrained(tmp_path / "pruned")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "pruned")
    dense = json.loads(run_cli("measure", str(tiny_bert), "--seq-len", "16", "--json").stdout)
    proc = run_cli("measure", str(tmp_path / "pruned"), "--seq-len", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    encoder_linear = 2 * 16 * (4 * 32 * 32 + 2 * 32 * 64)
    head_linear = 32 * 32 + 32 * 2  # pooler + classifier on [CLS], not pruned
    assert r["flops"]["dense_macs"] == dense["flops"]["dense_macs"]
    assert r["flops"]["effective_macs_by_operator"]["linear"] == encoder_linear // 2 + head_linear
    assert r["flops"]["effective_macs"] == r["flops"]["dense_macs"] - encoder_linear // 2
    assert r["params"]["encoder_matrix_sparsity"] == pytest.approx(0.5)
    assert r["verdict"]["faster"] == "storage only"
    assert r["disk"]["bytes"] == pytest.approx(dense["disk"]["bytes"], rel=0.01)
    assert r["disk"]["gzip_bytes"] < dense["disk"]["gzip_bytes"]
    assert "sparsity_table" in r


def test_export_with_a_task_whose_labels_do_not_fit_the_model_is_refused(tiny_bert, tmp_path):
    """``--task`` scores the outputs as the task's labels: a model fine-tuned for other labels is
    refused as ``compress eval`` refuses it, and an encoder whose fresh head has fewer outputs than
    the task has labels likewise (both once crashed in scikit-learn after the export), exit 1,
    one line, no file."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("text,label\ngood,a\nbad,b\nmeh,c\n")
    (data / "dev.csv").write_text("text,label\nfine,a\nawful,b\nso-so,c\n")
    run = tmp_path / "sample-run"
    res = run_cli("finetune", "--model", str(tiny_bert), "--max-steps", "1", "--batch-size", "8",
                  "--max-length", "16", "--out", str(run))
    assert res.returncode == 0, res.stderr[-2000:]
    target = tmp_path / "m.onnx"
    err = _one_line_error(run_cli("export", str(run), "--to", str(target), "--task", "csv",
                                  "--data-dir", str(data)), 1)
    assert err == (f"compress export: error: model '{run}' was trained for labels ['negative', 'positive'], "
                   "but the task has ['a', 'b', 'c']; use a model fine-tuned on this task")
    ev = _one_line_error(run_cli("eval", "--model", str(run), "--task", "csv", "--data-dir", str(data)), 1)
    assert ev.split(": error: ")[1] == err.split(": error: ")[1]  # the same check as eval's
    err = _one_line_error(run_cli("export", str(tiny_bert), "--to", str(target), "--task", "csv",
                                  "--data-dir", str(data)), 1)
    assert "has 2 outputs and no saved label set, but the task has 3 labels ['a', 'b', 'c']" in err
    assert list(tmp_path.glob("m*")) == [] and list(tmp_path.glob(".tmp-*")) == []


def test_exporter_warnings_go_to_the_report_and_only_verbose_prints_them(tiny_bert, tmp_path):
    """torch's exporter warns on every export (TracerWarning, UserWarning): a fresh interpreter,
    where nothing filters warnings, shows the terminal a clean run and the report the warnings."""
    quiet = run_cli("export", str(tiny_bert), "--to", str(tmp_path / "q.onnx"), isolated=True)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr == ""
    caught = json.loads((tmp_path / "q.json").read_text())["exporter_warnings"]
    assert caught and all(isinstance(w, str) and w.split(":")[0].endswith("Warning") for w in caught)
    loud = run_cli("export", str(tiny_bert), "--to", str(tmp_path / "v.onnx"), "--verbose", isolated=True)
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert all(f"warning: {w}" in loud.stderr for w in caught)
