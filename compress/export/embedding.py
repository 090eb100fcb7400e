"""A sentence-embedding graph scored on the embedding task: its ``encode(texts)`` (``onnx_scorer``) and
the report of an export (``onnx_embedding_report``: the PyTorch model's scores beside each graph's,
with each graph's cosine to the PyTorch embeddings)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from compress.embedding.evaluation import encoder_scorer
from compress.embedding.scores import embedding_scores
from compress.tasks.embedding import EMBEDDING_TASK, EmbeddingEval

PARITY_COSINE = 0.99  # mean cosine to the PyTorch embeddings an export should keep


def onnx_scorer(path, tokenizer, max_length: int, provider: str | None, batch_size: int = 64,
                lower_case: bool = False) -> Callable[[list[str]], torch.Tensor]:
    """``encode(texts)`` of an exported sentence-embedding graph (output ``sentence_embedding``);
    ``lower_case``: the exported model's ``do_lower_case``."""
    from compress.embedding.model import tokens
    from compress.export.ort import OrtModel

    session = OrtModel(path, provider=provider)

    def encode(texts: list[str]) -> torch.Tensor:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = None
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            batch = tokens(tokenizer, [texts[j] for j in idx], max_length, lower_case=lower_case)
            feeds = {k: v.numpy() for k, v in batch.items()}
            got = torch.as_tensor(session.run(feeds)["sentence_embedding"]).float()
            out = torch.zeros(len(texts), got.shape[1]) if out is None else out
            out[idx] = got
        return out if out is not None else torch.zeros(0, 1)
    return encode


def onnx_embedding_report(loaded, fp32_path, final_path, target: str, data: EmbeddingEval,
                          max_length: int | None, provider: str) -> dict:
    """The scores of the PyTorch model, of the fp32 graph and of the written one (int8, fp16, bf16)
    on the embedding task, each graph with its cosine to the PyTorch embeddings of every scored text;
    ``parity_ok``: the written graph's mean cosine is at least ``PARITY_COSINE``."""
    from compress.export.precision import half_session_error
    from compress.models.loading import load_tokenizer

    model = loaded.model
    tokenizer = load_tokenizer(loaded.path)
    data = data.with_prompts(model.prompts)
    length = max_length or model.pooling.max_length
    torch_scores, reference = embedding_scores(encoder_scorer(model, tokenizer, 64, length), data)
    out: dict = {"task": EMBEDDING_TASK, "metric": "p@1", "max_length": length, "torch": torch_scores}
    graphs = {"fp32": fp32_path} if target == "fp32" else {"fp32": fp32_path, target: final_path}
    for name, path in graphs.items():
        why = half_session_error(path, provider) if name in ("fp16", "bf16") else None
        if why is not None:
            out[name] = {"skipped": why}
            continue
        encode = onnx_scorer(path, tokenizer, length, provider, lower_case=model.pooling.lower_case)
        out[name], _ = embedding_scores(encode, data, reference)
    written = out[target]
    if "cosine_to_reference" in written:
        out["parity_cosine"] = PARITY_COSINE
        out["parity_ok"] = written["cosine_to_reference"]["mean"] >= PARITY_COSINE
    return out
