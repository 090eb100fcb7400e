"""Continued masked-LM pre-training: corpus reading, 15% masking (80/10/10), held-out MLM loss.

The shared training loop (``compress.training.loop.train``) collates classification features, so dynamic
masking lives in ``MaskedLMObjective.forward``: the loop hands it plain token blocks and it masks them
with transformers' ``DataCollatorForLanguageModeling`` (fresh masks at every step, as in BERT). The
decoder runs only on the masked positions: a full 30522-way logit tensor for every token of a batch
would cost ~0.5 GB on CPU for nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from compress.core.errors import DataError, ModelError
from compress.tasks.corpus import TEXT_SUFFIXES, corpus_files, read_corpus  # noqa: F401 - re-exported


def split_heldout(lines: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """(train, held-out): the held-out slice is the last ``fraction`` of the lines (at least one)."""
    if len(lines) < 2:
        raise DataError(f"the corpus has {len(lines)} non-blank line; need at least 2 (train + held-out)")
    n_held = min(len(lines) - 1, max(1, math.ceil(len(lines) * fraction)))
    return lines[:-n_held], lines[-n_held:]


def make_blocks(tokenizer, lines: list[str], block_size: int, max_blocks: int | None = None) -> list[dict]:
    """Concatenate the tokenized lines and cut ``[CLS] ... [SEP]`` blocks of ``block_size`` tokens.

    Each block is a feature for the shared loop; ``labels`` is a placeholder (the objective masks)."""
    body = block_size - 2
    ids: list[int] = []
    blocks = []
    for start in range(0, len(lines), 2000):  # in chunks, so a step-limited run tokenizes only what it uses
        enc = tokenizer(lines[start:start + 2000], add_special_tokens=False, verbose=False)["input_ids"]
        for row in enc:
            ids.extend(row)
            while len(ids) >= body:
                chunk, ids = ids[:body], ids[body:]
                blocks.append(_block(tokenizer, chunk))
                if max_blocks and len(blocks) >= max_blocks:
                    return blocks
    if ids and (not blocks or len(ids) >= 8):
        blocks.append(_block(tokenizer, ids))
    return blocks


def _block(tokenizer, chunk: list[int]) -> dict:
    ids = [tokenizer.cls_token_id, *chunk, tokenizer.sep_token_id]
    return {"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids),
            "labels": 0}


HEAD_FILE = "mlm_head.safetensors"  # beside a pre-training run's saved encoder
# Tied: the decoder matrix is the word embeddings, its bias is ``predictions.bias``. Never stored.
_TIED = ("predictions.decoder.weight", "predictions.decoder.bias")


HEAD_NOTES = {  # what ``pretrained_head`` returns as the source, explained in the run's summary
    "fresh": "the MLM head is new (the encoder has none), so 'before' is the loss of an untrained head",
    "checkpoint": "the MLM head is the checkpoint's own",
    HEAD_FILE: "the MLM head is the one an earlier pre-training run saved",
}


def head_state(mlm) -> dict[str, torch.Tensor]:
    """The MLM head's own tensors (``cls.*`` without the tied decoder ones), detached copies."""
    return {k: v.detach().clone().contiguous() for k, v in mlm.cls.state_dict().items()
            if k not in _TIED}


def _local_has_no_head(model_dir: str) -> bool:
    """True when ``model_dir`` is a local folder whose safetensors hold no ``cls.*`` tensor (MiniLM
    and other encoders): no need to load the model a second time to find that out."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return False  # a hub id: from_pretrained finds out
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        import json

        keys = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
    elif (folder / "model.safetensors").is_file():
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
            keys = list(fh.keys())
    else:
        return False
    return not any(k.startswith("cls.") for k in keys)


def save_head(mlm, model_dir: Path) -> None:
    """Write the trained head next to the saved encoder, so pre-training can go on from it."""
    from safetensors.torch import save_file

    save_file({k: v.cpu() for k, v in head_state(mlm).items()}, str(Path(model_dir) / HEAD_FILE))


def pretrained_head(model_dir: str) -> tuple[dict[str, torch.Tensor] | None, str]:
    """The MLM head to start pre-training from, and where it came from.

    ``mlm_head.safetensors`` of an earlier pre-training run; else the checkpoint's own head (hub
    BERT checkpoints such as bert-base-uncased carry ``cls.predictions.*``); else None ("fresh":
    MiniLM and other sentence encoders ship without one).
    """
    local = Path(model_dir) / HEAD_FILE
    if local.is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(local)), HEAD_FILE
        except Exception as exc:  # noqa: BLE001 - one line for any unreadable file
            raise ModelError(f"{local} is not a readable MLM head ({type(exc).__name__}); delete it "
                             "to start from a fresh head") from None
    if _local_has_no_head(model_dir):
        return None, "fresh"
    from transformers import BertForMaskedLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the missing-head report is the expected answer here
    try:
        mlm, info = BertForMaskedLM.from_pretrained(model_dir, output_loading_info=True,
                                                    use_safetensors=True, trust_remote_code=False)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - not a plain BERT checkpoint (e.g. structured-pruned): no head
        return None, "fresh"
    finally:
        hf_logging.set_verbosity(verbosity)
    if any(k.startswith("cls.") for k in info["missing_keys"]):
        return None, "fresh"
    return head_state(mlm), "checkpoint"


def build_mlm_model(encoder, head: dict[str, torch.Tensor] | None = None):
    """BertForMaskedLM around ``encoder`` (a BertModel, shared, pooler kept) with an MLM head whose
    decoder is tied to the encoder's word embeddings: ``head`` (from ``pretrained_head``) when
    given, else a fresh one (seeded, so the pruned and the dense-baseline model start alike)."""
    from transformers import BertForMaskedLM, BertModel

    if not isinstance(encoder, BertModel):
        raise ModelError(f"--stage pretrain needs a BERT encoder, got {type(encoder).__name__}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the same fresh head for the pruned and the dense-baseline model
        mlm = BertForMaskedLM(encoder.config)
    mlm.bert = encoder
    mlm.cls.predictions.decoder.weight = encoder.embeddings.word_embeddings.weight
    if head is not None:
        try:
            missing, unexpected = mlm.cls.load_state_dict(head, strict=False)
        except RuntimeError as exc:  # a tensor of another shape
            missing, unexpected = [str(exc).splitlines()[-1].strip()[:120]], []
        missing = [k for k in missing if k not in _TIED]
        if missing or unexpected:
            raise ModelError(f"the MLM head does not fit this encoder (missing {missing[:2]}, "
                             f"unexpected {unexpected[:2]}); delete {HEAD_FILE} to start from a fresh head")
    if encoder.pooler is not None:
        # The MLM loss never reaches the pooler; left trainable, DDP waits for its gradients and
        # stops on the second step of a multi-process run. Frozen, it is saved unchanged.
        encoder.pooler.requires_grad_(False)
    return mlm


class MaskedLMObjective(torch.nn.Module):
    """``forward(input_ids, attention_mask, token_type_ids, mlm_labels=None)`` -> ``.loss``.

    Training (``mlm_labels`` None): masks ``input_ids`` with the collator (global RNG, seeded by the
    loop). Evaluation: pass already-masked inputs and their ``mlm_labels`` (-100 = not scored).
    """

    def __init__(self, mlm_model, tokenizer, mlm_probability: float = 0.15):
        super().__init__()
        from transformers import DataCollatorForLanguageModeling

        self.mlm = mlm_model
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)))
        self.collator = DataCollatorForLanguageModeling(tokenizer, mlm=True,
                                                        mlm_probability=mlm_probability)

    def mask(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = input_ids.detach().cpu().clone()
        special = torch.isin(ids, self.special_ids)
        inputs, labels = self.collator.torch_mask_tokens(ids, special_tokens_mask=special)
        return inputs.to(input_ids.device), labels.to(input_ids.device)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, mlm_labels=None):
        if mlm_labels is None:
            input_ids, mlm_labels = self.mask(input_ids)
        hidden = self.mlm.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
        scored = mlm_labels != -100
        if not bool(scored.any()):
            # No token drawn in this batch (tiny batches only): a zero loss that keeps the graph.
            return _Out(hidden.sum() * 0.0, 0)
        logits = self.mlm.cls(hidden[scored])
        loss = torch.nn.functional.cross_entropy(logits.float(), mlm_labels[scored], reduction="mean")
        return _Out(loss, int(scored.sum()))


class _Out:
    def __init__(self, loss, n_tokens):
        self.loss, self.n_tokens = loss, n_tokens


def mask_heldout(tokenizer, blocks: list[dict], seed: int, mlm_probability: float = 0.15) -> list[dict]:
    """Mask the held-out blocks once with a seeded generator, so every model is scored on the same
    inputs."""
    from transformers import DataCollatorForLanguageModeling

    coll = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mlm_probability,
                                           seed=seed)
    coll.generator = torch.Generator().manual_seed(seed)
    special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    out = []
    for b in blocks:
        ids = torch.tensor([b["input_ids"]])
        inputs, labels = coll.torch_mask_tokens(ids.clone(), special_tokens_mask=torch.isin(ids, special_ids))
        out.append({**b, "input_ids": inputs[0].tolist(), "mlm_labels": labels[0].tolist()})
    return out


@torch.no_grad()
def heldout_loss(objective: MaskedLMObjective, tokenizer, masked_blocks: list[dict],
                 batch_size: int = 32) -> float:
    """Mean cross-entropy over all scored tokens of the held-out blocks (token-weighted)."""
    was_training = objective.training
    objective.eval()
    device = next(objective.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(masked_blocks), batch_size):
        rows = masked_blocks[i:i + batch_size]
        width = max(len(r["input_ids"]) for r in rows)

        def pad(key, fill, rows=rows, width=width):
            return torch.tensor([r[key] + [fill] * (width - len(r[key])) for r in rows], device=device)

        out = objective(pad("input_ids", tokenizer.pad_token_id), pad("attention_mask", 0),
                        pad("token_type_ids", 0), mlm_labels=pad("mlm_labels", -100))
        if out.n_tokens:
            total += float(out.loss) * out.n_tokens
            count += out.n_tokens
    objective.train(was_training)
    if count == 0:
        raise DataError("the held-out slice has no maskable token; use a larger corpus or "
                        "--heldout-fraction")
    return total / count
