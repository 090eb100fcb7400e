"""Copy a BERT folder (the packaged all-MiniLM-L6-v2 by default) as an ERNIE folder: the same
weights and tokenizer under ``model_type: ernie``. ERNIE has BERT's modules and computation (without
task-type embeddings), but no role table in compress, so the copy goes through role discovery: the
real pretrained weights give a check of the discovered path against the table path.

    python benchmarks/as_ernie.py OUT_FOLDER [SOURCE]

Fails unless transformers' ErnieModel loads every weight and computes BERT's output to 1e-5.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer, BertModel, ErnieModel

from compress.models.loading import resolve_model


def main(out: str, source: str = "minilm") -> None:
    src, dst = Path(resolve_model(source)), Path(out)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".gitattributes", "README.md"))
    config = json.loads((dst / "config.json").read_text())
    config.update(model_type="ernie", architectures=["ErnieModel"], use_task_id=False)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    ernie, info = ErnieModel.from_pretrained(dst, output_loading_info=True)
    bert = BertModel.from_pretrained(src)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(AutoModel.from_pretrained(dst)) is ErnieModel
    batch = AutoTokenizer.from_pretrained(dst)(["A sentence to check.", "Another, longer one here."],
                                                padding=True, return_tensors="pt")
    with torch.no_grad():
        diff = (ernie.eval()(**batch).last_hidden_state - bert.eval()(**batch).last_hidden_state).abs().max()
    assert diff < 1e-5, diff
    print(f"{dst}: ERNIE copy of {src.name}, largest difference to BERT {diff:.1e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
