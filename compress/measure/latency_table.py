"""A latency model of a structured-pruned encoder in the runtime it will ship in, measured on this
machine at one batch x sequence length.

A structured-pruned encoder keeps ``h_l`` attention heads and ``w_l`` FFN neurons in layer ``l``;
either may be zero (the whole attention or FFN block removed). Its time is modelled as

    T(model) = dense_scale * (base + sum over layers l of [layer_fixed * kept_l + A(h_l) + F(w_l)])

* ``base``: a 0-layer model (embeddings, pooler and classifier head);
* ``layer_fixed``: a layer whose attention and FFN blocks are both empty (its two LayerNorms and
  residual adds remain); ``kept_l`` is 1 for every layer the model has. A layer left with no head
  and no neuron still runs its LayerNorms in the pruned model classes
  (``compress.models.modeling_pruned``), so it counts unless ``drop_empty_layers`` says the model
  ships without it (a layer left out of the layout is not there at all);
* ``A(h)``, ``F(w)``: the time of an attention block with ``h`` heads and of an FFN block of width
  ``w``, with ``A(0) = F(0) = 0``;
* ``dense_scale``: the measured dense model's time over that sum for the dense layout (at least 1).

How it is measured (``latency_table``): 1-layer structured-pruned classifiers with random weights
are built from the model's config (``compress.models.modeling_pruned``), one per grid point, and
timed in the runtime: ``A(h) = T1(h, 0) - T1(0, 0)``, ``F(w) = T1(0, w) - T1(0, 0)``,
``layer_fixed = T1(0, 0) - T0`` with ``T0`` the 0-layer model. ``A`` is measured at every head
count 1..H for H <= 16 (a grid above), ``F`` on a grid of widths denser at small widths (a block of
8 neurons still pays its kernels' dispatch) and interpolated piecewise-linearly between its points.
Timing noise must not make fewer units look slower, so both grids are fitted monotone
non-decreasing (isotonic regression, pool-adjacent-violators) and clipped at 0.

* Families whose pruned classes cannot build an empty block (``modeling_pruned.can_empty_blocks``) are
  measured against the smallest layer instead: ``A(h) = T1(h, 1) - T1(1, 1)``, ``F(w) = T1(1, w) -
  T1(1, 1)`` and ``layer_fixed = T1(1, 1) - T0`` (so ``A(1) = F(1) = 0`` and the smallest blocks'
  time sits in ``layer_fixed``). The table's ``reference`` says which ("empty" or "smallest"); a
  "smallest" table predicts a layer with exactly one empty block only by refusing it.
* The 1-layer models use a vocabulary of ``TIMING_VOCAB`` rows: the export, optimization and
  quantization of MiniLM's 30522 x 384 embedding took about 4 s per model against 0.5 s, and
  every difference above is between models of the same vocabulary. ``base`` is a 0-layer model at
  the real vocabulary; ``layer_fixed`` subtracts a 0-layer model at the timing vocabulary.
* onnxruntime fuses the embeddings into ``EmbedLayerNormalization`` only when their LayerNorm
  feeds an attention block: the 0-layer models and ``T1(0, *)`` run them unfused, so ``A(h)`` also
  holds the difference between the fused and the unfused embeddings (about 1 ms at MiniLM's 32 x
  128 in int8); each measured configuration's fused operators are in ``configs``. A model whose
  first layer keeps no head runs its embeddings unfused too, which the table does not see.
* The full dense model is measured once too (``dense_ms``) beside its prediction
  (``dense_predicted_ms``), so the table says how far its sum is from a real model. On MiniLM in
  int8 at 32 x 128 on an idle machine the sum came out 6-16% below the measured time (162 ms
  against 150-153 ms), and the real members of a family measured 2-15% above their own sums, the
  smaller the model the less: the time the blocks do not explain grows with the model. So every
  prediction is multiplied by ``dense_scale`` (measured dense time over its sum, at least 1):
  ``predict_ms`` of the dense layout equals ``dense_ms``, and predicted speedups are ratios of
  sums. (Charged as a fixed cost instead, the 9.7 ms gap of one such table made the 4x member of a
  family measure 5.4x the dense export on an idle machine: its 33.5 ms were predicted at 40.5.) The
  gap itself is kept as ``residual_ms``. A dense timing and a sum more than ``DENSE_TOLERANCE``
  apart either way say the machine was busy while one of them ran (noise only adds time): the one
  that is slower is timed again, and the table is refused if they still disagree
  (``trusted_timings``). A table whose grid was timed on a busy machine once summed to 598 ms
  against 173 ms for the dense model and steered a family search.

Runtimes (``RUNTIMES``): ``ort-int8`` (what ``compress export --optimize --quantize int8`` writes),
``ort-fp32`` (optimized fp32 ONNX), ``torch`` (PyTorch eager fp32, transformers' default attention)
and ``ort-cuda-fp16`` (optimized, float16, onnxruntime's CUDA provider; only where it is usable).
Timings are medians of ``measure_interleaved`` rounds with the intra-op thread count ``compress
bench`` uses (``threads``, unset: torch's), on batch x seq_len random ids with a full attention mask.
Every grid model is built and loaded first, then all are timed in turn in each round, so the
machine's drift is spread over all of them. The dense model's prediction sums ``T1(H, *)`` and
``T1(*, full)`` minus the 1-layer reference and the 0-layer model once per layer, so the noise of
those two is multiplied by the layer count: they get ``REFERENCE_TURNS`` turns per round, spread
through the order, and their medians are averaged.

Tables are cached as one JSON file per key (machine, runtime, batch, seq_len, threads, grids and
the architecture's shape, ``cache_key``) in ``cache_dir`` (unset: ``$COMPRESS_CACHE_DIR/latency``,
else ``~/.cache/compress/latency``); a second call with the same key reads the file and times
nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import tempfile
import time
import warnings
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from compress.core.errors import MeasurementError, UsageError
from compress.measure.latency import measure_interleaved

T = TypeVar("T")

FORMAT = 3                 # bumped when a cached table's meaning changes
TIMING_VOCAB = 1024        # vocabulary of the 1-layer timing models (see the module docstring)
DENSE_HEADS_UP_TO = 16     # every head count is measured up to this many heads


# ----------------------------------------------------------------------------- runtimes


@dataclass(frozen=True)
class Runtime:
    """One way a model ships: ``precision`` is the ``compress.export.precision.PRECISIONS`` name of
    its ONNX graph (None: PyTorch eager), ``provider`` onnxruntime's execution provider."""

    name: str
    help: str
    precision: str | None
    provider: str = "CPUExecutionProvider"


RUNTIMES: dict[str, Runtime] = {
    "ort-int8": Runtime("ort-int8", "optimized ONNX, dynamic int8 (compress export --optimize "
                        "--quantize int8), onnxruntime CPU", "int8"),
    "ort-fp32": Runtime("ort-fp32", "optimized fp32 ONNX, onnxruntime CPU", "fp32"),
    "torch": Runtime("torch", "PyTorch eager fp32 on the CPU", None),
    "ort-cuda-fp16": Runtime("ort-cuda-fp16", "optimized float16 ONNX, onnxruntime CUDA", "fp16",
                             "CUDAExecutionProvider"),
}


def check_runtime(name: str) -> Runtime:
    """The ``RUNTIMES`` entry ``name``; UsageError naming the valid ones, or why it cannot run here."""
    if not isinstance(name, str) or name not in RUNTIMES:
        raise UsageError(f"unknown runtime {name!r}; choose from: {', '.join(RUNTIMES)}")
    rt = RUNTIMES[name]
    if rt.provider != "CPUExecutionProvider":
        from compress.export.ort import available_providers, unusable_providers

        if rt.provider not in available_providers():
            raise UsageError(f"runtime '{name}' needs onnxruntime's {rt.provider}, which this "
                             "onnxruntime lacks (install onnxruntime-gpu)")
        why = unusable_providers().get(rt.provider)
        if why is not None:
            raise UsageError(f"runtime '{name}' cannot run here: {why}")
    return rt


# ----------------------------------------------------------------------------- grids and fits


def head_grid(num_heads: int) -> tuple[int, ...]:
    """Head counts timed: every count 1..H up to ``DENSE_HEADS_UP_TO`` heads, else 1-4 and eighths."""
    if num_heads <= DENSE_HEADS_UP_TO:
        return tuple(range(1, num_heads + 1))
    points = {1, 2, 3, 4} | {round(num_heads * k / 8) for k in range(1, 9)}
    return tuple(sorted(p for p in points if 1 <= p <= num_heads))


def width_grid(width: int, linear_steps: int = 6) -> tuple[int, ...]:
    """FFN widths timed: 1 and powers of two from 8 below ``width / linear_steps`` (small blocks are
    dominated by dispatch, not arithmetic), then ``linear_steps`` even steps up to ``width``
    (multiples of 8 where the step allows). MiniLM's 1536: 1 8 16 32 64 128 256 512 ... 1536."""
    step = width / linear_steps
    points = {1} | {2**k for k in range(3, 31) if 2**k < step}
    for k in range(1, linear_steps + 1):
        p = step * k
        points.add(width if k == linear_steps else max(1, 8 * round(p / 8) if step >= 64 else round(p)))
    return tuple(sorted(p for p in points if 1 <= p <= width))


def isotonic(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing fit of ``values`` (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return out


def monotone_from_zero(raw: Sequence[float]) -> list[float]:
    """``raw`` (block times at the grid points after the reference) fitted non-decreasing together
    with the reference's 0 in front, clipped at 0; returns the fit without that leading 0."""
    return [max(0.0, v) for v in isotonic([0.0, *raw])][1:]


def interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear ``y(x)`` through the points (``xs`` increasing); x must lie in their range."""
    if not xs[0] <= x <= xs[-1]:
        raise UsageError(f"{x} is outside the measured range {xs[0]}..{xs[-1]}")
    i = bisect_left(xs, x)
    if xs[i] == x:
        return float(ys[i])
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class LatencyTable:
    """A measured latency model (module docstring), in milliseconds per batch.

    ``heads``/``widths`` are the grids including the reference point (0 for ``reference`` "empty",
    1 for "smallest"), ``attention_ms``/``ffn_ms`` grids their monotone fits (0 at the reference)
    and ``*_raw_ms`` the measured differences before the fit. ``configs``: every timed model, its
    median and p90 and the onnxruntime operators the optimizer fused. ``phase_seconds``: where
    ``build_seconds`` went.
    """

    key: dict[str, Any]
    runtime: str
    batch: int
    seq_len: int
    num_layers: int
    num_heads: int
    ffn_width: int
    reference: str
    base_ms: float
    layer_fixed_ms: float
    heads: tuple[int, ...]
    attention_grid_ms: tuple[float, ...]
    attention_raw_ms: tuple[float, ...]
    widths: tuple[int, ...]
    ffn_grid_ms: tuple[float, ...]
    ffn_raw_ms: tuple[float, ...]
    dense_ms: float
    dense_predicted_ms: float
    build_seconds: float
    repeats: int
    phase_seconds: dict[str, float] = field(default_factory=dict)
    configs: tuple[dict[str, Any], ...] = ()
    # the measured dense time the block sum does not explain (0 if the sum is higher); predictions
    # charge it in proportion to the blocks (``dense_scale``)
    residual_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))  # tuples -> lists: what JSON holds

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyTable:
        tuples = {"heads", "attention_grid_ms", "attention_raw_ms", "widths", "ffn_grid_ms", "ffn_raw_ms",
                  "configs"}
        return cls(**{k: tuple(v) if k in tuples else v for k, v in data.items()})

    def attention_ms(self, heads: int) -> float:
        """Time of an attention block keeping ``heads`` heads (0: the block removed)."""
        return self._block_ms(heads, self.heads, self.attention_grid_ms, self.num_heads, "attention heads")

    def ffn_ms(self, width: int) -> float:
        """Time of an FFN block of ``width`` neurons (0: the block removed), interpolated."""
        return self._block_ms(width, self.widths, self.ffn_grid_ms, self.ffn_width, "FFN neurons")

    def _block_ms(self, n: int, xs, ys, full: int, unit: str) -> float:
        if not 0 <= n <= full:
            raise UsageError(f"{n} {unit}: a layer of this architecture has 0..{full}")
        if n == 0 and self.reference == "empty":
            return 0.0
        if n == 0:
            raise UsageError(f"0 {unit}: this table's architecture cannot build an empty block "
                             f"(measured against the smallest one); only whole layers can be removed")
        return interpolate(n, xs, ys)

    @property
    def dense_scale(self) -> float:
        """The measured dense time over the sum of its blocks, at least 1 (1 before the dense model is
        measured): what every prediction is multiplied by."""
        if self.dense_predicted_ms <= 0 or self.dense_ms <= self.dense_predicted_ms:
            return 1.0
        return self.dense_ms / self.dense_predicted_ms

    def predict_ms(self, layer_heads: Sequence[int], layer_ffn: Sequence[int],
                   drop_empty_layers: bool = False) -> float:
        """Predicted ms per batch of an encoder whose layer l keeps ``layer_heads[l]`` heads and
        ``layer_ffn[l]`` FFN neurons: base plus every layer's fixed cost and blocks, times
        ``dense_scale``. A layer with both 0 costs ``layer_fixed_ms`` (its LayerNorms run) unless
        ``drop_empty_layers`` (the model ships without it)."""
        if len(layer_heads) != len(layer_ffn):
            raise UsageError(f"layer_heads has {len(layer_heads)} layers, layer_ffn {len(layer_ffn)}")
        total = self.base_ms
        for h, w in zip(layer_heads, layer_ffn):
            if h == 0 and w == 0 and drop_empty_layers:
                continue
            total += self.layer_fixed_ms + self.attention_ms(h) + self.ffn_ms(w)
        return total * self.dense_scale

    def dense_layout(self) -> tuple[list[int], list[int]]:
        return [self.num_heads] * self.num_layers, [self.ffn_width] * self.num_layers

    def predicted_speedup(self, layer_heads: Sequence[int], layer_ffn: Sequence[int]) -> float:
        """Predicted dense time / predicted time of the layout (both from this table)."""
        return self.predict_ms(*self.dense_layout()) / self.predict_ms(layer_heads, layer_ffn)


# ----------------------------------------------------------------------------- architecture and key


@dataclass(frozen=True)
class ArchShape:
    """What a table depends on of the architecture: the unpruned sizes of one layer, the layer count
    (for the dense model) and the vocabulary (the 0-layer base)."""

    model_type: str            # base type: bert, roberta, distilbert, ...
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int
    activation: str


def encoder_config(model_or_config):
    """The transformers config of a model, a config, or a model spec ('minilm', a folder)."""
    if isinstance(model_or_config, (str, Path)):
        from transformers import AutoConfig

        from compress.models.loading import register_model_types, resolve_model

        path = resolve_model(str(model_or_config))
        register_model_types(path)
        return AutoConfig.from_pretrained(path)
    if isinstance(model_or_config, torch.nn.Module):
        config = getattr(model_or_config, "config", None)
        if config is None:
            raise UsageError(f"a {type(model_or_config).__name__} has no transformers config; pass a "
                             "Hugging Face encoder, its config or a model folder")
        return _with_discovered_layout(model_or_config, config)
    if not hasattr(model_or_config, "model_type"):
        raise UsageError(f"expected a model, a transformers config or a model folder, got "
                         f"{type(model_or_config).__name__}")
    return model_or_config


def _with_discovered_layout(model: torch.nn.Module, config):
    """``config``, or for a type without a module table a copy carrying ``pruned_layout`` (the layout
    role discovery found in ``model``), so the timed 1-layer models can be built at any size."""
    import copy

    from compress.models.architectures import find_layout, layout_to_dict

    layout = find_layout(model)
    if layout is None or not layout.discovered or getattr(config, "pruned_layout", None):
        return config
    config = copy.deepcopy(config)
    config.pruned_layout = layout_to_dict(layout)
    return config


def arch_shape(config) -> ArchShape:
    """The ``ArchShape`` of ``config``; UsageError for a family without per-layer pruned classes."""
    from compress.models.modeling_pruned import MODULE_PATHS, base_model_type, head_dim_of, pruned_classes_for

    base = base_model_type(config.model_type)
    stored = getattr(config, "pruned_layout", None)
    if base == "albert" or (base not in MODULE_PATHS and not stored) or \
            "AutoModelForSequenceClassification" not in pruned_classes_for(base):
        raise UsageError(f"no latency table for model type '{config.model_type}': it needs per-layer "
                         f"structured-pruned classes (the role table's types but ALBERT, which shares its "
                         "layers, or a type whose roles discovery found: pass the model, not its config)")
    heads_config = MODULE_PATHS[base].heads_config if base in MODULE_PATHS else stored["heads_config"]
    ffn_config = stored["ffn_config"] if stored else "intermediate_size"
    widths = [getattr(config, ffn_config, None) or getattr(config, "hidden_dim", 0),
              *(getattr(config, "layer_intermediate", None) or [])]
    act = getattr(config, "hidden_act", None) or getattr(config, "activation", "")
    return ArchShape(base, int(config.hidden_size), int(getattr(config, heads_config)),
                     int(head_dim_of(config)), int(max(widths)), int(config.num_hidden_layers),
                     int(config.vocab_size), str(act))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(runtime: Runtime) -> dict[str, Any]:
    """CPU model, core count, onnxruntime and torch versions (and the GPU for a CUDA runtime)."""
    import onnxruntime

    out: dict[str, Any] = {"cpu": _cpu_name(), "cores": os.cpu_count(), "machine": platform.machine(),
                           "onnxruntime": onnxruntime.__version__, "torch": torch.__version__}
    if runtime.provider == "CUDAExecutionProvider":
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


# config fields that change how attention is computed (and timed) at the same sizes: DeBERTa's
# relative attention, BigBird's block-sparse pattern, Longformer's window, position embeddings
ATTENTION_OPTIONS = ("relative_attention", "pos_att_type", "position_buckets", "max_relative_positions",
                     "position_biased_input", "share_att_key", "norm_rel_ebd", "attention_type", "block_size",
                     "num_random_blocks", "attention_window", "position_embedding_type")
INT8_SCHEME = "dynamic, per-channel weights"  # what compress export --quantize int8 writes


def attention_options(config) -> dict[str, Any]:
    """The ``ATTENTION_OPTIONS`` ``config`` sets, as JSON values."""
    out = {}
    for name in ATTENTION_OPTIONS:
        if hasattr(config, name):
            value = getattr(config, name)
            out[name] = list(value) if isinstance(value, (list, tuple)) else value
    return json.loads(json.dumps(out, default=str))


def cache_key(shape: ArchShape, runtime: Runtime, batch: int, seq_len: int, threads: int,
              heads: Sequence[int], widths: Sequence[int], reference: str,
              attention: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything a table's numbers depend on; equal keys -> the cached table is reused."""
    return {"format": FORMAT, "machine": machine_key(runtime), "runtime": runtime.name, "batch": batch,
            "seq_len": seq_len, "threads": threads, "shape": asdict(shape), "heads": list(heads),
            "widths": list(widths), "reference": reference, "attention": attention or {},
            **({"int8_scheme": INT8_SCHEME} if runtime.precision == "int8" else {})}


def default_cache_dir() -> Path:
    """``$COMPRESS_CACHE_DIR/latency``, else ``~/.cache/compress/latency``."""
    root = os.environ.get("COMPRESS_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "compress") / "latency"


def _check_writable(folder: Path) -> None:
    """UsageError naming ``folder`` and the fix when a table could not be saved in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise UsageError(f"the latency cache folder {folder} is not writable ({type(exc).__name__}); set "
                         "COMPRESS_CACHE_DIR to a writable folder") from None


def cache_file(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / f"{key['runtime']}-{key['shape']['model_type']}-{digest}.json"


DENSE_TOLERANCE = 0.15  # the dense model's timing and its blocks' sum may differ this much (of the smaller),
DENSE_FLOOR_MS = 2.0  # or this many milliseconds (a tiny model's timings are mostly noise)
DENSE_RETRIES = 2  # re-timings of a table whose dense model and blocks disagree before it is refused


def dense_gap(dense_ms: float, predicted_ms: float) -> int:
    """+1 when the dense timing is far above its blocks' sum (``predicted_ms``), -1 when far below, 0
    when they agree within ``DENSE_TOLERANCE`` of the smaller or ``DENSE_FLOOR_MS``. Noise only adds
    time, so +1 says the dense model was timed on a busy machine (its absolute predictions would be
    too slow) and -1 that the blocks were (every block too dear, and not alike: a search on them cuts
    the wrong ones); a sum of 0 or less is never trusted."""
    if predicted_ms <= 0:
        return -1
    if dense_ms - predicted_ms > max(DENSE_TOLERANCE * predicted_ms, DENSE_FLOOR_MS):
        return 1
    if predicted_ms - dense_ms > max(DENSE_TOLERANCE * dense_ms, DENSE_FLOOR_MS):
        return -1
    return 0


def trusted_timings(blocks: T, dense_ms: float, predict: Callable[[T], float], retime_blocks: Callable[[], T],
                    retime_dense: Callable[[], float], shape: str) -> tuple[T, float]:
    """(``blocks``, ``dense_ms``) once the dense timing agrees with ``predict(blocks)`` (``dense_gap``):
    a dense timing far above is timed again (``retime_dense``), blocks whose sum is far above the
    dense timing are timed again (``retime_blocks``), up to ``DENSE_RETRIES`` times in all.
    MeasurementError, naming both times and which was slow, when they still disagree: a busy
    machine's timings would steer the search, and are neither used nor cached."""
    for attempt in range(DENSE_RETRIES + 1):
        predicted = predict(blocks)
        gap = dense_gap(dense_ms, predicted)
        if gap == 0:
            return blocks, dense_ms
        if attempt == DENSE_RETRIES:
            break
        if gap > 0:
            dense_ms = retime_dense()
        else:
            blocks = retime_blocks()
    slow = "the dense model" if gap > 0 else "the blocks"
    raise MeasurementError(
        f"the dense model timed {dense_ms:.1f} ms at {shape} against {predicted:.1f} ms from the sum of its "
        f"blocks ({100 * (dense_ms / predicted - 1) if predicted > 0 else float('inf'):+.0f}%, "
        f"{DENSE_RETRIES + 1} tries; {100 * DENSE_TOLERANCE:.0f}% is trusted): the machine was busy while "
        f"{slow} ran; rerun when it is idle (nothing was cached)")


def sane_table(table: LatencyTable, key: dict[str, Any]) -> bool:
    """Whether a table read back can steer a search: its own key is ``key``, its times are finite,
    non-negative numbers, its grids and their times are as long as each other, and its dense timing
    agrees with its blocks' sum either way (``dense_gap``)."""
    times = [table.base_ms, table.layer_fixed_ms, table.dense_ms, table.dense_predicted_ms, table.residual_ms,
             *table.attention_grid_ms, *table.ffn_grid_ms]
    if table.key != key or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times):
        return False
    if not all(math.isfinite(t) and t >= 0 for t in times):
        return False
    if len(table.heads) != len(table.attention_grid_ms) or len(table.widths) != len(table.ffn_grid_ms):
        return False
    return dense_gap(table.dense_ms, table.dense_predicted_ms) == 0


def _read_cached(path: Path, key: dict[str, Any]) -> LatencyTable | None:
    """The table in ``path`` when its key is ``key`` and it is sane (``sane_table``); None when
    absent, unreadable, another key's or not sane (it is then measured again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        table = LatencyTable.from_dict(data["table"])
        return table if sane_table(table, key) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError, UsageError):
        return None


# ----------------------------------------------------------------------------- models and timing

# config.to_dict() keys not passed back when a sized copy is made: the pruned class sets its own
# model type, the sizes are given anew, and a 2-label head replaces any saved label set
_DROPPED_KEYS = ("model_type", "architectures", "auto_map", "_name_or_path", "transformers_version",
                 "layer_heads", "layer_intermediate", "layer_kept_heads", "id2label", "label2id",
                 "layer_types")
ROUNDS = 5  # round-robin rounds the timed calls of each model are spread over (at most)
REFERENCE_TURNS = 3  # turns per round of the models subtracted from every layer


def pruned_config(config, layer_heads: Sequence[int], layer_ffn: Sequence[int], vocab: int,
                  attn_implementation: str = "eager"):
    """A ``Compress<T>Config`` like ``config`` with ``len(layer_heads)`` layers of the given sizes."""
    from compress.models.modeling_pruned import base_model_type, pruned_classes_for

    values = {k: v for k, v in config.to_dict().items() if k not in _DROPPED_KEYS}
    if values.get("pruned_layout"):  # a discovered type: each layer keeps its first heads, so the
        # per-head inputs computed outside the layers (MPNet's position bias) are cut to match
        values["layer_kept_heads"] = [list(range(h)) for h in layer_heads]
    cls = pruned_classes_for(base_model_type(config.model_type))["AutoConfig"]
    out = cls(**values, layer_heads=list(layer_heads), layer_intermediate=list(layer_ffn), num_labels=2,
              attn_implementation=attn_implementation)
    out.num_hidden_layers = len(layer_heads)  # set after: DistilBERT maps it to n_layers
    out.vocab_size = vocab
    return out


def _supports_sdpa(config) -> bool:
    """Whether the pruned classifier of ``config``'s type runs torch's SDPA attention (MPNet does not)."""
    from compress.models.modeling_pruned import base_model_type, pruned_classes_for

    cls = pruned_classes_for(base_model_type(config.model_type))["AutoModelForSequenceClassification"]
    return bool(getattr(cls, "_supports_sdpa", False))


def pruned_classifier(config) -> torch.nn.Module:
    """A random-weight ``Compress<T>ForSequenceClassification`` of a ``pruned_config``."""
    from compress.models.modeling_pruned import base_model_type, pruned_classes_for

    torch.manual_seed(0)
    cls = pruned_classes_for(base_model_type(config.model_type))["AutoModelForSequenceClassification"]
    with warnings.catch_warnings():  # "Initializing zero-element tensors is a no-op" (empty blocks)
        warnings.simplefilter("ignore", UserWarning)
        return cls(config).eval()


def timing_inputs(model: torch.nn.Module, batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    """batch x seq_len random ids of the model's declared inputs, attention mask all ones."""
    from compress.export.inputs import example_inputs
    from compress.export.loading import as_loaded

    feeds = example_inputs(as_loaded(model), batch, seq_len)
    feeds["attention_mask"] = torch.ones_like(feeds["attention_mask"])
    return feeds


def export_for_runtime(model: torch.nn.Module, runtime: Runtime, folder: Path, name: str,
                       length: int | None = None) -> tuple[Path, dict[str, int]]:
    """``model`` as the ONNX file ``runtime`` runs, made as ``compress export`` makes it: exported,
    optimized where a fusion applies, converted to the runtime's precision. Returns (file, fused
    operator counts). Parity is not checked: the weights are random and only the time is used."""
    from compress.export.loading import as_loaded
    from compress.export.onnx import TRACE_LENGTH, export_onnx
    from compress.export.optimize import attention_shape, fusion_on_trial, optimize_onnx, optimizer_model_type
    from compress.export.precision import PRECISIONS

    loaded = as_loaded(model)
    with warnings.catch_warnings():  # the tracer's warnings on every export
        warnings.simplefilter("ignore")
        # traced at the timed length: a size the model's code freezes in the trace is then right there
        path = export_onnx(loaded, folder / f"{name}.onnx", length=max(length or 0, TRACE_LENGTH))
    model_type, _ = optimizer_model_type(loaded)
    fused: dict[str, int] = {}
    if model_type is not None and not fusion_on_trial(loaded):
        heads, hidden = attention_shape(loaded)
        fused = optimize_onnx(path, folder / f"{name}.opt.onnx", heads, hidden, model_type=model_type)
        path = folder / f"{name}.opt.onnx"
    elif model_type is not None:  # as ``compress export`` does: a trial fusion that fails is dropped
        try:
            trial = optimize_onnx(path, folder / f"{name}.opt.onnx", 0, 0, model_type=model_type)
            if _parity_holds(loaded, folder / f"{name}.opt.onnx"):
                fused, path = trial, folder / f"{name}.opt.onnx"
        except Exception:  # noqa: BLE001 - the graph as exported is timed instead
            pass
    target = PRECISIONS[runtime.precision]
    if target.name != "fp32":
        target.convert(path, folder / f"{name}.{target.name}.onnx")
        path = folder / f"{name}.{target.name}.onnx"
    return path, fused


def _parity_holds(loaded, path: Path) -> bool:
    """Whether the ONNX file ``path`` computes what ``loaded`` computes (fp32, two small shapes)."""
    from compress.core.errors import ModelError, ParityError
    from compress.export.onnx import check_parity

    try:
        check_parity(loaded, path, [(2, 16), (1, 7)], 1e-4, "CPUExecutionProvider", "optimized fp32")
    except (ParityError, ModelError):
        return False
    return True


def runtime_callable(model: torch.nn.Module, runtime: Runtime, feeds: dict[str, torch.Tensor],
                     folder: Path, name: str, threads: int) -> tuple[Callable[[], Any], dict[str, int]]:
    """A no-argument call of ``model`` on ``feeds`` in ``runtime`` (an onnxruntime session bound to
    the inputs, as ``compress bench`` times it) and the fused operator counts."""
    if runtime.precision is None:
        def call():
            with torch.inference_mode():
                return model(**feeds)

        return call, {}
    from compress.export.ort import OrtModel

    path, fused = export_for_runtime(model, runtime, folder, name, feeds["input_ids"].shape[1])
    return OrtModel(path, provider=runtime.provider, threads=threads).bind(feeds), fused


@contextlib.contextmanager
def torch_threads(threads: int):
    """torch's intra-op thread count set to ``threads`` inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# a model to time: per-layer head counts, per-layer FFN widths, vocabulary size
Layout = tuple[tuple[int, ...], tuple[int, ...], int]


def spread_copies(names: Sequence[str], copies: dict[str, int]) -> list[tuple[str, str]]:
    """(turn name, layout name) in timing order: every name once, plus ``copies[name] - 1`` more
    turns of it (``name#2``, ...) at even intervals through the order (wrapping round), so a model
    every other one is compared with is timed at several moments of each round."""
    n = len(names)
    keyed = [(float(i), (name, name)) for i, name in enumerate(names)]
    for name, k in copies.items():
        i = names.index(name)
        keyed += [((i + j * n / k) % n + 0.5, (f"{name}#{j + 1}", name)) for j in range(1, k)]
    return [turn for _, turn in sorted(keyed, key=lambda t: t[0])]


def time_layouts(config, layouts: dict[str, Layout], runtime: Runtime, batch: int, seq_len: int,
                 threads: int, repeats: int, copies: dict[str, int] | None = None
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Build every layout as a random-weight pruned classifier in ``runtime`` (in a temporary
    folder), then time them all in round-robin rounds (``measure_interleaved``): ``repeats`` timed
    calls per turn of each. ``copies[name]`` gives a layout that many turns per round; its
    ``median_ms`` is then the mean of the turns' medians (each in ``turn_medians_ms``). Returns
    (stats by name, with ``fused_ops``; {"export_s", "timing_s"})."""
    attn = "eager" if runtime.precision is not None or not _supports_sdpa(config) else "sdpa"
    t0 = time.perf_counter()
    calls, fused = {}, {}
    with tempfile.TemporaryDirectory(prefix="compress-latency-") as tmp, torch_threads(threads):
        for i, (name, (heads, ffn, vocab)) in enumerate(layouts.items()):
            model = pruned_classifier(pruned_config(config, heads, ffn, vocab, attn))
            feeds = timing_inputs(model, batch, seq_len)
            calls[name], fused[name] = runtime_callable(model, runtime, feeds, Path(tmp), f"m{i}", threads)
        t1 = time.perf_counter()
        order = spread_copies(list(layouts), copies or {})
        rounds = min(repeats, ROUNDS)
        turns = measure_interleaved({turn: calls[name] for turn, name in order}, warmup=1,
                                    iterations=math.ceil(repeats / rounds), rounds=rounds)
        calls.clear()  # the sessions go before their files
    stats: dict[str, dict[str, Any]] = {}
    for turn, name in order:
        s = stats.setdefault(name, {**turns[turn], "fused_ops": fused[name], "turn_medians_ms": []})
        s["turn_medians_ms"].append(turns[turn]["median_ms"])
        s["median_ms"] = sum(s["turn_medians_ms"]) / len(s["turn_medians_ms"])
    return stats, {"export_s": t1 - t0, "timing_s": time.perf_counter() - t1}


# ----------------------------------------------------------------------------- building a table


def _grid(given: Sequence[int] | None, default: tuple[int, ...], full: int, what: str) -> tuple[int, ...]:
    """``given`` (or ``default``) with 1 and ``full`` added, sorted; UsageError outside 1..full."""
    points = set(default if given is None else given) | {1, full}
    bad = [p for p in points if not 1 <= p <= full]
    if bad:
        raise UsageError(f"{what} grid point {bad[0]} is outside 1..{full}")
    return tuple(sorted(int(p) for p in points))


def table_layouts(shape: ArchShape, heads: Sequence[int], widths: Sequence[int], reference: str
                  ) -> dict[str, Layout]:
    """The models a table times: 0-layer at the real and the timing vocabulary, the 1-layer
    reference (no block, or the smallest ones), one 1-layer model per other grid point."""
    small = min(shape.vocab, TIMING_VOCAB)
    rh, rw = (0, 0) if reference == "empty" else (1, 1)
    out: dict[str, Layout] = {"base": ((), (), shape.vocab), "base_small": ((), (), small),
                              "reference": ((rh,), (rw,), small)}
    out.update({f"heads={h}": ((h,), (rw,), small) for h in heads if h != rh})
    out.update({f"ffn={w}": ((rh,), (w,), small) for w in widths if w != rw})
    return out


def _assemble(key: dict[str, Any], shape: ArchShape, runtime: Runtime, batch: int, seq_len: int,
              heads: tuple[int, ...], widths: tuple[int, ...], reference: str,
              stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The table's fields from the medians of ``table_layouts``' models."""
    med = {name: s["median_ms"] for name, s in stats.items()}
    ref = 0 if reference == "empty" else 1
    a_raw = [med[f"heads={h}"] - med["reference"] for h in heads if h != ref]
    f_raw = [med[f"ffn={w}"] - med["reference"] for w in widths if w != ref]
    return {"key": key, "runtime": runtime.name, "batch": batch, "seq_len": seq_len,
            "num_layers": shape.layers, "num_heads": shape.heads, "ffn_width": shape.ffn,
            "reference": reference, "base_ms": med["base"],
            "layer_fixed_ms": max(0.0, med["reference"] - med["base_small"]),
            "heads": (ref, *[h for h in heads if h != ref]),
            "attention_grid_ms": (0.0, *monotone_from_zero(a_raw)), "attention_raw_ms": (0.0, *a_raw),
            "widths": (ref, *[w for w in widths if w != ref]),
            "ffn_grid_ms": (0.0, *monotone_from_zero(f_raw)), "ffn_raw_ms": (0.0, *f_raw),
            "configs": tuple({"name": n, **_brief(s)} for n, s in stats.items())}


def table_plan(config, rt: Runtime, batch: int, seq_len: int, threads: int,
               head_points: Sequence[int] | None = None, width_points: Sequence[int] | None = None):
    """(shape, head grid, width grid, reference, cache key) of the table of ``config``'s architecture
    in ``rt`` at ``batch`` x ``seq_len`` with ``threads``: what ``latency_table`` measures and the key
    it files the table under."""
    from compress.models.modeling_pruned import can_empty_blocks

    shape = arch_shape(config)
    heads = _grid(head_points, head_grid(shape.heads), shape.heads, "head")
    widths = _grid(width_points, width_grid(shape.ffn), shape.ffn, "width")
    reference = "empty" if can_empty_blocks(shape.model_type) else "smallest"
    key = cache_key(shape, rt, batch, seq_len, threads, heads, widths, reference, attention_options(config))
    return shape, heads, widths, reference, key


def latency_table(model_or_config, runtime: str = "ort-int8", batch: int = 32, seq_len: int = 128,
                  cache_dir: str | Path | None = None, rebuild: bool = False, repeats: int = 20,
                  threads: int | None = None, head_points: Sequence[int] | None = None,
                  width_points: Sequence[int] | None = None) -> LatencyTable:
    """The latency table of ``model_or_config``'s architecture (a model, its config or a model
    spec such as 'minilm') in ``runtime`` at ``batch`` x ``seq_len``, from the cache or measured.

    ``repeats``: timed calls per 1-layer model (spread over up to ``ROUNDS`` rounds; the dense
    model gets half as many, at least 3); ``threads``: intra-op threads (unset: torch's, as
    ``compress bench``); ``head_points`` / ``width_points``: the grids (unset: ``head_grid``,
    ``width_grid``; 1 and the full size are always added). ``rebuild`` measures even when cached.
    """
    from compress.core.arguments import check_int
    from compress.core.runs import write_json

    rt = check_runtime(runtime)
    for name, value in (("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        check_int(name, value, 1)
    check_int("threads", threads, 1, optional=True)
    config = encoder_config(model_or_config)
    threads = threads or torch.get_num_threads()
    shape, heads, widths, reference, key = table_plan(config, rt, batch, seq_len, threads, head_points,
                                                      width_points)
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = cache_file(folder, key)
    if not rebuild and (cached := _read_cached(path, key)) is not None:
        return cached
    _check_writable(folder)  # before minutes of timing, not after
    table = build_table(config, shape, rt, batch, seq_len, threads, heads, widths, reference, repeats,
                        key)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(path, {"key": key, "table": table.to_dict()})
    return table


def build_table(config, shape: ArchShape, runtime: Runtime, batch: int, seq_len: int, threads: int,
                heads: tuple[int, ...], widths: tuple[int, ...], reference: str, repeats: int,
                key: dict[str, Any]) -> LatencyTable:
    """Measure a table (``latency_table`` without the cache): the grid models, then the dense one,
    each timed again while the two disagree (``trusted_timings``)."""
    start = time.perf_counter()
    layouts = table_layouts(shape, heads, widths, reference)
    dense = {"dense": ((shape.heads,) * shape.layers, (shape.ffn,) * shape.layers, shape.vocab)}

    def time_blocks() -> LatencyTable:
        # the 1-layer reference and the 0-layer model of the timing vocabulary are subtracted from
        # every layer: three turns per round each (they are the fastest models of the grid)
        stats, phases = time_layouts(config, layouts, runtime, batch, seq_len, threads, repeats,
                                     copies={"reference": REFERENCE_TURNS, "base_small": REFERENCE_TURNS})
        fields = _assemble(key, shape, runtime, batch, seq_len, heads, widths, reference, stats)
        return LatencyTable(**fields, dense_ms=0.0, dense_predicted_ms=0.0, build_seconds=0.0,
                            repeats=repeats, phase_seconds=phases)

    dense_runs: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def time_dense() -> float:
        dense_runs.append(time_layouts(config, dense, runtime, batch, seq_len, threads, max(3, repeats // 2)))
        return dense_runs[-1][0]["dense"]["median_ms"]

    table, dense_ms = trusted_timings(time_blocks(), time_dense(), lambda t: t.predict_ms(*t.dense_layout()),
                                      time_blocks, time_dense, f"{batch}x{seq_len}")
    dense_stats, dense_phases = dense_runs[-1]
    phases = {**table.phase_seconds, **{f"dense_{k}": v for k, v in dense_phases.items()}}
    predicted = table.predict_ms(*table.dense_layout())
    return replace(table, dense_ms=dense_ms, dense_predicted_ms=predicted,
                   residual_ms=max(0.0, dense_ms - predicted), build_seconds=time.perf_counter() - start,
                   phase_seconds=phases,
                   configs=(*table.configs, {"name": "dense", **_brief(dense_stats["dense"])}))


def _brief(stats: dict[str, Any]) -> dict[str, Any]:
    """A timed model's median, p90 and fused operators, as the table keeps them."""
    return {"median_ms": stats["median_ms"], "p90_ms": stats["p90_ms"],
            "fused_ops": stats.get("fused_ops", {})}
