"""What ``compress info`` reports."""

from __future__ import annotations

from compress.core.runs import environment
from compress.core.version import __version__


def collect_info() -> dict:
    """Versions, device and the default model; ``onnxruntime_providers`` are the providers that can
    run here, ``onnxruntime_providers_built`` all that the installed onnxruntime lists (onnxruntime-gpu
    lists CUDA and TensorRT on a machine without a GPU) and ``onnxruntime_providers_unusable`` why
    each of the others cannot run."""
    from compress.models.loading import packaged_model_path

    info = {"compress": __version__, **environment()}
    try:
        from compress.export.ort import available_providers, unusable_providers

        built = available_providers()
        unusable = unusable_providers(built)
    except ImportError:
        built, unusable = [], {}
    info["onnxruntime_providers"] = [p for p in built if p not in unusable]
    info["onnxruntime_providers_built"] = built
    info["onnxruntime_providers_unusable"] = unusable
    info["default_model"] = str(packaged_model_path("minilm"))
    return info
