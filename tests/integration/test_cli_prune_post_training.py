"""`compress prune --stage post-training` through the real CLI on tiny random encoders: one-shot
SparseGPT / Wanda / Fisher-structured pruning of a fine-tuned model, with and without recovery,
then `verify`, `measure` and `export` on the result; the calibration reads the training split only;
bad input ends in one line with nothing written."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from compress.cli.main import main
from tests.integration.test_cli_prune_any_encoder import _layer_weights
from tests.tiny_encoders import ARCHITECTURES

FAST = ("--batch-size", "8", "--max-length", "32")


@pytest.fixture(scope="module")
def finetuned(tiny_encoder, tmp_path_factory):
    """``finetuned(arch)`` -> a run folder of the tiny ``arch`` fine-tuned 2 steps on the sample."""
    built = {}

    def make(arch: str):
        if arch not in built:
            out = tmp_path_factory.mktemp(f"ft_{arch}") / "run"
            assert main(["finetune", "--model", str(tiny_encoder(arch)), "--max-steps", "2", *FAST,
                         "--out", str(out)]) == 0
            built[arch] = out
        return built[arch]

    return make


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sparsegpt_one_shot_on_every_architecture_verifies(arch, finetuned, tmp_path):
    out = tmp_path / "pt"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned(arch)), "--criterion",
                 "sparsegpt", "--sparsity", "0.5", "--calibration-samples", "16", *FAST,
                 "--out", str(out)]) == 0
    weights = _layer_weights(out, arch)
    assert len(weights) >= 6
    for key, w in weights.items():
        assert abs(float((w == 0).float().mean()) - 0.5) < 0.01, key
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stage"] == "post-training" and summary["recovery_steps"] == 0
    assert set(summary) >= {"eval_dense", "eval_pruned_before_recovery", "eval", "calibration"}
    assert summary["eval"] == summary["eval_pruned_before_recovery"]
    assert summary["calibration"]["calibration_tokens"] > 0
    cal = json.loads((out / "calibration.json").read_text())
    assert any("estimated_error" in m for m in cal["matrices"].values())
    assert main(["verify", str(out)]) == 0


def test_wanda_2of4_then_measure_and_export(finetuned, tmp_path):
    out = tmp_path / "pt"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--criterion",
                 "wanda", "--pattern", "2:4", "--calibration-samples", "16", *FAST, "--out", str(out)]) == 0
    for key, w in _layer_weights(out, "bert").items():
        assert ((w.reshape(-1, 4) == 0).sum(dim=1) >= 2).all(), key
    assert json.loads((out / "summary.json").read_text())["pattern"] == "2:4"
    assert main(["verify", str(out)]) == 0
    assert main(["measure", str(out), "--seq-len", "32"]) == 0
    assert main(["export", str(out), "--to", str(tmp_path / "m.onnx")]) == 0
    assert (tmp_path / "m.onnx").is_file()


def test_recovery_with_the_dense_model_as_teacher_keeps_the_masks(finetuned, tmp_path):
    out = tmp_path / "pt"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--criterion",
                 "sparsegpt", "--sparsity", "0.6", "--calibration-samples", "16", "--recovery-steps", "3",
                 "--teacher", "self", *FAST, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recovery_steps"] == 3 and summary["distillation"] is not None
    assert summary["train_seconds"] >= 0  # it trained: the seconds are recorded
    first = (out / "model" / "README.md").read_text().split("\n---\n", 1)[1].split("\n\n")[1]
    assert "then 3 recovery training steps" in first, first
    masks = load_file(str(out / "model" / "masks.safetensors"))
    weights = load_file(str(out / "model" / "model.safetensors"))
    for name, m in masks.items():
        w = weights["bert." + name] if "bert." + name in weights else weights[name]
        assert (w[~m.bool()] == 0).all(), name  # trained 3 steps, the pruned weights stayed zero
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in steps if "eval" in r] == ["dense", "pruned", "recovery"]
    assert main(["verify", str(out)]) == 0


def test_fisher_structured_reaches_the_flops_target_and_reloads(finetuned, tmp_path):
    out = tmp_path / "pt"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--structured",
                 "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.4",
                 "--calibration-samples", "16", "--scale-bound", "2", "--max-swaps", "5", *FAST,
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    result = summary["structured"]
    assert result["flops_reduction"] >= 0.4
    assert result["scale_bound"] == 2.0 and result["max_swaps"] == 5 and result["tuned"]
    assert all(abs(v) <= 2.0 for m in result["head_masks"] + result["neuron_masks"] for v in m)
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["model_type"] == "compress_bert"
    assert sum(cfg["layer_intermediate"]) < 2 * 64 or sum(cfg["layer_heads"]) < 2 * 4
    assert main(["eval", "--model", str(out), "--max-length", "32"]) == 0


def test_obs_structured_reaches_the_flops_target_recovers_balanced_and_reloads(finetuned, tmp_path):
    out = tmp_path / "obs"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--structured",
                 "heads,ffn", "--criterion", "obs", "--flops-reduction", "0.4", "--calibration-samples", "16",
                 "--recovery-steps", "2", "--recovery-class-floor", "1.0", *FAST, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    result = summary["structured"]
    assert result["flops_reduction"] >= 0.4 and result["method"].startswith("structured OBS")
    assert len(result["layer_error"]["attention"]) == 2
    # the sample's classes are not exactly even: with the floor at the even share, the smaller one is
    # drawn again up to it before the recovery
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    balance = next(r["class_balance"] for r in rows if "class_balance" in r)
    assert balance["floor"] == 1.0 and balance["classes"]
    for before, after in balance["classes"].values():
        assert before < after
    assert main(["verify", str(out)]) == 0
    assert main(["eval", "--model", str(out), "--max-length", "32"]) == 0


def test_the_calibration_reads_the_training_split_only(finetuned, tmp_path, monkeypatch):
    import compress.pruning.calibration as cal

    data = tmp_path / "data"
    data.mkdir()
    train = [f"train sentence number {i} is good" if i % 2 else f"train sentence number {i} is bad"
             for i in range(40)]
    dev = [f"held out dev text {i} great" for i in range(10)]
    (data / "train.csv").write_text("text,label\n" + "".join(f"{t},{'pos' if 'good' in t else 'neg'}\n"
                                                              for t in train))
    (data / "dev.csv").write_text("text,label\n" + "".join(f"{t},{'pos' if i % 2 else 'neg'}\n"
                                                            for i, t in enumerate(dev)))
    ft = tmp_path / "ft"
    assert main(["finetune", "--model", str(finetuned("bert")), "--task", "csv", "--data-dir", str(data),
                 "--max-steps", "1", *FAST, "--out", str(ft)]) == 0
    seen = []
    real = cal.prune_calibrated

    def spy(model, targets, batches, *args, **kwargs):
        seen.extend(batches)
        return real(model, targets, batches, *args, **kwargs)

    monkeypatch.setattr(cal, "prune_calibrated", spy)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ft / "model")
    assert main(["prune", "--stage", "post-training", "--model", str(ft), "--task", "csv", "--data-dir",
                 str(data), "--criterion", "wanda", "--calibration-samples", "25", *FAST,
                 "--out", str(tmp_path / "pt")]) == 0
    texts = [tok.decode(ids, skip_special_tokens=True) for b in seen for ids in b["input_ids"]]
    assert len(texts) == 25 and len(set(texts)) == 25
    assert all(t.startswith("train sentence") for t in texts), texts[:3]


@pytest.mark.parametrize("args, words", [
    (["--criterion", "wanda"], "--stage post-training"),
    (["--stage", "post-training", "--criterion", "fisher", "--structured", "heads,ffn"], "--flops-reduction"),
    (["--stage", "post-training", "--criterion", "sparsegpt", "--prune-steps", "5"], "prunes once"),
    (["--stage", "post-training", "--criterion", "sparsegpt", "--no-mask-tuning"], "--no-mask-tuning"),
    (["--stage", "post-training", "--criterion", "fisher", "--structured", "heads,ffn", "--flops-reduction",
      "0.4", "--scale-bound", "0.5"], "scale"),
    (["--calibration-samples", "8"], "post-training only"),
    (["--stage", "post-training", "--calibration-samples", "0"], "--calibration-samples must be"),
    (["--stage", "post-training", "--criterion", "sparsegpt", "--pattern", "2:4", "--scope", "global"],
     "--scope"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(args, words, finetuned, tmp_path, capsys):
    out = tmp_path / "runs"
    code = main(["prune", "--model", str(finetuned("bert")), *args, *FAST, "--out", str(out / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not out.exists() or not any(out.iterdir())


def test_an_encoder_without_a_task_head_is_refused(tiny_encoder, tmp_path, capsys):
    out = tmp_path / "runs"
    code = main(["prune", "--stage", "post-training", "--model", str(tiny_encoder("bert")), "--criterion",
                 "sparsegpt", *FAST, "--out", str(out / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "fine-tuned" in err[0], err
    assert not out.exists() or not any(out.iterdir())


def test_squad_sparsegpt_one_shot_then_recovery_with_span_kd(tiny_bert, tmp_path):
    from tests.conftest import write_tiny_squad

    (tmp_path / "data").mkdir()
    data = write_tiny_squad(tmp_path / "data", n_articles=3)
    squad = ("--task", "squad", "--data-dir", str(data), "--split-by-article", "2/1", "--batch-size", "4",
             "--max-length", "48")
    ft = tmp_path / "ft"
    assert main(["finetune", "--model", str(tiny_bert), *squad, "--max-steps", "2", "--out", str(ft)]) == 0
    out = tmp_path / "pt"
    assert main(["prune", "--stage", "post-training", "--model", str(ft), *squad, "--criterion", "sparsegpt",
                 "--sparsity", "0.5", "--calibration-samples", "8", "--recovery-steps", "2",
                 "--teacher", "self", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "squad" and summary["recovery_steps"] == 2
    assert {"f1", "exact_match"} <= set(summary["eval_pruned_before_recovery"])
    assert summary["calibration"]["calibration_tokens"] > 0
    for key, w in _layer_weights(out, "bert").items():
        assert abs(float((w == 0).float().mean()) - 0.5) < 0.01, key
    assert json.loads((out / "model" / "compress.json").read_text())["task"] == "squad"
    assert main(["verify", str(out)]) == 0


EMB = "embeddings.word_embeddings.weight"


def _canonical_weights(run) -> dict:
    weights = load_file(str(run / "model" / "model.safetensors"))
    return {k.removeprefix("bert."): w for k, w in weights.items()}


def _card(run) -> tuple[dict, str]:
    import yaml

    header, body = (run / "model" / "README.md").read_text().removeprefix("---\n").split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_a_one_shot_run_leaves_the_embeddings_dense_and_says_what_it_did(finetuned, tmp_path):
    import torch

    dense = _canonical_weights(finetuned("bert"))
    out = tmp_path / "sgpt-50"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--criterion",
                 "sparsegpt", "--sparsity", "0.5", "--calibration-samples", "16", *FAST,
                 "--out", str(out)]) == 0
    masks = load_file(str(out / "model" / "masks.safetensors"))
    assert EMB not in masks and len(masks) == 12
    assert torch.equal(_canonical_weights(out)[EMB], dense[EMB])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sparsity"]["embeddings"] == 0.0
    assert summary["run"] == "sgpt-50" and summary["stage"] == "post-training"
    assert summary["criterion"] == "sparsegpt" and summary["sparsity_target"] == 0.5
    assert summary["recovery_steps"] == 0 and "train_seconds" not in summary
    meta, body = _card(out)
    text = (out / "model" / "README.md").read_text()
    assert meta["model-index"][0]["name"] == "sgpt-50" and ".tmp-" not in text
    first = body.split("\n\n")[1]
    assert "pruned once, after fine-tuning, with SparseGPT (Frantar & Alistarh 2023) to 50% target " \
           "sparsity" in first and "with no training after pruning" in first, first
    assert "magnitude-pruned" not in text and "Gordon" not in first and "fine-tuned on" not in first
    # named, the embeddings are pruned (by magnitude) too
    out = tmp_path / "with-embeddings"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--criterion",
                 "wanda", "--sparsity", "0.5", "--calibration-samples", "16", "--include",
                 "role:word_embeddings", *FAST, "--out", str(out)]) == 0
    masks = load_file(str(out / "model" / "masks.safetensors"))
    assert abs(float((~masks[EMB].bool()).float().mean()) - 0.5) < 0.01


def test_re_pruning_a_pruned_run_keeps_every_old_zero(finetuned, tmp_path, capsys):
    """A run pruned to 70% everywhere (word embeddings included) is pruned again at 70% without the
    embeddings and the FFN-in matrices: their old masks and zeros are kept, and every old zero of
    the re-pruned matrices too; --structured, which would keep none, is refused."""
    first = tmp_path / "p70"
    assert main(["prune", "--model", str(finetuned("bert")), "--sparsity", "0.7", "--schedule", "oneshot",
                 "--max-steps", "2", *FAST, "--out", str(first)]) == 0
    old = {k: m.bool() for k, m in load_file(str(first / "model" / "masks.safetensors")).items()}
    assert EMB in old and len(old) == 13
    out = tmp_path / "again"
    assert main(["prune", "--stage", "post-training", "--model", str(first), "--criterion", "sparsegpt",
                 "--sparsity", "0.7", "--exclude", "role:ffn_in", "--calibration-samples", "16", *FAST,
                 "--out", str(out)]) == 0
    new = {k: m.bool() for k, m in load_file(str(out / "model" / "masks.safetensors")).items()}
    weights = _canonical_weights(out)
    assert set(new) == set(old)
    for name, m in old.items():
        assert not (new[name] & ~m).any(), name
        assert (weights[name][~m] == 0).all(), name
        if "intermediate.dense" not in name and name != EMB:  # re-pruned: 70% exactly, not more
            assert int((~new[name]).sum()) == round(0.7 * m.numel()), name
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    code = main(["prune", "--stage", "post-training", "--model", str(first), "--structured", "heads,ffn",
                 "--criterion", "fisher", "--flops-reduction", "0.3", *FAST, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--structured would not keep the zeros" in err[0], err
    assert not (tmp_path / "s").exists()


def test_a_model_with_non_finite_weights_is_refused_before_any_work(finetuned, tmp_path, capsys,
                                                                      monkeypatch):
    import shutil

    import compress.api.post_training as post_training

    monkeypatch.setattr(post_training, "evaluate_classifier", lambda *a, **k: pytest.fail("scored"))
    bad = tmp_path / "bad"
    shutil.copytree(finetuned("bert"), bad)
    weights = load_file(str(bad / "model" / "model.safetensors"))
    weights["bert.encoder.layer.1.attention.output.dense.weight"][2, :2] = float("inf")
    from safetensors.torch import save_file

    save_file(weights, str(bad / "model" / "model.safetensors"), metadata={"format": "pt"})
    code = main(["prune", "--stage", "post-training", "--model", str(bad), "--criterion", "sparsegpt",
                 *FAST, "--out", str(tmp_path / "runs" / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert "bert.encoder.layer.1.attention.output.dense.weight holds 0 NaN and 2 infinite" in err[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, words", [
    (["--criterion", "sparsegpt", "--teacher", "self"], "add --recovery-steps N or drop --teacher"),
    (["--criterion", "sparsegpt", "--recovery-steps", "2", "--checkpoint-every", "1"],
     "drop --checkpoint-every"),
    (["--criterion", "sparsegpt", "--task", "squad", "--calibration-data", "lines.txt"],
     "drop --calibration-data"),
])
def test_flags_post_training_would_ignore_are_refused_before_loading(args, words, tmp_path, capsys,
                                                                      monkeypatch):
    import compress.api.post_training as post_training

    monkeypatch.setattr(post_training, "load_task_data", lambda *a, **k: pytest.fail("loaded"))
    code = main(["prune", "--stage", "post-training", "--model", "minilm", *args, "--out",
                 str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, code, words", [
    (["--calibration-data", "missing.txt"], 1, "--calibration-data not found: "),
    (["--include", "nothing_like_this"], 2, "--include 'nothing_like_this' matches no parameter"),
    (["--exclude", "role:no_such_role"], 2, "unknown role 'no_such_role'"),
])
def test_calibration_and_target_errors_come_before_the_dense_model_is_scored(args, code, words, finetuned,
                                                                             tmp_path, capsys, monkeypatch):
    import compress.api.post_training as post_training

    monkeypatch.setattr(post_training, "evaluate_classifier", lambda *a, **k: pytest.fail("scored first"))
    args = [str(tmp_path / a) if a == "missing.txt" else a for a in args]
    got = main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--criterion",
                "wanda", *args, *FAST, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run").exists()


def test_fisher_on_unlabelled_text_uses_the_models_own_predictions_and_says_what_it_removed(
        finetuned, tmp_path, capsys):
    text = tmp_path / "calibration.txt"
    text.write_text("".join(f"a plain sentence number {i} with no label at all\n" for i in range(20)))
    out = tmp_path / "fisher-30"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--structured",
                 "heads,ffn", "--criterion", "fisher", "--flops-reduction", "0.3", "--calibration-data",
                 str(text), "--calibration-samples", "12", *FAST, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["structured"]["loss"] == "cross-entropy against the model's own argmax"
    assert summary["structured"]["examples"] == 12
    removed = summary["removed"]
    assert removed["heads"] + removed["ffn_neurons"] > 0 and removed["flops_reduction"] >= 0.3
    assert removed["flops_reduction_target"] == 0.3 and "sparsity_target" not in summary
    pruning = json.loads((out / "model" / "compress.json").read_text())["pruning"]
    assert "sparsity" not in pruning and pruning["flops_reduction"] == 0.3
    _, body = _card(out)
    first = body.split("\n\n")[1]
    assert "target sparsity" not in body and "Kwon et al. 2022" in first, first
    assert f"{removed['heads']} attention heads and {removed['ffn_neurons']} FFN neurons removed" in first
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("ok: every weight finite, no masks (structured-pruned model)"), line


def test_recovery_learns_unlabeled_and_augmented_texts_from_the_teacher(finetuned, tmp_path, nltk_data):
    out = tmp_path / "extras"
    assert main(["prune", "--stage", "post-training", "--model", str(finetuned("bert")), "--structured",
                 "heads,ffn", "--criterion", "obs", "--flops-reduction", "0.3", "--calibration-samples", "16",
                 "--recovery-steps", "2", "--teacher", "self", "--train-limit", "100",
                 "--recovery-unlabeled", "40", "--recovery-augment", "1", *FAST, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["transfer_extras"] == {"unlabeled": 40, "augmented": 100}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"phase": "recovery", "transfer_extras": {"unlabeled": 40, "augmented": 100}} in rows
    assert summary["recovery_steps"] == 2 and summary["distillation"]["teacher"] == "self"
    assert main(["verify", str(out)]) == 0
