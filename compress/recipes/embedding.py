"""The embedding task's shared workflow pieces: its data (scored sets and unlabelled text), the scorer
of a ``SentenceEncoder`` and ``compress eval --task embedding``: a sentence-embedding model (the
packaged all-MiniLM-L6-v2, any sentence-transformers folder or hub id, or a run folder of
``compress prune --task embedding``) scored as is, without fine-tuning
(``compress.embedding.scores``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from compress.core.config import to_dict
from compress.core.errors import UsageError
from compress.core.runs import RunDir
from compress.embedding.model import SentenceEncoder, embed, load_sentence_encoder
from compress.embedding.scores import brief, embedding_scores
from compress.tasks.embedding import EMBEDDING_TASK, EmbeddingEval, load_embedding_eval


def load_eval_data(cfg) -> EmbeddingEval:
    return load_embedding_eval(cfg.data_options(), cfg.split_by_article, cfg.eval_limit)


def encoder_scorer(model: SentenceEncoder, tokenizer, batch_size: int, max_length: int | None
                   ) -> Callable[[list[str]], torch.Tensor]:
    """``encode(texts)`` of the model as it is when called (after pruning, the pruned one)."""
    return lambda texts: embed(model, tokenizer, texts, batch_size, max_length)


def refuse_non_embedding_model(meta: dict, spec: str) -> None:
    """A run folder of another task (a classifier, a span model) is not scored as an embedding model."""
    task = meta.get("task")
    if task not in (None, EMBEDDING_TASK):
        raise UsageError(f"model '{spec}' was trained for task '{task}'; --task embedding scores "
                         "sentence-embedding models (minilm, a sentence-transformers folder, or a run "
                         "of 'compress prune --task embedding')")


def eval_embedding(cfg) -> dict:
    """Score the model on ReQA (and MRPC pairs where present); writes an eval run folder."""
    data = load_eval_data(cfg)
    model, tokenizer, meta = load_sentence_encoder(cfg.model)
    refuse_non_embedding_model(meta, cfg.model)
    data = data.with_prompts(model.prompts)
    if torch.cuda.is_available():
        model.to("cuda")
    with RunDir("eval", name=EMBEDDING_TASK, out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        scores, _ = embedding_scores(encoder_scorer(model, tokenizer, cfg.batch_size, cfg.max_length), data)
        run.write_summary({"command": "eval", "task": EMBEDDING_TASK, "model": cfg.model, "metric": "p@1",
                           "pooling": vars(model.pooling), "eval": scores})
    print(f"embedding ({cfg.model}): {brief(scores)} on {scores['reqa']['n']} questions / "
          f"{scores['reqa']['candidates']} sentences -> {run.path}")
    return scores


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
