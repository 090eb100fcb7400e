"""A structured-pruned folder loads with plain ``from_pretrained`` in a fresh process after
``import compress``, whichever of compress and transformers is imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


@pytest.fixture(scope="module")
def pruned_folder(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification

    from compress.pruning.structured import prune_structured
    from tests.tiny_encoders import build

    cfg, _ = build("roberta")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg).eval()
    prune_structured(model, 0.5)
    folder = tmp_path_factory.mktemp("pruned")
    model.save_pretrained(folder)
    ids = torch.arange(5, 17).reshape(1, -1)
    with torch.no_grad():
        torch.save(model(input_ids=ids).logits, folder / "expected.pt")
    return folder


@pytest.mark.parametrize("order", ["import compress\nimport transformers",
                                   "import transformers\nimport compress"])
def test_plain_from_pretrained_after_import_compress(pruned_folder, order):
    code = f"""{order}
import torch
from transformers import AutoModelForSequenceClassification
m = AutoModelForSequenceClassification.from_pretrained({str(pruned_folder)!r}).eval()
assert type(m).__name__ == "CompressRobertaForSequenceClassification", type(m).__name__
with torch.no_grad():
    out = m(input_ids=torch.arange(5, 17).reshape(1, -1)).logits
exp = torch.load({str(pruned_folder / 'expected.pt')!r})
assert torch.allclose(out, exp, atol=1e-5), (out, exp)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_without_import_compress_plain_loading_asks_for_remote_code(pruned_folder):
    code = f"""import sys
sys.modules["compress"] = None
from transformers import AutoModelForSequenceClassification
try:
    AutoModelForSequenceClassification.from_pretrained({str(pruned_folder)!r})
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    raise SystemExit("loaded without the model type registered")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trust_remote_code" in r.stdout
