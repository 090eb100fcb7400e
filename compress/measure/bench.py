"""PyTorch eager vs onnxruntime latency/throughput, same process, same inputs (``bench_models``, what
``compress bench`` and a ``--speedup`` family run).

Each model argument is a model/run/student folder (timed in PyTorch eager and, exported on the
fly with the parity check, in onnxruntime) or an ``.onnx`` file (onnxruntime only; a float16 or
bfloat16 file's row is ``ort-fp16``/``ort-bf16``). PyTorch peers of a folder's eager model answer
"is the export faster than what I would do in PyTorch?" in the same table (``--runtimes``):
``torch-fp16``/``torch-bf16`` (the model cast to half precision; GPU only), ``torch-sparse`` (fp16
with every 2:4-pruned linear in PyTorch's semi-structured sparse form; GPU of compute capability
>= 8.0 only), ``torch-compile``
(``torch.compile`` of the eager model; its compile time, the first call at each shape, is taken
before the timed calls and reported as ``compile_s``) and ``torch-int8`` (dynamic int8
quantization of every ``nn.Linear``; CPU only). Each peer's logits are checked against eager fp32
first (``PEER_ATOL``); a peer that cannot run on this device is listed under ``skipped`` with
the reason. Every
(model, runtime) is timed on the same grid of batch sizes x sequence lengths after warm-up, all
of them in turn for ``rounds`` rounds (so drift of the machine's speed is shared); the first
model's first runtime is the baseline of the ratios, given pooled and as the range over rounds.
Inputs are placed on the device before timing and outputs stay there, for both runtimes
(onnxruntime through IO binding).
All models and sessions are loaded before timing starts, so memory holds every one of them at once.
The machine's measured dense matmul peak is reported beside each model's achieved GFLOP/s (dense
FLOPs of the PyTorch model / time; for int8 files the fp32 model's FLOPs, i.e. "equivalent"
GFLOP/s).
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.core.config import check_choice, check_range, option, to_dict
from compress.core.errors import UsageError
from compress.export.precision import PRECISIONS
from compress.measure.latency import _sync

RUNTIMES = ("torch", "ort", "torch-fp16", "torch-bf16", "torch-compile", "torch-int8", "torch-sparse")
DEFAULT_RUNTIMES = ("torch", "ort")
TORCH_PEERS = ("torch-fp16", "torch-bf16", "torch-compile", "torch-int8", "torch-sparse")
# logits, absolute, against PyTorch eager fp32 on the same inputs: half precision as the ONNX
# half-precision exports (compress.export.precision), int8 as the int8 export; torch.compile reorders and
# fuses float32 arithmetic only.
PEER_ATOL = {"torch-fp16": PRECISIONS["fp16"].atol, "torch-bf16": PRECISIONS["bf16"].atol,
             "torch-compile": 1e-3, "torch-int8": PRECISIONS["int8"].atol,
             "torch-sparse": PRECISIONS["fp16"].atol}
# torch.sparse.to_sparse_semi_structured (CUTLASS/cuSPARSELt 2:4 kernels): NVIDIA Ampere and later
SEMI_STRUCTURED_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class BenchOptions:
    batch_sizes: tuple[int, ...] = option((1, 32), help="batch sizes to time (integers)")
    seq_lens: tuple[int, ...] = option((128,), help="sequence lengths to time")
    warmup: int = option(3, help="untimed calls per model before the first round")
    iterations: int = option(10, help="timed calls per grid point and round")
    rounds: int = option(3, help="rounds in which every model is timed in turn (spreads machine "
                                 "drift evenly)")
    settle_s: float = option(0.1, help="idle seconds before each model's turn, which then starts "
                                       "with one untimed call")
    runtimes: tuple[str, ...] = option(DEFAULT_RUNTIMES, choices=RUNTIMES,
                                       help="for model folders: torch (eager fp32), ort (exported on "
                                            "the fly) and the PyTorch peers torch-fp16, torch-bf16 "
                                            "(GPU only), torch-sparse (2:4-pruned linears in "
                                            "PyTorch semi-structured form; GPU of capability >= "
                                            "8.0), torch-compile (compile time reported apart), "
                                            "torch-int8 (dynamic int8 nn.Linear, CPU only); .onnx "
                                            "files always use ort")
    provider: str = option("auto", help="onnxruntime provider: auto, cpu, cuda or a full provider "
                                        "name")
    threads: int | None = option(None, help="intra-op threads for torch and onnxruntime (unset: "
                                            "torch's)")
    matmul_n: int = option(1024, help="matrix size of the dense matmul peak measurement")
    out: str | None = option(None, help="run folder to create")
    name: str | None = option(None, help="run name")

    def __post_init__(self):
        if not self.batch_sizes or not self.seq_lens:
            raise UsageError("--batch-sizes and --seq-lens need at least one value each")
        for b in self.batch_sizes:
            check_range("batch_sizes", b, 1, 4096)
        for n in self.seq_lens:
            check_range("seq_lens", n, 1, 4096)
        check_range("warmup", self.warmup, 0)
        check_range("iterations", self.iterations, 1)
        check_range("rounds", self.rounds, 1)
        check_range("settle_s", self.settle_s, 0.0, 10.0)
        check_range("matmul_n", self.matmul_n, 16, 16384)
        if self.threads is not None:
            check_range("threads", self.threads, 1)
        for r in self.runtimes:
            check_choice("runtime", r, RUNTIMES)


@dataclass(frozen=True)
class BenchConfig(BenchOptions):
    models: tuple[str, ...] = ("minilm",)

    def __post_init__(self):
        super().__post_init__()
        if not self.models:
            raise UsageError("give at least one model (folder, run folder, 'minilm' or .onnx file)")


def parse_entry(item: str) -> tuple[str, str]:
    """``label=path`` or ``path`` -> (label, path)."""
    label, sep, path = item.partition("=")
    if sep and label and not Path(item).exists():
        return label, path
    return Path(item).name if Path(item).name else item, item


def _flops_source(path: str) -> str | None:
    """The PyTorch model an ONNX file was exported from (its ``compress export`` report), if that
    model can still be found from here; else None (no GFLOP/s for that file)."""
    from compress.core.errors import ModelError
    from compress.measure.verdict import read_export_report

    report = read_export_report(path) or {}
    try:
        src = report["config"]["model"]
        _validate_model_path(src)
    except (KeyError, TypeError, ValueError, ModelError):
        return None
    return src


def _inputs(names: tuple[str, ...], vocab: int, batch: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch * 7919 + length)
    ids = torch.randint(min(1000, vocab - 1), vocab, (batch, length), generator=g)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return {k: v for k, v in out.items() if k in names}


def bench_provider(cfg, entries) -> str:
    """``--provider`` resolved against onnxruntime; ``cuda`` for a bench of PyTorch runtimes only
    (no ``ort`` runtime, no .onnx file) also works with an onnxruntime that lacks the CUDA provider
    (e.g. the CPU wheel) when PyTorch sees a CUDA device: the PyTorch rows then run on the GPU."""
    from compress.export.loading import is_onnx_file
    from compress.export.ort import PROVIDER_ALIASES, resolve_provider

    torch_only = "ort" not in cfg.runtimes and not any(is_onnx_file(path) for _, path in entries)
    wants_cuda = PROVIDER_ALIASES.get(str(cfg.provider).lower(), cfg.provider) == "CUDAExecutionProvider"
    if torch_only and wants_cuda and torch.cuda.is_available():
        return "CUDAExecutionProvider"
    return resolve_provider(cfg.provider)


@dataclass
class BenchTarget:
    """One (model, runtime) to time: ``fn(**feeds) -> logits`` (an ``OrtModel`` for onnxruntime)."""

    label: str
    runtime: str
    fn: Any
    input_names: tuple[str, ...]
    vocab: int
    flops_source: str | None        # the PyTorch model whose FLOPs give its GFLOP/s


@dataclass
class BenchSetup:
    """What every model's loading shares: the provider, device, threads and CPU flags."""

    provider: str
    device: str
    threads: int
    vnni: list[str]
    avx2: bool

    @property
    def runtime_name(self) -> str:
        return "onnxruntime " + ("CUDA" if self.device == "cuda" else "CPU")


def bench_models(cfg: BenchConfig) -> dict[str, Any]:
    """Time every model/runtime on the grid; write ``bench.json`` in a run folder; return the results."""
    from compress.core.runs import RunDir, write_json
    from compress.export.loading import is_onnx_file
    from compress.measure.latency import matmul_peak_gflops
    from compress.measure.verdict import cpu_has_avx2, cpu_vnni_flags

    entries = [parse_entry(m) for m in cfg.models]
    provider = bench_provider(cfg, entries)
    for _, path in entries:  # validate every path before anything is written or timed
        _validate_model_path(path)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    setup = BenchSetup(provider, "cuda" if provider == "CUDAExecutionProvider" else "cpu",
                       torch.get_num_threads(), cpu_vnni_flags(), cpu_has_avx2())
    skipped: list[dict[str, str]] = []  # {model, runtime, reason}: runtimes that cannot run here

    # temps: the ONNX files exported for the ``ort`` runtime, removed when the run ends
    with RunDir("bench", name=cfg.name or "bench", out=cfg.out) as run, contextlib.ExitStack() as temps:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        peak = matmul_peak_gflops(cfg.matmul_n, device=setup.device)
        models_info: list[dict[str, Any]] = []
        targets: list[BenchTarget] = []  # all loaded before any timing
        for label, path in entries:
            if is_onnx_file(path):
                info, found = _onnx_targets(cfg, label, path, setup)
            else:
                info, found = _torch_targets(cfg, label, path, setup, temps, skipped)
            models_info.append(info)
            targets += found
        cells = _time_grid(cfg, targets, setup.device)
        rows = _rows(cfg, targets, cells)
        for row in rows:
            run.log_metrics(row)
        _add_ratios(rows)
        load = _load_average()
        result = {"provider": provider, "device": setup.device, "threads": setup.threads,
                  "matmul_peak": peak, "load_average_1min": load, "cpu_count": os.cpu_count(),
                  "vnni": setup.vnni, "avx2": setup.avx2, "models": models_info, "rows": rows,
                  "skipped": skipped,
                  "baseline": f"{rows[0]['model']} ({rows[0]['runtime']})" if rows else None}
        write_json(run.path / "bench.json", result)
        (run.path / "bench.txt").write_text(format_bench(result) + "\n", encoding="utf-8")
    result["run_dir"] = str(run.path)
    return result


def _onnx_targets(cfg: BenchConfig, label: str, path: str, setup: BenchSetup
                  ) -> tuple[dict[str, Any], list[BenchTarget]]:
    """An .onnx file: timed in onnxruntime only, its row named by its precision (``PRECISIONS``)."""
    from compress.export.ort import OrtModel
    from compress.measure.params import onnx_initializer_stats
    from compress.measure.verdict import exported_kind, is_structured_source, speed_verdict

    sess = OrtModel(path, provider=setup.provider, threads=cfg.threads or setup.threads)
    stats = onnx_initializer_stats(path)
    ops = stats["op_counts"]
    int8 = "MatMulInteger" in ops or "QAttention" in ops
    src = _flops_source(path)
    structured = is_structured_source(src)
    info = {"label": label, "path": path, "kind": "onnx", "flops_source": src, "int8": int8,
            "verdict": speed_verdict(unstructured_sparsity=stats["float_matrix_sparsity"],
                                     structured=structured, int8=int8,
                                     distilled=exported_kind(path) == "student",
                                     runtime=setup.runtime_name, vnni=setup.vnni, avx2=setup.avx2)}
    runtime = PRECISIONS[onnx_precision(path)].runtime
    return info, [BenchTarget(label, runtime, sess, sess.input_names, _onnx_vocab(path), src)]


def _torch_targets(cfg: BenchConfig, label: str, path: str, setup: BenchSetup,
                   temps: contextlib.ExitStack, skipped: list[dict[str, str]]
                   ) -> tuple[dict[str, Any], list[BenchTarget]]:
    """A model folder: PyTorch eager, its peers (each parity-checked, or skipped with the reason)
    and, for ``ort``, its export (exported into a folder of ``temps``, parity-checked)."""
    from compress.export.loading import load_torch_model
    from compress.export.model_export import warning_lines
    from compress.export.onnx import export_checked
    from compress.export.ort import OrtModel
    from compress.measure.verdict import speed_verdict
    from compress.models.modeling_pruned import is_structured_config

    device = setup.device
    loaded = load_torch_model(path, attn_implementation=None)
    model = loaded.model.to(device)
    info: dict[str, Any] = {"label": label, "path": path, "kind": loaded.kind, "flops_source": path,
                            "verdict": speed_verdict(
                                unstructured_sparsity=_encoder_sparsity(model),
                                structured=is_structured_config(getattr(model, "config", None)),
                                distilled=loaded.kind == "student",
                                runtime="PyTorch eager " + device, vnni=setup.vnni, avx2=setup.avx2)}
    found = []
    if "torch" in cfg.runtimes:
        found.append(BenchTarget(label, "torch", _torch_callable(loaded), loaded.input_names,
                                 loaded.vocab_size, path))
    for runtime in (r for r in cfg.runtimes if r in TORCH_PEERS):
        peer = torch_peer(loaded, runtime, device)
        if isinstance(peer, str):
            skipped.append({"model": label, "runtime": runtime, "reason": peer})
            continue
        info.setdefault("peer_parity", {})[runtime] = check_peer_parity(loaded, peer, runtime, device)
        found.append(BenchTarget(label, runtime, peer, loaded.input_names, loaded.vocab_size, path))
    if "ort" in cfg.runtimes:
        eager = load_torch_model(path, attn_implementation="eager")
        tmp = Path(temps.enter_context(tempfile.TemporaryDirectory(prefix="compress-bench-")))
        with warnings.catch_warnings(record=True) as caught:  # in bench.json, not on the terminal,
            warnings.simplefilter("always")  # as `compress export` records them in its report
            onnx_path, info["parity"], retraced = export_checked(eager, tmp / "model.onnx",
                                                                 provider=setup.provider)
        info["exporter_warnings"] = warning_lines(caught)
        if retraced:
            info["trace"] = retraced
        sess = OrtModel(onnx_path, provider=setup.provider, threads=cfg.threads or setup.threads)
        found.append(BenchTarget(label, "ort", sess, sess.input_names, loaded.vocab_size, path))
    return info, found


def _time_grid(cfg: BenchConfig, targets: list[BenchTarget], device: str
               ) -> dict[tuple[int, int, int], dict[str, Any]]:
    """Latency stats per (target index, length, batch). Every grid point times all targets in
    round-robin rounds (measure_interleaved), so drift of the machine's speed during the run does
    not land on one model's side of a ratio."""
    from compress.measure.latency import measure_interleaved

    cells: dict[tuple[int, int, int], dict[str, Any]] = {}
    for length in cfg.seq_lens:
        for batch in cfg.batch_sizes:
            fns, devices, first_call = {}, {}, {}
            for i, t in enumerate(targets):
                feeds = _inputs(t.input_names, t.vocab, batch, length)
                if t.runtime.startswith("torch"):
                    feeds = {k: v.to(device) for k, v in feeds.items()}
                    devices[str(i)] = device
                    fns[str(i)] = lambda fn=t.fn, feeds=feeds: fn(**feeds)
                    if t.runtime == "torch-compile":  # (re)compiles for this shape: not timed with the rest
                        first_call[i] = _first_call_s(fns[str(i)], device)
                else:  # inputs on the device before timing, outputs left there, as for torch
                    fns[str(i)] = t.fn.bind(feeds)
            timed = measure_interleaved(fns, cfg.warmup, cfg.iterations, cfg.rounds, devices,
                                        settle_s=cfg.settle_s)
            for i in range(len(targets)):
                cells[(i, length, batch)] = timed[str(i)]
                if i in first_call:
                    cells[(i, length, batch)]["compile_s"] = first_call[i]
    return cells


def _rows(cfg: BenchConfig, targets: list[BenchTarget], cells) -> list[dict[str, Any]]:
    """One row per (target, length, batch): its timings, throughput and achieved GFLOP/s (dense
    FLOPs of its PyTorch model, counted once per model and length)."""
    from compress.export.loading import load_torch_model
    from compress.measure.flops import count_flops

    flops_cache: dict[tuple[str, int], int] = {}

    def flops_of(src: str | None, length: int) -> int | None:
        if src is None:
            return None
        if (src, length) not in flops_cache:
            m = load_torch_model(src, attn_implementation=None)
            fake = _inputs(m.input_names, m.vocab_size, 1, length)
            flops_cache[(src, length)] = count_flops(m.model, fake)["dense_flops"]
        return flops_cache[(src, length)]

    rows: list[dict[str, Any]] = []
    for i, t in enumerate(targets):
        for length in cfg.seq_lens:
            fl = flops_of(t.flops_source, length)
            for batch in cfg.batch_sizes:
                stats = cells[(i, length, batch)]
                mean_s = stats["mean_ms"] / 1000.0
                rows.append({"model": t.label, "runtime": t.runtime, "batch": batch, "seq_len": length,
                             **stats, "throughput": batch / mean_s,
                             "flops_per_example": fl,
                             "achieved_gflops": fl * batch / mean_s / 1e9 if fl else None})
    return rows


def torch_peer(loaded, runtime: str, device: str):
    """The PyTorch peer ``runtime`` of ``loaded`` (already on ``device``) as ``call(**feeds) -> logits``,
    or, where it cannot run on ``device``, the one-line reason (a str).

    torch-fp16/bf16 cast a copy of the model (GPU only: CPU half-precision matmuls are not what one
    deploys a BERT with). torch-compile wraps the eager model itself (weights shared; compilation
    happens on the first call of each shape). torch-int8 is ``torch.ao.quantization.quantize_dynamic``
    of every ``nn.Linear`` on a copy (int8 weights, activations quantized per call; CPU kernels only).
    """
    from compress.export.loading import LoadedModel

    check_choice("runtime", runtime, TORCH_PEERS)
    model = loaded.model
    if runtime in ("torch-fp16", "torch-bf16"):
        if device != "cuda":
            return "GPU only: PyTorch half precision is timed on a CUDA device, and there is none here"
        peer = copy.deepcopy(model).to(torch.float16 if runtime == "torch-fp16" else torch.bfloat16)
    elif runtime == "torch-int8":
        if device != "cpu":
            return "CPU only: PyTorch's dynamically quantized nn.Linear has no CUDA kernels"
        with torch.no_grad():
            peer = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    elif runtime == "torch-sparse":
        why = semi_structured_unavailable(device)
        if why:
            return why
        peer = copy.deepcopy(model).to(torch.float16)
        converted = to_semi_structured(peer)
        if not converted:
            return ("no nn.Linear holds the 2:4 pattern at a shape the sparse kernels take; prune with "
                    "'compress prune --pattern 2:4' first")
    else:  # torch-compile
        peer = torch.compile(model)
    return _torch_callable(LoadedModel(peer.eval(), loaded.input_names, loaded.kind, loaded.path,
                                       loaded.meta))


def semi_structured_unavailable(device: str) -> str | None:
    """Why PyTorch's 2:4 sparse matmuls cannot run here (None when they can)."""
    if device != "cuda" or not torch.cuda.is_available():
        return ("GPU only: PyTorch's 2:4 semi-structured sparse kernels need a CUDA device of compute "
                "capability >= 8.0, and there is none here")
    cap = torch.cuda.get_device_capability()
    if tuple(cap) < SEMI_STRUCTURED_CAPABILITY:
        return f"the GPU's compute capability {cap[0]}.{cap[1]} is below 8.0, which 2:4 sparse kernels need"
    return None


def two_four_linears(model: torch.nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` layers whose weight holds 2:4 (at least 2 zeros in every group
    of 4 along the input dimension) at a shape the semi-structured kernels take (both dimensions
    multiples of 64)."""
    from compress.pruning.masks import broken_groups

    names = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            out_f, in_f = mod.weight.shape
            if out_f % 64 == 0 and in_f % 64 == 0 and broken_groups(mod.weight, 2, 4)[0] == 0:
                names.append(name)
    return names


def to_semi_structured(model: torch.nn.Module) -> list[str]:
    """Swap each 2:4 ``nn.Linear`` weight of ``model`` (on CUDA, half precision) for its
    ``torch.sparse.to_sparse_semi_structured`` form, in place; the converted layer names."""
    from torch.sparse import to_sparse_semi_structured

    converted = []
    for name in two_four_linears(model):
        mod = model.get_submodule(name)
        mod.weight = torch.nn.Parameter(to_sparse_semi_structured(mod.weight.detach()), requires_grad=False)
        converted.append(name)
    return converted


def check_peer_parity(loaded, peer, runtime: str, device: str, batch: int = 2, length: int = 16
                      ) -> dict[str, Any]:
    """Logits of ``peer`` against eager fp32 on one padded batch; ParityError beyond ``PEER_ATOL``.
    For torch-compile the call compiles, and ``compile_s`` (that first call) is returned too."""
    from compress.core.errors import ParityError
    from compress.export.inputs import example_inputs
    from compress.export.loading import torch_logits

    feeds = {k: v.to(device) for k, v in example_inputs(loaded, batch, length).items()}
    want = torch_logits(loaded, feeds).float()
    start = time.perf_counter()
    got = peer(**feeds).float()
    _sync(device)
    first_s = time.perf_counter() - start
    diff = float((got - want).abs().max())
    atol = PEER_ATOL[runtime]
    if not diff <= atol:  # also NaN
        raise ParityError(f"{runtime} logits differ from PyTorch eager fp32 by {diff:.3g} > {atol:g} "
                          f"at batch {batch} x length {length}")
    out = {"atol": atol, "max_abs_diff": diff, "shape": [batch, length],
           "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean())}
    if runtime == "torch-compile":
        out["compile_s"] = first_s
    return out


def _first_call_s(fn, device: str) -> float:
    """Seconds of one call, synchronized: torch.compile's (re)compilation for a new shape."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def onnx_precision(path: str) -> str:
    """The ``PRECISIONS`` entry whose weight type the file's weight matrices have (fp16/bf16 from
    ``compress export --precision``), else fp32 (int8 files included: their rows stay ``ort``)."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(path), load_external_data=False)
    types = {i.data_type for i in model.graph.initializer if len(i.dims) >= 2}
    for name, precision in PRECISIONS.items():
        if precision.weight_type is not None and getattr(TensorProto, precision.weight_type) in types:
            return name
    return "fp32"


def _load_average() -> float | None:
    """The 1-minute load average: other processes competing for the cores distort CPU timings
    (torch's intra-op threads are hit hardest), so it is recorded and warned about."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _validate_model_path(path: str) -> None:
    from compress.core.errors import ModelError
    from compress.export.loading import is_onnx_file
    from compress.models.loading import resolve_model

    p = Path(path)
    if is_onnx_file(path):
        if not p.is_file():
            raise ModelError(f"ONNX file not found: {path}")
        return
    if p.is_dir() and ((p / "student.json").is_file() or (p / "student" / "student.json").is_file()):
        return
    resolve_model(path)
    if p.is_file():
        raise ModelError(f"{path} is a file, not a model; pass a model folder or an .onnx file")


_ID_PRESERVING = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")


def _onnx_vocab(path: str) -> int:
    """Token-id range of an ONNX model: the first dimension of the table that ``input_ids`` index
    (BERT's word embeddings, not its 512-row position table; a student's embedding or
    vocabulary-sized buffer, an optimized graph's EmbedLayerNormalization), through Cast/Reshape-like
    nodes and an int8 model's DequantizeLinear."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    ids = {"input_ids"}
    for n in model.graph.node:  # nodes are topologically sorted
        if n.op_type in _ID_PRESERVING and n.input[0] in ids:
            ids.update(n.output)

    def table(name: str):
        node = producer.get(name)
        if name not in inits and node is not None and node.op_type == "DequantizeLinear":
            name = node.input[0]
        t = inits.get(name)
        return int(t.dims[0]) if t is not None and t.dims else None

    sizes = [table(n.input[0]) for n in model.graph.node
             if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] in ids]
    # an optimized graph fuses the word-embedding Gather: EmbedLayerNormalization(ids, segments, words...)
    sizes += [table(n.input[2]) for n in model.graph.node
              if n.op_type == "EmbedLayerNormalization" and len(n.input) > 2 and n.input[0] in ids]
    sizes = [v for v in sizes if v]
    return min(sizes) if sizes else 30522


def _encoder_sparsity(model: torch.nn.Module) -> float:
    from compress.measure.params import count_params

    return count_params(model)["encoder_matrix_sparsity"]


def _torch_callable(loaded):
    from compress.export.loading import torch_logits

    def call(**feeds):
        return torch_logits(loaded, feeds)

    return call


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Throughput ratio to the baseline (first model, first runtime) at the same batch x length:
    ``vs_baseline`` of the pooled means, ``vs_baseline_by_round`` of each round's means."""
    if not rows:
        return
    first = (rows[0]["model"], rows[0]["runtime"])
    base = {(r["batch"], r["seq_len"]): r for r in rows if (r["model"], r["runtime"]) == first}
    for r in rows:
        b = base.get((r["batch"], r["seq_len"]))
        r["vs_baseline"] = r["throughput"] / b["throughput"] if b else None
        r["vs_baseline_by_round"] = ([bm / m for bm, m in zip(b["round_mean_ms"], r["round_mean_ms"])]
                                     if b else None)


def format_bench(result: dict[str, Any]) -> str:
    peak = result["matmul_peak"]
    lines = [f"dense fp32 matmul peak: {peak['gflops']:.1f} GFLOP/s ({peak['n']}^3 on {peak['device']}, "
             f"{peak['threads']} threads); provider {result['provider']}; baseline = {result['baseline']}",
             f"{'model':<28} {'runtime':<13} {'batch':>5} {'len':>5} {'mean ms':>9} {'median':>9} "
             f"{'p90':>9} {'ex/s':>9} {'x base':>7} {'rounds':>11} {'GFLOP/s':>8} {'% peak':>7}"]
    for r in result["rows"]:
        g = r["achieved_gflops"]
        gtxt = f"{g:8.1f}" if g is not None else f"{'-':>8}"
        ptxt = f"{100 * g / peak['gflops']:6.1f}%" if g is not None else f"{'-':>7}"
        ratio = f"{r['vs_baseline']:6.2f}x" if r["vs_baseline"] is not None else f"{'-':>7}"
        by_round = r.get("vs_baseline_by_round")
        spread = f"{min(by_round):.2f}-{max(by_round):.2f}" if by_round else "-"
        lines.append(f"{r['model'][:28]:<28} {r['runtime']:<13} {r['batch']:>5} {r['seq_len']:>5} "
                     f"{r['mean_ms']:9.2f} {r['median_ms']:9.2f} {r['p90_ms']:9.2f} {r['throughput']:9.1f} "
                     f"{ratio} {spread:>11} {gtxt} {ptxt}")
    for skip in result.get("skipped", []):
        lines.append(f"skipped: {skip['model']} {skip['runtime']}: {skip['reason']}")
    compiled = [f"{r['model']} {r['batch']}x{r['seq_len']} {r['compile_s']:.1f} s"
                for r in result["rows"] if r.get("compile_s") is not None]
    if compiled:
        lines.append("torch-compile: compilation (first call at each shape, not in the timings): "
                     + ", ".join(compiled))
    load, cores = result.get("load_average_1min"), result.get("cpu_count")
    if load is not None and cores and load > cores:
        lines.append(f"warning: load average {load:.1f} > {cores} cores while timing: other processes "
                     "competed for the CPU; these timings are unreliable")
    lines.append("will it be faster?")
    for m in result["models"]:
        v = m["verdict"]
        lines.append(f"  {m['label']}: {v['faster']} ({v['runtime']}): " + "; ".join(v["reasons"]))
    return "\n".join(lines)
