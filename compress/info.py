"""What ``compress info`` reports."""

from __future__ import annotations

from compress import __version__
from compress.runs import environment


def collect_info() -> dict:
    from compress.models import packaged_model_path

    info = {"compress": __version__, **environment()}
    try:
        import onnxruntime as ort

        info["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError:
        info["onnxruntime_providers"] = []
    info["default_model"] = str(packaged_model_path("minilm"))
    return info
