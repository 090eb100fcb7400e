"""``compress measure``: parameters, FLOPs, sparsity, "will it be faster?" and disk size of one model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compress.core.config import check_range, option
from compress.measure.summary import measure_spec


@dataclass(frozen=True)
class MeasureConfig:
    model: str = option("minilm", help="model folder, run folder, student folder, 'minilm' or an "
                                       ".onnx file")
    seq_len: int = option(128, help="sequence length the FLOPs are counted at")
    json: bool = option(False, help="print the full report as JSON instead of text")
    runtime: str = option("onnxruntime CPU", help="runtime the 'will it be faster?' verdict is about")

    def __post_init__(self):
        check_range("seq_len", self.seq_len, 1, 4096)


def run_measure(cfg: MeasureConfig) -> dict[str, Any]:
    """Measure ``cfg.model`` (model folder, run folder, student folder, 'minilm' or .onnx file)."""
    return measure_spec(cfg.model, cfg.seq_len, cfg.runtime)


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def format_measure(r: dict[str, Any]) -> str:
    """The human-readable report printed by ``compress measure``."""
    from compress.measure.verdict import format_flops

    p = r["params"]
    if r["kind"] == "onnx":
        zeros = (f"fp32 weight-matrix sparsity {p['float_matrix_sparsity']:.1%}; int8 weights "
                 f"{_fmt_int(p['int8_elements'])}, {p['int8_zero_fraction']:.1%} zero (rounding included)")
    else:
        zeros = f"encoder weight-matrix sparsity {p['encoder_matrix_sparsity']:.1%}"
    lines = [f"model: {r['model']} ({r.get('architecture', r['kind'])})",
             f"parameters: total {_fmt_int(p['total'])}, embeddings {_fmt_int(p.get('embeddings'))}, "
             f"encoder {_fmt_int(p.get('encoder'))}, head {_fmt_int(p.get('head'))}, "
             f"non-zero {_fmt_int(p['nonzero'])} ({zeros})"]
    f = r.get("flops")
    if f:
        lines += [
            f"FLOPs per example at length {r['seq_len']} ({f['unit']})"
            + (f", {f['attention_implementation']} attention:" if f.get("attention_implementation") else ":"),
            f"  dense      {format_flops(f['dense_flops']):>14} ({_fmt_int(f['dense_macs'])} MACs)",
            f"  effective  {format_flops(f['effective_flops']):>14} (MACs with a zero weight not counted)",
            "  by operator (dense MACs): " + ", ".join(f"{k} {v:,}" for k, v in
                                                      f["dense_macs_by_operator"].items() if v),
        ]
        zero = "; ".join(f"{k}: {v}" for k, v in f["zero_by_definition"].items())
        if zero:
            lines.append(f"  counted as zero: {zero}")
        skipped = ", ".join(f"{k} x{v}" for k, v in f["not_counted"].items())
        lines.append(f"  not counted (element-wise): {skipped or 'none'}")
    elif r.get("flops_note"):
        lines.append(r["flops_note"])
    if r.get("structure"):
        heads = r["structure"]["layer_heads"]
        lines.append(f"structure: heads per layer {'all kept' if heads is None else heads}, "
                     f"FFN widths {r['structure']['layer_ffn']}")
    if r.get("fused_ops"):
        lines.append("fused ops: " + ", ".join(f"{k} {v}" for k, v in r["fused_ops"].items()))
    v = r["verdict"]
    lines.append(f"will it be faster on {v['runtime']}? {v['faster']}: " + "; ".join(v["reasons"]))
    ss = v.get("semi_structured")
    if ss:
        devices = "; ".join(f"{k}: {a}" for k, a in ss["per_device"].items())
        lines.append(f"will the {ss['pattern']} pattern be faster? here ({ss['here']['device']}): "
                     f"{ss['here']['faster']}; {devices} ({ss['reason']})")
    d = r.get("disk")
    if d:
        lines.append(f"on disk: {d['bytes'] / 1e6:.2f} MB raw, {d['gzip_bytes'] / 1e6:.2f} MB gzip "
                     f"({d['gzip_ratio']:.0%}) [{', '.join(d['files'])}]")
    if r.get("matrices"):
        lines += ["", f"{'initializer':<60} {'shape':>16} {'dtype':>8} {'zeros':>7}"]
        for m in r["matrices"]:
            shape = "x".join(str(d) for d in m["shape"])
            lines.append(f"{m['name'][-60:]:<60} {shape:>16} {m['dtype']:>8} {m['sparsity']:7.1%}")
    if r.get("sparsity_note"):
        lines.append(r["sparsity_note"])
    if r.get("sparsity_table"):
        lines += ["", r["sparsity_table"]]
    return "\n".join(lines)
