"""Worker for tests/integration/test_ddp.py; run as ``accelerate launch --num_processes 2 --cpu
tests/integration/ddp_worker.py OUT [--diverge]`` (or with plain ``python`` for the 1-process
reference).

It trains a tiny BERT classifier (dropout off, so 1- and 2-process runs are comparable) with
``train()`` and a magnitude-mask hook that re-prunes every other step. The loop compares the
hook's masks across ranks after every step; this worker additionally compares the parameters at
the end. With ``--diverge`` rank 1 flips one mask entry after step 2, which the loop must catch.
Rank 0 writes ``OUT/result.json`` (and ``OUT/params.pt``); an IntegrityError is written to
``OUT/error-rank<r>.txt`` and exits 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from compress.core.distributed import assert_same_across_ranks, is_distributed, tensor_checksum
from compress.core.errors import IntegrityError
from compress.training.loop import TrainConfig, TrainHook, encode, train


def sparsity_at(step: int, every: int) -> float:
    """0.2 at the start, +0.1 at every pruning step: the masks change during training."""
    return 0.2 + 0.1 * (step // every)


class MagnitudeMaskHook(TrainHook):
    """Masks the encoder's Linear weights by |w| to ``sparsity_at(step)``, recomputed every
    ``every`` steps (nested: a pruned weight stays pruned), re-applied after every step."""

    def __init__(self, model, every: int = 2, diverge_rank: int | None = None):
        self.params = {n: p for n, p in model.named_parameters()
                       if ".encoder." in n and n.endswith(".weight") and p.ndim == 2}
        self.masks = {n: torch.ones_like(p, dtype=torch.bool) for n, p in self.params.items()}
        self.every, self.diverge_rank = every, diverge_rank
        self.checksums: list[str] = []

    @torch.no_grad()
    def _prune(self, step: int) -> None:
        for n, p in self.params.items():
            score = p.abs().masked_fill(~self.masks[n], -1.0).flatten()
            k = int(round(sparsity_at(step, self.every) * score.numel()))
            drop = torch.topk(score, k, largest=False).indices
            m = self.masks[n].flatten().clone()
            m[drop] = False
            self.masks[n] = m.view_as(p)

    @torch.no_grad()
    def _apply(self) -> None:
        for n, p in self.params.items():
            p.masked_fill_(~self.masks[n], 0.0)

    def on_train_begin(self, model, total_steps: int) -> None:
        self._prune(0)
        self._apply()

    def on_step_end(self, model, step: int) -> None:
        if step % self.every == 0:
            self._prune(step)
        rank = torch.distributed.get_rank() if is_distributed() else 0
        if step == 2 and rank == self.diverge_rank:
            first = next(iter(self.masks))
            self.masks[first].view(-1)[0] ^= True  # this rank now disagrees by one weight
        self._apply()
        self.checksums.append(tensor_checksum(self.masks))

    def state_dict(self) -> dict:
        return {"masks": dict(self.masks)}

    def load_state_dict(self, state: dict) -> None:
        self.masks = {n: state["masks"][n].clone() for n in self.params}


def build(seed: int = 0):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from compress.models.loading import packaged_model_path

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, num_labels=2, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg), AutoTokenizer.from_pretrained(packaged_model_path("minilm"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--diverge", action="store_true")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)

    from compress.tasks import TASKS, DataOptions

    torch.set_num_threads(1)
    model, tok = build()
    ds = TASKS["sample"].load(DataOptions(), "train").subset(64)
    feats = encode(tok, ds, 32)
    hook = MagnitudeMaskHook(model, diverge_rank=1 if args.diverge else None)
    records: list[dict] = []
    cfg = TrainConfig(lr=1e-3, max_steps=args.steps, batch_size=args.batch_size, max_length=32,
                      warmup_ratio=0.0, log_every=1, seed=3, rank_check_every=1)
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = train(model, tok, feats, cfg, [hook], log=records.append)
        final = tensor_checksum(dict(model.state_dict()))
        ranks = assert_same_across_ranks(final, "parameters after training")
    except IntegrityError as exc:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"error-rank{rank}.txt").write_text(str(exc), encoding="utf-8")
        return 3
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        world = torch.distributed.get_world_size() if is_distributed() else 1
        (args.out / "result.json").write_text(json.dumps({
            "world": world, "steps": result["steps"], "losses": records,
            "mask_checksums": hook.checksums, "param_checksums": ranks,
            "sparsity": {n: float((~m).float().mean()) for n, m in hook.masks.items()},
        }), encoding="utf-8")
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out / "params.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
