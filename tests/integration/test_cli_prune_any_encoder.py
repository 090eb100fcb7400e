"""`compress prune` and `compress verify` through the real CLI on tiny random encoders of every
supported architecture; the sparsity is counted from the saved safetensors, independently of the
role table."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from compress.cli.main import main
from tests.conftest import run_cli
from tests.tiny_encoders import ARCHITECTURES

FAST = ("--max-steps", "2", "--batch-size", "8", "--max-length", "32")
# Where each architecture keeps its encoder layers in the saved file (written from the checkpoints'
# key names): every 2-D weight under it except the LayerNorms must be pruned.
LAYER_KEYS = {
    "bert": r"^bert\.encoder\.layer\.\d+\.",
    "roberta": r"^roberta\.encoder\.layer\.\d+\.",
    "xlm-roberta": r"^roberta\.encoder\.layer\.\d+\.",
    "distilbert": r"^distilbert\.transformer\.layer\.\d+\.",
    "electra": r"^electra\.encoder\.layer\.\d+\.",
    "albert": r"^albert\.encoder\.albert_layer_groups\.\d+\.albert_layers\.\d+\.",
    "deberta-v2": r"^deberta\.encoder\.layer\.\d+\.",
    "modernbert": r"^model\.layers\.\d+\.",
}


def _layer_weights(run, arch: str) -> dict[str, torch.Tensor]:
    weights = load_file(str(run / "model" / "model.safetensors"))
    return {k: w for k, w in weights.items() if re.match(LAYER_KEYS[arch], k) and w.ndim == 2
            and "norm" not in k.lower()}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prune_reaches_the_sparsity_in_every_encoder_matrix_and_verifies(arch, tiny_encoder, tmp_path):
    out = tmp_path / "run"  # in process (the real CLI entry point), as a subprocess costs seconds each
    assert main(["prune", "--model", str(tiny_encoder(arch)), "--sparsity", "0.4", *FAST,
                 "--out", str(out)]) == 0
    layer_weights = _layer_weights(out, arch)
    assert len(layer_weights) >= 6
    for key, w in layer_weights.items():
        assert abs(float((w == 0).float().mean()) - 0.4) < 0.01, key
    report = json.loads((out / "sparsity.json").read_text())
    assert abs(report["encoder"]["sparsity"] - 0.4) < 0.01 and report["encoder"]["numel"] == sum(
        w.numel() for w in layer_weights.values())
    assert main(["verify", str(out)]) == 0


@pytest.mark.parametrize("arch", ["modernbert", "albert"])
def test_global_scope(arch, tiny_encoder, tmp_path):
    out = tmp_path / "run"
    assert main(["prune", "--model", str(tiny_encoder(arch)), "--sparsity", "0.5", "--scope", "global",
                 *FAST, "--out", str(out)]) == 0
    report = json.loads((out / "sparsity.json").read_text())
    assert abs(report["global"]["sparsity"] - 0.5) < 1e-3
    assert all(float((w == 0).float().mean()) > 0 for w in _layer_weights(out, arch).values())


def _saved(folder, model):
    from transformers import AutoTokenizer

    from compress.models.loading import packaged_model_path

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(packaged_model_path("minilm")).save_pretrained(folder)
    return folder


def test_an_encoder_without_a_role_table_prunes_its_discovered_matrices_and_verifies(tmp_path):
    from transformers import MPNetConfig, MPNetModel

    folder = _saved(tmp_path / "mpnet", MPNetModel(MPNetConfig(
        vocab_size=30527, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)))
    out = tmp_path / "run"
    assert main(["prune", "--model", str(folder), "--sparsity", "0.4", *FAST, "--out", str(out)]) == 0
    weights = load_file(str(out / "model" / "model.safetensors"))
    layer_weights = {k: w for k, w in weights.items() if re.search(r"encoder\.layer\.\d+\..*weight$", k)
                     and w.ndim == 2}
    assert len(layer_weights) == 12
    for key, w in layer_weights.items():
        assert abs(float((w == 0).float().mean()) - 0.4) < 0.01, key
    assert main(["verify", str(out)]) == 0


def test_an_encoder_discovery_cannot_read_is_one_line_exit_2_nothing_written(tmp_path):
    from transformers import FNetConfig, FNetModel

    folder = _saved(tmp_path / "fnet", FNetModel(FNetConfig(
        vocab_size=30527, hidden_size=16, num_hidden_layers=1, intermediate_size=32)))
    out = tmp_path / "runs"
    r = run_cli("prune", "--model", str(folder), "--sparsity", "0.4", *FAST, "--out", str(out / "run"))
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "'fnet'" in last and "attention head count" in last and "--include" in last
    assert not out.exists() or not any(out.iterdir())


def test_part_of_a_fused_qkv_is_refused(tiny_encoder, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["prune", "--model", str(tiny_encoder("modernbert")), "--exclude", "role:key", *FAST,
                 "--out", str(out / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fuses query, key and value" in err[0]
    assert not out.exists() or not any(out.iterdir())


def test_quiet_by_default_and_verbose_shows_the_load_report(tiny_encoder, tmp_path):
    args = ("prune", "--model", str(tiny_encoder("distilbert")), "--sparsity", "0.4", *FAST)
    quiet = run_cli(*args, "--out", str(tmp_path / "quiet"), env={"COMPRESS_NO_PROGRESS": ""},
                    isolated=True)  # the load report is written by a handler bound at import
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    for noise in ("LOAD REPORT", "MISSING", "Loading weights", "Writing model shards", "\r"):
        assert noise not in quiet.stdout + quiet.stderr, noise
    assert quiet.stdout.count("new task head: classifier, 2 labels") == 1  # the report's one line
    verbose = run_cli(*args, "--out", str(tmp_path / "verbose"), "--verbose", isolated=True)
    assert verbose.returncode == 0 and "MISSING" in verbose.stdout + verbose.stderr


DISCOVERED = {"ernie": ("ErnieConfig", "ErnieModel", {}), "mpnet": ("MPNetConfig", "MPNetModel", {}),
              "longformer": ("LongformerConfig", "LongformerModel", {"attention_window": 8})}


@pytest.fixture(scope="module")
def discovered_finetuned(tmp_path_factory):
    """``discovered_finetuned(arch)`` -> a tiny encoder of a type without a role table, fine-tuned 2
    steps on the sample."""
    import transformers

    built = {}

    def make(arch: str):
        if arch not in built:
            config_name, model_name, extra = DISCOVERED[arch]
            config_class, model_class = getattr(transformers, config_name), getattr(transformers, model_name)
            root = tmp_path_factory.mktemp(arch)
            folder = _saved(root / arch, model_class(config_class(
                vocab_size=30527, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, **extra)))
            assert main(["finetune", "--model", str(folder), *FAST, "--out", str(root / "ft")]) == 0
            built[arch] = root / "ft"
        return built[arch]

    return make


@pytest.fixture(scope="module")
def ernie_finetuned(discovered_finetuned):
    return discovered_finetuned("ernie")


@pytest.mark.parametrize("arch", ["ernie", "mpnet"])
def test_fisher_structured_removes_heads_of_a_discovered_type_and_the_folder_reloads(
        arch, discovered_finetuned, tmp_path):
    """ERNIE and MPNet (whose relative-position bias is computed once for every head, outside the
    layers): Fisher-structured to -30% FLOPs, saved with the discovered layout; verify, eval and
    export read it, and transformers alone loads it with trust_remote_code to the same logits."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.unit.test_structured import logits_equal_without_compress

    out = tmp_path / "pt"
    assert main(["prune", "--stage", "post-training", "--model", str(discovered_finetuned(arch)),
                 "--structured", "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.3",
                 "--calibration-samples", "16", "--batch-size", "8", "--max-length", "32",
                 "--out", str(out)]) == 0
    result = json.loads((out / "summary.json").read_text())["structured"]
    assert result["flops_reduction"] >= 0.3
    cfg = json.loads((out / "model" / "config.json").read_text())
    roles = cfg["pruned_layout"]["roles"]
    assert cfg["model_type"] == f"compress_{arch}" and len(cfg["layer_kept_heads"]) == 2
    assert sum(cfg["layer_heads"]) < 8 or sum(cfg["layer_intermediate"]) < 128
    weights = load_file(str(out / "model" / "model.safetensors"))
    for i, (heads, width) in enumerate(zip(cfg["layer_heads"], cfg["layer_intermediate"])):
        prefix = f"{arch}.encoder.layer.{i}."
        assert len(cfg["layer_kept_heads"][i]) == heads
        assert weights[f"{prefix}{roles['query']}.weight"].shape == (heads * 8, 32)
        assert weights[f"{prefix}{roles['ffn_in']}.weight"].shape == (width, 32)
    assert main(["verify", str(out)]) == 0
    # a fresh process: compress builds and registers the compress_<type> classes from the folder's config
    fresh = run_cli("eval", "--model", str(out), "--max-length", "32", isolated=True)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert main(["export", str(out), "--to", str(tmp_path / "m.onnx"), "--optimize"]) == 0
    report = json.loads((tmp_path / "m.json").read_text())
    assert report["optimizer_model_type"] == "bert" and "parity_optimized" in report
    if arch == "ernie":  # BERT's graph: onnxruntime fuses its attention; MPNet's bias add stops it
        assert report["fused_ops"].get("Attention") == 2, report["fused_ops"]
    model = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    tokens = AutoTokenizer.from_pretrained(out / "model")(["a short sentence", "another"], padding=True,
                                                           return_tensors="pt")
    inputs = {k: tokens[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        logits = model(**inputs).logits
    printed = logits_equal_without_compress(out / "model", inputs, logits, tmp_path)
    card = (out / "model" / "README.md").read_text()
    assert 'from_pretrained("PATH_OR_HUB_ID", trust_remote_code=True)' in card  # as done just above
    assert f"{type(model).__name__} {cfg['layer_heads']}" in printed


def test_a_speedup_target_on_a_discovered_type_is_met_by_its_latency_table(ernie_finetuned, tmp_path,
                                                                           monkeypatch):
    import compress.measure.latency_table as latency
    from tests.unit.test_latency_table import hand_table

    table = hand_table("smallest")  # this ERNIE's sizes (2 layers, 4 heads, FFN 64); nothing is timed
    monkeypatch.setattr(latency, "latency_table", lambda *a, **k: table)
    out = tmp_path / "fast"
    assert main(["prune", "--stage", "post-training", "--model", str(ernie_finetuned), "--structured",
                 "heads,ffn", "--criterion", "fisher", "--speedup", "1.5", "--latency-shape", "4x32",
                 "--latency-runtime", "ort-fp32", "--calibration-samples", "16", "--batch-size", "8",
                 "--max-length", "32", "--out", str(out)]) == 0
    saved = latency.LatencyTable.from_dict(json.loads((out / "latency_table.json").read_text()))
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert saved == table and saved.reference == "smallest"
    assert cfg["layer_heads"] is None or min(cfg["layer_heads"]) >= 1  # no block can go
    assert min(cfg["layer_intermediate"]) >= 1
    heads = cfg["layer_heads"] or [4, 4]  # None: every layer keeps the config's heads
    assert table.predicted_speedup(heads, cfg["layer_intermediate"]) >= 1.5
    assert main(["verify", str(out)]) == 0


def test_heads_of_a_discovered_type_it_cannot_resize_are_refused_before_data_and_its_ffn_prunes(
        discovered_finetuned, tmp_path, capsys):
    """Longformer reshapes its attention output by the input's width, so its heads cannot go: asking
    for heads is refused in one line before any data is read, naming the FFN-only way that works."""
    ft = discovered_finetuned("longformer")
    out = tmp_path / "runs"
    args = ("prune", "--stage", "post-training", "--model", str(ft), "--criterion", "fisher",
            "--flops-reduction", "0.2", "--calibration-samples", "16", "--batch-size", "8",
            "--max-length", "32")
    r = run_cli(*args, "--structured", "heads,ffn", "--out", str(out / "run"))
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()
    assert len(last) == 1 and "cannot remove heads of longformer" in last[0], last
    assert "--structured ffn" in last[0]
    assert not out.exists() or not any(out.iterdir())
    assert main([*args, "--structured", "ffn", "--out", str(out / "ffn")]) == 0
    cfg = json.loads((out / "ffn" / "model" / "config.json").read_text())
    assert cfg["model_type"] == "compress_longformer" and sum(cfg["layer_intermediate"]) < 128
    assert cfg.get("layer_heads") is None  # every head kept
    capsys.readouterr()
    assert main(["verify", str(out / "ffn")]) == 0
    assert "(heads per layer all kept, FFN width per layer [" in capsys.readouterr().out
    assert main(["measure", str(out / "ffn")]) == 0
    printed = capsys.readouterr().out
    assert "structure: heads per layer all kept, FFN widths [" in printed  # measured as structured


def test_a_trial_fusion_that_breaks_parity_is_dropped_for_a_discovered_type_only(
        ernie_finetuned, tiny_encoder, tmp_path, monkeypatch):
    import compress.export.model_export as export
    from compress.core.errors import ParityError

    real = export.check_parity

    def failing(loaded, path, shapes, atol, provider, label):
        if label == "optimized fp32":
            raise ParityError("optimized fp32 ONNX model optimized.onnx does not match PyTorch")
        return real(loaded, path, shapes, atol, provider, label)

    monkeypatch.setattr(export, "check_parity", failing)
    assert main(["export", str(ernie_finetuned), "--to", str(tmp_path / "e.onnx"), "--optimize"]) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["optimizer_model_type"] is None and report["fused_ops"] == {}
    assert "tried and dropped" in report["fusion"] and "parity_fp32" in report
    assert main(["export", str(tiny_encoder("bert")), "--to", str(tmp_path / "b.onnx"), "--optimize"]) == 1
