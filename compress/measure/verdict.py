""""Will it be faster?": what a model's compression can buy on a runtime, and its on-disk size.

Unstructured zeros are stored densely by PyTorch and by ONNX Runtime (which densifies sparse
initializers), and dense GEMM kernels multiply zeros like any other number: they save storage
(after compression) but not time. Removing whole heads / FFN neurons shrinks the matrices, which
every runtime turns into less work. Dynamic int8 (MatMulInteger) is fast on CPUs with VNNI
dot-product instructions (AVX512-VNNI or AVX-VNNI); without them int8 GEMM is emulated with
wider instructions and the gain is small or negative.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
FLOP_UNITS = ((1e12, "TFLOPs"), (1e9, "GFLOPs"), (1e6, "MFLOPs"), (1e3, "kFLOPs"))


def format_flops(flops: float) -> str:
    """``flops`` in the unit that fits, 4 significant digits: 924 -> '924 FLOPs', 411200 ->
    '411.2 kFLOPs', 2.7e9 -> '2.7 GFLOPs' (a logistic regression is not '0.0000 GFLOPs')."""
    for scale, unit in FLOP_UNITS:
        if abs(flops) >= scale:
            return f"{flops / scale:.4g} {unit}"
    return f"{flops:.4g} FLOPs"


def _cpu_flags(cpuinfo: str | None) -> set[str] | None:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            flags.update(line.split(":", 1)[1].split())
    return flags


def cpu_vnni_flags(cpuinfo: str | None = None) -> list[str]:
    """VNNI flags present in ``/proc/cpuinfo`` (or in the given text); [] when unknown."""
    flags = _cpu_flags(cpuinfo) or set()
    return [f for f in VNNI_FLAGS if f in flags]


def cpu_has_avx2(cpuinfo: str | None = None) -> bool:
    """AVX2 in ``/proc/cpuinfo`` (or in the given text): onnxruntime's x86 int8 kernels use it when
    there is no VNNI. False when unknown."""
    return "avx2" in (_cpu_flags(cpuinfo) or set())


def speed_verdict(*, unstructured_sparsity: float = 0.0, structured: bool = False, int8: bool = False,
                  distilled: bool = False, runtime: str = "onnxruntime CPU",
                  vnni: list[str] | None = None, pattern: str | None = None,
                  avx2: bool | None = None) -> dict[str, Any]:
    """One verdict per model: does its compression turn into speed on ``runtime``?

    ``pattern``: the N:M pattern the zeros hold (``semi_structured_verdict`` answers for it per
    device; ``runtime``'s dense kernels multiply them all the same).
    Returns ``{"faster": "yes" | "unlikely" | "storage only" | "no compression", "runtime": ...,
    "reasons": [...]}``.
    """
    vnni = cpu_vnni_flags() if vnni is None else vnni
    avx2 = cpu_has_avx2() if avx2 is None else avx2
    reasons: list[str] = []
    faster = "no compression"
    if unstructured_sparsity > 0.01 and pattern:
        faster = "storage only"
        reasons.append(f"{unstructured_sparsity:.0%} zeros in a {pattern} pattern: {runtime}'s dense "
                       "kernels still multiply them, so no speed-up there; only semi-structured sparse "
                       "kernels skip them (see the pattern's verdict per device)")
    elif unstructured_sparsity > 0.01:
        faster = "storage only"
        reasons.append(f"{unstructured_sparsity:.0%} unstructured zeros: dense kernels still multiply "
                       "them, so no speed-up; they only shrink the compressed file")
    if distilled:
        faster = "yes"
        reasons.append("a distilled student in place of the transformer: a fraction of its FLOPs per "
                       "example on any runtime")
    if structured:
        faster = "yes"
        reasons.append("whole heads / FFN neurons removed: smaller matrices, less work on any runtime")
    if int8:
        on_cpu = "cpu" in runtime.lower()
        if on_cpu and vnni:
            faster = "yes"
            reasons.append(f"dynamic int8 on a CPU with {'/'.join(vnni)}: integer dot products are "
                           "faster than fp32")
        elif on_cpu and avx2:
            # measured: 2.09x eager fp32 and 1.70x the fused fp32 export, MiniLM 32 x 128, 2 threads
            reasons.append("dynamic int8 on a CPU with AVX2 but no VNNI: onnxruntime's AVX2 integer "
                           "kernels still beat fp32 (MiniLM on an AVX2 EPYC: 1.7x the fp32 export at "
                           "batch 32), VNNI would gain more")
            faster = "yes" if structured or distilled else "likely"
        elif on_cpu:
            reasons.append("dynamic int8 on a CPU with neither VNNI nor AVX2: little or no speed-up "
                           "expected")
            faster = "yes" if structured or distilled else "unlikely"
        else:
            reasons.append(f"dynamic int8 (MatMulInteger) on {runtime}: not a fast path there")
    if faster == "no compression":
        reasons.append("dense fp32 model: the baseline")
    return {"faster": faster, "runtime": runtime, "reasons": reasons}


# the kernels that turn an N:M pattern into speed, and what they need
SEMI_STRUCTURED_KERNELS = {
    "2:4": ((8, 0), "PyTorch's semi-structured sparse matmuls (torch.sparse.to_sparse_semi_structured "
                    "of the nn.Linear weights in fp16/bf16/int8, cuSPARSELt or CUTLASS)"),
}


def local_cuda_capability() -> tuple[tuple[int, int] | None, str]:
    """(compute capability of CUDA device 0, its name), or (None, 'CPU, no CUDA device')."""
    import torch

    if not torch.cuda.is_available():
        return None, "CPU, no CUDA device"
    return tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)


def semi_structured_verdict(pattern: str, every_encoder_matrix: bool = True,
                            capability: tuple[int, int] | None = None,
                            device: str = "CPU, no CUDA device") -> dict[str, Any]:
    """'Will it be faster?' for zeros in an N:M ``pattern``, per device, and here (``capability``
    and ``device`` name: the machine measuring, ``local_cuda_capability()``).

    Yes on CUDA devices of the kernels' minimum capability (2:4: 8.0, Ampere and newer) through
    PyTorch's semi-structured sparse kernels; storage only on CPUs, older GPUs and other patterns.
    When only some of the encoder's matrices hold the pattern, the answer there is 'partly'.
    """
    kernel = SEMI_STRUCTURED_KERNELS.get(pattern)
    fast = "yes" if every_encoder_matrix else "partly (the matrices that hold the pattern)"
    per_device: dict[str, str] = {}
    if kernel is not None:
        (major, minor), how = kernel
        per_device[f"CUDA capability >= {major}.{minor}"] = fast
        per_device[f"CPU, CUDA below {major}.{minor}, other runtimes"] = "storage only"
        here = fast if capability is not None and tuple(capability) >= (major, minor) else "storage only"
        reason = (f"{pattern} zeros: {how} skip them on CUDA capability >= {major}.{minor}, in "
                  "matrices whose sizes are multiples of the kernels' tiles (fp16 with CUTLASS: 32 x "
                  "64), most on large batches; dense kernels elsewhere multiply them, so they only "
                  "save storage there")
    else:
        per_device["any device"] = "storage only"
        here = "storage only"
        reason = f"no kernel runs a {pattern} pattern faster (2:4 has PyTorch's semi-structured kernels)"
    cap = "" if capability is None else f", capability {capability[0]}.{capability[1]}"
    return {"pattern": pattern, "per_device": per_device, "here": {"device": f"{device}{cap}",
                                                                   "faster": here}, "reason": reason}


def read_export_report(onnx_path: str | Path) -> dict[str, Any] | None:
    """The report ``compress export`` wrote beside an ONNX file (``model.json`` next to
    ``model.onnx``); None when it is missing or not a JSON object."""
    try:
        report = json.loads(Path(onnx_path).with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def exported_kind(onnx_path: str | Path) -> str | None:
    """The model kind ("bert", "student", ...) recorded in an ONNX file's export report."""
    return (read_export_report(onnx_path) or {}).get("kind")


def is_structured_source(src: str | None) -> bool:
    """Whether ``src`` (the PyTorch model an ONNX file came from) is a structured-pruned encoder
    (``is_structured_config``)."""
    from compress.core.errors import ModelError
    from compress.models.loading import resolve_model
    from compress.models.modeling_pruned import is_structured_config

    if src is None:
        return False
    try:
        cfg = Path(resolve_model(src)) / "config.json"
        return cfg.is_file() and is_structured_config(json.loads(cfg.read_text(encoding="utf-8")))
    except (ModelError, OSError, ValueError):
        return False


def _gzip_size(path: Path, level: int = 6) -> int:
    comp = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31 = gzip container
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            size += len(comp.compress(chunk))
    return size + len(comp.flush())


def disk_sizes(path: str | Path) -> dict[str, Any]:
    """Bytes on disk of a model's weights, raw and gzip-compressed (zeros compress; dense weights
    barely do). ``path`` is an ONNX file, a weights file or a model folder (its *.safetensors,
    *.onnx and *.pt files are summed, leaving out the pruning masks and a pre-training run's MLM
    head, which are not part of the model that runs)."""
    from compress.pruning.integrity import MASKS_FILE
    from compress.pruning.mlm import HEAD_FILE

    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in [*p.glob("*.safetensors"), *p.glob("*.onnx"), *p.glob("*.pt")]
                       if f.name not in (MASKS_FILE, HEAD_FILE))
    else:
        files = [p]
    raw = sum(f.stat().st_size for f in files)
    packed = sum(_gzip_size(f) for f in files)
    return {"files": [f.name for f in files], "bytes": raw, "gzip_bytes": packed,
            "gzip_ratio": packed / raw if raw else 0.0, "compressor": "gzip (zlib level 6)"}
