"""What a structured prune removed, in a few lines a person reads: heads kept per layer, FFN widths,
blocks and layers removed, parameters and encoder FLOPs before and after, the predicted speedup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def format_structure_change(report: Mapping[str, Any]) -> str:
    """Lines describing a structured-prune report (``remove_structured`` and the search's fields)."""
    heads, heads_before = report["layer_heads"], report["layer_heads_before"]
    ffn, ffn_before = report["layer_ffn"], report["layer_ffn_before"]
    lines = [f"heads kept per layer: {', '.join(f'{a}/{b}' for a, b in zip(heads, heads_before))} "
             f"({sum(heads)} of {sum(heads_before)})",
             f"FFN width per layer:  {', '.join(f'{a}/{b}' for a, b in zip(ffn, ffn_before))} "
             f"({sum(ffn)} of {sum(ffn_before)})"]
    blocks = (report.get("attention_blocks_removed", 0), report.get("ffn_blocks_removed", 0),
              report.get("layers_removed", 0))
    lines.append(f"removed: {blocks[0]} attention block(s), {blocks[1]} FFN block(s), {blocks[2]} whole "
                 "layer(s) (a layer with both blocks removed keeps only its LayerNorms)")
    lines.append(f"parameters: {report['params_before']:,} -> {report['params_after']:,} "
                 f"({1 - report['params_after'] / report['params_before']:.1%} fewer)")
    if "encoder_flops_before" in report:
        lines.append(f"encoder FLOPs per sequence: {report['encoder_flops_before']:,.0f} -> "
                     f"{report['encoder_flops_after']:,.0f} ({report['flops_reduction']:.1%} fewer)")
    if "predicted_speedup" in report:
        shape = report.get("latency_shape", "")
        lines.append(f"predicted speedup in {report.get('latency_runtime', 'the runtime')} at {shape}: "
                     f"{report['predicted_speedup']:.2f}x (target {report['speedup_requested']:g}x; "
                     f"{report['dense_predicted_ms']:.3g} -> {report['predicted_ms']:.3g} ms per batch)")
    return "\n".join(lines)
