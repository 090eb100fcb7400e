"""Dynamic int8 quantization of an exported graph.

Its parity check has a looser stated tolerance (``INT8_ATOL``) plus the argmax agreement.
"""

from __future__ import annotations

import logging
from pathlib import Path

# logits, absolute. Dynamic int8 rounds every activation tensor to 256 levels: the fine-tuned SST-2
# MiniLM differs by up to 0.42 on random-token inputs (dev accuracy 86.6% fp32 -> 85.8% int8), so the
# int8 check catches a broken graph, and the dev-set accuracy (--task) measures the quality cost.
INT8_ATOL = 1.0


def quantize_int8(src: str | Path, dst: str | Path, per_channel: bool = True,
                  exclude: tuple[str, ...] = ()) -> Path:
    """Dynamic int8: int8 weights, activations quantized per batch at run time (MatMulInteger,
    QAttention for fused attention; the word, position and segment tables of EmbedLayerNormalization
    too; Gemm, i.e. the pooler and the classifier, stays float32).

    ``per_channel`` (the default) gives every output column of a weight matrix its own scale;
    False, one scale per matrix. Per channel because of BERT's FFN output projection: a few output
    dimensions (the outlier dimensions of the residual stream) carry weights up to 42x the median
    row's largest, so one scale per matrix leaves the other rows a few int8 levels. On SST-2 (fine-
    tuned MiniLM, dev set, batch 64) quantizing that matrix alone, per tensor, moved 2.9% of the
    dense model's predictions to the other label and made nearly all of the int8 logit error (mean
    0.167 of 0.170). Per channel, the int8 model agrees with fp32 on 98.5% of the sentences instead
    of 97.1% (mean logit error 0.065), a Fisher-structured one (60% fewer FLOPs) on 97.9% instead
    of 96.8% (0.021 instead of 0.045), at the same speed (``docs/results.md``, "int8 of
    Fisher-structured models"). ``exclude``: names of nodes left in float32.

    Activations get one scale per tensor per call, so a sentence's int8 logits depend on the
    batch it runs in (the batch's largest activation sets the scale).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Fused contrib ops (Attention, SkipLayerNormalization) have no shape-inference types; their
    # outputs are float32, which is what DefaultTensorType says.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs a "consider pre-processing" hint on every call
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                         nodes_to_exclude=list(exclude),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)
    return Path(dst)
