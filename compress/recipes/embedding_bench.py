"""``compress bench --task embedding``: sentence-embedding models timed end to end on real sentences
(tokenising, the model, pooling) in sentences per second, each beside its quality on the embedding
task, in one run.

Entries: a PyTorch model (``minilm``, a sentence-transformers folder, a ``compress prune --task
embedding`` run), an exported graph (``.onnx`` from ``compress export --task embedding``; its
tokenizer is the exported model's, read from the export report) or a static student (a ``compress
distill --task embedding`` run, or any model2vec folder; ``model2vec:FOLDER`` times such a folder
with model2vec's own ``encode`` instead of this project's encoder). The first entry is the baseline:
every other gets its speed ratio and, at the same width, the cosine of its embeddings to the
baseline's.

The timed texts are the first ``--timed-texts`` held-out texts of the task (questions and candidate
sentences, never calibrated or distilled on); each round times every entry in turn on all of them,
and the median round is reported. Each entry reads the texts with its own prompts (a graph its
source model's, a static student its teacher's).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.core.config import check_range, option, to_dict
from compress.core.errors import ModelError, UsageError
from compress.core.runs import RunDir, write_json
from compress.embedding.evaluation import encoder_scorer, load_eval_data
from compress.embedding.model import Prompts
from compress.embedding.scores import embedding_scores
from compress.export.embedding import onnx_scorer
from compress.measure.bench import parse_entry
from compress.tasks.base import DataOptions, data_dir_from_env
from compress.tasks.embedding import EMBEDDING_TASK

MODEL2VEC_PREFIX = "model2vec:"


@dataclass(frozen=True)
class EmbeddingBenchConfig:
    models: tuple[str, ...] = ("minilm",)
    task: str = option(EMBEDDING_TASK, help="embedding: time sentence-embedding models on real sentences "
                                            "in sentences/s, beside their scores")
    data_dir: str | None = option(None, help="folder holding squad_v1.1 (and mrpc)")
    split_by_article: str | None = option(None, help="TRAIN/EVAL article counts; ReQA on the EVAL ones")
    eval_limit: int | None = option(None, help="score only the first N ReQA questions")
    timed_texts: int = option(2000, help="held-out texts encoded per timed round")
    batch_size: int = option(32, help="sentences per call")
    max_length: int = option(128, help="tokens kept per sentence (every entry alike)")
    rounds: int = option(3, help="rounds, each timing every entry in turn")
    threads: int | None = option(None, help="intra-op threads of torch and onnxruntime (unset: torch's)")
    provider: str = option("cpu", help="onnxruntime provider of the .onnx entries")
    out: str | None = option(None, help="run folder to create")
    name: str | None = option(None, help="run name")

    def __post_init__(self):
        if self.task != EMBEDDING_TASK:
            raise UsageError(f"--task {self.task}: compress bench times the {EMBEDDING_TASK} task on real "
                             "sentences; other models are timed on the --batch-sizes x --seq-lens grid "
                             "(drop --task)")
        if not self.models:
            raise UsageError("give at least one model: minilm, a model or run folder, or an .onnx file")
        for name in ("timed_texts", "batch_size", "max_length", "rounds"):
            check_range(name, getattr(self, name), 1)
        if self.threads is not None:
            check_range("threads", self.threads, 1)

    def data_options(self) -> DataOptions:
        return DataOptions(data_dir_from_env(self.data_dir))


def _export_source(onnx_path: str) -> str:
    """The model an embedding graph was exported from, read from its export report."""
    report = Path(onnx_path).with_suffix(".json")
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        if data["kind"] != "embedding":
            raise KeyError("kind")
        return data["config"]["model"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{onnx_path}: no sentence-embedding export report beside it ({report.name}); "
                         "export the model with 'compress export MODEL --task embedding'") from None


def load_entry(path: str, cfg: EmbeddingBenchConfig
               ) -> tuple[str, Callable[[list[str]], torch.Tensor], Prompts]:
    """(kind, encode, prompts) of one entry: a graph has its source model's prompts, a static student
    its teacher's."""
    from compress.embedding.model import load_sentence_encoder, read_model_config
    from compress.models.loading import load_tokenizer
    from students.static_embedding import StaticEncoder, find_static_folder, load_static

    if path.startswith(MODEL2VEC_PREFIX):  # the same kind of folder, encoded by model2vec's own encode
        folder = find_static_folder(Path(path[len(MODEL2VEC_PREFIX):]))
        if folder is None:
            raise ModelError(f"{path}: no model2vec folder there (config.json with model_type 'model2vec')")
        peer = load_static(folder)

        def encode(texts: list[str]) -> torch.Tensor:
            return torch.as_tensor(peer.encode(list(texts), batch_size=cfg.batch_size)).float()

        return "model2vec", encode, Prompts.of(read_model_config(str(folder)))
    p = Path(path)
    if path.endswith(".onnx"):
        if not p.is_file():
            raise ModelError(f"ONNX file not found: {p}")
        from compress.embedding.model import read_pooling
        from compress.models.loading import resolve_model

        spec = _export_source(path)
        source = resolve_model(spec)
        lower = read_pooling(source).lower_case
        return "onnx", onnx_scorer(p, load_tokenizer(spec), cfg.max_length, cfg.provider, cfg.batch_size,
                                   lower), Prompts.of(read_model_config(source))
    folder = find_static_folder(p) if p.is_dir() else None
    if folder is not None:  # a model2vec folder: its own tokens, its own truncation (no --max-length)
        return ("static", StaticEncoder(load_static(folder), cfg.batch_size),
                Prompts.of(read_model_config(str(folder))))
    model, tokenizer, _ = load_sentence_encoder(path)
    return "torch", encoder_scorer(model, tokenizer, cfg.batch_size, cfg.max_length), model.prompts


def run_embedding_bench(cfg: EmbeddingBenchConfig) -> dict[str, Any]:
    entries = [parse_entry(m) for m in cfg.models]
    data = load_eval_data(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    loaded = [(label, path, *load_entry(path, cfg)) for label, path in entries]
    prompted = [data.with_prompts(prompts) for *_, prompts in loaded]  # each entry's own inputs
    timed = [d.heldout_texts()[:cfg.timed_texts] for d in prompted]
    texts = timed[0]
    with RunDir("bench", name=cfg.name or "embedding-bench", out=cfg.out) as run:
        run.write_config(to_dict(cfg))
        run.write_env(None)
        rows = []
        reference = None
        for (label, path, kind, encode, _), own in zip(loaded, prompted):
            encode(texts[:cfg.batch_size])  # warm-up
            scores, emb = embedding_scores(encode, own, reference if reference is not None
                                           and reference.shape == (len(own.heldout_texts()), _width(encode))
                                           else None)
            reference = emb if reference is None else reference
            rows.append({"label": label, "model": path, "kind": kind, "scores": scores, "seconds": []})
        for _ in range(cfg.rounds):
            for row, (_, _, _, encode, _), own_texts in zip(rows, loaded, timed):
                t0 = time.perf_counter()
                encode(own_texts)
                row["seconds"].append(time.perf_counter() - t0)
        for row, own_texts in zip(rows, timed):
            row["sentences_per_second"] = len(own_texts) / statistics.median(row["seconds"])
            row["speedup"] = row["sentences_per_second"] / rows[0]["sentences_per_second"]
        result = {"task": EMBEDDING_TASK, "timed_texts": len(texts), "batch_size": cfg.batch_size,
                  "max_length": cfg.max_length, "rounds": cfg.rounds, "threads": torch.get_num_threads(),
                  "provider": cfg.provider, "baseline": rows[0]["label"], "rows": rows,
                  "run_dir": str(run.final)}
        write_json(run.path / "bench.json", result)
    return result


def _width(encode) -> int:
    return int(encode(["width"]).shape[1])


def format_embedding_bench(result: dict[str, Any]) -> str:
    lines = [f"{result['timed_texts']} held-out texts, batch {result['batch_size']}, at most "
             f"{result['max_length']} tokens, {result['threads']} threads, median of {result['rounds']} "
             f"rounds; baseline = {result['baseline']}",
             f"{'model':<24} {'kind':<9} {'sent/s':>9} {'x base':>7} {'P@1':>7} {'MRR':>7} {'pair AUC':>9} "
             f"{'cos base':>9}"]
    for r in result["rows"]:
        s = r["scores"]
        auc = f"{s['pairs']['roc_auc']:.4f}" if "pairs" in s else "-"
        cos = f"{s['cosine_to_reference']['mean']:.4f}" if "cosine_to_reference" in s else "-"
        lines.append(f"{r['label'][:24]:<24} {r['kind']:<9} {r['sentences_per_second']:>9.1f} "
                     f"{r['speedup']:>7.2f} {s['reqa']['p@1']:>7.4f} {s['reqa']['mrr']:>7.4f} {auc:>9} "
                     f"{cos:>9}")
    return "\n".join(lines)
