"""``README.md`` model cards in the Hugging Face format for every saved model folder.

A card is YAML metadata between ``---`` lines (``base_model``, ``library_name``, ``tags`` such as
``pruned``/``distilled``, ``pipeline_tag``, and a ``model-index`` with the task's metrics) followed
by Markdown: results, the sparsity table, FLOPs per example, the command that made the model and
its resolved config. Every recipe writes it beside the model it saves (``compress.report.saving``),
and so does the Python API's ``compress.save_model``, so a folder pushed to a hub explains itself.

What the card says comes from the model in memory (sparsity, FLOPs) and from the folder's
``compress.json``; inside a run folder (``RUN/model``) also from the run's ``config.yaml`` and the
last evaluation in ``metrics.jsonl``, which every command logs before it saves the model. Explicit
arguments win over both.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

CARD_FILE = "README.md"
# names ``--model`` accepts for packaged models -> their hub id (a card's base_model is a hub id)
PACKAGED_HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
# task family -> Hugging Face pipeline / model-index task type
FAMILY_TASKS = {"classification": ("text-classification", "Text Classification"),
                "multilabel": ("text-classification", "Text Classification"),
                "qa": ("question-answering", "Question Answering"),
                "retrieval": ("sentence-similarity", "Sentence Similarity")}
# metric names of compress -> Hugging Face metric types
METRIC_TYPES = {"accuracy": "accuracy", "mcc": "matthews_correlation", "f1": "f1", "micro_f1": "f1",
                "exact_match": "exact_match", "em": "exact_match", "mrr": "mrr"}
# Trainer/run bookkeeping that is not a quality metric of the model
NOT_METRICS = ("n", "score", "loss", "seconds", "runtime", "samples_per_second", "steps_per_second",
               "epoch", "step", "sparsity")


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running: ``compress prune ...`` for the CLI, else ``python script ...``."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    first = Path(argv[0])
    if first.name == "compress" or (first.name == "__main__.py" and first.parent.name == "compress"):
        return shlex.join(["compress", *argv[1:]])
    return shlex.join(["python", *argv]) if first.suffix == ".py" else shlex.join(argv)


def hub_base_model(spec: str | None, depth: int = 5) -> str | None:
    """The hub id a model started from: a packaged name maps to its hub id; a local folder made by
    compress is followed through its ``compress.json`` ``base_model``; anything else is returned as
    given (a hub id, or a local path that records no origin)."""
    if not spec:
        return None
    spec = str(spec)
    if spec in PACKAGED_HUB_IDS:
        return PACKAGED_HUB_IDS[spec]
    folder = Path(spec).expanduser()
    for cand in (folder / "model", folder):
        meta_file = cand / "compress.json"
        if depth > 0 and meta_file.is_file():
            parent = json.loads(meta_file.read_text(encoding="utf-8")).get("base_model")
            if parent and parent != spec:
                return hub_base_model(parent, depth - 1)
    return spec


def _run_folder(folder: Path) -> Path | None:
    """The run folder holding ``folder`` as its ``model/`` (config.yaml beside it), else None."""
    if folder.name == "model" and (folder.parent / "config.yaml").is_file():
        return folder.parent
    return None


def _final_name(run: Path) -> str:
    """The run's name once complete: a run is written as ``.tmp-<name>`` and renamed at the end
    (``compress.core.runs.RunDir``), after its card is written."""
    return run.name[len(".tmp-"):] if run.name.startswith(".tmp-") else run.name


def _last_eval(run: Path) -> dict[str, Any] | None:
    """The last record of ``metrics.jsonl`` with an ``eval`` dict (what the saved model scored)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("eval"), dict):
            last = rec["eval"]
    return last


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        name = k[len("eval_"):] if k.startswith("eval_") else k
        if isinstance(v, (int, float)) and not isinstance(v, bool) and name not in NOT_METRICS:
            out[name] = float(v)
    return out


def _flops(model, seq_len: int) -> tuple[dict[str, Any] | None, str | None]:
    """FLOPs per example at ``seq_len``, or (None, why not): the card is written even when the
    model cannot be traced, and then says so."""
    try:
        from compress.measure.summary import measure_module

        return measure_module(model, seq_len)["flops"], None
    except Exception as exc:  # noqa: BLE001 - a card states what it could not count
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _sparsity(folder: Path, run: Path | None, model, given: dict | None) -> dict | None:
    if given is not None:
        return given
    for cand in (folder / "sparsity.json", *((run / "sparsity.json",) if run else ())):
        if cand.is_file():
            return json.loads(cand.read_text(encoding="utf-8"))
    if model is not None:
        from compress.models.architectures import find_layout

        if find_layout(model) is not None:
            from compress.measure.sparsity import sparsity_report

            try:
                return sparsity_report(model)
            except RuntimeError:  # per-head slicing of a layout it does not fit: no table, as measure
                return None
    return None


def card_metadata(meta: dict[str, Any], metrics: dict[str, float], name: str, *, pruned: bool,
                  model_type: str | None) -> dict[str, Any]:
    """The YAML header of a card (a dict; ``render_model_card`` dumps it)."""
    task = meta.get("task")
    family, metric = None, None
    if task:
        from compress.tasks import TASKS

        spec = TASKS.get(task)
        family, metric = (spec.family, spec.metric) if spec else (None, None)
    if family is None and meta.get("label_names"):
        family = "multilabel" if meta.get("multilabel") else "classification"
    tags = ["compress"]
    if pruned:
        tags.append("pruned")
    if (meta.get("pruning") or {}).get("structured"):
        tags.append("structured-pruning")
    if meta.get("distillation") or meta.get("teacher"):
        tags.append("distilled")
    if model_type:
        tags.append(model_type)
    if meta.get("multilabel"):
        tags.append("multi-label")
    header: dict[str, Any] = {}
    base = hub_base_model(meta.get("base_model"))
    if base:
        header["base_model"] = base
    header["library_name"] = "transformers"
    header["tags"] = tags
    if family in FAMILY_TASKS:
        header["pipeline_tag"] = FAMILY_TASKS[family][0]
    if metrics:
        ttype, tname = FAMILY_TASKS.get(family or "", ("text-classification", "Text Classification"))
        ordered = sorted(metrics, key=lambda k: (k != metric, k))  # the task's primary metric first
        entries = [{"type": METRIC_TYPES.get(k, k), "value": round(metrics[k], 6), "name": f"dev {k}"}
                   for k in ordered]
        dataset = task or meta.get("dataset") or "evaluation set"
        result: dict[str, Any] = {"task": {"type": ttype, "name": tname},
                                  "dataset": {"name": dataset, "type": task or "custom", "split": "dev"},
                                  "metrics": entries}
        header["model-index"] = [{"name": name, "results": [result]}]
    return header


# --criterion -> how a card names it
CRITERION_NAMES = {"magnitude": "by magnitude (Gordon et al. 2020)",
                   "random": "at random (Gordon et al.'s control)",
                   "wanda": "with Wanda (Sun et al. 2023)",
                   "sparsegpt": "with SparseGPT (Frantar & Alistarh 2023)",
                   "fisher": "by Fisher-guided search (Kwon et al. 2022)"}


def pruning_description(pruning: dict[str, Any]) -> str:
    """What pruned the model, from ``compress.json``'s ``pruning``: the structure removed (heads,
    FFN neurons, the FLOPs reduction of a Fisher search) or the sparsity target and pattern, and
    for the post-training stage that it pruned once, after training."""
    criterion = pruning.get("criterion")
    how = CRITERION_NAMES.get(criterion, f"by {criterion}" if criterion else None)
    once = "once, after fine-tuning," if pruning.get("stage") == "post-training" else None
    result = (pruning.get("structured") or {}).get("result")
    if isinstance(result, dict):
        how = "by L2 norm" if criterion == "magnitude" else how
        amount = (f"{result.get('heads_removed', 0)} attention heads and {result.get('ffn_removed', 0)} "
                  "FFN neurons removed")
        blocks = [f"{result[k]} {what}" for k, what in (("attention_blocks_removed", "attention blocks"),
                                                         ("ffn_blocks_removed", "FFN blocks"),
                                                         ("layers_removed", "whole layers"))
                  if result.get(k)]
        if blocks:
            amount += f" ({', '.join(blocks)})"
        if isinstance(result.get("flops_reduction"), (int, float)):
            amount += f", {100 * result['flops_reduction']:.1f}% fewer encoder FLOPs"
        if isinstance(result.get("predicted_speedup"), (int, float)):
            amount += (f", aimed at {result['speedup_requested']:g}x the dense speed in "
                       f"{result.get('latency_runtime')} at {result.get('latency_shape')} (predicted "
                       f"{result['predicted_speedup']:.2f}x by a latency table measured on the machine)")
        head = " ".join(p for p in ("structured-pruned", once, how) if p)
        return f"{head}: {amount}"
    target = pruning.get("sparsity")
    if pruning.get("pattern"):
        amount = f"to the {pruning['pattern']} pattern"
    elif isinstance(target, (int, float)):
        amount = f"to {100 * target:.0f}% target sparsity"
    else:
        return "pruned"
    return " ".join(p for p in ("pruned", once, how, amount) if p)


def _task_phrase(pruning: dict[str, Any], task: str) -> str:
    """A post-training prune does not fine-tune: it says whether it trained to recover after."""
    if pruning.get("stage") != "post-training":
        return f"fine-tuned on {task}"
    steps = pruning.get("recovery_steps")
    if steps:
        return f"for {task}, then {steps} recovery training steps"
    return f"for {task}, with no training after pruning"


def render_model_card(meta: dict[str, Any], *, name: str, metrics: dict[str, float] | None = None,
                      sparsity: dict | None = None, flops: dict | None = None, flops_note: str | None = None,
                      seq_len: int = 128, command: str | None = None, config: dict | str | None = None,
                      model_type: str | None = None, prompts: dict[str, str] | None = None) -> str:
    """The card's text (YAML header + Markdown body) from plain values; no file or model access.
    ``prompts``: an embedding model's sentence-transformers prompts (its snippet then encodes
    queries and documents apart)."""
    import yaml

    from compress.measure.sparsity import format_sparsity_table

    metrics = metrics or {}
    global_sparsity = (sparsity or {}).get("global", {}).get("sparsity") or 0.0
    pruning = meta.get("pruning") or {}
    pruned = bool(pruning) or global_sparsity > 0
    header = card_metadata(meta, metrics, name, pruned=pruned, model_type=model_type)
    lines = ["---", yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {name}", ""]
    what = [pruning_description(pruning)] if pruned else []
    if meta.get("distillation") or meta.get("teacher"):
        what.append("distilled from a teacher")
    if meta.get("task"):
        what.append(_task_phrase(pruning, meta["task"]))
    base = header.get("base_model")
    desc = ", ".join(what) if what else "saved"
    lines.append(f"A {model_type or 'transformer'} encoder {desc}" + (f", from `{base}`" if base else "")
                 + ", by the `compress` toolkit.")
    if meta.get("label_names"):
        lines += ["", "Labels: " + ", ".join(f"`{n}`" for n in meta["label_names"]) + "."]
    if metrics:
        lines += ["", "## Results (dev set)", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in metrics.items()]
    lines += ["", "## Sparsity", ""]
    if sparsity and global_sparsity > 0:
        lines += ["Fraction of the pruned matrices' weights that are exactly zero (stored as zeros; "
                  "`masks.safetensors` marks the pruned ones and `compress verify` checks them).", "",
                  "```", format_sparsity_table(sparsity), "```"]
    elif sparsity:
        lines.append("Dense: no weight of the prunable matrices is zero.")
    else:
        lines.append("Not measured (no role table for this architecture, or its heads do not fit one).")
    lines += ["", f"## FLOPs per example (sequence length {seq_len})", ""]
    if flops:
        from compress.measure.verdict import format_flops

        lines += [f"- dense: {format_flops(flops['dense_flops'])} ({flops['dense_macs']:,} MACs)",
                  f"- effective: {format_flops(flops['effective_flops'])} (MACs with a zero weight not "
                  "counted)",
                  f"- {flops['unit']}; not counted (element-wise): "
                  + (", ".join(flops.get("not_counted") or {}) or "none"),
                  "- Unstructured zeros save storage (gzip), not time on dense kernels; removed heads/FFN "
                  "neurons and int8 are what run faster."]
    else:
        lines.append(f"Not counted ({flops_note or 'no model given'}).")
    lines += ["", "## How it was made", ""]
    if command:
        lines += ["```bash", command, "```"]
    if config:
        text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
        lines += ["", "Configuration:", "", "```yaml", text.rstrip(), "```"]
    if pruning.get("history"):
        steps = ", ".join(f"{h['step']}: {100 * h['sparsity']:.1f}%" for h in pruning["history"][-5:])
        lines += ["", f"Pruning steps (last five, step: sparsity): {steps}."]
    lines += ["", "## Use", "", *_use_lines(meta, model_type, prompts), "",
              "Fine-tuning it with `compress finetune --model PATH` keeps its masks (pruned weights stay "
              "zero); `compress measure PATH` and `compress export PATH --to model.onnx` read it.", ""]
    return "\n".join(lines)


def _use_lines(meta: dict[str, Any], model_type: str | None, prompts: dict[str, str] | None = None
               ) -> list[str]:
    """The card's loading snippet: sentence-transformers for an embedding model (a structured one
    opens its stock copy), else the Auto class, with ``trust_remote_code=True`` where the per-layer
    sizes need the folder's own classes."""
    from compress.models.modeling_pruned import MODULE_PATHS, base_model_type

    structured = (model_type or "").startswith("compress_")
    remote = ", trust_remote_code=True" if structured else ""
    if meta.get("task") == "embedding":
        lines = ["```python", "from sentence_transformers import SentenceTransformer",
                 "model = SentenceTransformer(\"PATH_OR_HUB_ID\")"]
        if any((prompts or {}).values()):  # its prompts go before queries and documents
            lines += ["queries = model.encode_query([\"Which river flows through Paris?\"])",
                      "documents = model.encode_document([\"The Seine flows through Paris.\"])", "```", "",
                      "Prompts (from `config_sentence_transformers.json`): " + ", ".join(
                          f"{k} `{v}`" for k, v in sorted((prompts or {}).items()) if v) + "."]
        else:
            lines += ["embeddings = model.encode([\"A first sentence.\", \"A second one.\"])", "```"]
        if structured:
            lines += ["", "Its layers keep different numbers of heads and FFN neurons, which no stock config "
                      "describes. sentence-transformers opens `0_Transformer/`, a stock copy in which the "
                      "removed heads and neurons are zero: the same embeddings at about the unpruned cost. "
                      "The speed is in the pruned weights beside it: export them with `compress export "
                      "PATH --to model.onnx`, or load them with `AutoModel.from_pretrained(\"PATH_OR_HUB_ID\""
                      ", trust_remote_code=True)` (the classes are in `modeling_pruned.py`)."]
        return lines
    auto = "AutoModelForSequenceClassification" if meta.get("label_names") else "AutoModel"
    lines = ["```python", f"from transformers import {auto}",
             f"model = {auto}.from_pretrained(\"PATH_OR_HUB_ID\"{remote})", "```"]
    if structured:
        registered = base_model_type(model_type) in MODULE_PATHS
        lines += ["", "Its layers keep different numbers of heads and FFN neurons, which no stock config "
                  "describes: the classes that build them are in `modeling_pruned.py` beside the weights, "
                  "hence `trust_remote_code=True`"
                  + (" (or `import compress` first, where it is installed)." if registered else ".")]
    return lines


def _prompts(folder: Path) -> dict[str, str]:
    """The prompts of the sentence-transformers config saved in ``folder`` (none without one)."""
    path = folder / "config_sentence_transformers.json"
    try:
        prompts = json.loads(path.read_text(encoding="utf-8")).get("prompts") if path.is_file() else {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: v for k, v in (prompts or {}).items() if isinstance(v, str)}


def write_model_card(folder: str | Path, model=None, *, meta: dict[str, Any] | None = None,
                     metrics: dict[str, Any] | None = None, command: str | None = None,
                     config: dict | str | None = None, sparsity: dict | None = None,
                     seq_len: int | None = None) -> Path:
    """Write ``folder/README.md`` for the model saved there; returns its path.

    ``model`` (the model in memory) gives the sparsity and FLOPs; ``meta`` defaults to the folder's
    ``compress.json``; ``metrics`` to the run's last evaluation; ``command`` to the running command
    line; ``config`` to the run's ``config.yaml``; ``seq_len`` (FLOPs) to the model's
    ``max_length``, else 128. ``eval_``-prefixed metric names (``Trainer.evaluate``) are accepted.
    """
    from compress.core.arguments import check_module, check_path

    check_path("folder", folder)
    if model is not None:
        check_module("model", model)
    folder = Path(folder)
    if meta is None:
        meta_file = folder / "compress.json"
        meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    run = _run_folder(folder)
    if metrics is None and run is not None:
        metrics = _last_eval(run)
    if config is None and run is not None:
        config = (run / "config.yaml").read_text(encoding="utf-8")
    seq_len = seq_len or int(meta.get("max_length") or 128)
    flops, note = _flops(model, seq_len) if model is not None else (None, None)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None and (folder / "config.json").is_file():
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    name = _final_name(run) if run is not None else folder.resolve().name
    text = render_model_card(meta, name=name, metrics=_numeric(metrics or {}),
                             sparsity=_sparsity(folder, run, model, sparsity), flops=flops,
                             flops_note=note, seq_len=seq_len,
                             command=command if command is not None else command_line(), config=config,
                             model_type=model_type, prompts=_prompts(folder))
    path = folder / CARD_FILE
    path.write_text(text, encoding="utf-8")
    return path
