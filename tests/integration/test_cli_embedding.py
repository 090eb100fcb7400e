"""The embedding task through the real CLI on a tiny random BERT and a tiny data folder (SQuAD-format
ReQA, MRPC pairs, WikiText-style text): eval, one-shot and structured pruning with embedding
distillation, the folder sentence-transformers opens, the export's embedding parity, the static
student and the sentences-per-second bench; and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TINY_CONTEXT, run_cli, write_tiny_squad

pytestmark = pytest.mark.usefixtures("nltk_data")

WIKI = """ = Valkyria Chronicles =

 The game began development in 2010 , carrying over a large portion of the work done on the first game .
 It was released in Japan in January 2011 and was praised by critics . The story follows a squad of soldiers .
 = = Gameplay = =
 Players take control of units on a map and move them in turns . Each unit has its own strengths .
"""
MRPC = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(
    f"{label}\t{i}\t{i + 100}\t{a}\t{b}" for i, (label, a, b) in enumerate([
        (1, "The cat sat on the mat.", "A cat was sitting on the mat."),
        (0, "Stocks fell sharply today.", "The weather will be warm."),
        (1, "He said the plan would work.", "He stated that the plan would succeed."),
        (0, "Paris is in France.", "Rain is expected tomorrow in the north."),
    ])) + "\n"
FAST = ("--batch-size", "4", "--max-length", "32", "--calibration-samples", "8")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("embedding_data")
    (root / "squad_v1.1").mkdir()
    write_tiny_squad(root / "squad_v1.1", n_articles=4)
    (root / "mrpc").mkdir()
    (root / "mrpc" / "dev.tsv").write_text(MRPC)
    (root / "wikitext2").mkdir()
    (root / "wikitext2" / "wiki.test.raw").write_text(WIKI)
    return root


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_eval_scores_the_model_as_is(tiny_bert, data_dir, tmp_path):
    r = run_cli("eval", "--task", "embedding", "--model", str(tiny_bert), "--data-dir", str(data_dir),
                "--out", str(tmp_path / "ev"))
    assert r.returncode == 0, r.stderr
    s = _summary(tmp_path / "ev")["eval"]
    assert s["reqa"]["n"] == 8 and s["reqa"]["candidates"] == len([x for x in TINY_CONTEXT.split(". ") if x])
    assert 0 <= s["reqa"]["p@1"] <= 1 and s["pairs"]["n"] == 4
    assert "ReQA P@1" in r.stdout


def test_a_prompted_model_is_scored_and_saved_with_its_prompts(tiny_bert, data_dir, tmp_path):
    """E5-style prompts: the CLI's ReQA scores equal those of sentence-transformers' own
    encode_query / encode_document, and the pruned folder keeps the prompts."""
    import shutil

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from compress.tasks.base import DataOptions
    from compress.tasks.embedding import load_embedding_eval
    from compress.tasks.ranking import order_from_scores, retrieval_metrics
    from tests.unit.test_embedding import write_st_config

    folder = tmp_path / "e5"
    shutil.copytree(tiny_bert, folder)
    write_st_config(folder, "mean", normalize=True)
    prompts = {"query": "query: ", "document": "passage: "}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    r = run_cli("eval", "--task", "embedding", "--model", str(folder), "--data-dir", str(data_dir),
                "--out", str(tmp_path / "ev"))
    assert r.returncode == 0, r.stderr
    got = _summary(tmp_path / "ev")["eval"]["reqa"]
    st = SentenceTransformer(str(folder), device="cpu")
    reqa = load_embedding_eval(DataOptions(data_dir)).reqa
    cos = np.asarray(st.encode_query(reqa.questions)) @ np.asarray(st.encode_document(reqa.sentences)).T
    want = retrieval_metrics(order_from_scores(cos), reqa.gold)
    assert got["mrr"] == pytest.approx(want["mrr"], abs=1e-6) and got["p@1"] == pytest.approx(want["p@1"])
    run = tmp_path / "pruned"
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--model", str(folder),
                "--criterion", "magnitude", "--sparsity", "0.3", "--data-dir", str(data_dir),
                "--out", str(run), *FAST)
    assert r.returncode == 0, r.stderr
    assert _summary(run)["sentence_transformers"]["equal_to_1e-5"] is True
    saved = json.loads((run / "model" / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == prompts
    card = (run / "model" / "README.md").read_text()  # its snippet encodes queries and documents apart
    assert "model.encode_query(" in card and "query `query: `" in card and "model.encode(" not in card
    static = tmp_path / "static"
    r = run_cli("distill", "--task", "embedding", "--student", "static", "--teacher", str(folder),
                "--dims", "8", "--no-peer", "--data-dir", str(data_dir), "--out", str(static))
    assert r.returncode == 0, r.stderr
    from compress.recipes.embedding_bench import EmbeddingBenchConfig, load_entry

    kind, _, student_prompts = load_entry(str(static), EmbeddingBenchConfig(models=(str(static),)))
    assert kind == "static" and (student_prompts.query, student_prompts.document) == ("query: ", "passage: ")


def test_sparsegpt_with_distillation_keeps_masks_and_saves_a_sentence_transformers_folder(
        tiny_bert, data_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from compress.embedding.model import embed, load_sentence_encoder

    run = tmp_path / "sgpt"
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--model", str(tiny_bert),
                "--criterion", "sparsegpt", "--sparsity", "0.5", "--recovery-steps", "3",
                "--teacher", "self", "--kd-layers", "1", "--log-every", "1",
                "--data-dir", str(data_dir), "--out", str(run), *FAST)
    assert r.returncode == 0, r.stderr
    s = _summary(run)
    assert s["criterion"] == "sparsegpt" and s["recovery_steps"] == 3
    assert s["sentence_transformers"]["equal_to_1e-5"] is True
    assert s["eval"]["cosine_to_reference"]["n"] > 0
    assert s["sparsity"]["encoder"] == pytest.approx(0.5, abs=0.01)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in logged if r.get("phase") == "recovery" and "loss" in r]
    # the layer-wise term is on: each step's loss is cosine + 1 x layers
    assert steps and all(r["loss"] == pytest.approx(r["cosine"] + r["layers"], rel=1e-4) for r in steps)
    weights = load_file(str(run / "model" / "model.safetensors"))
    q = weights["encoder.layer.0.attention.self.query.weight"]
    assert float((q == 0).float().mean()) == pytest.approx(0.5, abs=0.02)  # kept through the recovery
    texts = ["Paris is the capital of France.", "The Seine flows through it."]
    model, tok, meta = load_sentence_encoder(str(run))
    assert meta["task"] == "embedding" and meta["distillation"]["steps"] == 3
    ours = embed(model, tok, texts)
    theirs = torch.as_tensor(SentenceTransformer(str(run / "model"), device="cpu").encode(texts))
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert run_cli("verify", str(run)).returncode == 0


def test_structured_fisher_removes_units_and_exports_with_embedding_parity(tiny_bert, data_dir, tmp_path):
    run = tmp_path / "fisher"
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--model", str(tiny_bert),
                "--structured", "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.4",
                "--recovery-steps", "2", "--data-dir", str(data_dir), "--out", str(run), *FAST)
    assert r.returncode == 0, r.stderr
    s = _summary(run)
    assert "Gauss-Newton" in s["structured"]["loss"]
    assert s["structured"]["flops_reduction"] >= 0.4
    assert json.loads((run / "model" / "config.json").read_text())["model_type"] == "compress_bert"
    assert s["sentence_transformers"]["equal_to_1e-5"] is True
    # where compress is not imported, a bare SentenceTransformer(folder) opens the stock copy beside
    # the pruned weights (no trust_remote_code, no project code), and gives the same embeddings
    import subprocess
    import sys

    from compress.embedding.model import embed, load_sentence_encoder

    texts = ["Paris is the capital of France.", "The Seine flows through it."]
    code = ("import json, sys; from sentence_transformers import SentenceTransformer; "
            f"m = SentenceTransformer({str(run / 'model')!r}, device='cpu'); "
            f"print(json.dumps({{'emb': m.encode({texts!r}).tolist(), "
            "'compress': any(k.startswith('compress') for k in sys.modules), "
            "'type': type(m[0].auto_model).__name__}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    model, tok, _ = load_sentence_encoder(str(run))
    assert fresh["compress"] is False and fresh["type"] == "BertModel"
    assert torch.allclose(torch.tensor(fresh["emb"]), embed(model, tok, texts), atol=1e-5)
    onnx = tmp_path / "fisher-int8.onnx"
    r = run_cli("export", str(run), "--to", str(onnx), "--optimize", "--quantize", "int8", "--task",
                "embedding", "--data-dir", str(data_dir))
    assert r.returncode == 0, r.stderr
    report = json.loads(onnx.with_suffix(".json").read_text())
    assert report["kind"] == "embedding" and report["outputs"] == ["sentence_embedding"]
    assert report["optimizer_model_type"] == "bert" and report["fused_ops"].get("Attention", 0) >= 1
    acc = report["accuracy"]
    assert acc["fp32"]["cosine_to_reference"]["mean"] > 0.9999
    assert acc["int8"]["cosine_to_reference"]["mean"] > 0.9
    assert acc["parity_ok"] == (acc["int8"]["cosine_to_reference"]["mean"] >= 0.99)

    student_run = tmp_path / "static"
    r = run_cli("distill", "--task", "embedding", "--student", "static", "--teacher", str(tiny_bert),
                "--dims", "8", "--no-peer", "--data-dir", str(data_dir), "--out", str(student_run))
    assert r.returncode == 0, r.stderr
    st = _summary(student_run)
    assert st["static"]["dims"] == 8 and st["model2vec"] == {"skipped": "--no-peer"}
    assert st["eval"]["sentences_per_second"] > 0

    r = run_cli("bench", "--task", "embedding", f"dense={tiny_bert}", f"int8={onnx}", f"static={student_run}",
                "--data-dir", str(data_dir), "--rounds", "1", "--out", str(tmp_path / "bench"))
    assert r.returncode == 0, r.stderr
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert [row["kind"] for row in bench["rows"]] == ["torch", "onnx", "static"]
    assert bench["rows"][0]["speedup"] == pytest.approx(1.0)
    assert all(row["sentences_per_second"] > 0 for row in bench["rows"])
    rows = bench["rows"]
    ratio = rows[1]["sentences_per_second"] / rows[0]["sentences_per_second"]
    assert rows[1]["speedup"] == pytest.approx(ratio)
    assert "cosine_to_reference" not in bench["rows"][2]["scores"]  # 8 dims against 32: no cosine


@pytest.mark.parametrize("args,message", [
    (("prune", "--task", "embedding", "--stage", "finetune"), "use --stage post-training"),
    (("prune", "--task", "embedding", "--stage", "post-training", "--teacher", "minilm",
      "--recovery-steps", "2"), "use --teacher self"),
    (("prune", "--task", "embedding", "--stage", "post-training", "--teacher", "self", "--kd-lambda", "2",
      "--recovery-steps", "2"), "has no logits"),
    (("distill", "--task", "embedding", "--student", "bilstm"), "one student, 'static'"),
    (("distill", "--task", "sst2", "--student", "static"), "add --task embedding"),
    (("distill", "--task", "embedding", "--student", "static", "--align-lr", "0"), "--align-lr must be in"),
    (("distill", "--task", "embedding", "--student", "static", "--align-epochs", "0", "--calibration-data",
      "x.txt"), "add --align-epochs N or --weighting text"),
    (("bench", "minilm", "--timed-texts", "5"), "apply with --task embedding"),
])
def test_bad_embedding_options_fail_in_one_line(args, message, tmp_path):
    r = run_cli(*args, "--out", str(tmp_path / "x"))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_an_old_static_folder_is_refused_in_one_line_naming_the_fix(data_dir, tmp_path):
    old = tmp_path / "old" / "student"
    old.mkdir(parents=True)
    (old / "static.json").write_text("{}")
    r = run_cli("bench", "--task", "embedding", f"old={tmp_path / 'old'}", "--data-dir", str(data_dir),
                "--out", str(tmp_path / "bench"))
    assert r.returncode != 0
    assert "old format" in r.stderr and "compress distill --task embedding --student static" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bench").exists()


def test_missing_unlabelled_text_is_refused_before_any_run_folder(tiny_bert, data_dir, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(data_dir, bare)
    shutil.rmtree(bare / "wikitext2")
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--model", str(tiny_bert),
                "--criterion", "wanda", "--sparsity", "0.5", "--data-dir", str(bare), "--out",
                str(tmp_path / "run"), *FAST)
    assert r.returncode != 0
    assert "--calibration-data" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_embedding_sweep_then_report(tiny_bert, data_dir, tmp_path):
    import csv

    out = tmp_path / "sweep"
    r = run_cli("sweep", "--tasks", "embedding", "--sparsities", "0,0.5", "--variants", "sparsegpt",
                "--teacher", "self", "--recovery-steps", "2", "--calibration-samples", "8",
                "--model", str(tiny_bert), "--data-dir", str(data_dir), "--batch-size", "4",
                "--max-length", "32", "--out", str(out))
    assert r.returncode == 0, r.stderr
    state = json.loads((out / "sweep.json").read_text())
    assert all(c["status"] == "finished" for c in state["cells"]) and len(state["cells"]) == 3
    dense = _summary(out / "ft-embedding-dense-lr5e-05")["eval"]["score"]
    for c in state["cells"][1:]:
        s = _summary(out / c["name"])
        assert s["eval_dense"]["score"] == pytest.approx(dense)  # the same model, scored the same way
        assert s["recovery_steps"] == (2 if "+kd" in c["name"] else 0)
    rep = run_cli("report", str(out))
    assert rep.returncode == 0, rep.stderr
    with open(out / "report" / "metric_vs_sparsity.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted({r["variant"] for r in rows}) == ["sparsegpt", "sparsegpt+kd"]


def test_structured_fisher_on_an_mpnet_embedding_model_without_a_role_table(data_dir, tmp_path):
    """MPNet (all-mpnet-base-v2's architecture) has no role table: discovery finds its roles and its
    heads keep their rows of the relative-position bias; sentence-transformers reopens the folder."""
    from transformers import AutoTokenizer, MPNetConfig, MPNetModel

    from compress.models.loading import packaged_model_path

    base = tmp_path / "mpnet"
    MPNetModel(MPNetConfig(vocab_size=30527, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64)).save_pretrained(base)
    AutoTokenizer.from_pretrained(packaged_model_path("minilm")).save_pretrained(base)
    run = tmp_path / "fisher"
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--model", str(base),
                "--structured", "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.3",
                "--recovery-steps", "1", "--data-dir", str(data_dir), "--out", str(run), *FAST)
    assert r.returncode == 0, r.stderr
    s = _summary(run)
    assert s["structured"]["flops_reduction"] >= 0.3
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["model_type"] == "compress_mpnet" and "pruned_layout" in config
    stock = json.loads((run / "model" / "0_Transformer" / "config.json").read_text())
    assert stock["model_type"] == "mpnet" and "auto_map" not in stock  # what sentence-transformers opens
    assert s["sentence_transformers"]["equal_to_1e-5"] is True
    card = (run / "model" / "README.md").read_text()  # how to open it, as the test just did
    assert 'SentenceTransformer("PATH_OR_HUB_ID")' in card and "0_Transformer/" in card
    assert "import compress" not in card  # importing compress does not register a discovered type


@pytest.mark.parametrize("criterion", ["fisher", "obs"])
def test_a_speedup_family_of_embedding_models_is_scored_on_retrieval_and_names_the_fastest(
        criterion, tiny_bert, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "family"
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--model", str(tiny_bert),
                "--structured", "heads,ffn", "--criterion", criterion, "--speedup", "1.5,2.5",
                "--latency-shape", "4x32", "--max-drop", "100", "--data-dir", str(data_dir),
                "--out", str(out), *FAST)
    assert r.returncode == 0, r.stderr
    family = json.loads((out / "family.json").read_text())
    assert family["metric"] == "p@1" and [row["label"] for row in family["rows"]] == ["1.5x", "2.5x"]
    assert family["criterion"] == criterion and family["family_mode"] == "independent"
    dense = json.loads((out / "speedup-1.5x" / "summary.json").read_text())["eval_dense"]
    assert family["dense_score"] == pytest.approx(dense["reqa"]["p@1"])
    for row, target in zip(family["rows"], (1.5, 2.5)):
        member = out / f"speedup-{target:g}x"
        assert row["predicted_speedup"] >= target and 0 <= row["score_int8"] <= 1
        assert json.loads((member / "summary.json").read_text())["sentence_transformers"]["equal_to_1e-5"]
        report = json.loads((member / "model-ort-int8.json").read_text())
        assert report["kind"] == "embedding" and report["accuracy"]["int8"]["score"] == row["score_int8"]
    fastest = max(family["rows"], key=lambda row: row[family["speed_key"]])
    assert family["fastest_within_budget"] == fastest["label"]


def test_a_speedup_family_refuses_what_an_embedding_prune_refuses():
    r = run_cli("prune", "--stage", "post-training", "--task", "embedding", "--structured", "heads,ffn",
                "--criterion", "fisher", "--speedup", "1.5,2", "--recovery-steps", "2", "--teacher", "minilm")
    assert r.returncode != 0 and "--teacher self" in r.stderr
