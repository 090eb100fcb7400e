"""torch -> ONNX export and its mandatory parity check.

* The export uses the TorchScript exporter (``dynamo=False``) on a model loaded with eager
  attention (``compress.export.loading``): that graph has the MatMul/Softmax/MatMul pattern
  onnxruntime's transformer optimizer fuses into ``Attention`` (``compress.export.optimize``). An
  sdpa export (and the dynamo exporter) does not fuse. Inputs are those declared per model kind
  (``compress.export.inputs``); batch and sequence axes are dynamic; the one output is ``logits``.
* Parity: the ONNX model is run on several (batch, length) shapes with padding in the attention
  mask and compared with PyTorch; every mismatch is collected, then one ParityError names each
  output, its max difference and the shapes. fp32 tolerance 1e-4 (absolute, on logits); the other
  precisions have their own (``compress.export.precision.PRECISIONS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.errors import ModelError, ParityError, first_line
from compress.export.inputs import DEFAULT_SHAPES, example_inputs
from compress.export.loading import LoadedModel, torch_logits

FP32_ATOL = 1e-4


class _Exportable(torch.nn.Module):
    """Positional inputs in the declared order -> one tensor (``loaded.output_name``)."""

    def __init__(self, loaded: LoadedModel):
        super().__init__()
        self.model = loaded.model
        self._loaded = loaded

    def forward(self, *args):
        return torch_logits(self._loaded, dict(zip(self._loaded.input_names, args)))


TRACE_LENGTH = 16  # the sequence length the exporter traces at, unless a retrace asks for more
LONGEST_TRACE = 512


def export_onnx(loaded: LoadedModel, path: str | Path, opset: int = 17, length: int = TRACE_LENGTH) -> Path:
    """Export with dynamic batch and sequence axes, traced on a 2 x ``length`` batch; one output,
    ``logits`` [batch, labels] (a sentence-embedding model: ``sentence_embedding`` [batch, hidden])."""
    path = Path(path)
    names = loaded.input_names
    sample = example_inputs(loaded, 2, length)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic[loaded.output_name] = {0: "batch"}
    try:
        with torch.no_grad():
            torch.onnx.export(_Exportable(loaded).eval(), tuple(sample[n] for n in names), str(path),
                              input_names=list(names), output_names=[loaded.output_name],
                              dynamic_axes=dynamic,
                              opset_version=opset, do_constant_folding=True, dynamo=False)
    except torch.onnx.errors.OnnxExporterError as err:  # an operator ONNX has no counterpart for
        Path(path).unlink(missing_ok=True)
        raise ModelError(f"the ONNX exporter cannot export this {loaded.architecture or 'model'} "
                         f"({first_line(err)[:200]}); ONNX has no operator for it at opset {opset}: "
                         "try a newer --opset, or keep this model in PyTorch") from None
    return path


def check_parity(loaded: LoadedModel, onnx_path: str | Path, shapes=DEFAULT_SHAPES,
                 atol: float = FP32_ATOL, provider: str | None = "CPUExecutionProvider",
                 label: str = "fp32") -> dict[str, Any]:
    """Compare ONNX and PyTorch outputs on every (batch, length) shape; raise on any mismatch.

    Returns ``{"atol", "shapes", "max_abs_diff", "argmax_agreement"}``; raises ParityError naming
    each output, its max difference and the shapes where it exceeded ``atol``.
    """
    from compress.export.ort import OrtModel

    ort_model = OrtModel(onnx_path, provider=provider)
    worst: dict[str, float] = {}
    bad: dict[str, list[str]] = {}
    agree = total = 0
    for batch, length in shapes:
        inputs = example_inputs(loaded, batch, length)
        ref = {loaded.output_name: torch_logits(loaded, inputs).float().numpy()}
        try:
            got = ort_model.run(inputs)
        except Exception as err:  # noqa: BLE001 - onnxruntime's own error types; any failure is a mismatch
            raise ParityError(f"{label} ONNX model {Path(onnx_path).name} fails to run at batch {batch} x "
                              f"length {length} ({first_line(err)[:200]})") from None
        for name, want in ref.items():
            have = got.get(name)
            if have is None or have.shape != want.shape:
                shape = None if have is None else have.shape
                raise ParityError(f"ONNX output '{name}' has shape {shape}, PyTorch {want.shape} "
                                  f"at batch {batch} x length {length}")
            diff = float(np.max(np.abs(have.astype(np.float64) - want)))
            worst[name] = max(worst.get(name, 0.0), diff)
            if not diff <= atol:  # also catches NaN
                bad.setdefault(name, []).append(f"{batch}x{length}")
            agree += int(np.sum(have.argmax(-1) == want.argmax(-1)))
            total += want.shape[0]
    if bad:
        parts = [f"output '{n}' max |diff| {worst[n]:.3g} > {atol:g} at batch x length {', '.join(s)}"
                 for n, s in bad.items()]
        raise ParityError(f"{label} ONNX model {Path(onnx_path).name} does not match PyTorch: "
                          + "; ".join(parts))
    return {"label": label, "atol": atol, "shapes": [list(s) for s in shapes],
            "max_abs_diff": worst, "argmax_agreement": agree / total if total else 1.0}


def longest_trace(loaded: LoadedModel) -> int | None:
    """The longest input a retrace uses: the model's position count, at most ``LONGEST_TRACE``
    (None for a model without a transformers config, whose students trace no sizes)."""
    positions = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0:
        return None
    base = getattr(loaded.model, "base_model", None)
    offset = getattr(getattr(base, "embeddings", None), "padding_idx", None)
    if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
        positions -= offset + 1  # RoBERTa's positions start after the padding index
    return min(positions, LONGEST_TRACE) if positions > 0 else None


def export_checked(loaded: LoadedModel, path: str | Path, shapes=DEFAULT_SHAPES, atol: float = FP32_ATOL,
                   provider: str | None = "CPUExecutionProvider", opset: int = 17
                   ) -> tuple[Path, dict[str, Any], str | None]:
    """Export and check parity; -> (path, parity, retrace note or None).

    A model whose code turns a size into a Python number has it frozen by the trace (DeBERTa v1's
    attention span, ``min(length, max_relative_positions)``): its graph traced on a short batch fails
    or differs at other lengths. Such a graph is exported again traced on the model's longest input
    (where the span saturates), and kept only if it passes the same check."""
    path = Path(path)
    export_onnx(loaded, path, opset)
    try:
        return path, check_parity(loaded, path, shapes, atol, provider, "fp32"), None
    except ParityError as err:
        longest = longest_trace(loaded)
        if longest is None or longest <= TRACE_LENGTH:
            raise
        short = first_line(err)
    path.unlink()
    try:
        export_onnx(loaded, path, opset, length=longest)
    except Exception as err:  # noqa: BLE001 - the exporter's or the model's own error, as one line
        path.unlink(missing_ok=True)
        raise ParityError(f"{short}; traced again at length {longest}, the export failed "
                          f"({type(err).__name__}: {first_line(err)[:160]})") from None
    try:
        parity = check_parity(loaded, path, shapes, atol, provider, "fp32")
    except ParityError as err:
        raise ParityError(f"{short}; traced again at length {longest}: {first_line(err)}") from None
    return path, parity, (f"traced at 2x{longest}: the graph traced at 2x{TRACE_LENGTH} failed its "
                          f"check ({short[:200]})")


def onnx_checker(path: str | Path) -> None:
    """``onnx.checker`` on the file (full check, with shape inference); ModelError on failure."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelError(f"{Path(path).name} is not valid ONNX: {(str(exc).splitlines() or [''])[0][:200]}"
                         ) from None
