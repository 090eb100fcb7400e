"""Shared fixtures: a tiny random BERT built in the test, and the real data folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (ROOT / ".." / "shared" / "data").resolve()

os.environ.setdefault("COMPRESS_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("NLTK_DATA", str(SHARED_DATA / "nltk_data"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs one worker per core; each worker (and the CLI subprocesses it starts) then
    # keeps to one thread instead of every process contending for all cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def skip_without_tagger_data() -> None:
    """Augmentation (NLTK's tagger and Punkt) and ReQA's sentence splitting (Punkt) need NLTK data,
    which ships in ../shared/data/nltk_data."""
    if not (SHARED_DATA / "nltk_data").is_dir():
        pytest.skip("../shared/data/nltk_data (NLTK tagger and Punkt data) is not present")


@pytest.fixture
def nltk_data() -> None:
    skip_without_tagger_data()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 BERT with random weights (biases and LayerNorms perturbed) and MiniLM's
    WordPiece tokenizer, on disk."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from compress.models.loading import packaged_model_path
    from tests.tiny_encoders import perturb_defaults

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_bert")
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=512)
    perturb_defaults(BertModel(cfg)).save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(packaged_model_path("minilm")).save_pretrained(folder)
    return folder


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
            isolated: bool = False) -> subprocess.CompletedProcess:
    """Run the real ``compress`` CLI and return what a subprocess run would: exit code, stdout, stderr.

    By default ``compress.cli.main.main`` runs in this process with its output captured: the same
    code path as ``python -m compress``, without 5-10 s of imports per call (about a hundred calls
    in the suite). ``isolated=True`` starts a real subprocess, for what only a fresh interpreter
    shows: output written by library log handlers bound to the real stderr at import time (the
    load report), environment variables a library reads once at import (``NLTK_DATA``,
    ``TMPDIR``). An exception escaping ``main`` becomes exit code 1 with its traceback on stderr,
    as the interpreter would print it; ``sys.argv``, the environment, working folder, torch
    threads and random states are restored after the call."""
    if isolated:
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "compress", *args], capture_output=True,
                              text=True, cwd=cwd, env=full_env, timeout=900)
    import contextlib
    import io
    import random
    import traceback

    import numpy as np
    import torch

    from compress.cli.main import main

    saved_env, saved_cwd, threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    saved_argv, sys.argv = sys.argv, ["compress", *args]  # what a model card records
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env or {})
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
            except Exception:  # what the interpreter would do with it
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
    return subprocess.CompletedProcess([sys.executable, "-m", "compress", *args], code,
                                       out.getvalue(), err.getvalue())


# The child pauses once its first checkpoint is complete (a step checkpoint of the fine-tuning loop,
# or a student's epoch checkpoint), so the kill always lands mid-run however fast the machine runs.
_PAUSE_AFTER_FIRST_CHECKPOINT = """
import pathlib, sys, time
import compress.training.loop as training
from compress.cli.main import main
real_save, real_replace = training.save_checkpoint, pathlib.Path.replace
def save_then_pause(*args, **kwargs):
    out = real_save(*args, **kwargs)
    time.sleep(600)
    return out
def replace_then_pause(self, target):
    out = real_replace(self, target)
    if pathlib.Path(target).name == "student.pt":
        time.sleep(600)
    return out
training.save_checkpoint = save_then_pause
pathlib.Path.replace = replace_then_pause
sys.exit(main(sys.argv[1:]))
"""


def kill_at_first_checkpoint(args: list[str], tmp_run: Path, marker: str = "checkpoint/**/state.sha256"
                             ) -> None:
    """Start ``compress *args``, SIGKILL it once its first checkpoint (``marker``, a glob under
    ``tmp_run``, the run's .tmp- folder) is complete, and check that it really died of the signal."""
    proc = subprocess.Popen([sys.executable, "-c", _PAUSE_AFTER_FIRST_CHECKPOINT, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        try:
            if list(tmp_run.glob(marker)):
                break
        except FileNotFoundError:  # a checkpoint folder renamed into place while the glob walked it
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]


TINY_CONTEXT = "Paris is the capital of France. It has the Eiffel Tower. The Seine flows through it."


def write_tiny_squad(folder: Path, n_articles: int = 3) -> Path:
    """A SQuAD v1.1 file of ``n_articles`` copies of one paragraph with two questions each."""
    arts = [{"title": f"T{i}", "paragraphs": [{"context": TINY_CONTEXT, "qas": [
        {"id": f"{i}-a", "question": "Capital?", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": f"{i}-b", "question": "Tower?",
         "answers": [{"text": "Eiffel", "answer_start": TINY_CONTEXT.index("Eiffel")}]},
    ]}]} for i in range(n_articles)]
    (folder / "dev-v1.1.json").write_text(json.dumps({"data": arts}))
    return folder


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory):
    """``tiny_encoder(arch)`` -> folder of a tiny random encoder of ``arch`` (tests/tiny_encoders.py),
    built once per session and architecture."""
    from tests.tiny_encoders import save_tiny_encoder

    built: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in built:
            built[arch] = save_tiny_encoder(arch, tmp_path_factory.mktemp(f"tiny_{arch}"))
        return built[arch]

    return make


def write_tiny_reuters(folder: Path, n_train: int = 24, n_test: int = 8) -> Path:
    """A ModApte-layout SGML file with three labels (one or two per document)."""
    topics = [("grain",), ("wheat", "grain"), ("corn",)]
    docs = []
    for i in range(n_train + n_test):
        split = "TRAIN" if i < n_train else "TEST"
        tags = "".join(f"<D>{t}</D>" for t in topics[i % 3])
        docs.append(f'<REUTERS TOPICS="YES" LEWISSPLIT="{split}" NEWID="{i + 1}"><TOPICS>{tags}</TOPICS>'
                    f"<TEXT><TITLE>{' '.join(topics[i % 3])} news {i}</TITLE>"
                    f"<BODY>Prices of {topics[i % 3][0]} moved today.</BODY></TEXT></REUTERS>")
    (folder / "reuters21578").mkdir(parents=True)
    (folder / "reuters21578" / "reut2-000.sgm").write_text("\n".join(docs) + "\n")
    return folder
