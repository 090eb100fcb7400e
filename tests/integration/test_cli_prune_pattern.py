"""`compress prune --pattern 2:4` through the CLI (in process) on a tiny random BERT: every group of 4
of every pruned matrix, read back from the saved safetensors, holds >= 2 zeros, one-shot and gradual;
fine-tuning keeps them; verify names a broken group; measure reports the pattern; bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.cli.main import main

FAST = ("--batch-size", "8", "--max-length", "32")


def _pruned_weights(run):
    """Every masked matrix of ``run`` as stored in its safetensors, by canonical name."""
    w = load_file(str(run / "model" / "model.safetensors"))
    masks = load_file(str(run / "model" / "masks.safetensors"))
    out = {}
    for name in masks:
        out[name] = w[next(k for k in (name, "bert." + name) if k in w)]
    return out, masks


def _zeros_per_group(t: torch.Tensor) -> torch.Tensor:
    assert t.shape[-1] % 4 == 0
    return (t.reshape(-1, 4) == 0).sum(dim=1)


@pytest.fixture(scope="module")
def oneshot_run(tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("nm") / "oneshot"
    assert main(["prune", "--model", str(tiny_bert), "--pattern", "2:4", "--schedule", "oneshot",
                 "--max-steps", "4", *FAST, "--out", str(out)]) == 0
    return out


def test_oneshot_two_four_every_group_of_every_pruned_matrix(oneshot_run, capsys):
    weights, masks = _pruned_weights(oneshot_run)
    assert len(weights) == 13  # 2 layers x 6 role matrices + word embeddings
    for name, w in weights.items():
        per_group = _zeros_per_group(w)
        assert int(per_group.min()) >= 2, name
        pruned = ~masks[name].bool()
        assert (pruned.reshape(-1, 4).sum(dim=1) == 2).all(), name  # the mask prunes exactly 2
        assert not w[pruned].any(), name
    meta = json.loads((oneshot_run / "model" / "compress.json").read_text())
    assert meta["pruning"]["pattern"] == "2:4" and meta["pruning"]["sparsity"] == 0.5
    summary = json.loads((oneshot_run / "summary.json").read_text())
    assert summary["pattern"] == "2:4"
    report = json.loads((oneshot_run / "sparsity.json").read_text())
    assert report["pattern"]["pattern"] == "2:4" and report["pattern"]["encoder"]
    assert len(report["pattern"]["matrices"]) == 13
    assert oneshot_run.name == "oneshot"


def test_gradual_two_four_ramps_groups_and_ends_on_every_group(tiny_bert, tmp_path, capsys):
    out = tmp_path / "gradual"
    assert main(["prune", "--model", str(tiny_bert), "--pattern", "2:4", "--max-steps", "6",
                 "--prune-steps", "4", "--prune-every", "1", *FAST, "--out", str(out)]) == 0
    assert "2:4 pattern: every group of 4 weights along the input dimension holds >= 2 zeros in all 13" \
        in capsys.readouterr().out
    weights, _ = _pruned_weights(out)
    for name, w in weights.items():
        assert int(_zeros_per_group(w).min()) >= 2, name
    history = json.loads((out / "summary.json").read_text())["prune_history"]
    assert [h["step"] for h in history] == [0, 1, 2, 3, 4]
    sparsities = [h["sparsity"] for h in history]
    assert sparsities[0] == 0 and 0 < sparsities[1] < sparsities[2] < sparsities[3] < 0.5
    assert sparsities[-1] == pytest.approx(0.5, abs=1e-9)


def test_finetune_keeps_the_pattern_and_verify_passes(oneshot_run, tmp_path, capsys):
    kept = tmp_path / "kept"
    assert main(["finetune", "--model", str(oneshot_run), "--max-steps", "6", "--lr", "5e-3",
                 "--weight-decay", "0.1", *FAST, "--out", str(kept)]) == 0
    before, _ = _pruned_weights(oneshot_run)
    after, _ = _pruned_weights(kept)
    assert before.keys() == after.keys()
    moved = 0
    for name in before:
        assert int(_zeros_per_group(after[name]).min()) >= 2, name
        assert torch.equal(after[name] == 0, before[name] == 0), name  # the same zeros
        moved += int((after[name] != before[name]).sum())
    assert moved > 0  # it did train
    capsys.readouterr()
    assert main(["verify", str(kept)]) == 0
    assert "holds the 2:4 pattern" in capsys.readouterr().out


def test_verify_names_a_broken_group(oneshot_run, tmp_path, capsys):
    assert main(["verify", str(oneshot_run)]) == 0
    assert "every group of 4 along their input dimension holds the 2:4 pattern" in capsys.readouterr().out
    bad = tmp_path / "bad"
    shutil.copytree(oneshot_run, bad)
    f = bad / "model" / "model.safetensors"
    w = load_file(str(f))
    name = "encoder.layer.1.attention.output.dense.weight"
    t = w["bert." + name]
    per_group = _zeros_per_group(t)
    g = int(torch.nonzero(per_group == 2)[5])  # a group with exactly 2 zeros: give one back a value
    row, group = divmod(g, t.shape[1] // 4)
    col = group * 4 + int(torch.nonzero(t[row, group * 4:group * 4 + 4] == 0)[0])
    t[row, col] = 0.25
    save_file(w, str(f), metadata={"format": "pt"})
    assert main(["verify", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (f"1 groups break the 2:4 pattern: first {name} row {row} group {group} "
            f"(columns {group * 4}-{group * 4 + 3}) has 1 zero(s), 2 needed") in err


def test_measure_reports_the_pattern_and_storage_only_here(oneshot_run, capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the verdict of a machine without CUDA")
    assert main(["measure", str(oneshot_run), "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    assert "will the 2:4 pattern be faster? here (CPU, no CUDA device): storage only; " \
           "CUDA capability >= 8.0: yes" in out
    assert "zeros in a 2:4 pattern" in out


@pytest.mark.parametrize("args, message", [
    (["--pattern", "4:2"], "--pattern 4:2: N:M needs integers 0 < N < M"),
    (["--pattern", "two:four"], "--pattern 'two:four': expected N:M"),
    (["--pattern", "2:4", "--sparsity", "0.4"], "sparsity 0.5 by definition, not 0.4"),
    (["--pattern", "2:4", "--sparsity", "0.7"], "sparsity 0.5 by definition, not 0.7"),
    (["--pattern", "2:4", "--scope", "global"], "drop --scope 'global'"),
    (["--pattern", "2:4", "--criterion", "random"], "drop --criterion 'random'"),
    (["--pattern", "2:4", "--structured", "heads"], "--structured removes whole heads"),
    (["--pattern", "2:3"], "embeddings.word_embeddings.weight is [30522, 32] (and 12 more); leave it "
                           "out with --exclude"),
])
def test_bad_input_is_one_line_and_writes_nothing(tiny_bert, tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert main(["prune", "--model", str(tiny_bert), "--max-steps", "2", *FAST, "--out", str(out),
                 *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))
