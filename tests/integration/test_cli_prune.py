"""The real CLI on a tiny random BERT: every stage, masks kept by finetune, verify, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import run_cli, skip_without_tagger_data, write_tiny_squad

FAST = ("--batch-size", "8", "--max-length", "32")


def _zero_pattern(run):
    w = load_file(str(run / "model" / "model.safetensors"))
    masks = load_file(str(run / "model" / "masks.safetensors"))
    out = {}
    for name, m in masks.items():
        key = next(k for k in (name, "bert." + name) if k in w)
        out[name] = (w[key] == 0, m.bool())
    return out


@pytest.fixture(scope="module")
def pruned_run(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "run"
    r = run_cli("prune", "--model", str(tiny_bert), "--sparsity", "0.4", "--max-steps", "6", *FAST,
                "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out, r.stdout


def test_stage_finetune_outputs(pruned_run):
    out, stdout = pruned_run
    for f in ("config.yaml", "env.json", "summary.json", "sparsity.json", "masks.safetensors",
              "model/model.safetensors", "model/masks.safetensors", "model/compress.json"):
        assert (out / f).is_file(), f
    assert "heads min/mean/max" in stdout and "global: 40.0%" in stdout
    report = json.loads((out / "sparsity.json").read_text())
    assert len(report["matrices"]) == 13
    for name, m in report["matrices"].items():
        assert abs(m["sparsity"] - 0.4) <= 0.005, name
    for name, (zero, mask) in _zero_pattern(out).items():
        assert torch.equal(zero, ~mask), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["prune_history"][-1]["step"] == 3  # first half
    meta = json.loads((out / "model" / "compress.json").read_text())
    assert meta["pruning"]["criterion"] == "magnitude" and meta["label_names"]
    from transformers import AutoModelForSequenceClassification

    AutoModelForSequenceClassification.from_pretrained(out / "model")  # plain from_pretrained


def test_finetune_keeps_masks_and_information_deletion_regrows(pruned_run, tmp_path):
    out, _ = pruned_run
    kept = tmp_path / "kept"
    r = run_cli("finetune", "--model", str(out), "--max-steps", "8", "--lr", "5e-3", "--weight-decay",
                "0.1", *FAST, "--out", str(kept))
    assert r.returncode == 0, r.stderr
    before = _zero_pattern(out)
    after = _zero_pattern(kept)
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(after[name][1], before[name][1]), name  # same masks saved
        assert torch.equal(after[name][0], before[name][0]), name  # same zeros, bit for bit
    assert run_cli("verify", str(kept)).returncode == 0
    deleted = tmp_path / "deleted"
    r = run_cli("finetune", "--model", str(out), "--max-steps", "8", "--lr", "5e-3",
                "--information-deletion", *FAST, "--out", str(deleted))
    assert r.returncode == 0, r.stderr
    assert not (deleted / "model" / "masks.safetensors").exists()
    w = load_file(str(deleted / "model" / "model.safetensors"))
    masks = load_file(str(out / "model" / "masks.safetensors"))
    regrown = sum(int((w["bert." + n][~m.bool()] != 0).sum()) for n, m in masks.items()
                  if n.startswith("encoder."))
    assert regrown > 0
    meta = json.loads((deleted / "model" / "compress.json").read_text())
    assert "information_deletion" in meta


def test_verify_catches_a_tampered_model(pruned_run, tmp_path):
    import shutil

    out, _ = pruned_run
    r = run_cli("verify", str(out))
    assert r.returncode == 0 and "ok:" in r.stdout, r.stderr
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    f = bad / "model" / "model.safetensors"
    w = load_file(str(f))
    m = load_file(str(bad / "model" / "masks.safetensors"))["encoder.layer.1.output.dense.weight"].bool()
    t = w["bert.encoder.layer.1.output.dense.weight"]
    i, j = torch.nonzero(~m)[0].tolist()
    t[i, j] = 0.5
    t[torch.nonzero(~m)[1].tolist()[0], torch.nonzero(~m)[1].tolist()[1]] = -0.5
    save_file(w, str(f), metadata={"format": "pt"})
    r = run_cli("verify", str(bad))
    assert r.returncode == 1
    assert "encoder.layer.1.output.dense.weight: 2 regrown" in r.stderr and "Traceback" not in r.stderr


def test_verify_fails_on_a_nan_and_an_inf_in_a_pruned_run_and_a_dense_folder(pruned_run, tiny_bert,
                                                                               tmp_path):
    import shutil

    out, _ = pruned_run
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    f = bad / "model" / "model.safetensors"
    w = load_file(str(f))
    m = load_file(str(bad / "model" / "masks.safetensors"))["encoder.layer.0.attention.self.query.weight"]
    i, j = torch.nonzero(m.bool())[0].tolist()  # a kept weight: the mask check alone passes it
    w["bert.encoder.layer.0.attention.self.query.weight"][i, j] = float("nan")
    w["classifier.weight"][0, 0] = float("inf")  # not pruned at all
    save_file(w, str(f), metadata={"format": "pt"})
    r = run_cli("verify", str(bad))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "2 saved weights are not finite" in r.stderr
    assert "bert.encoder.layer.0.attention.self.query.weight: 1 NaN, 0 inf" in r.stderr
    assert "classifier.weight: 0 NaN, 1 inf" in r.stderr

    dense = tmp_path / "dense"  # a model folder without masks
    shutil.copytree(tiny_bert, dense)
    r = run_cli("verify", str(dense))
    assert r.returncode == 0 and "no masks (dense model)" in r.stdout  # finite, nothing pruned: fine
    w = load_file(str(dense / "model.safetensors"))
    name = sorted(k for k in w if k.endswith("dense.weight"))[0]
    w[name][0, :3] = float("nan")
    save_file(w, str(dense / "model.safetensors"), metadata={"format": "pt"})
    r = run_cli("verify", str(dense))
    assert r.returncode == 1 and f"{name}: 3 NaN, 0 inf" in r.stderr, r.stderr


def test_stage_after_finetune_global_random(tiny_bert, tmp_path):
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_bert), "--stage", "after-finetune", "--schedule", "oneshot",
                "--scope", "global", "--criterion", "random", "--sparsity", "0.5", "--max-steps", "3",
                "--recovery-steps", "4", *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert (s["dense_steps"], s["recovery_steps"]) == (3, 4)
    assert s["eval_dense"] and s["eval_pruned_before_recovery"] and s["eval"]
    for name, (zero, mask) in _zero_pattern(out).items():
        # every pruned weight is zero (random init also has an all-zero [PAD] embedding row, kept)
        assert not (~mask & ~zero).any(), name
    pruned = sum(int((~m).sum()) for _, m in _zero_pattern(out).values())
    total = sum(m.numel() for _, m in _zero_pattern(out).values())
    assert pruned == round(0.5 * total)


def test_after_finetune_oneshot_later_in_recovery_has_no_unrecovered_score(tiny_bert, tmp_path):
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_bert), "--stage", "after-finetune", "--schedule", "oneshot",
                "--sparsity", "0.5", "--max-steps", "2", "--recovery-steps", "4", "--prune-start", "2",
                *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["eval_pruned_before_recovery"] is None  # it would be the dense model's score
    meta = json.loads((out / "model" / "compress.json").read_text())
    assert [h["step"] for h in meta["pruning"]["history"]] == [2]  # pruned 2 steps into recovery
    for name, (zero, mask) in _zero_pattern(out).items():
        assert zero[~mask].all() and (~mask).float().mean() == pytest.approx(0.5, abs=0.005), name


def test_stage_pretrain_then_finetune(tiny_bert, tmp_path, shared_data):
    out = tmp_path / "pre"
    r = run_cli("prune", "--model", str(tiny_bert), "--stage", "pretrain", "--corpus",
                str(shared_data / "wikitext2" / "wiki.valid.tokens"), "--max-steps", "3",
                "--heldout-blocks", "16", *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    m = s["mlm_loss"]
    assert all(isinstance(m[k], float) for k in ("before", "dense_after", "pruned_after"))
    assert "held-out MLM loss" in r.stdout and "unpruned after 3 steps" in r.stdout
    from transformers import AutoModel, BertModel

    assert isinstance(AutoModel.from_pretrained(out / "model"), BertModel)  # encoder, no head
    assert m["head"] == "fresh" and (out / "model" / "mlm_head.safetensors").is_file()
    # Pre-training goes on from the run with the head it trained: on the same held-out blocks the
    # second run's starting loss is the first run's final one (a fresh head would score ~log V).
    more = tmp_path / "more"
    r = run_cli("prune", "--model", str(out), "--stage", "pretrain", "--corpus",
                str(shared_data / "wikitext2" / "wiki.valid.tokens"), "--max-steps", "1",
                "--heldout-blocks", "16", "--no-dense-baseline", *FAST, "--out", str(more))
    assert r.returncode == 0, r.stderr
    m2 = json.loads((more / "summary.json").read_text())["mlm_loss"]
    assert m2["head"] == "mlm_head.safetensors"
    assert m2["before"] == pytest.approx(m["pruned_after"], rel=1e-5)
    ft = tmp_path / "ft"
    r = run_cli("finetune", "--model", str(out), "--max-steps", "3", *FAST, "--out", str(ft))
    assert r.returncode == 0, r.stderr
    for name, (zero, mask) in _zero_pattern(ft).items():
        assert torch.equal(zero, ~mask), name


@pytest.mark.integration
def test_sst2_finetune_of_pruned_model_keeps_pattern(pruned_run, tmp_path, shared_data):
    out, _ = pruned_run
    ft = tmp_path / "sst2"
    r = run_cli("finetune", "--model", str(out), "--task", "sst2", "--data-dir", str(shared_data),
                "--train-limit", "4000", "--max-steps", "200", "--eval-limit", "64", "--lr", "1e-3",
                "--weight-decay", "0.01", *FAST, "--out", str(ft))
    assert r.returncode == 0, r.stderr
    before, after = _zero_pattern(out), _zero_pattern(ft)
    for name in before:
        assert torch.equal(after[name][0], before[name][0]), name


@pytest.mark.parametrize("args, code, needle", [
    (["--sparsity", "1.0"], 2, "--sparsity must be in [0, 1)"),
    (["--sparsity", "-0.1"], 2, "--sparsity must be in [0, 1)"),
    (["--criterion", "snip"], 2, "unknown criterion 'snip'; choose one of: magnitude, random"),
    (["--scope", "row"], 2, "unknown scope 'row'; choose one of: local, global"),
    (["--stage", "train"], 2, "unknown stage 'train'; choose one of: pretrain, finetune, after-finetune"),
    (["--schedule", "cosine"], 2, "unknown schedule 'cosine'; choose one of: oneshot, gradual"),
    (["--include", "nothing_like_this"], 2, "--include 'nothing_like_this' matches no parameter"),
    (["--stage", "pretrain"], 1, "needs --corpus"),
    (["--stage", "pretrain", "--corpus", "EMPTYFILE"], 1, "is empty"),
    (["--stage", "pretrain", "--corpus", "NOTEXTDIR"], 1, "has no text files"),
    (["--stage", "pretrain", "--corpus", "/nonexistent/corpus.txt"], 1, "corpus not found"),
    (["--prune-steps", "2", "--prune-every", "3", "--max-steps", "4"], 2, "--prune-every (3)"),
    (["--recovery-steps", "3"], 2,
     "--recovery-steps applies to --stage after-finetune and post-training only"),
])
def test_bad_input_one_line_no_run_folder(tiny_bert, tmp_path, args, code, needle):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "notext").mkdir()
    (tmp_path / "notext" / "data.csv").write_text("a,b\n")
    args = [str(tmp_path / "empty.txt") if a == "EMPTYFILE" else str(tmp_path / "notext")
            if a == "NOTEXTDIR" else a for a in args]
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_bert), *args, "--out", str(out),
                env={"COMPRESS_ARTIFACTS": str(tmp_path / "a")})
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert any(needle in ln for ln in lines), r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and not list(tmp_path.rglob(".tmp-*"))


def test_verify_bad_input(tmp_path):
    r = run_cli("verify", str(tmp_path))
    assert r.returncode == 1 and "not a run folder" in r.stderr


def test_structured_calls_prune_structured_then_recovers(tiny_bert, tmp_path):
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_bert), "--structured", "heads,ffn", "--sparsity", "0.5",
                "--max-steps", "2", *FAST, "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["structured"]["heads_removed"] > 0 and s["structured"]["ffn_removed"] > 0
    assert s["steps"] == 2 and not (out / "masks.safetensors").exists()
    report = json.loads((out / "sparsity.json").read_text())
    heads = s["structured"]["layer_heads"]
    assert [len(report["heads"][str(i)]["per_head"]) for i in range(len(heads))] == heads


def test_same_seed_same_masks_and_weights(pruned_run, tiny_bert, tmp_path):
    out, _ = pruned_run
    again = tmp_path / "again"
    r = run_cli("prune", "--model", str(tiny_bert), "--sparsity", "0.4", "--max-steps", "6", *FAST,
                "--out", str(again))
    assert r.returncode == 0, r.stderr
    a, b = load_file(str(out / "masks.safetensors")), load_file(str(again / "masks.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    wa = load_file(str(out / "model" / "model.safetensors"))
    wb = load_file(str(again / "model" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("task", ["squad", "reqa"])
def test_qa_and_retrieval_finetune_of_pruned_model_keep_pattern(pruned_run, tmp_path, task):
    out, _ = pruned_run
    if task == "reqa":
        skip_without_tagger_data()
    write_tiny_squad(tmp_path)
    ft = tmp_path / task
    r = run_cli("finetune", "--model", str(out), "--task", task, "--data-dir", str(tmp_path),
                "--split-by-article", "2/1", "--max-steps", "4", "--lr", "1e-2", "--batch-size", "4",
                "--max-length", "48", "--out", str(ft))
    assert r.returncode == 0, r.stderr
    before, after = _zero_pattern(out), _zero_pattern(ft)
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(after[name][0], before[name][0]), name


def _prune_on_tiny_squad(model, task: str, tmp_path, out, sparsity: str, steps: str):
    """``compress prune`` of ``model`` on a tiny SQuAD file (squad or reqa), checked to succeed."""
    if task == "reqa":
        skip_without_tagger_data()  # ReQA splits contexts into sentences with NLTK's Punkt
    write_tiny_squad(tmp_path)
    r = run_cli("prune", "--model", str(model), "--task", task, "--data-dir", str(tmp_path),
                "--split-by-article", "2/1", "--sparsity", sparsity, "--max-steps", steps,
                "--batch-size", "4", "--max-length", "48", "--out", str(out))
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("task", ["squad", "reqa"])
def test_prune_while_finetuning_on_squad_and_reqa(tiny_bert, tmp_path, task):
    out = tmp_path / "run"
    r = _prune_on_tiny_squad(tiny_bert, task, tmp_path, out, "0.4", "6")
    assert "global" in r.stdout and f"run folder: {out}" in r.stdout
    rep = json.loads((out / "sparsity.json").read_text())
    for name, m in rep["matrices"].items():
        assert abs(m["sparsity"] - 0.4) <= 0.005, name
    meta = json.loads((out / "model" / "compress.json").read_text())
    assert meta["task"] == task and meta["pruning"]["sparsity"] == 0.4
    # the saved weights hold the masks' zeros, and verify agrees
    for name, (zeros, mask) in _zero_pattern(out).items():
        assert zeros[~mask].all() and (~mask).float().mean() == pytest.approx(0.4, abs=0.005), name
    v = run_cli("verify", str(out))
    assert v.returncode == 0, v.stderr


@pytest.mark.parametrize("task", ["squad", "reqa"])
def test_repruning_a_pruned_model_on_squad_and_reqa_saves_the_new_masks(pruned_run, tmp_path, task):
    src, _ = pruned_run  # 40% sparse
    out = tmp_path / "run"
    _prune_on_tiny_squad(src, task, tmp_path, out, "0.7", "4")
    new, root = load_file(str(out / "model" / "masks.safetensors")), load_file(str(out / "masks.safetensors"))
    old = load_file(str(src / "model" / "masks.safetensors"))
    assert new.keys() == root.keys() and all(torch.equal(new[k], root[k]) for k in new)
    for name, m in new.items():
        assert (~m.bool()).float().mean() == pytest.approx(0.7, abs=0.005), name
        if name in old:  # masks only shrink: the 40% stay pruned
            assert not (m.bool() & ~old[name].bool()).any(), name
    meta = json.loads((out / "model" / "compress.json").read_text())
    assert meta["pruning"]["sparsity"] == 0.7 and "kept_masks" not in meta["pruning"]
    for name, (zeros, mask) in _zero_pattern(out).items():
        assert zeros[~mask].all(), name


def test_repruning_with_targets_that_leave_out_pruned_matrices_is_refused(pruned_run, tmp_path):
    src, _ = pruned_run
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(src), "--sparsity", "0.6", "--exclude", "encoder.layer.0.*",
                "--max-steps", "2", *FAST, "--out", str(out))
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and "leave out (encoder.layer.0." in err[0] and "add --include" in err[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_prune_structured_on_squad_is_refused(tiny_bert, tmp_path):
    write_tiny_squad(tmp_path)
    out = tmp_path / "run"
    r = run_cli("prune", "--model", str(tiny_bert), "--task", "squad", "--data-dir", str(tmp_path),
                "--structured", "heads", "--out", str(out))
    assert r.returncode == 2 and "--structured supports classification tasks" in r.stderr
    assert not out.exists()
