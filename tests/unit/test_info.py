"""compress info lists the onnxruntime providers that can run here, apart from those merely built in."""

from __future__ import annotations

import json

import pytest
import torch

from compress.export.ort import provider_load_error, unusable_providers, usable_providers

ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def _never(provider):
    raise AssertionError(f"{provider}: no device, so its libraries need no probe")


def test_gpu_providers_without_a_cuda_device_cannot_run():
    bad = unusable_providers(ALL, cuda_device=False, load_error=_never)
    assert set(bad) == {"TensorrtExecutionProvider", "CUDAExecutionProvider"}
    assert all("no CUDA device" in why for why in bad.values())
    assert usable_providers(ALL, cuda_device=False, load_error=_never) == ["CPUExecutionProvider"]


def test_with_a_device_a_provider_whose_libraries_do_not_load_cannot_run():
    def load_error(provider):
        return "libnvinfer.so.10 not found" if provider == "TensorrtExecutionProvider" else None

    assert unusable_providers(ALL, cuda_device=True, load_error=load_error) == {
        "TensorrtExecutionProvider": "libnvinfer.so.10 not found"}
    assert usable_providers(ALL, cuda_device=True, load_error=load_error) == [
        "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_the_probe_says_why_a_provider_does_not_run_and_cpu_runs():
    assert provider_load_error("CPUExecutionProvider") is None
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the CUDA provider may well load")
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():  # onnxruntime-gpu without a GPU
        assert provider_load_error("CUDAExecutionProvider")


def test_info_lists_runnable_providers_and_keeps_the_built_list(monkeypatch, capsys):
    import compress.export.ort as ort_module
    from compress.cli.main import main

    monkeypatch.setattr(ort_module, "available_providers", lambda: list(ALL))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["onnxruntime_providers"] == ["CPUExecutionProvider"]
    assert info["onnxruntime_providers_built"] == ALL
    assert set(info["onnxruntime_providers_unusable"]) == set(ALL[:2])
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "onnxruntime_providers: ['CPUExecutionProvider']" in text
    assert "CUDAExecutionProvider: no CUDA device" in text
