"""A sentence-embedding model as ``sentence-transformers`` defines it: a Hugging Face encoder, a
pooling of its token states (mean, CLS or max, as ``1_Pooling/config.json`` says) and an optional
l2 normalisation (a ``Normalize`` module in ``modules.json``), with the tokenizer's length limit of
``sentence_bert_config.json``.

Dense modules after the pooling (LaBSE-style projections) are loaded with sentence-transformers' own
``Dense`` class and run after the pooling, before the normalisation; they are not pruned.

Prompts (``config_sentence_transformers.json``: E5's ``"query: "`` and ``"passage: "``, BGE's query
instruction) are read as ``Prompts`` and kept in what is saved; the scores put the query prompt
before each question, the document prompt before each candidate sentence and the default prompt
before any other scored text, as ``encode_query``, ``encode_document`` and ``encode`` do; where a
model has an empty ``document`` prompt beside a ``passage`` one (E5 under sentence-transformers 6,
whose ``encode_document`` takes the empty one), the passage prompt its author wrote is used.

``load_sentence_encoder(spec)`` reads that description from the model folder (or hub repository);
a plain encoder folder without it gets mean pooling and normalisation, the usual choice, and says
so in ``pooling.source``. ``save_sentence_transformer`` writes the same files beside the weights,
so that ``sentence_transformers.SentenceTransformer(folder)`` opens what this project saved and
gives the same embeddings. Pruning applies to ``SentenceEncoder.encoder``, the Hugging Face model.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from compress.core.errors import ModelError, first_line
from compress.pruning.stock_copy import STOCK_DIR

POOLING_MODES = ("mean", "cls", "max")
MODULES_FILE = "modules.json"
POOLING_DIR = "1_Pooling"
ST_CONFIG = "sentence_bert_config.json"
ST_MODEL_CONFIG = "config_sentence_transformers.json"
KEPT_MODEL_CONFIG = ("prompts", "default_prompt_name", "similarity_fn_name")  # written back on save
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
ST_MODULE = "sentence_transformers.models."
DEFAULT_MAX_LENGTH = 256


@dataclass(frozen=True)
class Pooling:
    """How token states become one vector: ``mode`` (mean over real tokens, the [CLS] state, or
    the max over real tokens), ``normalize`` (unit length) and ``max_length`` (tokens kept);
    ``source``: where the choice was read (``sentence-transformers config`` or ``default``);
    ``lower_case``: texts are lowercased before tokenising (``do_lower_case``)."""

    mode: str = "mean"
    normalize: bool = True
    max_length: int = DEFAULT_MAX_LENGTH
    source: str = "default"
    lower_case: bool = False

    def __post_init__(self):
        if self.mode not in POOLING_MODES:
            raise ModelError(f"pooling mode '{self.mode}' is not one of {', '.join(POOLING_MODES)}")


@dataclass(frozen=True)
class Prompts:
    """What goes before a text: ``query`` before a search query, ``document`` before a candidate
    (the first non-empty of the document, passage and corpus prompts), ``other`` before any other
    text (the default prompt)."""

    query: str = ""
    document: str = ""
    other: str = ""

    @classmethod
    def of(cls, model_config: dict) -> Prompts:
        """The prompts of a ``config_sentence_transformers.json`` (its kept keys)."""
        prompts = {k: v for k, v in (model_config.get("prompts") or {}).items() if isinstance(v, str)}
        other = prompts.get(model_config.get("default_prompt_name") or "", "")
        document = next((prompts[n] for n in DOCUMENT_PROMPT_NAMES if prompts.get(n)), "")
        return cls(prompts.get("query", ""), document, other)


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T, H) token states and (B, T) attention mask -> (B, H)."""
    if mode == "cls":
        return hidden[:, 0]
    m = mask.to(hidden.dtype)[..., None]
    if mode == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


class SentenceEncoder(nn.Module):
    """texts' token ids -> (B, D) sentence embeddings; ``encoder`` is a Hugging Face ``AutoModel``,
    ``dense`` the sentence-transformers ``Dense`` modules after the pooling, by their folder name."""

    def __init__(self, encoder: nn.Module, pooling: Pooling, dense: dict[str, nn.Module] | None = None,
                 model_config: dict | None = None):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.dense = nn.ModuleDict(dense or {})
        self.model_config = dict(model_config or {})  # prompts, default prompt, similarity (kept keys)

    @property
    def prompts(self) -> Prompts:
        return Prompts.of(self.model_config)

    @property
    def config(self):
        return self.encoder.config

    @property
    def dim(self) -> int:
        """Width of the sentence embedding (the last Dense module's, else the encoder's)."""
        return list(self.dense.values())[-1].out_features if len(self.dense) else self.config.hidden_size

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        kw = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state
        return self.embedding_of(hidden, attention_mask)

    def embedding_of(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The sentence embedding of the encoder's last token states (pooled, normalised if so)."""
        e = pool(hidden, attention_mask, self.pooling.mode)
        for module in self.dense.values():
            e = module({"sentence_embedding": e})["sentence_embedding"]
        return F.normalize(e, dim=-1) if self.pooling.normalize else e


def _read_json(path: Path, what: str, kind: type = dict):
    """The JSON of ``path``, a ``kind`` (an object, or a list for ``modules.json``); ModelError otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: the {what} is not readable JSON ({type(exc).__name__}); copy the model "
                         "folder again") from None
    if not isinstance(data, kind) or (kind is list and not all(isinstance(m, dict) for m in data)):
        shape = "list of objects" if kind is list else "object"
        raise ModelError(f"{path}: the {what} is not a JSON {shape}; copy the model folder again")
    return data


def _read_modules(modules_file: Path) -> list[dict]:
    """``modules.json``'s entries, each with a string ``type`` and a ``path`` inside the model
    folder (sentence-transformers refuses one that leaves it); ModelError naming the entry otherwise."""
    from compress.models.loading import module_path_inside

    modules = _read_json(modules_file, MODULES_FILE, list)
    for i, m in enumerate(modules):
        if not isinstance(m.get("type"), str) or not m["type"]:
            raise ModelError(f"{modules_file}: entry {i} has no module type (a string such as "
                             "'sentence_transformers.models.Pooling'); copy the model folder again")
        path = m.get("path")
        if not isinstance(path, str) or (path and not module_path_inside(path)):
            raise ModelError(f"{modules_file}: entry {i} ({m['type'].rsplit('.', 1)[-1]}) has path {path!r}; "
                             "a module's path is a folder inside the model folder")
    return modules


def _st_file(path: str, name: str) -> Path | None:
    """``name`` inside the model (a local folder, or a hub repository through its cache)."""
    local = Path(path) / name
    if Path(path).is_dir():
        return local if local.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(path, name))
    except Exception:  # noqa: BLE001 - a repository without the file: no sentence-transformers config
        return None


def st_root(path: str) -> str:
    """The folder of the sentence-transformers files of the encoder at ``path``: its parent where
    the parent's ``modules.json`` keeps the encoder in that subfolder, else ``path`` itself."""
    from compress.models.loading import st_transformer_folder

    p = Path(os.path.abspath(path))  # not resolved: a linked encoder folder keeps its parent
    if p.is_dir():
        sub = st_transformer_folder(p.parent)
        if sub is not None and sub == p:
            return str(p.parent)
    return path


def read_pooling(path: str) -> Pooling:
    """The pooling ``sentence-transformers`` would use for the model at ``path`` (a folder or hub id;
    ``sentence_bert_config.json`` is read beside the encoder, the rest in ``st_root(path)``)."""
    encoder_path, path = path, st_root(path)
    modules_file = _st_file(path, MODULES_FILE)
    if modules_file is None:
        return Pooling()
    modules = _read_modules(modules_file)
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    dense = ["Dense"] * (len(kinds) - 2 - ("Normalize" in kinds))
    if kinds not in (["Transformer", "Pooling", *dense], ["Transformer", "Pooling", *dense, "Normalize"]):
        raise ModelError(f"{path}: {MODULES_FILE} lists {kinds}; this project runs Transformer, Pooling, "
                         "optional Dense modules and an optional Normalize, in that order")
    pooling_dir = next(m.get("path", POOLING_DIR) for m in modules if m.get("type", "").endswith("Pooling"))
    cfg_file = _st_file(path, f"{pooling_dir}/config.json")
    cfg = _read_json(cfg_file, "pooling config") if cfg_file else {}
    modes = [m for m, key in (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                              ("max", "pooling_mode_max_tokens")) if cfg.get(key)]
    if cfg.get("pooling_mode") in POOLING_MODES:
        modes = [cfg["pooling_mode"]]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v
              and k not in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens")]
    if len(modes) != 1 or others:
        raise ModelError(f"{path}: pooling {cfg} is not one of mean, cls or max alone; this project runs "
                         "those three")
    if cfg.get("include_prompt") is False:
        raise ModelError(f"{path}: its pooling leaves the prompt's tokens out (include_prompt false, "
                         "an INSTRUCTOR-style model); this project pools every token, so use a model "
                         "that pools its prompt")
    st_cfg_file = _st_file(encoder_path, ST_CONFIG)
    st_cfg = _read_json(st_cfg_file, ST_CONFIG) if st_cfg_file else {}
    max_length = st_cfg.get("max_seq_length") or _tokenizer_max_length(encoder_path) or DEFAULT_MAX_LENGTH
    if isinstance(max_length, bool) or not isinstance(max_length, (int, float)) or max_length < 1:
        raise ModelError(f"{path}: max_seq_length {max_length!r} is not a positive number of tokens; "
                         f"fix {ST_CONFIG}")
    positions = _positions(encoder_path)
    if positions:  # as sentence-transformers 6 bounds it: no longer than the position table
        max_length = min(int(max_length), positions)
    return Pooling(modes[0], "Normalize" in kinds, int(max_length), "sentence-transformers config",
                   bool(st_cfg.get("do_lower_case", False)))


def _positions(path: str) -> int | None:
    """The encoder's ``max_position_embeddings`` (None when its config has none)."""
    cfg_file = _st_file(path, "config.json")
    value = (_read_json(cfg_file, "config.json") if cfg_file else {}).get("max_position_embeddings")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _tokenizer_max_length(path: str) -> int | None:
    """Where sentence-transformers 6 keeps ``max_seq_length``: the tokenizer's ``model_max_length``
    (unless unset or the 'no limit' placeholder), at most the model's ``max_position_embeddings``;
    None when neither is known."""
    limits = []
    for name, key in (("tokenizer_config.json", "model_max_length"),
                      ("config.json", "max_position_embeddings")):
        cfg_file = _st_file(path, name)
        value = (_read_json(cfg_file, name) if cfg_file else {}).get(key)
        if isinstance(value, (int, float)) and 0 < value <= 1_000_000:
            limits.append(int(value))
    return min(limits) if limits else None


def read_model_config(path: str) -> dict:
    """The kept keys (prompts, default prompt name, similarity) of the model's
    ``config_sentence_transformers.json``; empty without one."""
    path = st_root(path)
    cfg_file = _st_file(path, ST_MODEL_CONFIG)
    cfg = _read_json(cfg_file, ST_MODEL_CONFIG) if cfg_file else {}
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, (str, type(None))) for v in prompts.values()):
        raise ModelError(f"{path}: the prompts of {ST_MODEL_CONFIG} are not a name -> text mapping; "
                         "copy the model folder again")
    cfg = {**cfg, "prompts": {k: v or "" for k, v in prompts.items()}}  # null reads as "", as ST does
    default = cfg.get("default_prompt_name")
    if default is not None and (not isinstance(default, str) or default not in cfg["prompts"]):
        raise ModelError(f"{path}: {ST_MODEL_CONFIG} names the default prompt {default!r}, which is not "
                         f"among its prompts {sorted(cfg['prompts'])}; add it or set it to null")
    return {k: cfg[k] for k in KEPT_MODEL_CONFIG if cfg.get(k)}


def load_sentence_encoder(spec: str, **kwargs):
    """(SentenceEncoder, tokenizer, metadata) of ``spec``: a folder, run folder, hub id or ``minilm``;
    ``kwargs`` go to ``from_pretrained`` (e.g. ``attn_implementation``)."""
    from transformers import AutoModel

    from compress.models.loading import (
        load_pretrained,
        load_tokenizer,
        match_tokenizer_inputs,
        read_meta,
        resolve_model,
    )

    path = resolve_model(spec)
    pooling = read_pooling(path)
    encoder = load_pretrained(AutoModel, spec, path, "an encoder", **kwargs)
    tokenizer = match_tokenizer_inputs(load_tokenizer(spec), encoder)
    model = SentenceEncoder(encoder, pooling, read_dense(path), read_model_config(path))
    return model, tokenizer, read_meta(path)


def read_dense(path: str) -> dict[str, nn.Module]:
    """The ``Dense`` modules of the pipeline at ``path`` by folder name (none without modules.json),
    loaded by sentence-transformers itself."""
    path = st_root(path)
    modules_file = _st_file(path, MODULES_FILE)
    if modules_file is None:
        return {}
    dirs = [m["path"] for m in _read_modules(modules_file) if m["type"].endswith("Dense")]
    if not dirs:
        return {}
    from sentence_transformers.models import Dense

    try:
        return {d: Dense.load(path, subfolder=d) for d in dirs}
    except Exception as exc:  # noqa: BLE001 - any failure to read a module is one line
        raise ModelError(f"{path}: its Dense module could not be loaded ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


def tokens(tokenizer, texts: Sequence[str], max_length: int, device="cpu", lower_case: bool = False) -> dict:
    """Padded model inputs of ``texts`` (lowercased first with ``lower_case``, as
    sentence-transformers does for ``do_lower_case``)."""
    texts = [t.lower() for t in texts] if lower_case else list(texts)
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


@torch.no_grad()
def embed(model: SentenceEncoder, tokenizer, texts: Sequence[str], batch_size: int = 128,
          max_length: int | None = None) -> torch.Tensor:
    """(N, H) float32 embeddings on the CPU. Texts are sorted by length into batches (less padding;
    the order of the result is the order of ``texts``)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    max_length = max_length or model.pooling.max_length
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = torch.zeros(len(texts), model.dim)
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        batch = tokens(tokenizer, [texts[j] for j in idx], max_length, device, model.pooling.lower_case)
        out[idx] = model(**batch).float().cpu()
    model.train(was_training)
    return out


def _saved_model_config(model: SentenceEncoder) -> dict:
    """The kept keys of the model's ``config_sentence_transformers.json``, with the document prompt
    it was scored with also under ``document``, the name ``encode_document`` takes first."""
    cfg = dict(model.model_config)
    document = model.prompts.document
    if document and not cfg.get("prompts", {}).get("document"):
        cfg["prompts"] = {**cfg.get("prompts", {}), "document": document}
    return cfg


def save_sentence_transformer(model: SentenceEncoder, tokenizer, folder: Path, meta: dict) -> str | None:
    """The encoder in Hugging Face format (``compress.models.loading.save_model``: weights, tokenizer,
    ``compress.json``) plus the ``sentence-transformers`` files: ``modules.json``, the pooling
    config, ``sentence_bert_config.json``, ``config_sentence_transformers.json`` (the prompts) and,
    with normalisation, a ``2_Normalize`` folder. The model card (``README.md``) is the caller's
    (``compress.report.modelcard.write_model_card``).

    A structured-pruned encoder, whose layers stock transformers cannot build at their sizes, is
    also written as its stock copy (``compress.pruning.stock_copy``: removed units zero, the same
    embeddings) in ``0_Transformer``, where ``modules.json`` sends sentence-transformers: the folder
    opens with a bare ``SentenceTransformer(folder)``, no project code run. This project, the ONNX
    export and ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` read the pruned weights
    beside it, which carry the speed. Where the copy cannot be made (its outputs differ, or building it
    fails, out of memory among others), the pruned
    folder is saved without it, opened by sentence-transformers only with ``trust_remote_code=True``;
    the reason is returned (None otherwise) and printed as a warning."""
    from compress.models.loading import save_model
    from compress.models.modeling_pruned import is_structured_config

    p = model.pooling
    stock, missing = None, None
    if is_structured_config(model.config):  # built (and checked) before anything is written
        from compress.pruning.stock_copy import stock_copy

        try:
            stock = stock_copy(model.encoder)
        except Exception as err:  # noqa: BLE001 - a refusal or out of memory: the pruned model is saved
            missing = first_line(err)
            if not isinstance(err, ModelError):
                missing = f"{type(err).__name__}: {missing}"
            print(f"warning: no stock copy for sentence-transformers: {missing}", file=sys.stderr)
    save_model(model.encoder, tokenizer, folder, {**meta, "pooling": asdict(p)})
    st_config = {"max_seq_length": p.max_length, "do_lower_case": p.lower_case}
    transformer_dir = ""
    if stock is None and (folder / STOCK_DIR).is_dir():  # a copy from an earlier save no longer matches
        shutil.rmtree(folder / STOCK_DIR)
    if stock is not None:
        transformer_dir = STOCK_DIR
        stock.save_pretrained(folder / STOCK_DIR, safe_serialization=True)
        tokenizer.save_pretrained(folder / STOCK_DIR)
        (folder / STOCK_DIR / ST_CONFIG).write_text(json.dumps(st_config, indent=2) + "\n", encoding="utf-8")
    modules = [{"idx": 0, "name": "0", "path": transformer_dir, "type": ST_MODULE + "Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": ST_MODULE + "Pooling"}]
    for name, module in model.dense.items():
        (folder / name).mkdir(exist_ok=True)
        module.save(str(folder / name))
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": name,
                        "type": ST_MODULE + "Dense"})
    if p.normalize:
        normalize_dir = f"{len(modules)}_Normalize"
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": normalize_dir,
                        "type": ST_MODULE + "Normalize"})
        (folder / normalize_dir).mkdir(exist_ok=True)
    (folder / POOLING_DIR).mkdir(exist_ok=True)
    pooling_cfg = {"word_embedding_dimension": model.config.hidden_size,
                   "pooling_mode_cls_token": p.mode == "cls", "pooling_mode_mean_tokens": p.mode == "mean",
                   "pooling_mode_max_tokens": p.mode == "max", "pooling_mode_mean_sqrt_len_tokens": False}
    files = ((folder / MODULES_FILE, modules), (folder / POOLING_DIR / "config.json", pooling_cfg),
             (folder / ST_CONFIG, st_config), (folder / ST_MODEL_CONFIG, _saved_model_config(model)))
    for path, data in files:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return missing
