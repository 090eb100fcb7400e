"""The public Python API (``compress/__init__.py``): stable names, pruning, KD loss, measure, export,
model cards, and misuse that fails with one exception naming the fix. Tiny models only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

import compress
from compress.measure.latency_table import latency_table
from tests.conftest import ROOT
from tests.tiny_encoders import FFN, HIDDEN, build

# Every public name, written out here (not read from compress.__all__): renaming one breaks users.
PUBLIC = ("CompressError", "DataError", "DistillationTrainer", "GradualSchedule", "IntegrityError",
          "MagnitudePruner", "ScheduledPruner", "ModelError", "OneShotSchedule", "ParityError",
          "PrunerStateError",
          "PruningCallback", "TrainingDivergedError", "UsageError", "export_onnx",
          "format_sparsity_table", "kd_loss",
          "make_pruner", "measure_model", "prunable_targets", "prune_model", "prune_structured_model",
          "save_model", "stock_copy",
          "sparsity_report", "verify_masks", "write_model_card", "load_embedding_model", "embed_texts",
          "prune_embedding_model", "distil_embedding_model", "save_embedding_model")


@pytest.fixture(scope="module")
def bert_parts():
    config, tokenizer = build("bert")
    return config, tokenizer


def _classifier(config, num_labels=2, seed=0):
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = config.__class__(**{**config.to_dict(), "num_labels": num_labels})
    return BertForSequenceClassification(cfg)


def _card(folder):
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_the_pruner_s_former_name_is_the_same_class():
    assert compress.MagnitudePruner is compress.ScheduledPruner


def test_every_public_name_imports():
    assert sorted(compress.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(compress, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'prune_everything'"):
        compress.prune_everything  # noqa: B018


def test_import_compress_loads_neither_torch_nor_transformers():
    code = "import sys, compress; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_prune_model_oneshot_zeroes_the_requested_fraction_of_each_matrix(bert_parts):
    model = _classifier(bert_parts[0])
    masks = compress.prune_model(model, 0.5)
    params = dict(model.named_parameters())
    # Q, K, V, attention output, FFN in and out of 2 layers, and the word embeddings
    assert len(masks) == 2 * 6 + 1
    for name, mask in masks.items():
        p = params.get("bert." + name)
        assert p is not None, name
        assert int((p == 0).sum()) == round(0.5 * p.numel()), name
        assert torch.equal(p.detach() == 0, ~mask), name


def test_pruner_misuse_names_the_fix(bert_parts):
    model = _classifier(bert_parts[0])
    pruner = compress.make_pruner(model, 0.5, total_steps=10)
    with pytest.raises(compress.PrunerStateError, match=r"call pruner\.initialize\(\) once"):
        pruner.step(1)
    pruner.initialize()
    pruner.finalize()
    with pytest.raises(compress.PrunerStateError, match="build a new pruner"):
        pruner.step(2)
    with pytest.raises(compress.UsageError, match="total_steps="):
        compress.make_pruner(model, 0.5)  # gradual, with no step count
    with pytest.raises(compress.UsageError, match="choose one of: oneshot, gradual"):
        compress.make_pruner(model, 0.5, schedule="cubic", total_steps=10)


def test_a_model_without_prunable_matrices_is_refused_with_the_fix():
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(compress.UsageError, match=r"pass include=\('re:<regex>',\)"):
        compress.PruningCallback(0.5, model=plain)
    with pytest.raises(compress.UsageError, match="include="):
        compress.make_pruner(plain, 0.5, schedule="oneshot")
    # the fix works: naming the matrix prunes it
    masks = compress.prune_model(plain, 0.5, include=("re:weight$",))
    assert list(masks) == ["0.weight"] and int((plain[0].weight == 0).sum()) == 8


def test_gradual_pruner_in_a_plain_loop_keeps_pruned_gradients_and_weights_zero(bert_parts):
    model = _classifier(bert_parts[0])
    pruner = compress.make_pruner(model, 0.6, total_steps=8, prune_every=1)  # ramp over steps 0..4
    pruner.initialize()
    pruner.register_grad_masks()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = torch.randint(100, 1000, (4, 12))
    seen = []
    for step in range(1, 9):
        loss = model(input_ids=ids, labels=torch.tensor([0, 1, 0, 1])).loss
        loss.backward()
        for name, mask in pruner.masks.items():  # the hooks zeroed them during backward
            grad = pruner.params[name].grad
            assert grad is None or not grad[~mask].any(), name
        opt.step()
        opt.zero_grad()
        pruner.step(step)
        seen.append(pruner.history[-1]["sparsity"])
    masks = pruner.finalize()
    assert seen == sorted(seen) and 0 < seen[0] < 0.6  # gradual: increasing to the target
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        p = params["bert." + name].detach()
        assert int((~mask).sum()) == round(0.6 * p.numel()) and not p[~mask].any(), name


def test_kd_loss_known_answer():
    s = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    t = torch.tensor([[1.0, 1.0, 0.0], [3.0, -2.0, 0.0]])
    y = torch.tensor([0, 2])
    temp = 2.0
    p_t = torch.softmax(t / temp, -1)
    kl = (p_t * (p_t.log() - torch.log_softmax(s / temp, -1))).sum(-1).mean() * temp ** 2
    ce = -torch.log_softmax(s, -1)[torch.arange(2), y].mean()
    out = compress.kd_loss(s, t, y, temperature=temp)
    assert out["distill"].item() == pytest.approx(kl.item(), rel=1e-6)
    assert out["task"].item() == pytest.approx(ce.item(), rel=1e-6)
    assert out["loss"].item() == pytest.approx(ce.item() + 4.0 * kl.item(), rel=1e-6)  # lambda 4
    no_labels = compress.kd_loss(s, t, temperature=temp, kd_lambda=1.0)
    assert no_labels["task"].item() == 0 and no_labels["loss"].item() == pytest.approx(kl.item(), rel=1e-6)
    assert compress.kd_loss(s, s, kind="mse")["distill"].item() == 0


def test_kd_loss_misuse_names_the_fix():
    with pytest.raises(compress.UsageError, match=r"predicts 2 labels and the teacher 3.*num_labels=3"):
        compress.kd_loss(torch.zeros(4, 2), torch.zeros(4, 3))
    with pytest.raises(compress.UsageError, match="choose one of: kl, mse"):
        compress.kd_loss(torch.zeros(4, 2), torch.zeros(4, 2), kind="cosine")
    with pytest.raises(compress.UsageError, match="pass outputs.logits"):
        compress.kd_loss(torch.zeros(4), torch.zeros(4))


def test_distillation_trainer_refuses_a_teacher_with_other_labels(bert_parts, tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with pytest.raises(compress.UsageError, match="num_labels=3"):
        compress.DistillationTrainer(model=_classifier(bert_parts[0], 2), args=args,
                                     teacher=_classifier(bert_parts[0], 3))


def test_measure_counts_linear_macs_by_hand_dense_and_after_pruning(bert_parts):
    model = _classifier(bert_parts[0]).train()
    seq = 16
    per_layer = 4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN  # Q, K, V, attention output; FFN in and out
    head = HIDDEN * HIDDEN + HIDDEN * 2  # pooler (one token) and the 2-label classifier
    dense = compress.measure_model(model, seq)
    assert dense["flops"]["dense_macs_by_operator"]["linear"] == 2 * seq * per_layer + head
    assert model.training  # measuring left the model's mode alone
    compress.prune_model(model, 0.5)
    r = compress.measure_model(model, seq)
    assert r["flops"]["effective_macs_by_operator"]["linear"] == 2 * seq * per_layer // 2 + head
    assert r["sparsity"]["encoder"]["sparsity"] == pytest.approx(0.5)
    assert "sparsity" in r["sparsity_table"]


def test_export_onnx_checks_parity_and_never_overwrites(bert_parts, tmp_path):
    model = _classifier(bert_parts[0])
    compress.prune_model(model, 0.3)
    out = compress.export_onnx(model, tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").is_file() and out["inputs"] == ["input_ids", "attention_mask",
                                                                  "token_type_ids"]
    assert out["parity"]["max_abs_diff"]["logits"] <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temporary file left
    with pytest.raises(compress.UsageError, match="never overwritten"):
        compress.export_onnx(model, tmp_path / "m.onnx")


def test_save_model_writes_what_verify_reads_and_a_card(bert_parts, tmp_path):
    config, tokenizer = bert_parts
    model = _classifier(config)
    masks = compress.prune_model(model, 0.5)
    folder = tmp_path / "pruned"
    compress.save_model(model, tokenizer, folder, masks, meta={"base_model": "minilm"},
                               metrics={"accuracy": 0.75})
    r = compress.verify_masks(folder)
    assert r["tensors"] == 13 and r["pruned"] == sum(int((~m).sum()) for m in masks.values())
    report = json.loads((folder / "sparsity.json").read_text())
    assert report["global"]["sparsity"] == pytest.approx(0.5, abs=1e-3)
    header, body = _card(folder)
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert header["library_name"] == "transformers" and "pruned" in header["tags"]
    metric = header["model-index"][0]["results"][0]["metrics"][0]
    assert metric["type"] == "accuracy" and metric["value"] == 0.75
    assert "## Sparsity" in body and "global: 50.0%" in body and "effective" in body
    # a regrown weight is caught on the saved folder
    from safetensors.torch import load_file, save_file

    w = load_file(str(folder / "model.safetensors"))
    name = next(n for n in masks if n.startswith("encoder."))
    idx = (~masks[name]).nonzero()[0]
    w["bert." + name][tuple(idx)] = 1.0
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(compress.IntegrityError, match="regrown"):
        compress.verify_masks(folder)


def test_save_model_in_a_run_folder_cards_the_last_eval_and_the_config(bert_parts, tmp_path):
    from compress.report.saving import save_model

    config, tokenizer = bert_parts
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: sst2\nsparsity: 0.4\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 0.7}\n{"step": 6, "eval": {"accuracy": 0.5,'
                                       ' "n": 64, "score": 0.5}}\n{"step": 8, "eval": {"accuracy": 0.625,'
                                       ' "n": 64, "score": 0.625}}\n')
    model = _classifier(config)
    compress.prune_model(model, 0.4)
    save_model(model, tokenizer, run / "model", {"task": "sst2", "label_names": ["neg", "pos"],
                                                 "base_model": "org/bert-small", "max_length": 32,
                                                 "pruning": {"sparsity": 0.4}})
    header, body = _card(run / "model")
    assert header["base_model"] == "org/bert-small" and header["pipeline_tag"] == "text-classification"
    result = header["model-index"][0]["results"][0]
    assert result["dataset"]["name"] == "sst2"
    assert [(m["type"], m["value"]) for m in result["metrics"]] == [("accuracy", 0.625)]
    assert "sparsity: 0.4" in body and "global: 40.0%" in body and "sequence length 32" in body


def test_library_does_not_import_the_examples():
    from tests.unit.test_layering import _imported_modules, _library_files

    examples = {p.stem for p in (ROOT / "examples").glob("*.py")}
    assert {"trainer_prune", "sample_data"} <= examples
    bad = [f"{p}: {m}" for p in _library_files() for m in _imported_modules(p)
           if m.split(".")[0] in examples | {"examples"}]
    assert not bad


def test_card_base_model_follows_compress_folders_to_the_hub_id(tmp_path):
    from compress.report.modelcard import hub_base_model

    pruned, tuned = tmp_path / "pruned", tmp_path / "tuned"
    (pruned / "model").mkdir(parents=True)
    (pruned / "model" / "compress.json").write_text(json.dumps({"base_model": "minilm"}))
    tuned.mkdir()
    (tuned / "compress.json").write_text(json.dumps({"base_model": str(pruned)}))
    assert hub_base_model(str(tuned)) == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_base_model("org/name") == "org/name" and hub_base_model(None) is None
    assert hub_base_model(str(tmp_path / "plain")) == str(tmp_path / "plain")  # records no origin


def test_readme_python_api_section_lists_every_public_name():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):text.index("## Tests")]
    missing = [n for n in PUBLIC if f"`{n}" not in section]
    assert not missing


def test_distillation_trainer_gradient_accumulation_matches_one_big_batch(bert_parts, tmp_path):
    from transformers import TrainingArguments

    config = bert_parts[0].__class__(**{**bert_parts[0].to_dict(), "hidden_dropout_prob": 0.0,
                                        "attention_probs_dropout_prob": 0.0})
    ids = torch.randint(100, 1000, (4, 10), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": ids[i], "attention_mask": torch.ones(10, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(4)]
    after = []
    for batch, accumulate in ((4, 1), (2, 2)):
        args = TrainingArguments(output_dir=str(tmp_path / f"b{batch}"), per_device_train_batch_size=batch,
                                 gradient_accumulation_steps=accumulate, max_steps=1, optim="sgd",
                                 learning_rate=0.5, lr_scheduler_type="constant", max_grad_norm=0.0,
                                 save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
        student = _classifier(config, seed=1)
        trainer = compress.DistillationTrainer(model=student, teacher=_classifier(config, seed=2), args=args,
                                               train_dataset=data)
        trainer.train()
        after.append(student.classifier.weight.detach().clone())
    before = _classifier(config, seed=1).classifier.weight.detach()
    assert not torch.allclose(after[0], before)  # the step moved the weights
    assert torch.allclose(after[0], after[1], atol=1e-6)  # 2 x 2 accumulated == one batch of 4


_LOGITS = torch.zeros(2, 3)
# (function, arguments as a callable of the model and a folder, words the one-line error must hold)
BAD_ARGUMENTS = [
    ("prune_model", lambda m, d: compress.prune_model(m, "0.4"), ["sparsity must be a real number", "'0.4'",
                                                                  "sparsity=0.4"]),
    ("prune_model", lambda m, d: compress.prune_model(m, True), ["sparsity must be a real number", "bool"]),
    ("prune_model", lambda m, d: compress.prune_model(m, float("nan")), ["sparsity must be in [0, 1]"]),
    ("prune_model", lambda m, d: compress.prune_model("bert", 0.4), ["model must be a torch.nn.Module",
                                                                     "'bert'"]),
    ("prune_model", lambda m, d: compress.prune_model(m, 0.4, include="pooler"),
     ["include='pooler' is a single string", "include=('pooler',)"]),
    ("prune_model", lambda m, d: compress.prune_model(m, 0.4, exclude=("role:query", 3)),
     ["exclude holds 3 (int)"]),
    ("make_pruner", lambda m, d: compress.make_pruner(m, 0.4, total_steps="10"),
     ["total_steps must be an int", "'10' (str)", "total_steps=10"]),
    ("make_pruner", lambda m, d: compress.make_pruner(m, 0.4, total_steps=-5),
     ["total_steps must be an int >= 1", "got -5"]),
    ("make_pruner", lambda m, d: compress.make_pruner(m, 0.4, total_steps=10.0),
     ["total_steps must be an int"]),
    ("make_pruner", lambda m, d: compress.make_pruner(m, 0.4, total_steps=10, prune_every=0),
     ["prune_every must be an int >= 1"]),
    ("export_onnx", lambda m, d: compress.export_onnx(m, d / "m.onnx", atol=0), ["atol must be in (0, inf]"]),
    ("export_onnx", lambda m, d: compress.export_onnx(m, d / "m.onnx", atol="1e-4"),
     ["atol must be a real number"]),
    ("export_onnx", lambda m, d: compress.export_onnx(m, d / "m.onnx", shapes=[(1, 0)]),
     ["shapes entry (1, 0)", "positive ints"]),
    ("export_onnx", lambda m, d: compress.export_onnx(m, d / "m.onnx", shapes=[(1, 8.0)]),
     ["shapes entry (1, 8.0)"]),
    ("export_onnx", lambda m, d: compress.export_onnx(m, 42), ["path must be a path", "42 (int)"]),
    ("export_onnx", lambda m, d: compress.export_onnx(None, d / "m.onnx"),
     ["model must be a torch.nn.Module"]),
    ("measure_model", lambda m, d: compress.measure_model(m, seq_len="128"), ["seq_len must be an int"]),
    ("measure_model", lambda m, d: compress.measure_model(3), ["model must be a torch.nn.Module or a model"]),
    ("kd_loss", lambda m, d: compress.kd_loss(_LOGITS, _LOGITS, temperature="2"),
     ["temperature must be a real number"]),
    ("kd_loss", lambda m, d: compress.kd_loss(_LOGITS, _LOGITS, temperature=1e20),
     ["temperature must be in (0, 100.0]"]),
    ("kd_loss", lambda m, d: compress.kd_loss(_LOGITS, _LOGITS, kd_lambda=1e9),
     ["kd_lambda must be in [0, 10000.0]"]),
    ("kd_loss", lambda m, d: compress.kd_loss([[0.0]], _LOGITS), ["student_logits must be a torch.Tensor"]),
    ("save_model", lambda m, d: compress.save_model(m, None, 5), ["folder must be a path", "5 (int)"]),
    ("save_model", lambda m, d: compress.save_model("m", None, d), ["model must be a torch.nn.Module"]),
    ("verify_masks", lambda m, d: compress.verify_masks(None), ["folder must be a path", "None"]),
    ("save_model", lambda m, d: compress.save_model(m, "tok", d / "out"),
     ["tokenizer must be a Hugging Face tokenizer", "'tok' (str)"]),
    ("kd_loss", lambda m, d: compress.kd_loss(_LOGITS, _LOGITS, torch.tensor([0, 3])),
     ["labels holds class ids from 0 to 3", "the 3 labels [0, 3)"]),
    ("kd_loss", lambda m, d: compress.kd_loss(_LOGITS, _LOGITS, torch.tensor([0, 1, 2])),
     ["labels has shape [3]", "[2]"]),
    ("prune_structured_model", lambda m, d: compress.prune_structured_model(m, _calibration(), speedup=2,
                                                                            latency_batch="32"),
     ["latency_batch must be an int", "'32' (str)"]),
    ("prune_structured_model", lambda m, d: compress.prune_structured_model(m, _calibration(), speedup=2,
                                                                            latency_batch=32.5),
     ["latency_batch must be an int", "32.5 (float)"]),
    ("prune_structured_model", lambda m, d: compress.prune_structured_model(m, _calibration(), speedup=2,
                                                                            latency_runtime=["ort"]),
     ["unknown runtime ['ort']"]),
    ("prune_structured_model", lambda m, d: compress.prune_structured_model(
        m, _calibration(labels=torch.tensor([0, 5])), flops_reduction=0.3),
     ["calibration[0]['labels'] holds class ids from 0 to 5", "outside the 2 labels"]),
    ("latency_table", lambda m, d: latency_table(m, seq_len="16", cache_dir=d), ["seq_len must be an int"]),
    ("latency_table", lambda m, d: latency_table(m, batch=2.5, cache_dir=d), ["batch must be an int"]),
    ("sparsity_report", lambda m, d: compress.sparsity_report(None), ["model must be a torch.nn.Module"]),
    ("sparsity_report", lambda m, d: compress.sparsity_report(m, masks=[1]), ["masks must be a dict"]),
    ("write_model_card", lambda m, d: compress.write_model_card(None), ["folder must be a path"]),
    ("write_model_card", lambda m, d: compress.write_model_card(d, "model"),
     ["model must be a torch.nn.Module"]),
]


def _calibration(**extra):
    ids = torch.tensor([[2, 40, 41, 3], [2, 42, 3, 0]])
    return [{"input_ids": ids, "attention_mask": (ids != 0).long(), **extra}]


@pytest.mark.parametrize("call, words", [(c, w) for _, c, w in BAD_ARGUMENTS],
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_ARGUMENTS)])
def test_api_arguments_are_checked_at_the_boundary(bert_parts, tmp_path, call, words):
    config, _ = bert_parts
    model = _classifier(config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(compress.UsageError) as err:
        call(model, tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # refused before touching the model
    assert not list(tmp_path.iterdir())  # and before writing anything


def test_measure_refuses_a_model_with_a_non_finite_weight(bert_parts):
    model = _classifier(bert_parts[0])
    with torch.no_grad():
        model.bert.encoder.layer[1].intermediate.dense.weight[0, 0] = float("inf")
    with pytest.raises(compress.ModelError, match="layer.1.intermediate.dense.weight holds 0 NaN and 1 inf"):
        compress.measure_model(model)
