"""Structured pruning: whole heads / FFN neurons removed by magnitude, saved and reloaded exactly."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
)

from compress.core.errors import UsageError
from compress.models import modeling_pruned
from compress.models.architectures import LAYOUTS, encoder_layers, head_layout
from compress.models.loading import save_model
from compress.pruning.structured import (
    CompressBertConfig,
    CompressBertForSequenceClassification,
    layer_sizes,
    prune_structured,
)
from tests.tiny_encoders import ARCHITECTURES, build

HEAD = 16  # head size of the tiny model below: hidden 64 / 4 heads


def tiny_classifier(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


def _blocks(w: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [w[i:i + size] for i in range(0, w.shape[0], size)]


def test_removes_whole_heads_and_neurons_keeping_hidden_size():
    model = tiny_classifier()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    report = prune_structured(model, 0.5)
    sizes = layer_sizes(model)
    assert sum(sizes["heads"]) == 12 - report["heads_removed"]
    assert report["heads_removed"] == 6  # half of 3 layers x 4 heads
    assert abs(report["ffn_removed_fraction"] - 0.5) < 0.02
    assert isinstance(model, CompressBertForSequenceClassification)
    assert isinstance(model.config, CompressBertConfig)
    assert model.config.layer_heads == sizes["heads"] and model.config.layer_intermediate == sizes["ffn"]
    for i, layer in enumerate(model.bert.encoder.layer):
        assert layer.output.dense.out_features == 64 and layer.attention.output.dense.out_features == 64
        # every kept query block is one of the original heads, unchanged
        orig_q = _blocks(original[f"bert.encoder.layer.{i}.attention.self.query.weight"], HEAD)
        for block in _blocks(layer.attention.self.query.weight.detach(), HEAD):
            assert any(torch.equal(block, o) for o in orig_q)
        # every kept FFN row is one of the original rows
        orig_rows = original[f"bert.encoder.layer.{i}.intermediate.dense.weight"]
        kept = layer.intermediate.dense.weight.detach()
        assert all(any(torch.equal(r, o) for o in orig_rows) for r in kept)
    assert report["params_after"] == sum(p.numel() for p in model.parameters()) < report["params_before"]
    ids = torch.randint(5, 500, (2, 9))
    assert model(input_ids=ids).logits.shape == (2, 3)


def test_lowest_magnitude_heads_and_neurons_go_first():
    model = tiny_classifier(1)
    layer = model.bert.encoder.layer[1]
    with torch.no_grad():
        for lin in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value):
            lin.weight[:HEAD] *= 1e-3  # head 0 of layer 1 becomes tiny
            lin.bias[:HEAD] *= 1e-3
        layer.attention.output.dense.weight[:, :HEAD] *= 1e-3
        layer.intermediate.dense.weight[:10] *= 1e-3  # neurons 0-9 of layer 1 become tiny
        layer.output.dense.weight[:, :10] *= 1e-3
    small_q = layer.attention.self.query.weight[:HEAD].clone()
    small_rows = layer.intermediate.dense.weight[:10].clone()
    prune_structured(model, 0.25)
    q = model.bert.encoder.layer[1].attention.self.query.weight.detach()
    assert not any(torch.equal(b, small_q) for b in _blocks(q, HEAD))
    rows = model.bert.encoder.layer[1].intermediate.dense.weight.detach()
    assert not any(torch.equal(r, s) for r in rows for s in small_rows)


def test_only_ffn_or_only_heads():
    m = tiny_classifier()
    r = prune_structured(m, 0.5, ("ffn",))
    assert r["heads_removed"] == 0 and r["ffn_removed"] > 0
    m = tiny_classifier()
    r = prune_structured(m, 0.5, ("heads",))
    assert r["heads_removed"] == 6 and r["ffn_removed"] == 0


def test_reload_in_fresh_process_gives_identical_logits(tmp_path):
    model = tiny_classifier()
    prune_structured(model, 0.4)
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(5, 500, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
    torch.save({"ids": ids, "mask": mask, "logits": ref}, tmp_path / "ref.pt")
    code = (
        "import sys, torch\n"
        "import compress.pruning.structured\n"
        "from transformers import AutoModelForSequenceClassification\n"
        f"m = AutoModelForSequenceClassification.from_pretrained({str(tmp_path / 'm')!r}).eval()\n"
        f"r = torch.load({str(tmp_path / 'ref.pt')!r})\n"
        "with torch.no_grad():\n"
        "    out = m(input_ids=r['ids'], attention_mask=r['mask']).logits\n"
        "print(type(m).__name__, m.config.layer_heads)\n"
        "sys.exit(0 if torch.equal(out, r['logits']) else 3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CompressBertForSequenceClassification" in proc.stdout
    assert str(model.config.layer_heads) in proc.stdout


def test_project_loaders_read_a_structured_model_without_importing_it_first(tmp_path):
    # `compress verify` / re-pruning load saved models through compress.pruning.integrity and
    # AutoModel; the compress_bert type must be registered by them, not by an earlier import.
    model = tiny_classifier()
    prune_structured(model, 0.4)
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "compress.json").write_text('{"label_names": ["a", "b", "c"]}')
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from compress.pruning.integrity import load_saved_model\n"
        "assert 'compress.pruning.structured' not in sys.modules\n"
        f"m = load_saved_model(Path({str(tmp_path / 'm')!r}))\n"
        "print(type(m).__name__, m.config.layer_heads)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"CompressBertForSequenceClassification {model.config.layer_heads}" in proc.stdout


def test_bad_input():
    with pytest.raises(UsageError, match="sparsity"):
        prune_structured(tiny_classifier(), 1.0)
    with pytest.raises(UsageError, match="unknown structured target 'neurons'.*heads, ffn"):
        prune_structured(tiny_classifier(), 0.3, ("neurons",))
    with pytest.raises(UsageError, match="BERT"):
        prune_structured(torch.nn.Linear(3, 3), 0.3)


def test_a_sparsity_that_would_empty_a_layer_is_refused_not_silently_lowered():
    # 2 layers x 4 heads: at 90% the cut-off would empty a layer; that is refused rather than the
    # layer kept whole (torch-pruning's MetaPruner did that silently); 50% and 70% are honoured
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(cfg).eval()
    removed = {}
    for s in (0.5, 0.7, 0.9):
        m = BertForSequenceClassification(cfg).eval()
        m.load_state_dict(model.state_dict())
        try:
            removed[s] = prune_structured(m, s, ("heads",))["heads_removed"]
        except UsageError as exc:
            assert "would leave layer" in str(exc) and "use a lower --sparsity" in str(exc)
            removed[s] = None
    # whatever is returned honours the request within one head per layer
    for s, r in removed.items():
        assert r is None or abs(r - round(s * 8)) <= 2, (s, r)
    assert removed[0.5] == 4 and removed[0.9] is None


# ---------------------------------------------------------------------------------------------
# every architecture of the role table (tests/tiny_encoders.py: 2-3 layers, 4 heads of 8, FFN 64)

def tiny_arch_classifier(folder, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3).eval()


def tiny_inputs(model, seed: int = 1) -> dict[str, torch.Tensor]:
    """Ids above the 5 special tokens, the second row padded after 6 tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    ids[1, 6:] = model.config.pad_token_id
    return {"input_ids": ids, "attention_mask": mask}


def _kept(original: torch.Tensor, pruned: torch.Tensor, width: int) -> list[int]:
    """Which column blocks of ``original`` (``width`` columns each) survive in ``pruned``: matched
    by value, independently of what the pruner reports."""
    blocks = [pruned[:, k:k + width] for k in range(0, pruned.shape[1], width)]
    kept = [j for j in range(original.shape[1] // width)
            if any(torch.equal(original[:, j * width:(j + 1) * width], b) for b in blocks)]
    assert len(kept) == len(blocks), "a pruned block matches no original one"
    return kept


@torch.no_grad()
def zeroed_like(original, pruned):
    """A copy of ``original`` whose heads and FFN neurons missing from ``pruned`` output zero (their
    attention-output / FFN-output columns zeroed): it must compute what ``pruned`` computes."""
    ref = copy.deepcopy(original)
    _, head_dim = head_layout(ref)
    for lo, lp in zip(encoder_layers(ref), encoder_layers(pruned)):
        for role, width in (("attn_out", head_dim), ("ffn_out", 1)):
            w = lo.linears[role].weight
            kept = _kept(w, lp.linears[role].weight, width)
            for j in range(w.shape[1] // width):
                if j not in kept:
                    w[:, j * width:(j + 1) * width] = 0
    return ref


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_prunes_matches_zeroed_original_and_reloads(arch, tiny_encoder, tmp_path):
    folder = tiny_encoder(arch)
    original = tiny_arch_classifier(folder)
    model = copy.deepcopy(original)
    report = prune_structured(model, 0.5)
    layers = encoder_layers(model)
    total_heads, total_ffn = 4 * len(layers), 64 * len(layers)
    # exactly half of the heads and neurons go (ALBERT: of its one shared layer)
    assert report["heads_removed"] == total_heads // 2 and report["ffn_removed"] == total_ffn // 2
    assert model.config.model_type == f"compress_{original.config.model_type}"
    assert model.config.layer_heads == report["layer_heads"] == [len(k) for k in report["kept_heads"]]
    assert model.config.layer_intermediate == report["layer_ffn"]
    assert sum(model.config.layer_heads) == total_heads // 2
    assert sum(model.config.layer_intermediate) == total_ffn // 2
    assert ("shared_layers" in report) == (arch == "albert")
    _, head_dim = head_layout(model)
    for lay, heads in zip(layers, model.config.layer_heads):
        assert lay.linears["attn_out"].in_features == heads * head_dim
        for role, lin in lay.linears.items():
            if role in ("query", "key", "value", "pos_query", "pos_key"):
                assert lin.out_features == heads * head_dim
    assert report["params_after"] == sum(p.numel() for p in model.parameters()) < report["params_before"]

    inputs = tiny_inputs(model)
    with torch.no_grad():
        logits = model(**inputs).logits
        expected = zeroed_like(original, model)(**inputs).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)

    out = tmp_path / "pruned"
    save_model(model, AutoTokenizer.from_pretrained(folder), out, {"note": "test"})
    saved = json.loads((out / "config.json").read_text())
    assert saved["layer_heads"] == model.config.layer_heads
    assert saved["auto_map"]["AutoConfig"].startswith("modeling_pruned.Compress")
    assert (out / "modeling_pruned.py").is_file()
    again = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(again) is type(model)
    with torch.no_grad():
        assert torch.equal(again(**inputs).logits, logits)


def test_deberta_with_separate_position_projections_prunes_them_per_head():
    cfg, _ = build("deberta-v2")
    cfg.share_att_key = False
    cfg.num_labels = 2
    torch.manual_seed(0)
    original = AutoModelForSequenceClassification.from_config(cfg).eval()
    model = copy.deepcopy(original)
    prune_structured(model, 0.5, ("heads",))
    lay = encoder_layers(model)[0]
    assert {"pos_query", "pos_key"} <= set(lay.linears)
    assert lay.linears["pos_key"].out_features == lay.linears["query"].out_features
    inputs = tiny_inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, zeroed_like(original, model)(**inputs).logits,
                                   rtol=1e-4, atol=1e-5)


def test_fused_qkv_and_gated_ffn_rank_whole_heads_and_neurons(tiny_encoder):
    model = tiny_arch_classifier(tiny_encoder("modernbert"))
    lay = encoder_layers(model)[1]
    qkv, wo = lay.linears["qkv"].weight, lay.linears["attn_out"].weight
    w_in, w_out = lay.linears["ffn_in"].weight, lay.linears["ffn_out"].weight
    with torch.no_grad():
        for part in range(3):  # head 2 of layer 1 becomes tiny in the q, k and v blocks
            qkv[part * 32 + 16:part * 32 + 24] *= 1e-3
        wo[:, 16:24] *= 1e-3
        for j in (5, 6):  # neurons 5, 6: input row, gate row (64 + j) and output column
            w_in[j] *= 1e-3
            w_in[64 + j] *= 1e-3
            w_out[:, j] *= 1e-3
    report = prune_structured(model, 0.25)
    assert 2 not in report["kept_heads"][1]
    kept = _kept(w_out.detach(), encoder_layers(model)[1].linears["ffn_out"].weight, 1)
    assert 5 not in kept and 6 not in kept
    # the kept input and gate rows are the same neurons, in the same order
    new_in = encoder_layers(model)[1].linears["ffn_in"].weight
    n = len(kept)
    assert torch.equal(new_in[:n], w_in.detach()[kept])
    assert torch.equal(new_in[n:], w_in.detach()[[64 + j for j in kept]])


def test_refused_sparsity_leaves_the_model_unchanged(tiny_encoder):
    model = tiny_arch_classifier(tiny_encoder("roberta"))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UsageError, match=r"would leave layer \d with none; use a lower --sparsity"):
        prune_structured(model, 0.9, ("heads",))
    with pytest.raises(UsageError, match="removes none"):
        prune_structured(model, 0.05, ("heads",))  # 8 heads: 5% is not one head
    assert type(model).__name__ == "RobertaForSequenceClassification"
    assert model.config.model_type == "roberta"
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_loader_table_matches_the_role_table():
    # modeling_pruned must stay self-contained, so it repeats the module paths of the role table
    for layout in LAYOUTS.values():
        for model_type in layout.model_types:
            mine = modeling_pruned.MODULE_PATHS[model_type]
            fields = ("layers", "roles", "attention", "head_attrs", "heads_config", "glu")
            assert [getattr(mine, f) for f in fields] == [getattr(layout, f) for f in fields], model_type
            assert model_type in modeling_pruned.PRUNED_CLASSES


def test_pruned_module_imports_only_torch_and_transformers():
    import ast

    tree = ast.parse(open(modeling_pruned.__file__, encoding="utf-8").read())
    roots = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert roots <= {"__future__", "json", "re", "shutil", "warnings", "dataclasses", "pathlib", "torch",
                     "transformers"}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


@pytest.mark.parametrize("arch", ["roberta", "modernbert"])
def test_saved_pruned_model_loads_with_remote_code_where_compress_is_not_importable(arch, tiny_encoder,
                                                                                    tmp_path):
    model = tiny_arch_classifier(tiny_encoder(arch))
    prune_structured(model, 0.5)
    save_model(model, AutoTokenizer.from_pretrained(tiny_encoder(arch)), tmp_path / "saved", {})
    alone = tmp_path / "elsewhere" / "pruned"
    shutil.copytree(tmp_path / "saved", alone)
    inputs = tiny_inputs(model)
    with torch.no_grad():
        ref = model(**inputs).logits
    out = logits_equal_without_compress(alone, inputs, ref, tmp_path)
    assert "transformers_modules" in out
    assert f"ForSequenceClassification {model.config.layer_heads}" in out


def test_pruning_a_pruned_model_again_prunes_what_is_left(tmp_path):
    model = tiny_classifier()
    prune_structured(model, 0.5)
    model.save_pretrained(tmp_path / "m")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    before = copy.deepcopy(again)
    report = prune_structured(again, 0.5)
    assert report["layer_heads_before"] == model.config.layer_heads
    assert sum(report["layer_heads"]) == 3 and sum(again.config.layer_heads) == 3  # 6 heads -> 3
    assert type(again) is CompressBertForSequenceClassification
    inputs = tiny_inputs(again)
    with torch.no_grad():
        torch.testing.assert_close(again(**inputs).logits, zeroed_like(before, again)(**inputs).logits,
                                   rtol=1e-4, atol=1e-5)


def test_compress_bert_folders_saved_before_the_loading_code_travelled_still_load(tmp_path):
    # folders written before this change have model type compress_bert, layer_heads and
    # layer_intermediate, and neither auto_map nor modeling_pruned.py
    model = tiny_classifier()
    prune_structured(model, 0.5)
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "modeling_pruned.py").unlink()
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["auto_map"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    assert config["model_type"] == "compress_bert"
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    assert type(again) is CompressBertForSequenceClassification
    ids = torch.randint(5, 500, (2, 9))
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)


def logits_equal_without_compress(folder, inputs: dict, logits: torch.Tensor, tmp_path) -> str:
    """Load ``folder`` with ``trust_remote_code`` in a process where compress cannot be imported, run
    ``inputs``, fail unless its logits equal ``logits``; returns what the process printed (module and
    class of the model, its layer_heads and layer_intermediate)."""
    torch.save({"inputs": inputs, "logits": logits}, tmp_path / "ref.pt")
    code = (
        "import sys\n"
        "sys.modules['compress'] = None  # any import of compress fails\n"
        "import torch\n"
        "from transformers import AutoModelForSequenceClassification\n"
        "try:\n"
        "    import compress  # noqa\n"
        "    sys.exit(4)\n"
        "except ImportError:\n"
        "    pass\n"
        f"m = AutoModelForSequenceClassification.from_pretrained({str(folder)!r},\n"
        "                                                       trust_remote_code=True).eval()\n"
        f"r = torch.load({str(tmp_path / 'ref.pt')!r})\n"
        "with torch.no_grad():\n"
        "    out = m(**r['inputs']).logits\n"
        "print(type(m).__module__, type(m).__name__, m.config.layer_heads, m.config.layer_intermediate)\n"
        "sys.exit(0 if torch.equal(out, r['logits']) else 3)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(folder).parent, env=env)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    return proc.stdout
