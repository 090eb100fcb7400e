"""onnxruntime session wrapper with the torch call signature, and execution-provider choice.

``OrtModel(path)(input_ids=..., attention_mask=...)`` returns torch tensors like the PyTorch
model it was exported from, so evaluation and benchmarking code can call either one.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.errors import ModelError, UsageError

# short names accepted by --provider -> onnxruntime provider names
PROVIDER_ALIASES: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


# onnxruntime graph rewrites left off on the CPU provider. Its SkipLayerNormalization kernel (the
# fusion of residual Add + LayerNormalization) took 116 ms per batch of 32 x 128 on MiniLM against
# 36 ms for the Add and LayerNormalization it replaces (onnxruntime 1.31, one AVX-512 thread,
# session profiling); with the fusion off the optimized fp32 graph goes from 0.97x to 1.06x of
# PyTorch. The export's optimizer leaves the pair unfused too (compress.export.optimize.optimize_onnx).
CPU_DISABLED_OPTIMIZERS: tuple[str, ...] = ("SkipLayerNormFusion",)


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


# providers that run only on an NVIDIA GPU, with libraries beyond onnxruntime's own (CUDA, cuDNN,
# TensorRT); onnxruntime-gpu lists them whether or not the device and the libraries are there
GPU_PROVIDERS: tuple[str, ...] = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def provider_load_error(provider: str) -> str | None:
    """None when an onnxruntime session asked for ``provider`` really runs on it, else why not.

    A provider whose shared libraries do not load (no TensorRT, a CUDA or cuDNN of another major
    version) is dropped by onnxruntime, which falls back to CPU; a session on a one-node graph finds
    that out exactly as a real session would."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", value[:1], value[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    ort.set_default_logger_severity(4)  # the failed library load is logged as an error: hide it here
    printed = io.StringIO()  # onnxruntime prints an "EP Error" banner before it falls back to CPU
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            session = ort.InferenceSession(model.SerializeToString(), opts,
                                           providers=list(dict.fromkeys([provider, "CPUExecutionProvider"])))
    except Exception as exc:  # noqa: BLE001 - any failure to create the session is the answer
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    finally:
        ort.set_default_logger_severity(2)  # onnxruntime's default (warnings)
    if provider not in session.get_providers():
        said = re.search(r"EP Error .*?\) (.+?) when using", " ".join(printed.getvalue().split()))
        return (said.group(1)[:300] if said else
                "onnxruntime could not load it (its CUDA, cuDNN or TensorRT libraries are missing)")
    return None


def unusable_providers(available: list[str] | None = None, cuda_device: bool | None = None,
                       load_error=provider_load_error) -> dict[str, str]:
    """{provider: why it cannot run here} for the providers onnxruntime lists but cannot use: the
    GPU providers without a CUDA device, or whose libraries do not load."""
    available = available_providers() if available is None else available
    cuda_device = torch.cuda.is_available() if cuda_device is None else cuda_device
    out = {}
    for p in available:
        if p not in GPU_PROVIDERS:
            continue
        if not cuda_device:
            out[p] = "no CUDA device (torch.cuda.is_available() is False)"
        elif (why := load_error(p)) is not None:
            out[p] = why
    return out


def usable_providers(available: list[str] | None = None, cuda_device: bool | None = None,
                     load_error=provider_load_error) -> list[str]:
    """The providers onnxruntime lists that can actually run on this machine, in its order."""
    available = available_providers() if available is None else available
    bad = unusable_providers(available, cuda_device, load_error)
    return [p for p in available if p not in bad]


def default_provider(available: list[str] | None = None, cuda_device: bool | None = None) -> str:
    """CUDA when onnxruntime has the CUDA provider and a CUDA device is present, else CPU.

    onnxruntime-gpu lists CUDAExecutionProvider even on machines with no GPU, so the device itself
    is checked too.
    """
    available = available_providers() if available is None else available
    cuda_device = torch.cuda.is_available() if cuda_device is None else cuda_device
    if "CUDAExecutionProvider" in available and cuda_device:
        return "CUDAExecutionProvider"
    return "CPUExecutionProvider"


def resolve_provider(name: str | None, available: list[str] | None = None) -> str:
    """Validate ``--provider`` (a short alias or a full onnxruntime name) against the available list."""
    available = available_providers() if available is None else available
    if name is None or name == "auto":
        return default_provider(available)
    full = PROVIDER_ALIASES.get(name.lower(), name)
    if full not in available:
        short = {v: k for k, v in PROVIDER_ALIASES.items()}
        listed = ", ".join(f"{short[p]} ({p})" if p in short else p for p in available)
        raise UsageError(f"unknown or unavailable provider '{name}'; available on this machine: {listed}")
    if full == "CUDAExecutionProvider" and not torch.cuda.is_available():
        raise UsageError(f"provider '{name}' is installed but no CUDA device is visible; "
                         "use --provider cpu")
    return full


def session_providers(provider: str) -> list:
    """The ``providers`` argument of an InferenceSession for ``provider``. The CUDA provider runs
    float32 GEMMs in TF32 on Ampere and later GPUs unless ``use_tf32`` is 0 (onnxruntime PR 19357);
    PyTorch's float32 matmuls do not use TF32 by default, so it is turned off: an fp32 row is float32
    on both sides of a comparison, and the 1e-4 parity check compares like with like."""
    if provider == "CPUExecutionProvider":
        return [provider]
    if provider == "CUDAExecutionProvider":
        return [(provider, {"use_tf32": "0"}), "CPUExecutionProvider"]
    return [provider, "CPUExecutionProvider"]


class OrtModel:
    """An ONNX model in an onnxruntime session, called like the torch model.

    ``__call__(input_ids, attention_mask=None, token_type_ids=None)`` returns the first output
    (logits) as a torch tensor; ``run(feeds)`` returns every output as numpy arrays by name.
    Inputs the graph does not declare are dropped; declared inputs that are missing are built
    (all-ones attention mask, all-zeros token types).
    """

    def __init__(self, path: str | Path, provider: str | None = None, threads: int | None = None):
        import onnxruntime as ort

        p = Path(path)
        if not p.is_file():
            raise ModelError(f"ONNX file not found: {p}")
        self.provider = resolve_provider(provider)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
        providers = session_providers(self.provider)
        try:
            disabled = list(CPU_DISABLED_OPTIMIZERS) if self.provider == "CPUExecutionProvider" else None
            self.session = ort.InferenceSession(str(p), sess_options=opts, providers=providers,
                                                disabled_optimizers=disabled)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several untyped errors
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise ModelError(f"{p} is not a valid ONNX model for onnxruntime: {first}") from None
        got = self.session.get_providers()[0]
        if got != self.provider:
            raise ModelError(f"onnxruntime fell back from {self.provider} to {got} for {p}")
        self.path = p
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())

    def _arrays(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        """The session's inputs as int64 numpy arrays, missing mask/token types built."""
        arrays = {}
        for name in self.input_names:
            if name in feeds:
                v = feeds[name]
                arrays[name] = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        ids = arrays.get("input_ids")
        if ids is not None:
            if "attention_mask" in self.input_names and "attention_mask" not in arrays:
                arrays["attention_mask"] = np.ones_like(ids)
            if "token_type_ids" in self.input_names and "token_type_ids" not in arrays:
                arrays["token_type_ids"] = np.zeros_like(ids)
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            if name in arrays:
                arrays[name] = arrays[name].astype(np.int64)
        missing = [n for n in self.input_names if n not in arrays]
        if missing:
            raise UsageError(f"ONNX model {self.path.name} needs inputs {missing}")
        return arrays

    def run(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        outs = self.session.run(None, self._arrays(feeds))
        return dict(zip(self.output_names, outs))

    def bind(self, feeds: dict[str, Any]):
        """Place ``feeds`` on the session's device once and return ``call()``, which runs the
        session on them with the outputs left on the device (onnxruntime's IO binding), and
        returns the outputs as numpy arrays only when asked: ``call(fetch=True)``.

        For timing: a plain ``run`` copies the inputs to the GPU and the outputs back on every call,
        which the PyTorch side (inputs already on the GPU) does not pay.
        """
        import onnxruntime as ort

        device = "cuda" if self.provider == "CUDAExecutionProvider" else "cpu"
        binding = self.session.io_binding()
        placed = {n: ort.OrtValue.ortvalue_from_numpy(a, device, 0) for n, a in self._arrays(feeds).items()}
        for name, value in placed.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, device)

        def call(fetch: bool = False):
            self.session.run_with_iobinding(binding)
            return dict(zip(self.output_names, binding.copy_outputs_to_cpu())) if fetch else None

        call.inputs = placed  # kept alive with the binding
        return call

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, **_: Any) -> torch.Tensor:
        feeds = {"input_ids": input_ids}
        if attention_mask is not None:
            feeds["attention_mask"] = attention_mask
        if token_type_ids is not None:
            feeds["token_type_ids"] = token_type_ids
        return torch.from_numpy(self.run(feeds)[self.output_names[0]])
