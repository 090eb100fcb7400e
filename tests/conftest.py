"""Shared fixtures: a tiny random BERT built in the test, and the real data folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (ROOT / ".." / "shared" / "data").resolve()

os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("NLTK_DATA", str(SHARED_DATA / "nltk_data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and MiniLM's WordPiece tokenizer, on disk."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from compress.models import packaged_model_path

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_bert")
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=512)
    BertModel(cfg).save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(packaged_model_path("minilm")).save_pretrained(folder)
    return folder


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``compress`` CLI in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "compress", *args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=900)
