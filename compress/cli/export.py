from compress.cli.common import add_config_args, config_from_args
from compress.export.precision import PRECISIONS
from compress.recipes.export import ExportConfig, run_export

HELP = "export a model to ONNX with a mandatory parity check; optionally optimize (fusion) and quantize"
EXAMPLES = """examples:
  compress export minilm --to minilm.onnx
  compress export artifacts/finetune/RUN --to sst2.onnx --optimize
  compress export artifacts/finetune/RUN --to sst2-int8.onnx --optimize --quantize int8 \\
      --task sst2 --data-dir ../shared/data          # also dev accuracy fp32 vs int8
  compress export artifacts/finetune/RUN --to sst2-fp16.onnx --precision fp16 --provider cuda \\
      --task sst2 --data-dir ../shared/data          # fused, float16 inside, float32 in and out
  compress export artifacts/distill/RUN --to bilstm.onnx
"""


def add_arguments(parser):
    add_config_args(parser, ExportConfig, positional=("model",))


def run(args):
    report = run_export(config_from_args(ExportConfig, args))
    kind = report.get("architecture", report["kind"])
    lines = [f"exported {kind} model -> {report['file']} ({report['bytes'] / 1e6:.2f} MB); "
             f"inputs {', '.join(report['inputs'])}; dynamic batch and sequence axes"]
    converted = [n for n in PRECISIONS if n != "fp32"]  # one of them at most
    for key in ("parity_fp32", "parity_optimized", *(f"parity_{n}" for n in converted)):
        if key in report:
            p = report[key]
            if "skipped" in p:
                lines.append(f"parity {p['label']}: not run: {p['skipped']}")
                continue
            lines.append(f"parity {p['label']}: max |diff| {max(p['max_abs_diff'].values()):.3g} "
                         f"<= {p['atol']:g} on {len(p['shapes'])} shapes; argmax agreement "
                         f"{p['argmax_agreement']:.1%}" + (f" ({p['note']})" if "note" in p else ""))
    if report.get("fused_ops"):  # nothing fused: the fusion line alone says so, and why
        fused = ", ".join(f"{k} {v}" for k, v in report["fused_ops"].items())
        lines.append(f"fused ops: {fused}")
    if "half" in report:
        h = report["half"]
        kept = f"; kept in float32: {', '.join(h['float32_ops'])}" if h["float32_ops"] else ""
        lines.append(f"{h['precision']}: {h['half_initializers']} {h['precision']} initializers, "
                     f"{h['float32_initializers']} float32{kept}; float32 inputs and outputs")
    if "fusion" in report:
        lines.append(f"fusion: {report['fusion']}")
    if "trace" in report:
        lines.append(f"trace: {report['trace']}")
    if "accuracy" in report and report["accuracy"]["task"] == "embedding":
        from compress.embedding.scores import brief

        acc = report["accuracy"]
        for k in ("torch", *PRECISIONS):
            if k in acc and "skipped" in acc[k]:
                lines.append(f"embedding {k}: not run: {acc[k]['skipped']}")
            elif k in acc:
                lines.append(f"embedding {k}: {brief(acc[k])}")
        if "parity_ok" in acc:
            lines.append(f"embedding parity: mean cosine to PyTorch {'>=' if acc['parity_ok'] else '<'} "
                         f"{acc['parity_cosine']}")
    elif "accuracy" in report:
        acc = report["accuracy"]
        scores = ", ".join(f"{k} {acc[k]['score']:.4f}" for k in PRECISIONS
                           if k in acc and "score" in acc[k])
        lines.append(f"{acc['task']} {acc['metric']}: {scores} on {acc['fp32']['n']} dev examples")
        for k in converted:
            if k in acc and "skipped" in acc[k]:
                lines.append(f"{k} dev accuracy not run: {acc[k]['skipped']}")
            elif k in acc and "argmax_agreement" in acc[k]:
                agree, diff = acc[k]["argmax_agreement"], acc[k]["max_abs_diff"]
                lines.append(f"{k} vs fp32 on the dev set: argmax agreement {agree:.2%}, "
                             f"max |diff| of logits {diff:.3g}")
    lines.append(f"report -> {report['report']}")
    print("\n".join(lines))
    if getattr(args, "verbose", False):  # otherwise only in the report, under exporter_warnings
        import sys

        for w in report.get("exporter_warnings", []):
            print(f"warning: {w}", file=sys.stderr)
    return 0
