"""PyTorch models for export, measurement and benchmarks: a model folder, run folder, 'minilm',
structured-pruned model or student folder -> a ``LoadedModel`` (the module, its declared inputs,
its kind), and the logits of a call.

Models load with eager attention by default: that graph has the MatMul/Softmax/MatMul pattern
onnxruntime's transformer optimizer fuses into ``Attention``; an sdpa export does not fuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from compress.core.errors import ModelError, UsageError
from compress.export.inputs import STUDENT_INPUTS, declared_inputs


@dataclass
class LoadedModel:
    """A torch model with its declared input names and what is known about it."""

    model: torch.nn.Module
    input_names: tuple[str, ...]
    kind: str                      # "bert" | "embedding" | "student" | "module"
    path: str | None = None        # folder it came from
    meta: dict[str, Any] | None = None

    @property
    def architecture(self) -> str:
        """The model's own type (``ernie``, ``compress_bert``), or its kind where it has no config."""
        return getattr(getattr(self.model, "config", None), "model_type", None) or self.kind

    @property
    def output_name(self) -> str:
        """The graph's one output: ``sentence_embedding`` for a sentence-embedding model (pooled and,
        where its config says so, normalised), ``logits`` for the rest."""
        return "sentence_embedding" if self.kind == "embedding" else "logits"

    @property
    def vocab_size(self) -> int:
        if isinstance(getattr(self.model, "vocab_size", None), int):
            return int(self.model.vocab_size)
        cfg = getattr(self.model, "config", None)
        if cfg is not None and getattr(cfg, "vocab_size", None):
            return int(cfg.vocab_size)
        for m in self.model.modules():
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                return int(m.num_embeddings)
        return 1000


def is_onnx_file(spec: str) -> bool:
    return str(spec).lower().endswith(".onnx")


def _load_student_folder(folder: Path) -> LoadedModel | None:
    """A student saved by ``students.registry.save_student`` (``student.json``), else None."""
    from students.registry import STUDENT_FILE, load_student

    if not (folder / STUDENT_FILE).is_file() and not (folder / "student" / STUDENT_FILE).is_file():
        return None
    model, info = load_student(folder)
    where = folder / "student" if (folder / "student" / STUDENT_FILE).is_file() else folder
    return LoadedModel(model.eval(), STUDENT_INPUTS, "student", str(where), info)


def load_torch_model(spec: str, attn_implementation: str | None = "eager", embedding: bool = False
                     ) -> LoadedModel:
    """A BERT-family classifier (model folder, run folder, 'minilm', structured-pruned) or a student;
    with ``embedding``, or for a run folder of the embedding task, the sentence-embedding model
    (encoder, pooling, normalisation: ``compress.embedding.model``).

    ``attn_implementation``: "eager" (the default: the graph the ONNX optimizer fuses), "sdpa", or
    None for transformers' own choice: SDPA where the architecture has it, eager otherwise
    (DeBERTa-v2/v3). The implementation that was loaded is ``model.config._attn_implementation``.

    Encoder-only folders (no classification head saved) get a randomly initialised 2-label head;
    the timing and FLOPs are those of a classifier, the outputs are not meaningful predictions.
    """
    if is_onnx_file(spec):
        raise UsageError(f"{spec} is an ONNX file; this step needs a PyTorch model folder")
    p = Path(spec).expanduser()
    if p.is_file():
        raise ModelError(f"{p} is a file, not a model; pass a model folder, a run folder, "
                         "'minilm' or an .onnx file")
    if p.is_dir():
        student = _load_student_folder(p)
        if student is not None:
            return student
    from transformers import AutoModelForSequenceClassification

    import compress.pruning.structured  # noqa: F401 - registers the structured-pruned BERT class
    from compress.models.loading import load_pretrained, read_meta, resolve_model

    path = resolve_model(spec)
    meta = read_meta(path)
    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation}
    if embedding or meta.get("task") == "embedding":
        from compress.embedding.model import load_sentence_encoder

        model, _, meta = load_sentence_encoder(spec, **kwargs)
        return LoadedModel(model.eval(), declared_inputs(model.encoder), "embedding", path, meta)
    if "label_names" not in meta:
        kwargs["num_labels"] = 2
    model = load_pretrained(AutoModelForSequenceClassification, spec, path, "a sequence classifier", **kwargs)
    return LoadedModel(model.eval(), declared_inputs(model), "bert", path, meta)


def wrap_module(model: torch.nn.Module, input_names: tuple[str, ...] = STUDENT_INPUTS) -> LoadedModel:
    """Any module with the ``forward(input_ids, attention_mask=None) -> logits`` contract."""
    return LoadedModel(model.eval(), input_names, "module")


def as_loaded(model: torch.nn.Module) -> LoadedModel:
    """A ``LoadedModel`` of an in-memory module: a Hugging Face encoder with the inputs
    ``compress export`` declares for it, else the student contract (input_ids, attention_mask)."""
    if getattr(model, "config", None) is not None and hasattr(model, "base_model"):
        return LoadedModel(model, declared_inputs(model), "bert")
    return LoadedModel(model, STUDENT_INPUTS, "module")


def torch_logits(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        out = loaded.model(**inputs)
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0]
