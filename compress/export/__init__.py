"""export building blocks, one module per job:

- ``loading``: a model folder, run folder, 'minilm' or student folder -> ``LoadedModel``;
- ``inputs``: the declared inputs per model kind, example values, the parity shapes;
- ``onnx``: torch -> ONNX and the mandatory parity check;
- ``optimize``: onnxruntime's transformer optimizer, the graph surgery it needs, the fusion line;
- ``precision``: the ``PRECISIONS`` table (fp32, fp16, bf16, int8) and the half-precision conversion;
- ``quantize``: dynamic int8;
- ``ort``: the onnxruntime session wrapper and providers.
"""
