"""A truncated weights or masks file is refused in one line naming the file and the fix."""

from __future__ import annotations

import shutil

import pytest
import torch

from compress.cli.main import main
from compress.core.errors import CorruptFileError
from compress.models.loading import check_safetensors_file
from compress.pruning.integrity import MASKS_FILE, save_masks


@pytest.fixture
def pruned_run(tiny_bert, tmp_path):
    """A run folder as 'compress prune' leaves it: model/ with the weights and the masks."""
    run = tmp_path / "run"
    shutil.copytree(tiny_bert, run / "model")
    weight = "encoder.layer.0.intermediate.dense.weight"
    save_masks({weight: torch.ones(64, 32, dtype=torch.bool)}, run / "model" / MASKS_FILE)
    return run


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_whole_file_passes_and_a_cut_or_garbage_one_is_named(pruned_run, tmp_path):
    masks = pruned_run / "model" / MASKS_FILE
    check_safetensors_file(masks)  # whole: no error
    _truncate(masks)
    with pytest.raises(CorruptFileError, match=f"{MASKS_FILE} is truncated or corrupt.*copy"):
        check_safetensors_file(masks)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CorruptFileError, match="garbage.safetensors"):
        check_safetensors_file(garbage)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    with pytest.raises(CorruptFileError, match="tiny.safetensors"):
        check_safetensors_file(tiny)


@pytest.mark.parametrize("damaged", [MASKS_FILE, "model.safetensors"])
@pytest.mark.parametrize("command", ["verify", "finetune"])
def test_verify_and_finetune_refuse_a_truncated_run_in_one_line(pruned_run, tmp_path, capsys,
                                                                command, damaged):
    assert main(["verify", str(pruned_run)]) == 0  # the intact run is fine
    capsys.readouterr()
    _truncate(pruned_run / "model" / damaged)
    argv = (["verify", str(pruned_run)] if command == "verify" else
            ["finetune", "--model", str(pruned_run), "--max-steps", "1", "--out", str(tmp_path / "ft")])
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"model/{damaged} is truncated or corrupt" in err and "re-run the command" in err, err
    assert not (tmp_path / "ft").exists()
