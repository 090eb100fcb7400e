"""The PRECISIONS table: every entry converts, has a tolerance, is a choice of the export config,
names its bench row, and its conversion passes its own parity check on a tiny BERT."""

from __future__ import annotations

import dataclasses

import pytest

from compress.export.loading import load_torch_model
from compress.export.onnx import export_onnx
from compress.export.precision import PRECISION_CHOICES, PRECISIONS, QUANTIZE_CHOICES
from compress.measure.bench import RUNTIMES, onnx_precision
from compress.recipes.export import ExportConfig

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_every_precision_has_a_conversion_a_tolerance_and_is_an_export_choice(name, tmp_path):
    p = PRECISIONS[name]
    assert p.name == name
    assert callable(p.convert) and callable(p.check)
    assert p.atol > 0
    assert p.option in ("precision", "quantize")
    cfg = ExportConfig(to=str(tmp_path / "m.onnx"), **{p.option: name})
    assert cfg.target == name and cfg.target_atol == p.atol
    assert name in (PRECISION_CHOICES if p.option == "precision" else QUANTIZE_CHOICES)
    assert p.runtime == "ort" or p.runtime.startswith("ort-")
    choices = {f.name: f.metadata.get("choices") for f in dataclasses.fields(ExportConfig)}
    assert name in choices[p.option]


def test_choices_are_the_table():
    assert set(PRECISION_CHOICES) | set(QUANTIZE_CHOICES) == set(PRECISIONS)
    assert PRECISION_CHOICES[0] == "fp32"  # the default of --precision
    assert "ort" in RUNTIMES


@pytest.fixture(scope="module")
def fp32_export(tiny_bert, tmp_path_factory):
    loaded = load_torch_model(str(tiny_bert))
    return loaded, export_onnx(loaded, tmp_path_factory.mktemp("precisions") / "fp32.onnx")


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_every_conversion_passes_its_own_parity_check(fp32_export, name, tmp_path):
    loaded, fp32 = fp32_export
    p = PRECISIONS[name]
    out = tmp_path / f"{name}.onnx"
    summary = p.convert(fp32, out)
    assert out.is_file() and isinstance(summary, dict)
    parity = p.check(loaded, out, ((1, 8), (2, 16)), p.atol, "CPUExecutionProvider")
    assert parity["label"] == name
    if "skipped" in parity:  # the CPU provider has no kernels for it: the table says so
        assert not p.cpu_runs and "no kernel for" in parity["skipped"]
    else:
        assert parity["max_abs_diff"]["logits"] <= p.atol
    if p.weight_type is not None:  # bench recognises the file and names its row
        assert onnx_precision(str(out)) == name
    else:
        assert onnx_precision(str(out)) == "fp32" and p.runtime == "ort"
