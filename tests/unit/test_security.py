"""Security rules, enforced by scanning the source with ``ast`` and by loading hostile files.

Rules: model weights only from safetensors; every ``torch.load`` with ``weights_only=True``;
``trust_remote_code`` never on; YAML only through ``yaml.safe_load``/``safe_dump``; no pickle,
``np.load(allow_pickle=True)``, ``eval`` or ``exec`` in shipped code.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from compress.core.errors import IntegrityError, ModelError

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("compress", "students", "pipelines")
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all",
               "Loader", "UnsafeLoader", "FullLoader", "dump", "dump_all"}
PICKLERS = ("pickle", "dill", "cloudpickle", "marshal", "shelve")
NOT_WEIGHTS = ("Tokenizer", "Config", "Processor", "FeatureExtractor")
# loaders that read weights with safetensors only (model2vec's persistence opens model.safetensors
# with safetensors.safe_open and has no pickle path), so they take no use_safetensors flag
SAFETENSORS_ONLY = ("StaticModel",)


def _sources() -> list[Path]:
    files = [p for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20  # the scan really sees the package
    return files


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _enclosing_sets_safetensors(func: ast.AST) -> bool:
    """``**kwargs`` calls pass if the function builds kwargs with use_safetensors=True."""
    for node in ast.walk(func):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "use_safetensors" and _is_true(v):
                    return True
        if isinstance(node, ast.Call) and _is_true(_kw(node, "use_safetensors")):
            return True
    return False


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    bad: list[str] = []
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def where(node) -> str:
        return f"{rel}:{node.lineno}"

    def enclosing(node):
        inside = [f for f in funcs if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)]
        return min(inside, key=lambda f: (f.end_lineno or 0) - f.lineno) if inside else tree

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (node.module == "yaml" and a.name in UNSAFE_YAML) or (
                        node.module == "torch" and a.name == "load") or node.module in PICKLERS:
                    bad.append(f"{where(node)}: from {node.module} import {a.name}")
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in PICKLERS:
                    bad.append(f"{where(node)}: import {a.name}")
        if isinstance(node, ast.keyword) and node.arg == "trust_remote_code" and not (
                isinstance(node.value, ast.Constant) and node.value.value is False):
            bad.append(f"{rel}: trust_remote_code={ast.unparse(node.value)}")
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", None) for t in targets]
            if "trust_remote_code" in names and node.value is not None and not (
                    isinstance(node.value, ast.Constant) and node.value.value is False):
                bad.append(f"{where(node)}: trust_remote_code defaults to {ast.unparse(node.value)}")
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "trust_remote_code" and not (
                        isinstance(v, ast.Constant) and v.value is False):
                    bad.append(f"{where(node)}: 'trust_remote_code': {ast.unparse(v)}")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("eval", "exec"):
            bad.append(f"{where(node)}: {f.id}()")
        if not isinstance(f, ast.Attribute):
            continue
        owner = ast.unparse(f.value)
        if f.attr == "load" and owner == "torch" and not _is_true(_kw(node, "weights_only")):
            bad.append(f"{where(node)}: torch.load without weights_only=True")
        if owner == "yaml" and f.attr in UNSAFE_YAML:
            bad.append(f"{where(node)}: yaml.{f.attr} (use yaml.safe_load / yaml.safe_dump)")
        if owner in ("np", "numpy") and f.attr == "load" and _is_true(_kw(node, "allow_pickle")):
            bad.append(f"{where(node)}: np.load(allow_pickle=True)")
        if owner in ("pickle", "dill", "cloudpickle") and f.attr in ("load", "loads"):
            bad.append(f"{where(node)}: {owner}.{f.attr}")
        if f.attr == "from_pretrained" and not any(w in owner for w in NOT_WEIGHTS + SAFETENSORS_ONLY):
            has_star = any(k.arg is None for k in node.keywords)
            ok = _is_true(_kw(node, "use_safetensors")) or (has_star and _enclosing_sets_safetensors(
                enclosing(node)))
            if not ok:
                bad.append(f"{where(node)}: {owner}.from_pretrained without use_safetensors=True")
    return bad


def test_shipped_source_follows_the_loading_rules():
    found = [v for p in _sources() for v in violations(p)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("snippet, needle", [
    ("import torch\nx = torch.load('f')", "without weights_only=True"),
    ("import torch\nx = torch.load('f', weights_only=False)", "without weights_only=True"),
    ("import yaml\nx = yaml.load(s, Loader=yaml.Loader)", "yaml.load"),
    ("import yaml\nx = yaml.unsafe_load(s)", "yaml.unsafe_load"),
    ("from yaml import load", "from yaml import load"),
    ("import pickle", "import pickle"),
    ("def f(m):\n    return m.from_pretrained(p, trust_remote_code=True)", "trust_remote_code=True"),
    ("def f():\n    return AutoModel.from_pretrained(p)", "without use_safetensors=True"),
    ("def f():\n    kw = {}\n    return AutoModel.from_pretrained(p, **kw)", "without use_safetensors"),
    ("trust_remote_code: bool = True", "trust_remote_code defaults to True"),
    ("import numpy as np\nnp.load('x.npy', allow_pickle=True)", "allow_pickle=True"),
    ("eval('1')", "eval()"),
])
def test_the_scanner_catches_each_rule(tmp_path, snippet, needle):
    """Meta-test: the scan above is not vacuous."""
    p = tmp_path / "probe.py"
    p.write_text(snippet)
    found = violations(p)
    assert any(needle in v for v in found), found


def test_safe_snippets_pass(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text("import torch, yaml\n"
                 "def f():\n"
                 "    kw = {'use_safetensors': True}\n"
                 "    a = AutoModel.from_pretrained(p, **kw)\n"
                 "    t = AutoTokenizer.from_pretrained(p, trust_remote_code=False)\n"
                 "    return torch.load(x, weights_only=True), yaml.safe_load(s), yaml.safe_dump(d)\n")
    assert violations(p) == []


class _Hostile:
    """Pickles to a call that would create a marker file if it were ever unpickled unsafely."""

    marker = ""

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_hostile_checkpoint_is_refused_without_running_code(tmp_path):
    from compress.core.checkpoints import _sha256, load_checkpoint

    marker = tmp_path / "pwned"
    _Hostile.marker = str(marker)
    ck = tmp_path / "ck" / "step-00000001"
    ck.mkdir(parents=True)
    torch.save({"step": 1, "model": _Hostile()}, ck / "state.pt")
    (ck / "state.sha256").write_text(_sha256(ck / "state.pt"))  # even with a valid hash
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(IntegrityError, match="cannot be read") as e:
        load_checkpoint(tmp_path / "ck", m, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1), [])
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_model_folder_with_only_a_pickle_checkpoint_is_not_loaded(tmp_path):
    from transformers import BertConfig

    from compress.models.loading import load_classifier, packaged_model_path

    marker = tmp_path / "pwned"
    _Hostile.marker = str(marker)
    folder = tmp_path / "m"
    folder.mkdir()
    BertConfig(vocab_size=100, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=8).save_pretrained(folder)
    torch.save({"x": _Hostile()}, folder / "pytorch_model.bin")
    tok = packaged_model_path("minilm")
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (tok / f).exists():
            (folder / f).write_bytes((tok / f).read_bytes())
    (folder / "compress.json").write_text(json.dumps({}))
    with pytest.raises(ModelError) as e:
        load_classifier(str(folder), ("a", "b"))
    assert "\n" not in str(e.value)
    assert not marker.exists()
